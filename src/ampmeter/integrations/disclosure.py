"""Telling the agent its budget (``disclose_budget=True``): the context's budget line is added
as system text to every instrumented LLM request, and the node records it (``budget_note``).

The line goes where each wire format keeps system text: a leading ``system`` message (chat),
the ``instructions`` (responses), the ``system`` field (anthropic). Messages and system blocks
may be any iterable the SDKs take; the caller's own objects are never changed: the request
gets new lists and strings.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final, TypeGuard

if TYPE_CHECKING:
    from ampmeter.context import ExecutionContext

__all__ = ["META_BUDGET_NOTE", "disclose"]

META_BUDGET_NOTE: Final = "budget_note"


def disclose(ctx: ExecutionContext, kwargs: dict[str, Any], wire: str | None) -> str | None:
    """Add the context's budget line to the request ``kwargs`` (in place) when it asks for it;
    the line told, else None."""
    if wire is None or not ctx.disclose_budget:
        return None
    note = ctx.budget_note()
    if wire == "anthropic":
        system = kwargs.get("system")
        if _is_many(system):
            kwargs["system"] = [*system, {"type": "text", "text": note}]
        else:
            kwargs["system"] = f"{system}\n\n{note}" if system else note
    elif wire == "responses":
        instructions = kwargs.get("instructions")
        kwargs["instructions"] = f"{instructions}\n\n{note}" if instructions else note
    elif wire == "chat" and _is_many(kwargs.get("messages")):
        kwargs["messages"] = [{"role": "system", "content": note}, *kwargs["messages"]]
    else:
        return None  # a wire without a place for system text is sent as it is
    return note


def _is_many(value: object) -> TypeGuard[Iterable[Any]]:
    """Whether ``value`` is a collection of messages or blocks (any iterable but text and a
    single mapping), which the SDKs take as well as a list."""
    return isinstance(value, Iterable) and not isinstance(value, (str, bytes, Mapping))
