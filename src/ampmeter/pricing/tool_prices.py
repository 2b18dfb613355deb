"""Prices of tool calls: what one call of a priced tool costs, in dollars.

Some tools cost money per call (a paid search API, a code sandbox, an MCP server that bills).
:func:`set_tool_price` prices a tool by its exact name or by an fnmatch pattern
(``"search_*"``); :func:`tool_price` is what the integrations ask when a tool is called, and a
priced tool call counts toward cost caps and reserves its price like an LLM call. Tool names
match case-sensitively, as MCP names them; an exact price wins over a pattern, a longer
pattern over a shorter one. Prices are read as written (``0.005`` is exactly 0.005 dollars).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Final

from ampmeter.pricing.price_book import PriceBook, is_pattern
from ampmeter.pricing.rates import MAX_RATE, rate_arg

__all__ = [
    "MAX_TOOL_USD",
    "clear_tool_prices",
    "remove_tool_price",
    "set_tool_price",
    "tool_price",
]

MAX_TOOL_USD: Final = MAX_RATE
"""The highest price of one tool call, in dollars: far above any, and well inside what the
ledgers count (a larger one would only make every call of the tool slow to price)."""

_book: PriceBook[Decimal] = PriceBook()  # by (name, None): names match case-sensitively


def _name_arg(name: object) -> str:
    if not isinstance(name, str):
        raise TypeError(f"tool name must be a str, got {type(name).__name__} {name!r}")
    if not name.strip():
        raise ValueError("tool name must be a non-empty tool name or pattern")
    return name


def set_tool_price(name_or_pattern: str, *, usd: Decimal | float | int | str) -> None:
    """Price every call of the tool ``name_or_pattern`` (an fnmatch pattern when it holds
    ``*``, ``?`` or ``[``) at ``usd`` dollars (at most :data:`MAX_TOOL_USD`, with at most 24
    decimal places); replaces an earlier price of the same name."""
    name = _name_arg(name_or_pattern)
    _book.set((name, None), rate_arg(usd, "usd", "dollars a call"))


def remove_tool_price(name_or_pattern: str) -> None:
    """Remove a price set with :func:`set_tool_price`; ``KeyError`` if there is none."""
    name = _name_arg(name_or_pattern)
    if not _book.remove((name, None)):
        kind = "pattern" if is_pattern(name) else "tool"
        raise KeyError(f"no tool price was set for {kind} {name!r}")


def clear_tool_prices() -> None:
    """Remove every tool price."""
    _book.clear()


def tool_price(name: str) -> Decimal | None:
    """The dollars one call of tool ``name`` costs, or None when no price covers it (unpriced,
    which is not the same as a price of zero)."""
    return _book.find((name,))
