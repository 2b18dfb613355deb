"""A context's part in admission: its limits, deadline and ledger, and how it stopped.

Each :class:`~ampmeter.ExecutionContext` owns one :class:`Frame`; the admission reads the
frames of a context and of every context above it, and marks the ones a stop ends. The frame
holds this state so that contexts, calls and steps share it without reading each other's
private fields. It does not know its context: the core is a leaf, and what a frame needs from
above (a shared ledger, a hand-off link, the policies' state) it is handed, by protocol or as
data the core does not read.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Final, Literal

from ampmeter._core.check import Guard, compile_limits
from ampmeter._core.exhaustion import Exhaustion, PauseLedger
from ampmeter._core.idempotency import SeenKeys
from ampmeter._core.outcome import Outcome, TerminationReason

if TYPE_CHECKING:
    from ampmeter._core.kernel import Level
    from ampmeter.limits import ExceededLimit, Limit

__all__ = ["Frame", "Stop"]

Stop = tuple["Frame", "ExceededLimit", TerminationReason]
"""A refusal: the context whose limit fired, the limit, and the reason it stops."""

_LOCAL_TERMINATIONS: Final = frozenset(
    {TerminationReason.LIMIT_EXCEEDED, TerminationReason.TIMEOUT}
)


class Frame:
    """The admission state of one context (see the module docstring)."""

    __slots__ = (
        "ancestry",
        "canceled",
        "canceled_in_tree",
        "deadline",
        "disclose_budget",
        "exceeded_limit",
        "exhaustion",
        "guard",
        "handoff_from",
        "ledger",
        "level",
        "limits",
        "name",
        "node_id",
        "on_expired_hold",
        "on_ledger_error",
        "parent",
        "pause_events",
        "policies",
        "revision",
        "root",
        "seen",
        "span_prefix",
        "started_at",
        "termination_reason",
        "timeout_s",
    )

    def __init__(
        self,
        name: str,
        node_id: str,
        parent: Frame | None,
        level: Level,
        limits: tuple[Limit, ...],
        timeout_s: float | None,
        ledger: PauseLedger | None,
        *,
        on_ledger_error: str,
        handoff_from: Any,
        exhaustion: Exhaustion | None = None,
        disclose_budget: bool | None = None,
        on_expired_hold: Literal["charge", "release"] | None = None,
    ) -> None:
        self.name = name
        self.node_id = node_id  # the context's own node
        self.parent = parent
        self.ancestry: tuple[Frame, ...] = (self, *(parent.ancestry if parent is not None else ()))
        self.root: Frame = self.ancestry[-1]
        self.level = level
        self.limits = limits
        # Its limits as the kernel checks them at its level (rows replaced when one is raised).
        self.guard = Guard(level, compile_limits(limits))
        self.started_at = time.monotonic()
        self.timeout_s = timeout_s
        self.deadline = None if timeout_s is None else self.started_at + timeout_s
        # The shared ledger (as the shared ledger step and a pause use it) and the hand-off this
        # context was made from (None: none; the ledger step reads it).
        self.ledger: Any = ledger
        self.on_ledger_error = on_ledger_error
        self.handoff_from = handoff_from
        self.canceled = False
        # On the root frame: whether any context of the tree was canceled (until one is, a
        # call has no contexts above to look through).
        self.canceled_in_tree = False
        self.span_prefix = ""  # prepended to this process's node ids in a multi-process run
        self.termination_reason: TerminationReason | None = None
        self.exceeded_limit: ExceededLimit | None = None
        # What a call does at a hard limit (inherited); pauses and resumes seen here; and, on
        # the root frame, a count of raised limits (policies that derive ceilings from the limits
        # derive them again when it moves).
        self.exhaustion: Exhaustion = exhaustion or (
            parent.exhaustion if parent is not None else Exhaustion()
        )
        self.pause_events: list[dict[str, Any]] = []
        self.disclose_budget: bool = (
            disclose_budget
            if disclose_budget is not None
            else (parent.disclose_budget if parent is not None else False)
        )
        # What a shared ledger does when the lease of a hold of this context's calls runs out
        # (set here or above; None: each ledger's own rule).
        self.on_expired_hold: Literal["charge", "release"] | None = on_expired_hold or (
            parent.on_expired_hold if parent is not None else None
        )
        self.revision = 0
        # The idempotency keys the run has counted: one set, the root's, shared by every frame.
        self.seen: SeenKeys = parent.seen if parent is not None else SeenKeys()
        # What the context's policies keep for it (their steps read it; the core does not).
        self.policies: Any = None

    def can_stop(self) -> bool:
        """Whether this context can stop a call (only those take part in admission)."""
        return bool(self.limits) or self.deadline is not None or self.ledger is not None

    def cancel(self) -> None:
        """Cancel this context: its calls and those of the contexts below it are refused."""
        self.canceled = True
        self.root.canceled_in_tree = True

    def any_canceled(self) -> bool:
        """Whether this context or one above it was canceled."""
        return self.root.canceled_in_tree and any(frame.canceled for frame in self.ancestry)

    def stop(self, owner: Frame, limit: ExceededLimit, reason: TerminationReason) -> None:
        """Record a stop: the context whose limit fired (``owner``), and every context between
        it and this one, stop for ``reason``."""
        for frame in self.ancestry:
            if frame.exceeded_limit is None:
                frame.exceeded_limit = limit
            current = frame.termination_reason
            if current is None or current not in _LOCAL_TERMINATIONS:
                frame.termination_reason = reason
            if frame is owner:
                break

    def closing(self, exc: BaseException | None) -> Outcome:
        """How this context's node ends when it closes with ``exc`` (its termination reason is
        set now if nothing stopped it before)."""
        from ampmeter import redact
        from ampmeter.errors import ExecutionCanceled, LimitExceeded

        if self.termination_reason is None:
            self.termination_reason = TerminationReason.of(exc)
            if isinstance(exc, LimitExceeded):
                self.exceeded_limit = self.exceeded_limit or exc.exceeded
        reason = self.termination_reason
        if reason is TerminationReason.SUCCESS:
            return Outcome("success")
        if reason is TerminationReason.ERROR and exc is not None:
            return Outcome(
                "fail", error_class=type(exc).__name__, stop_reason=redact.error_text(exc)
            )
        if self.exceeded_limit is not None:
            stop = str(self.exceeded_limit)
        elif isinstance(exc, LimitExceeded | ExecutionCanceled):
            stop = str(exc)
        else:
            stop = reason.value
        return Outcome("halt", stop_reason=stop)

    def describe(self) -> dict[str, Any]:
        """How this context stopped, as JSON-ready data (None fields when it did not)."""
        limit = self.exceeded_limit
        return {
            "termination_reason": (
                self.termination_reason.value if self.termination_reason else None
            ),
            "exceeded_limit": None
            if limit is None
            else {
                "key": limit.key,
                "value": float(limit.value),
                "limit_key": limit.limit.key,
                "limit_type": limit.limit.type.value,
                "max_value": float(limit.limit.max_value),
            },
        }
