"""The specification's wrapper interface: run a function as a call and get a :class:`Decision`
(``with ctx.llm_call(...)`` is the usual way; this stays for compatibility)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from enum import Enum
from typing import TYPE_CHECKING

from ampmeter import _validate
from ampmeter.errors import ExecutionCanceled, LimitExceeded

if TYPE_CHECKING:
    from ampmeter.call import Call

__all__ = ["Decision", "WrapOptions", "run_wrapped"]


class Decision(str, Enum):
    """What ``wrap_llm_call`` / ``wrap_tool_call`` tell the caller to do next."""

    ALLOW = "allow"
    RETRY = "retry"
    HALT = "halt"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class WrapOptions:
    """Options of ``wrap_llm_call`` / ``wrap_tool_call``.

    ``cost_estimate_hint`` is reserved before the call and, when it succeeds, recorded as its
    cost (the wrapped function returns nothing to price).
    """

    operation_name: str = ""
    cost_estimate_hint: Decimal | float = 0.0
    model: str | None = None

    def __post_init__(self) -> None:
        _validate.text(self.operation_name, "operation_name")
        _validate.optional_text(self.model, "model")
        hint = _validate.dollars(self.cost_estimate_hint, "cost_estimate_hint")
        object.__setattr__(self, "cost_estimate_hint", hint)


def run_wrapped(call: Call, fn: Callable[[], object], cost: Decimal | float) -> Decision:
    """Run ``fn`` as ``call``: HALT if a limit stops it, RETRY if it raised, else ALLOW."""
    try:
        call.start()
    except (LimitExceeded, ExecutionCanceled):
        return Decision.HALT
    try:
        fn()
    except Exception as exc:
        call.finish(exc)
        return Decision.RETRY
    except BaseException as exc:
        call.finish(exc)
        raise
    if call.kind == "llm" or cost:
        call.record(cost_usd=cost)
    call.finish()
    return Decision.ALLOW
