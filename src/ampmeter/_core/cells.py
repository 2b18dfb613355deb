"""Where the kernel keeps values: a :class:`Cell` per key, a :class:`Level` per context, and a
:class:`Ticket` per call in flight. Only :mod:`ampmeter._core.kernel` changes them, under its
lock."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

from ampmeter._core.usage import Shape
from ampmeter.keys import is_money
from ampmeter.node import Node

__all__ = ["Cell", "Held", "Level", "Ticket"]


class Cell:
    """One counter's or gauge's value. A level maps keys to cells, so a plan can hold the cells
    of its keys and add to them without looking anything up (cells are never removed)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


class Level:
    """The stats of one context: counters and gauges as cells, and its ancestry (itself, then
    each level up to the root)."""

    __slots__ = (
        "ancestry",
        "counters",
        "gauges",
        "known",
        "parent",
        "plans",
        "version",
        "watched",
    )

    def __init__(self, parent: Level | None) -> None:
        self.parent = parent
        self.ancestry: tuple[Level, ...] = (self,) + (parent.ancestry if parent is not None else ())
        self.counters: dict[str, Cell] = {}
        self.gauges: dict[str, Cell] = {}
        # Every key ever written or held here, in first-seen order.
        self.known: dict[str, None] = {}
        # For each prefix a limit watches, the keys starting with it (kept up to date).
        self.watched: dict[str, list[str]] = {}
        # Usage shape -> the cells it adds to, level by level up its ancestry, each with the Usage
        # field it adds.
        self.plans: dict[Shape, tuple[tuple[Cell, int], ...]] = {}
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

    def plan(self, shape: Shape) -> tuple[tuple[Cell, int], ...]:
        """The cells a usage of ``shape`` adds to here and at every ancestor, level by level in
        ``shape``'s order, each with the Usage field it adds (made now if new; kept in
        :attr:`plans`)."""
        cells = tuple(
            (stats.cell(key, gauge), field)
            for stats in self.ancestry
            for key, field, gauge in shape.entries
        )
        if shape.interned:
            self.plans[shape] = cells
        return cells


class Ticket(Protocol):
    """What the kernel keeps of a call in flight: its node, where its reservation is held
    (``holds`` pairs each level whose limits watch it with the keys held there, ``amounts``
    gives each key's amount), the thread that admitted it, and what its settlement still has to
    add. The admission's :class:`~ampmeter._core.steps.Flight` is one: the kernel fills
    in the holds when it admits the call and refers to it weakly, so a call dropped without
    settling (an interrupt) is found by its dead reference and ended."""

    node: Node
    amounts: Mapping[str, Any]
    holds: tuple[tuple[Level, tuple[str, ...]], ...]
    thread: int
    # The (cell, Usage field) pairs of the settlement still to add: an iterator, so an
    # interrupted settlement resumes exactly where it stopped (None until it starts).
    feed: Iterator[tuple[Cell, int]] | None


class Held:
    """A hold with no call to settle it (:meth:`~ampmeter._core.kernel.Kernel.hold_forever`)."""

    __slots__ = ("amounts", "feed", "holds", "node", "thread")

    def __init__(
        self,
        node: Node,
        amounts: Mapping[str, Any],
        holds: tuple[tuple[Level, tuple[str, ...]], ...],
    ) -> None:
        self.node = node
        self.amounts = amounts
        self.holds = holds
        self.thread = threading.get_ident()
        self.feed: Iterator[tuple[Cell, int]] | None = None
