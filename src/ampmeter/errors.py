"""Every exception ampmeter raises on purpose, in one tree under :class:`AmpmeterError`.

Errors that are also a standard kind keep it as a second base, so ``except OSError`` still
catches a failed log write and ``except ValueError`` a malformed log line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ampmeter.limits import ExceededLimit

__all__ = [
    "AmpmeterError",
    "AnalysisError",
    "BudgetBusy",
    "BudgetUnavailable",
    "DemoError",
    "EventSchemaError",
    "ExecutionCanceled",
    "HandoffError",
    "HookAbort",
    "JsonlError",
    "LimitExceeded",
    "LocalLLMError",
    "LogLineError",
    "SinkClosedError",
    "SinkWriteError",
    "StreamAbandoned",
]


class AmpmeterError(Exception):
    """Base class of the errors ampmeter raises on purpose."""


# -- containment ----------------------------------------------------------------------------------


class LimitExceeded(AmpmeterError):
    """A call (or iteration) was stopped before it ran because it would break a limit.

    ``exceeded`` names the limit, the key and the value it would have reached; ``node_id`` is
    the halted node (None when an iteration, not a call, was stopped).
    """

    def __init__(
        self, message: str, exceeded: ExceededLimit | None = None, node_id: str | None = None
    ) -> None:
        super().__init__(message)
        self.exceeded = exceeded
        self.node_id = node_id


class BudgetUnavailable(LimitExceeded):
    """The budget ledger could not be reached or did not answer in time.

    Raised by a ledger backend (then ``node_id`` is None), and to the caller whose call it
    stopped (fail closed): the budget could not be checked, so the call was not made.
    """


class BudgetBusy(LimitExceeded):
    """A call waited for other calls' reservations to settle and the wait ran out.

    The budget was not spent: what was already spent left room for the call, but calls in
    flight held the rest for longer than the context's ``admission_timeout_s``.
    """


class ExecutionCanceled(AmpmeterError):
    """The context was canceled; no further calls run in it."""

    def __init__(self, message: str, node_id: str | None = None) -> None:
        super().__init__(message)
        self.node_id = node_id


class HandoffError(AmpmeterError, ValueError):
    """A hand-off token is malformed, cannot be made (no shared ledger), or cannot be attached
    to (its ledger needs credentials the token does not carry, or is not reachable)."""


class HookAbort(AmpmeterError):
    """Raised by user code (a hook or the loop) to stop an executor run on purpose."""


class StreamAbandoned(AmpmeterError):
    """A streamed response was closed (or dropped) before its last event was read."""


# -- logs and sinks -------------------------------------------------------------------------------


class SinkWriteError(AmpmeterError, OSError):
    """Writing events failed (disk full, file gone); the message says how many were lost."""


class SinkClosedError(AmpmeterError, OSError):
    """An event was given to a sink that is already closed."""


class LogLineError(AmpmeterError, ValueError):
    """Something is wrong at a place in a log file: ``path``, ``line`` (None if unknown), why."""

    def __init__(self, path: str, line: int | None, reason: str) -> None:
        self.path = path
        self.line = line
        self.reason = reason
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {reason}")


class JsonlError(LogLineError):
    """A line of a JSONL file is not a JSON object; ``path`` and ``line`` say where."""


class AnalysisError(LogLineError):
    """A record of a log lacks a field analysis needs, or has one of the wrong type.

    ``path`` and ``line`` say where (``line`` is None when it could not be found again).
    """


class EventSchemaError(AmpmeterError, ValueError):
    """An event does not match the TokenTracker v0 schema; ``errors`` lists every problem."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        super().__init__(f"not a valid TokenTracker v0 event: {errors[0]}{more}")


# -- the demo -------------------------------------------------------------------------------------


class LocalLLMError(AmpmeterError, RuntimeError):
    """The local model server could not be found, configured or started."""


class DemoError(AmpmeterError, ValueError):
    """The demo was asked for something it cannot do (bad flag values, missing model...)."""
