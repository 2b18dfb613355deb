"""A call paused at a hard limit (``on_exhausted="pause"`` or a callback), and raising a
context's ceiling, which frees it (see :mod:`~ampmeter._core.exhaustion` for the rule).

A paused call waits in the admission's own wait (it yields :class:`Pause` and, for a shared
ledger, :class:`Work`), so it holds no lock and an ``asyncio`` task leaves the event loop free.
The admission it pauses in is reached through :class:`Pausing`, so this module does not import
the steps that use it.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Generator
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Final, Protocol

from ampmeter import _validate
from ampmeter._core.check import compile_limits
from ampmeter._core.waiting import Pause, Wait, Work
from ampmeter.limits import Limit

if TYPE_CHECKING:
    from ampmeter._core.frame import Frame, Stop
    from ampmeter._core.kernel import Kernel
    from ampmeter.errors import LimitExceeded
    from ampmeter.limits import ExceededLimit

__all__ = ["PauseWait", "Pausing", "raise_limit"]

META_LIMIT_EVENTS: Final = "limit_events"
_POLL_S: Final = 0.1  # how often a paused call asks again (a raise in this process wakes it)
_EVENTS_KEPT: Final = 1_000  # per context, for the snapshot

_NOTE_S: Final = 30.0  # how long a paused call's note in the ledger lasts unless renewed
_RENEW_S: Final = 10.0  # how often a paused call renews it


class Pausing(Protocol):
    """What a pause asks of the admission it waits in (``_core.steps.Admission`` is one)."""

    def ask_exhausted(self, owner: Frame, exceeded: ExceededLimit) -> object:
        """Ask the ``on_exhausted`` callback for a new ceiling (None: stop)."""

    def refuse(self, call: Any, stop: Stop, message: str | None = None) -> LimitExceeded:
        """Halt ``call`` for ``stop``; the error to raise."""

    def deadline_passed(self) -> Stop | None:
        """The stop of a ``timeout_s`` that ran out, if one did."""


def raise_limit(frame: Frame, key: str, new_max: object, kernel: Kernel) -> None:
    """Set the ceiling of ``frame``'s limit on ``key`` to ``new_max`` (any thread); calls paused
    on it try again at once. ``KeyError`` names the key when the context has no such ceiling."""
    value = _validate.limit_max(key, new_max, f"new maximum for {key!r}")
    with _RAISE_LOCK:
        found = [lim for lim in frame.limits if lim.key == key and lim.is_ceiling]
        if not found:
            raise KeyError(
                f"context {frame.name!r} has no hard limit on {key!r} "
                f"(its limits: {', '.join(lim.key for lim in frame.limits) or 'none'})"
            )
        limits = tuple(
            Limit(lim.key, value, lim.type, lim.warn_at) if lim in found else lim
            for lim in frame.limits
        )
        frame.limits = limits
        frame.guard.rows = compile_limits(limits)
        frame.root.revision += 1
    kernel.wake()


_RAISE_LOCK = threading.Lock()


class PauseWait:
    """One call's pause at a hard limit while an admission step waits: its events, its time
    limits and its note in the ledger. Made when the step starts waiting; it begins at the
    first hard limit the call meets (``owner`` is then the frame whose limit stopped the call,
    ``exceeded`` the limit as found)."""

    __slots__ = (
        "begun",
        "call_id",
        "exceeded",
        "flight_node",
        "frame",
        "kernel",
        "mark",
        "noted_at",
        "owner",
        "paused_at",
        "since",
        "wait",
    )

    def __init__(self, frame: Frame, kernel: Kernel, node: Any) -> None:
        self.frame = frame
        self.kernel = kernel
        self.flight_node = node
        self.begun = False
        self.noted_at: float | None = None  # when the ledger note was written (None: none)

    def turn(
        self, thread: int | None, admission: Pausing, flight: object, stop: Stop
    ) -> Generator[Pause | Work, Any, None]:
        """One turn of the pause at ``stop``: the first notes it and asks the callback
        (:meth:`begin`); unless the callback raised the limit, wait once for a raise
        (:meth:`look`)."""
        if not self.begun:
            self.begun = True
            self.owner, self.exceeded = stop[0], stop[1]
            self.paused_at = time.monotonic()
            self.since = time.time()
            self.call_id = f"{self.flight_node.node_id}-{uuid.uuid4().hex[:8]}"
            self.mark: str | None = None  # the ledger's raise mark when the pause was noted
            timeout = self.frame.exhaustion.timeout_s
            self.wait = Wait(timeout) if timeout is not None else None
            if (yield from self.begin(admission, flight, stop)):
                return
        yield from self.look(thread, admission, flight, stop)

    def begin(
        self, admission: Pausing, flight: object, stop: Stop
    ) -> Generator[Pause | Work, Any, bool]:
        """Note the pause; ask the callback, if any. True when the callback raised the limit;
        a callback that returns None stops the call."""
        self.event("pause")
        if self.frame.exhaustion.hook is None:
            return False
        new_max = yield Work(lambda: admission.ask_exhausted(self.owner, self.exceeded))
        if new_max is None:
            self.event("pause_declined")
            raise admission.refuse(flight, stop, f"{stop[1]}; on_exhausted returned None")
        raise_limit(self.owner, self.exceeded.limit.key, new_max, self.kernel)
        return True

    def look(
        self, thread: int | None, admission: Pausing, flight: object, stop: Stop
    ) -> Generator[Pause | Work, Any, None]:
        """Wait once for a raise (a ceiling raised in the shared ledger after the pause is
        taken), or stop the call with :class:`~ampmeter.LimitExceeded` when
        ``pause_timeout_s`` or a context's ``timeout_s`` is over."""
        timed = admission.deadline_passed()
        if timed is not None:
            yield from self.end()
            self.event("pause_timeout")
            note = f"paused {self.waited():.3g}s at {self.exceeded.limit.describe()}"
            raise admission.refuse(flight, timed, f"{timed[1]} ({note}; timeout_s ran out)")
        if self.owner.ledger is not None:
            yield Work(self.watch_ledger)
        pause = self.next_pause(thread)
        if pause is None:
            yield from self.end()
            self.event("pause_timeout")
            raise admission.refuse(flight, stop, f"{stop[1]}; {self.timeout_note()}")
        yield pause

    def next_pause(self, thread: int | None) -> Pause | None:
        """The next wait, or None when ``pause_timeout_s`` is over."""
        if self.wait is None:
            return Pause(_POLL_S, self.kernel if thread is not None else None)
        left = self.wait.deadline - time.monotonic()
        if left <= 0.0:
            return None
        return Pause(min(_POLL_S, left), self.kernel if thread is not None else None)

    def watch_ledger(self) -> None:
        """Read the owner's shared ledger (blocking work): the first time, note the pause there
        and keep the raise mark it finds; later, renew the note now and then, and take a
        ceiling the ledger keeps above the context's own once the mark has moved on (an
        operator raised it after the pause: ``ampmeter budget raise``)."""
        ledger = self.owner.ledger
        assert ledger is not None
        limit = self.exceeded.limit
        key = limit.key
        now = time.monotonic()
        if self.noted_at is None or now - self.noted_at >= _RENEW_S:
            if self.noted_at is None:
                self.mark = ledger.raise_mark(key)  # raises made before this one do not count
            context, since = self.owner.name, self.since
            ledger.note_paused(self.call_id, key, limit.max_value, context, since, _NOTE_S)
            self.noted_at = now
            return
        if ledger.raise_mark(key) == self.mark:
            return
        kept = ledger.ceilings().get(key)
        mine = next((lim.max_value for lim in self.owner.limits if lim.key == key), None)
        if kept is not None and mine is not None and Decimal(str(kept)) > Decimal(str(mine)):
            raise_limit(self.owner, key, kept, self.kernel)

    def end(self) -> Generator[Work, Any, None]:
        """Drop the pause's note from the ledger (the call goes on or stops)."""
        if self.noted_at is not None:
            self.noted_at = None
            yield Work(self.forget)

    def forget(self) -> None:
        """Drop the note now (blocking work)."""
        if self.owner.ledger is not None:
            self.owner.ledger.forget_paused(self.call_id)

    def abandon(self) -> None:
        """The admission ended on an error or an interrupt: drop the note if the ledger can
        be reached (else it lapses by itself)."""
        if self.noted_at is not None:
            self.noted_at = None
            with contextlib.suppress(Exception):
                self.forget()

    def resumed(self) -> Generator[Work, Any, None]:
        """Note the resume, if the call paused."""
        if self.begun:
            self.event("resume", waited_s=round(self.waited(), 3))
            yield from self.end()

    def waited(self) -> float:
        """Seconds paused so far."""
        return time.monotonic() - self.paused_at

    def timeout_note(self) -> str:
        """Why the pause ended in a stop."""
        return f"paused {self.waited():.3g}s (pause_timeout_s ran out)"

    def event(self, kind: str, **extra: Any) -> None:
        """Record a limit event of ``kind`` on the node and in the context's snapshot."""
        exceeded = self.exceeded
        value = exceeded.value
        event: dict[str, Any] = {
            "kind": kind,
            "limit": exceeded.limit.describe(),
            "key": exceeded.key,
            "value": float(value) if isinstance(value, Decimal) else value,
            "node_id": self.flight_node.node_id,
            "context": self.owner.name,
            **extra,
        }
        self.kernel.append_metadata(self.flight_node, META_LIMIT_EVENTS, [event])
        events = self.frame.pause_events
        if len(events) < _EVENTS_KEPT:
            events.append(event)
