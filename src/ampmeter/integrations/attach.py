"""Which context an SDK or HTTP request attaches to, when it is made.

The context a lazy stream being read was created in, else the current one, else the process
default (:func:`ampmeter.integrations.set_default_context`), else the one a hand-off token in
``AMPMETER_HANDOFF`` gives this process. A call made on a thread where none of these applies,
while a context is open elsewhere, goes out unmetered and says so once.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import warnings
import weakref
from typing import Any

from ampmeter._current import CURRENT, OPEN, open_contexts
from ampmeter.context import ExecutionContext
from ampmeter.errors import HandoffError, StreamOutlivedContext, note_stop
from ampmeter.integrations.lifecycle import settings
from ampmeter.propagation import HANDOFF_ENV, HANDOFF_LOG_ENV

__all__ = ["attach_from_env", "metered_context", "remember_stream_origin"]

# Lazy streams: generators that send their request only when first read (LlamaIndex's
# ``stream_chat()``), by the id of the generator's frame, with the context they were made in.
# A request is made from inside that frame, wherever and whenever the generator is read.
_stream_origins: dict[int, tuple[weakref.ref[Any], ExecutionContext]] = {}


def metered_context() -> ExecutionContext | None:
    """The context SDK calls attach to here (see the module's documentation), or None."""
    if _stream_origins:
        origin = _origin_of_running_stream()
        if origin is not None:
            return origin
    current = CURRENT.get()
    if current is not None:
        return current[0]
    ctx = settings.default_context
    if ctx is None:
        if HANDOFF_ENV in os.environ:
            return attach_from_env()
        if not settings.warned_unmetered and OPEN:
            _warn_unmetered()
    return ctx


def remember_stream_origin(stream: Any, ctx: ExecutionContext) -> None:
    """Meter the requests that generator ``stream`` sends against ``ctx`` (its creator's
    context), wherever it is read; forgotten when the generator is."""
    frame = getattr(stream, "gi_frame", None) or getattr(stream, "ag_frame", None)
    if frame is None:
        return
    key = id(frame)

    def forget(ref: weakref.ref[Any]) -> None:
        if _stream_origins.get(key, (None,))[0] is ref:
            del _stream_origins[key]

    _stream_origins[key] = (weakref.ref(stream, forget), ctx)


def _origin_of_running_stream() -> ExecutionContext | None:
    """The creating context of a remembered generator running further up this stack."""
    frame = sys._getframe(2)
    while frame is not None:
        found = _stream_origins.get(id(frame))
        if found is not None:
            stream = found[0]()
            if stream is not None and _runs_in(stream, frame):
                ctx = found[1]
                if ctx not in open_contexts():
                    stop = StreamOutlivedContext(
                        f"a stream created in context {ctx.name!r} was read after that context "
                        "closed: its request was not sent. Read the stream inside the context."
                    )
                    note_stop(stop)  # frameworks re-raise it as their own error
                    raise stop
                return ctx
        frame = frame.f_back  # type: ignore[assignment]
    return None


def _runs_in(stream: Any, frame: Any) -> bool:
    """Whether ``frame`` is the frame of generator ``stream`` (a frame id can be reused)."""
    return frame is getattr(stream, "gi_frame", None) or frame is getattr(stream, "ag_frame", None)


def _warn_unmetered() -> None:
    settings.warned_unmetered = True
    names = ", ".join(sorted({repr(ctx.name) for ctx in open_contexts()}))
    warnings.warn(
        f"ampmeter: an SDK call on thread {threading.current_thread().name!r} is not metered: "
        f"no context is current here, while {names} is open in another thread (this thread "
        "was not started, or its work not submitted, inside it, or instrument(threads=False) "
        "is in effect). Call ampmeter.set_default_context(ctx) so calls on any thread attach "
        "to it, or submit the work with contextvars.copy_context().run. "
        "(This warning is shown once.)",
        RuntimeWarning,
        stacklevel=4,
    )


_attached: dict[int, ExecutionContext | None] = {}  # pid -> the context attached from the env
_attach_lock = threading.Lock()


def attach_from_env() -> ExecutionContext | None:
    """The context made from ``AMPMETER_HANDOFF`` in this process (made on first use), or None.

    Its events go to the JSONL file ``AMPMETER_HANDOFF_LOG`` names (if any); it closes when the
    interpreter exits. A damaged token or unreachable ledger raises :class:`HandoffError` once
    and is not retried.
    """
    pid = os.getpid()
    if pid in _attached:
        return _attached[pid]
    with _attach_lock:
        if pid in _attached:
            return _attached[pid]
        _attached[pid] = None
        token = os.environ.get(HANDOFF_ENV)
        if not token:
            return None
        from ampmeter.sinks.jsonl import JsonlSink

        log = os.environ.get(HANDOFF_LOG_ENV)
        sink = JsonlSink(log, flush="line") if log else None
        try:
            ctx = ExecutionContext.from_handoff(token, sinks=[sink] if sink else [])
        except Exception as error:
            if sink is not None:
                sink.close()
            raise HandoffError(f"cannot attach to {HANDOFF_ENV}: {error}") from error
        _attached[pid] = ctx

        def close() -> None:
            if os.getpid() == pid:
                ctx.close()
                if sink is not None:
                    sink.close()

        atexit.register(close)
        return ctx
