"""What a call does at a hard limit: stop (``on_exhausted="raise"``, the default) or pause until
the ceiling is raised (``"pause"``, or a callback that may raise it at once).

A paused call waits in the admission chain's own wait (it yields :class:`Pause` and, for a
shared ledger, :class:`Work`), so it holds no lock and an ``asyncio`` task leaves the event loop
free. It tries again when a ceiling is raised (:func:`raise_limit`, from any thread), when a
shared ledger keeps a higher ceiling than the context's own (``ampmeter budget raise``), or when
an operator's pause of the ledger scope is lifted (``ampmeter budget resume``). Every pause and
resume is a limit event, on the call's node (``limit_events``) and in the context's snapshot.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Final

from ampmeter import _validate
from ampmeter._core.check import compile_limits
from ampmeter._core.waiting import Pause, Wait, Work
from ampmeter.keys import is_money

if TYPE_CHECKING:
    from ampmeter._core.frame import Frame
    from ampmeter._core.kernel import Kernel
    from ampmeter._core.steps import Chain, Flight, Steps, Stop
    from ampmeter.context import ExecutionContext
    from ampmeter.limits import ExceededLimit

__all__ = ["ON_EXHAUSTED_MODES", "ExhaustedHook", "Exhaustion", "PauseWait", "raise_limit"]

ON_EXHAUSTED_MODES: Final = ("raise", "pause")
META_LIMIT_EVENTS: Final = "limit_events"
_POLL_S: Final = 0.1  # how often a paused call asks again (a raise in this process wakes it)
_EVENTS_KEPT: Final = 1_000  # per context, for the snapshot

ExhaustedHook = Callable[["ExecutionContext", "ExceededLimit"], "float | Decimal | int | None"]
"""``on_exhausted(ctx, exceeded) -> new_max | None``: a new ceiling for the exceeded limit's key
resumes the call at once; None pauses it as ``"pause"`` does."""


@dataclass(frozen=True, slots=True)
class Exhaustion:
    """A context's checked ``on_exhausted`` and ``pause_timeout_s`` (None: no end to a pause)."""

    mode: str = "raise"
    timeout_s: float | None = None
    hook: ExhaustedHook | None = None

    @classmethod
    def checked(cls, on_exhausted: object, pause_timeout_s: object) -> Exhaustion | None:
        """The settings from a user's keywords (None when neither is given: inherit)."""
        if on_exhausted is None and pause_timeout_s is None:
            return None
        timeout = _validate.optional_amount(pause_timeout_s, "pause_timeout_s")
        if on_exhausted is None:
            return cls("pause", timeout)
        if callable(on_exhausted):
            return cls("pause", timeout, on_exhausted)
        if on_exhausted not in ON_EXHAUSTED_MODES:
            raise ValueError(
                f"on_exhausted must be 'raise', 'pause' or a callable, got {on_exhausted!r}"
            )
        return cls(str(on_exhausted), timeout)

    @property
    def pauses(self) -> bool:
        """Whether a call at a hard limit pauses rather than stops."""
        return self.mode == "pause"


def raise_limit(frame: Frame, key: str, new_max: object) -> None:
    """Set the ceiling of ``frame``'s limit on ``key`` to ``new_max`` (any thread); calls paused
    on it try again at once. ``KeyError`` names the key when the context has no such ceiling."""
    from ampmeter.limits import Limit

    what = f"new maximum for {key!r}"
    value: Any = (
        _validate.dollars(new_max, what) if is_money(key) else _validate.number(new_max, what)
    )
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
    frame.context.wake_paused()


_RAISE_LOCK = threading.Lock()


class PauseWait:
    """One call's pause at a hard limit: its events and its time limit.

    ``owner`` is the frame whose limit stopped the call, ``exceeded`` the limit as found."""

    __slots__ = ("exceeded", "flight_node", "frame", "kernel", "owner", "paused_at", "wait")

    def __init__(
        self, frame: Frame, owner: Frame, exceeded: ExceededLimit, kernel: Kernel, node: Any
    ) -> None:
        self.frame = frame
        self.owner = owner
        self.exceeded = exceeded
        self.kernel = kernel
        self.flight_node = node
        self.paused_at = time.monotonic()
        timeout = frame.exhaustion.timeout_s
        self.wait = Wait(timeout) if timeout is not None else None

    def begin(self) -> Generator[Pause | Work, Any, bool]:
        """Note the pause; ask the callback, if any. True when the callback raised the limit."""
        self.event("pause")
        hook = self.frame.exhaustion.hook
        if hook is None:
            return False
        context = self.owner.context
        new_max = yield Work(lambda: hook(context, self.exceeded))
        if new_max is None:
            return False
        raise_limit(self.owner, self.exceeded.limit.key, new_max)
        return True

    def look(self, thread: int | None, chain: Chain, flight: Flight, stop: Stop) -> Steps:
        """Wait once for a raise (adopting a higher ceiling the shared ledger keeps), or stop
        the call with :class:`~ampmeter.LimitExceeded` when ``pause_timeout_s`` is over."""
        adopt = self.adopt_ledger_ceiling()
        if adopt is not None:
            yield adopt
        pause = self.next_pause(thread)
        if pause is None:
            self.event("pause_timeout")
            raise chain.refuse(flight, stop, f"{stop[1]}; {self.timeout_note()}")
        yield pause

    def next_pause(self, thread: int | None) -> Pause | None:
        """The next wait, or None when ``pause_timeout_s`` is over."""
        if self.wait is None:
            return Pause(_POLL_S, self.kernel if thread is not None else None)
        left = self.wait.deadline - time.monotonic()
        if left <= 0.0:
            return None
        return Pause(min(_POLL_S, left), self.kernel if thread is not None else None)

    def adopt_ledger_ceiling(self) -> Work | None:
        """Work reading the owner's shared ledger: a kept ceiling above the context's own
        (``ampmeter budget raise``) raises the context's limit to it."""
        ledger = self.owner.ledger
        if ledger is None:
            return None
        key = self.exceeded.limit.key
        owner = self.owner

        def adopt() -> None:
            kept = ledger.ceilings().get(key)
            if kept is None:
                return
            mine = next((lim.max_value for lim in owner.limits if lim.key == key), None)
            if mine is not None and Decimal(str(kept)) > Decimal(str(mine)):
                raise_limit(owner, key, kept)

        return Work(adopt)

    def resumed(self) -> None:
        """Note the resume."""
        self.event("resume", waited_s=round(time.monotonic() - self.paused_at, 3))

    def timeout_note(self) -> str:
        """Why the pause ended in a stop."""
        return f"paused {time.monotonic() - self.paused_at:.3g}s (pause_timeout_s ran out)"

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
