"""MCP tools: each ``mcp.ClientSession.call_tool`` is a ``tool`` node under the current call.

The node is admitted before the request goes to the MCP server, against the tool limits
(``amp:tool_calls`` and ``amp:tool_calls:<name>``) and, for a tool with a price
(:func:`ampmeter.pricing.set_tool_price`), against the cost caps with that price
reserved, so a stop raises ``LimitExceeded`` and the tool does not run. The node ends with the
tool's price as its cost, ``fail`` when the server reports the tool failed (``is_error``) or
the request raised: then free, unless its answer never came (a timeout, the connection lost),
when the price stands, as the server may have run the tool.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any, Final

from ampmeter.errors import LimitExceeded, note_stop
from ampmeter.integrations.attach import metered_context
from ampmeter.integrations.lifecycle import META_OPERATION, META_TRANSPORT
from ampmeter.integrations.patching import Patch, undo_all
from ampmeter.pricing.tool_prices import tool_price

__all__ = ["ToolFailed", "instrument_mcp", "uninstrument_mcp"]

OPERATION: Final = "mcp.call_tool"

_patches: list[Patch] = []


class ToolFailed(Exception):
    """The MCP server reported the tool call failed (recorded on the node, never raised)."""


def _wrap_call_tool(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def call_tool(session: Any, name: str, *args: Any, **kwargs: Any) -> Any:
        ctx = metered_context()
        if ctx is None:
            return await original(session, name, *args, **kwargs)
        price = tool_price(name)
        call = ctx.tool_call(
            name,
            estimate_usd=price,
            metadata={META_OPERATION: OPERATION, META_TRANSPORT: "mcp"},
            arguments=kwargs.get("arguments", args[0] if args else None),
        )
        try:
            call.start()
        except LimitExceeded as stop:
            note_stop(stop)  # frameworks may re-raise it as their own error
            raise
        try:
            result = await original(session, name, *args, **kwargs)
        except BaseException as exc:
            if price is not None and _unanswered(exc):  # it may have run: its price stands
                call.record(cost_usd=price)
            call.finish(exc)
            raise
        if price is not None:
            call.record(cost_usd=price)
        # The server says the tool failed: ``is_error`` in mcp 2, ``isError`` before.
        flags = (getattr(result, "is_error", None), getattr(result, "isError", None))
        failed = any(flag is True for flag in flags)
        call.finish(ToolFailed(f"the MCP tool {name!r} reported an error") if failed else None)
        return result

    return call_tool


# The codes of an MCP error the client raises when the server's answer never came (the
# request was sent): connection closed (-32000), request timed out (-32001; mcp 1 used 408).
_UNANSWERED: Final = frozenset({-32000, -32001, 408})


def _unanswered(exc: BaseException) -> bool:
    """Whether ``exc`` says the tool's request went unanswered (the server may have run it)."""
    return getattr(getattr(exc, "error", None), "code", None) in _UNANSWERED


def instrument_mcp(module: ModuleType) -> None:
    """Meter ``ClientSession.call_tool`` (``module`` is ``mcp``; idempotent)."""
    session = module.ClientSession
    if _patches or "call_tool" not in session.__dict__:
        return
    wrapped = _wrap_call_tool(session.__dict__["call_tool"])
    _patches.append(Patch.apply(session, "call_tool", wrapped))


def uninstrument_mcp() -> None:
    """Restore ``ClientSession.call_tool`` (idempotent)."""
    undo_all(_patches)
