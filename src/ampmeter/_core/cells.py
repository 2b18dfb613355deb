"""Where the kernel keeps values: a :class:`Cell` per key and a :class:`Level` per context.
Only :mod:`ampmeter._core.kernel` changes them, under its lock."""

from __future__ import annotations

from typing import Any

from ampmeter._core.usage import Entry
from ampmeter.keys import is_money

__all__ = ["Cell", "Level"]


class Cell:
    """One counter's or gauge's value. A level maps keys to cells, so a plan can hold the cells
    of its keys and add to them without looking anything up (cells are never removed)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


class Level:
    """The stats of one context: counters and gauges as cells. ``targets`` are the levels a
    usage made here adds to: itself and every level above it."""

    __slots__ = (
        "counters",
        "gauges",
        "known",
        "parent",
        "targets",
        "version",
        "watched",
    )

    def __init__(self, parent: Level | None) -> None:
        self.parent = parent
        self.targets: tuple[Level, ...] = (self,) + (() if parent is None else parent.targets)
        self.counters: dict[str, Cell] = {}
        self.gauges: dict[str, Cell] = {}
        # Every key ever written or held here, in first-seen order.
        self.known: dict[str, None] = {}
        # For each prefix a limit watches, the keys starting with it (kept up to date).
        self.watched: dict[str, list[str]] = {}
        # Moves whenever a key or a cell is added here: a guard's entries older than it are
        # stale (see ampmeter._core.check.Guard).
        self.version = 0

    def note(self, key: str) -> None:
        """Record that ``key`` exists here (prefix watch lists see it from now on)."""
        if key in self.known:
            return
        self.version += 1
        self.known[key] = None
        for prefix, keys in self.watched.items():
            if key.startswith(prefix):
                keys.append(key)

    def keys_with(self, prefix: str) -> list[str]:
        """The known keys that start with ``prefix``; the first call starts watching it."""
        keys = self.watched.get(prefix)
        if keys is None:
            keys = [key for key in self.known if key.startswith(prefix)]
            self.watched[prefix] = keys
        return keys

    def cell(self, key: str, gauge: bool) -> Cell:
        """The cell of ``key`` (made at 0 if new: an int for counters and for money, which is
        counted in whole nano-dollars; a float for other gauges)."""
        cells = self.gauges if gauge else self.counters
        found = cells.get(key)
        if found is None:
            found = Cell(0.0 if gauge and not is_money(key) else 0)
            cells[key] = found
            self.version += 1
            self.note(key)
        return found

    def cells(self, entries: tuple[Entry, ...]) -> tuple[tuple[Cell, int], ...]:
        """The (cell, Usage field) pairs a usage of ``entries`` adds to at every target."""
        return tuple(
            (level.cell(key, gauge), field)
            for level in self.targets
            for key, field, gauge in entries
        )
