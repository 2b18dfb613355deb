"""How a node, a call or a context ends: an :class:`Outcome`, a :class:`TerminationReason`."""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any, NamedTuple

__all__ = ["Ending", "Outcome", "TerminationReason"]


class TerminationReason(str, Enum):
    """Why a context (or an executor run) ended."""

    SUCCESS = "success"
    ERROR = "error"
    CONTEXT_CANCELED = "context_canceled"
    HOOK_ABORT = "hook_abort"
    LIMIT_EXCEEDED = "limit_exceeded"
    TIMEOUT = "timeout"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def of(cls, exc: BaseException | None) -> TerminationReason:
        """Why a context that ends with ``exc`` (None: normally) ended."""
        from ampmeter.errors import ExecutionCanceled, LimitExceeded
        from ampmeter.keys import KEY_ELAPSED_S

        if exc is None:
            return cls.SUCCESS
        if isinstance(exc, LimitExceeded):
            timed_out = exc.exceeded is not None and exc.exceeded.key == KEY_ELAPSED_S
            return cls.TIMEOUT if timed_out else cls.LIMIT_EXCEEDED
        if isinstance(exc, ExecutionCanceled):
            return cls.CONTEXT_CANCELED
        return cls.ERROR


class Outcome(NamedTuple):
    """How a node ended: its status (``success``, ``fail`` or ``halt``), what it used (its cost
    in whole nano-dollars) and why it stopped. Every way of ending a node takes one of these."""

    status: str
    cost_nano: int = 0
    tokens_in: int | None = None
    tokens_out: int | None = None
    error_class: str | None = None
    stop_reason: str | None = None
    metadata: Mapping[str, Any] | None = None


Ending = tuple[str, int, int | None, int | None, str | None, str | None, Mapping[str, Any] | None]
"""An :class:`Outcome`'s fields in order, as the node table reads them: a caller holding just
the values (the graph's ``mark_*``) passes them without building an Outcome to be unpacked."""
