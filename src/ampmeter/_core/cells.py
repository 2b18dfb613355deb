"""Where the kernel keeps values: a :class:`Cell` per key and a :class:`Level` per context.
Only :mod:`ampmeter._core.kernel` changes them, under its lock.

Folding. A level nothing reads live (a context with no limit, no ledger and no policy step) is
*folded*: a usage made below it is not added to it; a read sums its own cells and those of the
open children it *pulls* (:meth:`Level.read`). A child that ends is folded into it once
(:meth:`ampmeter._core.kernel.Kernel.retire`): from then on its adds reach the parent directly.
Only sums fold: local keys and plain (non-money) gauges are kept whole at every level.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Any

from ampmeter._core.usage import Entry
from ampmeter.keys import LOCAL_KEYS, is_money

__all__ = ["Cell", "Fold", "Level", "fold_in", "summed"]


class Cell:
    """One counter's or gauge's value. A level maps keys to cells, so a plan can hold the cells
    of its keys and add to them without looking anything up (cells are never removed)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


class Fold:
    """Shared by the levels of one tree: ``epoch`` moves whenever which levels a usage adds to
    changes (a child folded into its parent), so targets and compiled plans are worked out
    again."""

    __slots__ = ("epoch",)

    def __init__(self) -> None:
        self.epoch = 0


def summed(key: str, gauge: bool) -> bool:
    """Whether ``key`` is a sum that a folded level reads from its children (counters and money
    gauges; not the local keys, nor float gauges, whose sums depend on their order)."""
    return key not in LOCAL_KEYS and (not gauge or is_money(key))


class Level:
    """The stats of one context: counters and gauges as cells. ``lineage`` is itself and every
    level above it; :attr:`targets` the levels a usage made here adds to (see the module
    docstring)."""

    __slots__ = (
        "__weakref__",
        "_epoch",
        "_targets",
        "caches",
        "children",
        "counters",
        "fold",
        "gauges",
        "known",
        "lineage",
        "live",
        "offset",
        "parent",
        "pulled",
        "pulled_by",
        "version",
        "watched",
    )

    def __init__(self, parent: Level | None) -> None:
        self.parent = parent
        self.lineage: tuple[Level, ...] = (self,) + (() if parent is None else parent.lineage)
        self.fold: Fold = Fold() if parent is None else parent.fold
        self.live = True
        # The open children a folded level reads (as a dict: ordered, removed in one step).
        self.pulled: dict[Level, None] = {}
        self.pulled_by: Level | None = None
        # What a read adds to each summed key's cell: the totals of children folded in, less
        # the changes a ``set`` made below that this level must not see.
        self.offset: dict[tuple[str, bool], Cell] = {}
        # Its children, weakly (a folded child's level goes with its stats), and the settlement
        # caches compiled for it, cleared when the levels its usage adds to change.
        self.children: weakref.WeakSet[Level] = weakref.WeakSet()
        self.caches: list[dict[Any, Any]] = []
        if parent is not None:
            parent.children.add(self)
        if parent is not None and not parent.live:
            parent.pulled[self] = None
            self.pulled_by = parent
        self._epoch = -1
        self._targets: tuple[Level, ...] = ()
        self.counters: dict[str, Cell] = {}
        self.gauges: dict[str, Cell] = {}
        # Every key ever written or held here, in first-seen order.
        self.known: dict[str, None] = {}
        # For each prefix a limit watches, the keys starting with it (kept up to date).
        self.watched: dict[str, list[str]] = {}
        # Moves whenever a key or a cell is added here: a guard's entries older than it are
        # stale (see ampmeter._core.check.Guard).
        self.version = 0

    @property
    def targets(self) -> tuple[Level, ...]:
        """The levels a sum added here goes to: itself, and each level above that does not
        read the one below it on the way (a live level, or one a child was folded into)."""
        if self._epoch != self.fold.epoch:
            found = [self]
            below: Level = self
            above = self.parent
            while above is not None:
                if below.pulled_by is None:
                    found.append(above)
                below, above = above, above.parent
            self._targets = tuple(found)
            self._epoch = self.fold.epoch
        return self._targets

    def subtree(self) -> list[Level]:
        """This level and every level below it that is still alive."""
        found = [self]
        for level in found:
            found.extend(level.children)
        return found

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
        """The (cell, Usage field) pairs a usage of ``entries`` adds to at every target (its
        keys are made at every level above, so each level lists them in the order seen)."""
        for level in self.lineage:
            for key, _, gauge in entries:
                level.cell(key, gauge)
        return tuple(
            (level.cell(key, gauge), field)
            for level in self.targets
            for key, field, gauge in entries
        )

    def offset_cell(self, key: str, gauge: bool) -> Cell:
        """The cell of ``key``'s offset here (made at 0 if new)."""
        found = self.offset.get((key, gauge))
        if found is None:
            found = self.offset[key, gauge] = Cell(0)
        return found

    def read(self, key: str, gauge: bool) -> Any:
        """The value of ``key`` here (None if never written), children it pulls included
        (under the kernel's lock when it pulls any)."""
        cell = (self.gauges if gauge else self.counters).get(key)
        if cell is None:
            return None
        value = cell.value
        if summed(key, gauge):
            offset = self.offset.get((key, gauge))
            if offset is not None:
                value += offset.value
            for child in self.pulled:
                value += child.read(key, gauge) or 0
        return value

    def values(self, gauge: bool) -> dict[str, Any]:
        """Every value here (see :meth:`read`), in the order the keys were first written;
        linear in the open children."""
        cells = self.gauges if gauge else self.counters
        found = {key: cell.value for key, cell in list(cells.items())}
        if self.offset or self.pulled:
            for (key, of_gauge), offset in list(self.offset.items()):
                if of_gauge is gauge and key in found:
                    found[key] += offset.value
            for child in list(self.pulled):
                for key, value in child.values(gauge).items():
                    if key in found and summed(key, gauge):
                        found[key] += value
        return found


def fold_in(level: Level, above: Level, totals: Iterator[tuple[Cell, Any]]) -> None:
    """Add ``level``'s ``totals`` to ``above``'s offset cells, then stop ``above`` reading it
    (the fold moves on, so every target is worked out again). Resumable: an addition is
    straight-line bytecode and the iterator moves only when the next pair is taken, so running
    it again after an interrupt resumes where it stopped (the kernel runs it whole)."""
    for cell, value in totals:
        cell.value += value
    if level.pulled_by is not None:
        level.fold.epoch += 1
        for below in level.subtree():  # (clearing a cache twice is harmless)
            for settles in below.caches:
                settles.clear()
        above.pulled.pop(level, None)
        level.pulled_by = None
