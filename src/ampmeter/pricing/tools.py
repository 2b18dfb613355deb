"""Prices of tool calls: a tool that costs money (a paid search, a code sandbox, an MCP tool
billed per call) counts toward cost caps and is reserved before it runs, like an LLM call.

A price is set for a tool's exact name or for a shell-style pattern (``"search_*"``); an exact
name wins over patterns, and among patterns the one set last wins. A tool with no price costs
nothing (tools are free unless said otherwise).
"""

from __future__ import annotations

import fnmatch
import threading
from decimal import Decimal

from ampmeter import money

__all__ = ["clear_tool_prices", "set_tool_price", "tool_price"]

_lock = threading.Lock()
_exact: dict[str, Decimal] = {}
_patterns: list[tuple[str, Decimal]] = []  # in the order they were set
_PATTERN_CHARS = frozenset("*?[")


def set_tool_price(name_or_pattern: str, *, usd: Decimal | float | int | str) -> None:
    """Price each call of the tool ``name_or_pattern`` (a name, or a pattern with ``*``, ``?``
    or ``[...]``) at ``usd`` dollars; setting it again replaces it."""
    if not isinstance(name_or_pattern, str) or not name_or_pattern:
        raise ValueError(f"tool name must be a non-empty str, got {name_or_pattern!r}")
    amount = money.usd(usd, "usd")
    with _lock:
        if _PATTERN_CHARS.isdisjoint(name_or_pattern):
            _exact[name_or_pattern] = amount
            return
        _patterns[:] = [(p, a) for p, a in _patterns if p != name_or_pattern]
        _patterns.append((name_or_pattern, amount))


def tool_price(name: str) -> Decimal | None:
    """The price of one call of tool ``name`` in dollars, or None when none is set."""
    with _lock:
        found = _exact.get(name)
        if found is not None:
            return found
        for pattern, amount in reversed(_patterns):
            if fnmatch.fnmatchcase(name, pattern):
                return amount
    return None


def clear_tool_prices() -> None:
    """Forget every tool price."""
    with _lock:
        _exact.clear()
        _patterns.clear()
