"""The metering of each Python process of an ``ampmeter run`` (the child side).

The bootstrap ``sitecustomize`` calls :func:`child_setup` when the program first imports
something ampmeter meters. The process then instruments the SDKs and opens one
:class:`~ampmeter.ExecutionContext` with the run's limits and its shared ledger (SQLite in the
run's temporary directory, or ``--ledger redis://...``), so the limits hold for the whole
process tree, and writes its events line by line: a worker ended by SIGTERM or ``os._exit``
has still left every call it finished or was refused.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import signal
import sys
import threading
import time
from types import TracebackType
from typing import Any

from ampmeter.cli.run.config import RunConfig
from ampmeter.cli.run.leftover import open_run_ledger
from ampmeter.cli.run.parent import ENV_CONFIG, ENV_TREE

__all__ = ["child_setup"]


def child_setup(*, top: bool) -> None:
    """Meter this interpreter for ``ampmeter run`` (``top``: the run's first Python process).

    The run's settings stay in the environment, so every Python process the program starts is
    metered too, against the same shared ledger; a ``fork`` child starts afresh (its own
    context and log file) instead of counting on the parent's copy.
    """
    raw = os.environ.get(ENV_CONFIG)
    if raw is None or ENV_TREE not in os.environ:
        return
    config = RunConfig(**json.loads(raw))

    from ampmeter.integrations import instrument

    config.set_prices()
    instrument(capture_content=config.capture_content)
    _Process.start(config, top)
    os.register_at_fork(after_in_child=functools.partial(_forked, config))
    previous_hook = sys.excepthook

    def excepthook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        if _Process.current is not None:
            _Process.current.seen.append(exc)
        from ampmeter.errors import LimitExceeded

        if isinstance(exc, LimitExceeded):
            return  # the parent prints the one-line reason
        previous_hook(kind, exc, tb)

    sys.excepthook = excepthook
    if top:
        _interrupt_on_sigterm()


def _interrupt_on_sigterm() -> None:
    """Let SIGTERM (``--timeout``, or a SIGTERM sent to ``ampmeter run``) unwind this process
    as an interrupt instead of ending it on the spot, so a call in flight is charged at its
    reservation and logged (:mod:`ampmeter._core.interrupted`) and the log is closed. Only
    where the program left SIGTERM at its default: its own handler is its own business.

    Only in the run's top process, as SIGINT does there. Its worker processes are ended by
    SIGTERM on the spot, as multiprocessing expects: a pool terminates its idle workers so,
    and an exception raised into one that holds the pool's queue lock (or in its exit hooks)
    left it hanging and the run with it. A worker's call cut so is charged by the run from
    its expired hold (:mod:`ampmeter.cli.run.leftover`)."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return
    signal.signal(signal.SIGTERM, _terminated)


def _terminated(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends it at once
    raise SystemExit(128 + signum)


def _forked(config: RunConfig) -> None:
    """Meter a ``fork`` child afresh. A fork inherits the top process's SIGTERM handler, and a
    pool worker must end on the spot when its pool terminates it (see
    :func:`_interrupt_on_sigterm`): the handler goes back to the default here."""
    on_main = threading.current_thread() is threading.main_thread()
    if on_main and signal.getsignal(signal.SIGTERM) is _terminated:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _Process.start(config, False)


class _Process:
    """The metering of one process of the run: its context, ledger and log file."""

    current: _Process | None = None

    def __init__(self, ctx: Any, sink: Any, ledger: Any) -> None:
        self.pid = os.getpid()
        self.ctx = ctx
        self.sink = sink
        self.ledger = ledger
        self.seen: list[BaseException] = []

    @classmethod
    def start(cls, config: RunConfig, top: bool) -> None:
        """Open this process's context (the top one's node is the run's root)."""
        from ampmeter._current import set_enclosing_context
        from ampmeter.integrations import set_default_context
        from ampmeter.sinks.jsonl import JsonlSink

        tree = json.loads(os.environ[ENV_TREE])
        pid = os.getpid()
        ledger = open_run_ledger(tree)
        log = JsonlSink(os.path.join(tree["events"], f"{time.time_ns()}-{pid}.jsonl"), flush="line")
        set_enclosing_context(None)  # a fork child's copy of its parent's is not ours
        if top:
            ctx = config.context("ampmeter_run", tree, ledger, log)
        else:
            ctx = config.context(f"process {pid}", tree, ledger, log, "p", pid=pid)
        ctx.__enter__()  # also in a fork child: the parent's context is not ours any more
        set_default_context(ctx)
        set_enclosing_context(ctx)  # the program's own contexts run inside the run's
        if top and ctx.node_id != tree["root"]:
            raise RuntimeError(
                f"the run's root context got node id {ctx.node_id!r}, not {tree['root']!r}: "
                "the other processes' logs would not join it"
            )
        cls.current = cls(ctx, log, ledger)
        atexit.register(cls.current.finish)

    def finish(self) -> None:
        """Close the context, log and ledger (in this process only)."""
        if os.getpid() != self.pid:
            return  # an atexit hook inherited through fork: the parent's, not ours
        self.ctx.close(self.seen[0] if self.seen else None)
        self.sink.close()
        self.ledger.close()
