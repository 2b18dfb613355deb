"""Holds left in the run's ledger once every process of the run has ended: charged and logged.

A process that ended with a call in flight and could not end the call itself (killed after
``--grace``, ``os._exit``) leaves that call's hold in the run's ledger and nothing in the log,
and its request may have been billed. The run's processes hold with a short lease
(:data:`RUN_LEASE_S`), so once the tree has ended the run waits for such holds to run out,
which the ledger charges as unsettled spend, and logs each as an ``unsettled hold`` node under
the run's root (:mod:`ampmeter.shared.unsettled`) for ``summary``, ``report`` and ``watch``.

Runs given one ``--scope`` share one ledger scope, and a hold there may be another run's, live
or dead. So each run's processes name their holds with the run's own prefix
(:func:`hold_prefix`, the ledger's ``hold_prefix``): a run waits for, and records, only the
holds its own processes left (all dead once its tree has ended); another run's are that run's.
"""

from __future__ import annotations

import os
import time
from typing import Any, Final

__all__ = ["RUN_LEASE_S", "hold_prefix", "open_run_ledger", "record_leftover_holds"]

RUN_LEASE_S: Final = 4.0
"""The lease of a hold taken by a process of the run."""
_POLL_S: Final = 0.2


def hold_prefix(tree: dict[str, Any]) -> str:
    """What the ids of the holds of the run of ``tree`` (its settings) begin with."""
    return f"run-{tree['chain']}-"


def open_run_ledger(tree: dict[str, Any], *, create: bool = True) -> Any:
    """The ledger of the run of ``tree`` (its settings): at its address (a server URL, or the
    SQLite file's path; ``create``: else a file not there yet, as before any process of the
    run metered, is a ``ValueError``), on its scope, its holds named as the run's."""
    from ampmeter.ledgers.reach import open_address

    ledger = open_address(tree["ledger"], tree["scope"], lease_s=RUN_LEASE_S, create=create)
    ledger.hold_prefix = hold_prefix(tree)
    return ledger


def record_leftover_holds(tree: dict[str, Any]) -> None:
    """Charge and log the holds the run's processes left (see the module); ``tree`` is the
    run's settings as its processes got them."""
    try:
        ledger = open_run_ledger(tree, create=False)
    except ValueError:
        return  # no process of the run metered anything
    try:
        own = ledger.hold_prefix
        if not _held(ledger) and not any(h.id.startswith(own) for h in ledger.unsettled_holds()):
            return
        deadline = time.monotonic() + RUN_LEASE_S + 2 * _POLL_S
        while _held(ledger) and time.monotonic() < deadline:
            time.sleep(_POLL_S)
        _record(ledger, tree)
    finally:
        ledger.close()


def _held(ledger: Any) -> bool:
    """Whether a process of the run holds anything still (its hold's lease has not run out)."""
    # (Reading what is held ends a hold whose lease ran out: it is charged then, and listed
    # with the unsettled holds, not the held ones.)
    ledger.reserved()
    return any(rid.startswith(ledger.hold_prefix) for rid in ledger.reservation_ids())


def _record(ledger: Any, tree: dict[str, Any]) -> None:
    from ampmeter.context import ExecutionContext
    from ampmeter.sinks.jsonl import JsonlSink
    from ampmeter.sinks.relabel import RelabeledSink

    path = os.path.join(tree["events"], f"{time.time_ns()}-{os.getpid()}-leftover.jsonl")
    log = JsonlSink(path, flush="line")
    sink = RelabeledSink(
        log, prefix="leftover.", attach_to=tree["root"], depth_offset=1, keep_root=False
    )
    # Its close records, once across every reader, each hold charged as unsettled.
    ExecutionContext("ampmeter_run", ledger=ledger, chain_id=tree["chain"], sinks=[sink]).close()
    log.close()
