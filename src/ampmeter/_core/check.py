"""Compiled limit rows: what the kernel's check compares, built once per set of limits.

A context's limits become *rows* when it is made (:func:`compile_limits`); a :class:`Guard`
pairs a level with the rows checked there and keeps their *entries* (:func:`compile_entries`):
the cells to read, in check order, rebuilt only when the rows were replaced (a raised limit) or
a key or cell was added at that level.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ampmeter._core.cells import Cell

if TYPE_CHECKING:
    from ampmeter._core.cells import Level

__all__ = ["Entry", "Guard", "Hit", "LimitRow", "Refused", "compile_entries", "compile_limits"]

LimitRow = tuple[bool, str, Any, Any]
"""A compiled limit: ``(is_prefix, key, max_value, limit object)``."""
Entry = tuple["Cell | None", Any, Any, str]
"""One value a check compares: ``(cell or None, max_value, limit object, key)``."""
Hit = tuple[Any, str, Any]
"""A limit found exceeded: ``(limit object, key, value)``."""
Refused = tuple[int, Hit, bool]
"""Why the kernel did not hold a call: the index of the guard, the hit, and whether only the
holds of calls in flight are in the way (what is spent leaves room)."""


class Guard:
    """A level that can stop calls, with its compiled limits (``rows``, replaced whole when a
    limit is raised, from any thread) and the entries that check them there."""

    __slots__ = ("compiled", "level", "rows")

    def __init__(self, level: Level, rows: tuple[LimitRow, ...]) -> None:
        self.level = level
        self.rows = rows
        # The rows compiled, the level's version then, and their entries: valid while both
        # are current. One tuple, so a raise between the compilation and its storing shows as
        # rows that are no longer current.
        self.compiled: tuple[tuple[LimitRow, ...] | None, int, tuple[Entry, ...]] = (None, 0, ())

    def compile(self) -> tuple[Entry, ...]:
        """Build the entries again for the rows and the level as they are now (under the
        kernel's lock)."""
        rows, level = self.rows, self.level
        entries = compile_entries(level, rows)
        # A folded level's sums are read, not kept: its entries are never reused.
        folded = bool(level.pulled or level.offset)
        self.compiled = (rows, -1 if folded else level.version, entries)
        return entries


def compile_limits(limits: Iterable[Any]) -> tuple[LimitRow, ...]:
    """``limits`` as the rows the kernel's check reads, in list order (plain ceilings only: soft
    and windowed limits are the policies' work). Money ceilings are whole nano-dollars, as the
    kernel's money cells are."""
    return tuple(
        (limit.type.value == "prefix", limit.key, limit.internal_max, limit)
        for limit in limits
        if limit.is_ceiling
    )


def compile_entries(level: Level, rows: tuple[LimitRow, ...]) -> tuple[Entry, ...]:
    """The entries checking ``rows`` at ``level``: ``(cell or None, max_value, limit, key)`` in
    check order (list order; for each limit counters, then gauges). ``None`` stands for a key
    with no value yet, which only a held or pending amount can push over."""
    entries: list[Entry] = []
    counters, gauges = level.counters, level.gauges
    if level.pulled or level.offset:  # a folded level: its values as read now
        counters = {key: Cell(value) for key, value in level.values(False).items()}
        gauges = {key: Cell(value) for key, value in level.values(True).items()}
    for is_prefix, key, top, limit in rows:
        keys = level.keys_with(key) if is_prefix else (key,)
        # Counters first (None for a key with neither a counter nor a gauge yet), then gauges.
        for name in keys:
            count = counters.get(name)
            if count is not None or name not in gauges:
                entries.append((count, top, limit, name))
        entries.extend((gauges[name], top, limit, name) for name in keys if name in gauges)
    return tuple(entries)
