"""Every exception ampmeter raises on purpose, in one tree under :class:`AmpmeterError`.

Errors that are also a standard kind keep it as a second base, so ``except OSError`` still
catches a failed log write and ``except ValueError`` a malformed log line.
"""

from __future__ import annotations

import contextlib
from collections import deque
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from ampmeter.limits import ExceededLimit


class AmpmeterError(Exception):
    """Base class of the errors ampmeter raises on purpose."""


# -- containment ----------------------------------------------------------------------------------


class LimitExceeded(AmpmeterError):
    """A call (or iteration) was stopped before it ran because it would break a limit.

    ``exceeded`` names the limit, the key and the value it would have reached; ``node_id`` is
    the halted node (None when an iteration, not a call, was stopped).

    Frameworks that translate client errors by their HTTP status (LiteLLM) read ``status_code``
    and ``message``: 400 makes the stop a non-retryable client error there (a "bad request"
    that no retry, fallback deployment or Router cooldown would fix), not a server error.
    """

    status_code = 400

    def __init__(
        self, message: str, exceeded: ExceededLimit | None = None, node_id: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.exceeded = exceeded
        self.node_id = node_id


# The latest stops raised into instrumented clients: a framework that re-raises a stop as its own
# error without keeping it (LiteLLM does) still keeps its message, by which it is found again.
_recent_stops: Final[deque[LimitExceeded]] = deque(maxlen=64)


def note_stop(stop: LimitExceeded) -> None:
    """Remember a stop raised into third-party code, for :func:`find_limit_exceeded`."""
    _recent_stops.append(stop)


def find_limit_exceeded(exc: BaseException | None) -> LimitExceeded | None:
    """The :class:`LimitExceeded` behind ``exc`` (``exc`` itself, or what a framework wrapped).

    Follows ``__cause__`` and ``__context__``, exception groups, LiteLLM's
    ``original_exception``, tenacity's ``RetryError.last_attempt`` and instructor's
    ``failed_attempts``; an error that kept only the stop's message (LiteLLM's mapped errors)
    is matched to the stop by that message. None when no stop is behind it.
    """
    seen: set[int] = set()
    pending: list[Any] = [exc]
    walked: list[BaseException] = []
    while pending:
        error = pending.pop()
        if not isinstance(error, BaseException) or id(error) in seen:
            continue
        seen.add(id(error))
        if isinstance(error, LimitExceeded):
            return error
        walked.append(error)
        pending += [error.__cause__, error.__context__, getattr(error, "original_exception", None)]
        pending += getattr(error, "exceptions", None) or ()  # an exception group
        for attempt in getattr(error, "failed_attempts", None) or ():
            pending.append(getattr(attempt, "exception", None))
        last = getattr(error, "last_attempt", None)
        if last is not None and callable(getattr(last, "exception", None)):
            with contextlib.suppress(Exception):  # an attempt that did not fail has none
                pending.append(last.exception())
    for stop in reversed(_recent_stops):
        text = str(stop)
        if text and any(text in str(error) for error in walked):
            return stop
    return None


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


class StreamOutlivedContext(LimitExceeded):
    """A lazy stream (one that sends its request when first read, like LlamaIndex's
    ``stream_chat()``) was read after the context it was created in had closed.

    Its request belongs to that context, which takes no more calls: it is stopped before it is
    sent, as a limit would stop it, rather than sent unmetered and outside the context's limits.
    Read the stream inside the context.
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


# Every error class defined here, and the two functions that find a stop again.
__all__ = [
    name
    for name, value in list(globals().items())
    if isinstance(value, type) and issubclass(value, AmpmeterError)
] + ["find_limit_exceeded", "note_stop"]
