"""The exceptions ampmeter raises on purpose."""

from __future__ import annotations

from ampmeter.limits import ExceededLimit

__all__ = ["AmpmeterError", "BudgetUnavailable", "ExecutionCanceled", "HookAbort", "LimitExceeded"]


class AmpmeterError(Exception):
    """Base class of the errors ampmeter raises on purpose."""


class LimitExceeded(AmpmeterError):
    """A call (or iteration) was stopped before it ran because it would break a limit.

    ``exceeded`` names the limit, the key and the value it would have reached; ``node_id`` is
    the halted node (None when an iteration, not a call, was stopped).
    """

    def __init__(self, message: str, exceeded: ExceededLimit | None, node_id: str | None) -> None:
        super().__init__(message)
        self.exceeded = exceeded
        self.node_id = node_id


class BudgetUnavailable(LimitExceeded):
    """The shared budget ledger could not be reached, so the call was stopped (fail closed)."""


class ExecutionCanceled(AmpmeterError):
    """The context was canceled; no further calls run in it."""

    def __init__(self, message: str, node_id: str | None = None) -> None:
        super().__init__(message)
        self.node_id = node_id


class HookAbort(AmpmeterError):
    """Raised by user code (a hook or the loop) to stop an executor run on purpose."""
