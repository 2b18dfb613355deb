"""What ``ampmeter run`` says while its program runs, on stderr: each warning a limit gives (in
the process where it fired), what a dry run would have stopped, and each call paused at a limit
with the command that lets it go on."""

from __future__ import annotations

import contextlib
import os
import shlex
import threading
from collections.abc import Iterator
from typing import Any, Final

from ampmeter.cli.run.config import RunConfig
from ampmeter.cli.run.leftover import open_run_ledger

__all__ = ["say_limit_event", "watching_pauses"]

_PAUSE_POLL_S: Final = 0.25


def say_limit_event(event: Any) -> None:
    """The ``on_limit_event`` of the run's contexts: one line per event (a
    :class:`~ampmeter.LimitEvent`)."""
    from ampmeter.cli.output import printable, say
    from ampmeter.keys import is_money
    from ampmeter.money import format_usd

    value = format_usd(event.value) if is_money(event.key) else f"{event.value:,}"
    where = f"call {event.node_id} of {event.context}"
    if event.kind == "warning":
        text = f"warning: {event.threshold:.0%} of {event.limit.describe()} used ({value}, {where})"
    elif event.kind == "soft_limit":
        text = (
            f"dry run: {event.key} reached {value} at {where}: without --dry-run, "
            f"{event.limit.describe().replace(' (soft)', '')} would have stopped it or a call "
            "before it"
        )
    elif event.kind == "unpriced":
        text = (
            f"warning: {where} went to a model without a price: it counts as unpriced, never "
            "$0 (price it with --price MODEL=IN/OUT)"
        )
    else:
        text = f"{event.kind}: {event.limit.describe()} ({value}, {where})"
    say(printable(f"ampmeter run: {text}"))


@contextlib.contextmanager
def watching_pauses(config: RunConfig, tree: dict[str, Any]) -> Iterator[None]:
    """While the block runs, name each call paused at a limit (``--on-exhausted pause``) once,
    with the ``ampmeter budget raise`` that lets it go on."""
    if config.on_exhausted != "pause" or config.dry_run:
        yield
        return
    stop = threading.Event()
    thread = threading.Thread(
        target=_watch, args=(tree, stop), name="ampmeter-run-pauses", daemon=True
    )
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)


def _watch(tree: dict[str, Any], stop: threading.Event) -> None:
    from ampmeter.cli.output import printable, say

    where, scope = tree["ledger"], tree["scope"]
    seen: set[str] = set()
    ledger = None
    try:
        while not stop.wait(_PAUSE_POLL_S):
            if ledger is None:
                if not where.startswith(("redis://", "rediss://")) and not os.path.exists(where):
                    continue  # no process has metered yet
                ledger = open_run_ledger(where, scope)
            with contextlib.suppress(Exception):  # busy or gone: look again
                for call in ledger.show(scope).paused_calls:
                    if call.id not in seen:
                        seen.add(call.id)
                        command = f"ampmeter budget raise {shlex.quote(where)} {shlex.quote(scope)}"
                        say(
                            printable(
                                f"ampmeter run: paused: a call of {call.context} is at its limit "
                                f"{call.key} {call.cap}; it goes on once the limit is raised: "
                                f"{command} {call.key} NEW_MAX"
                            )
                        )
    finally:
        if ledger is not None:
            ledger.close()
