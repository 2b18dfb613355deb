"""The accounting kernel: the only place where accounting state changes.

One :class:`Kernel` serves one tree of contexts (one graph and its stats levels). It owns, behind
one lock taken only with ``with``:

* the graph's nodes and the aggregates kept as nodes end;
* the stats of every level (a context's :class:`~ampmeter.ExecutionStats`) as cells;
* the calls in flight (:class:`Ticket`) with their reservations;
* the limit check.

Its interface is narrow: begin, run and end a node; add a :class:`~ampmeter.usage.Usage` or a
single key; admit a call (check its reservation and hold it); settle it (replace the hold by the
actual usage); check; read. The public classes validate their arguments and call in here.

Interrupts. ``KeyboardInterrupt`` is raised by CPython only between bytecodes at calls, loop
back-edges and function entries. Every change here is written so that such a point falls only
between whole steps, each step records its progress, and a step interrupted half-way is finished
before the interrupt goes on (see :meth:`Kernel.settle`). A call whose owner disappears without
settling (an interrupt that landed where no Python code of ours could run) is found by its dead
weak reference and ended, its hold returned, at the next read or refused admission.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final

from ampmeter.keys import LOCAL_KEYS
from ampmeter.node import TERMINAL_STATUSES, Node
from ampmeter.usage import Shape, Usage

__all__ = ["Busy", "Cell", "Hit", "Kernel", "Level", "LimitRow", "Ticket"]

_CREATED: Final = "created"
_RUNNING: Final = "running"
_DUST: Final = 1e-12  # reserved totals below this are float dust from add/subtract pairs
_PLANS_MAX: Final = 4_096  # per level: usage shapes with a resolved cell plan
_CHECKS_MAX: Final = 64  # per level: limit rows with a compiled check

LimitRow = tuple[bool, str, float, Any]
"""A compiled limit: ``(is_prefix, key, max_value, limit object)``."""
Entry = tuple["Cell | None", float, Any, str]
"""One value a check compares: ``(cell or None, max_value, limit object, key)``."""
Hit = tuple[Any, str, float]
"""A limit found exceeded: ``(limit object, key, value)``."""
Guard = tuple["Level", tuple[LimitRow, ...]]
"""A level that can stop calls, with its compiled limits."""


def now_ms() -> int:
    """Milliseconds since the epoch."""
    return time.time_ns() // 1_000_000


class Cell:
    """One counter's or gauge's value. A level maps keys to cells, so a plan can hold the cells
    of its keys and add to them without looking anything up (cells are never removed)."""

    __slots__ = ("value",)

    def __init__(self, value: float) -> None:
        self.value = value


class Level:
    """The stats of one context: counters and gauges as cells, and its chain up to the root."""

    __slots__ = (
        "chain", "checks", "counters", "gauges", "known", "parent", "plans", "version", "watched"
    )  # fmt: skip

    def __init__(self, parent: Level | None) -> None:
        self.parent = parent
        self.chain: tuple[Level, ...] = (self,) + (parent.chain if parent is not None else ())
        self.counters: dict[str, Cell] = {}
        self.gauges: dict[str, Cell] = {}
        # Every key ever written or held here, in first-seen order.
        self.known: dict[str, None] = {}
        # For each prefix a limit watches, the keys starting with it (kept up to date).
        self.watched: dict[str, list[str]] = {}
        # Usage shape -> the cells it adds to, level by level up the chain.
        self.plans: dict[Shape, tuple[Cell, ...]] = {}
        # Moves whenever a key or a cell is added here: compiled checks older than it are stale.
        self.version = 0
        # id(limit rows) -> (those rows, the version compiled at, the check's entries).
        self.checks: dict[int, tuple[tuple[LimitRow, ...], int, tuple[Entry, ...]]] = {}

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
        """The cell of ``key`` (made at 0 if new)."""
        cells = self.gauges if gauge else self.counters
        found = cells.get(key)
        if found is None:
            found = Cell(0.0 if gauge else 0)
            cells[key] = found
            self.version += 1
            self.note(key)
        return found

    def plan(self, shape: Shape) -> tuple[Cell, ...]:
        """The cells a usage of ``shape`` adds to here and at every ancestor, level by level in
        ``shape``'s order (made now if new; kept in :attr:`plans`)."""
        cells = tuple(stats.cell(key, gauge) for stats in self.chain
                      for key, _, gauge in shape.entries)  # fmt: skip
        if len(self.plans) < _PLANS_MAX:
            self.plans[shape] = cells
        return cells

    def compile(self, rows: tuple[LimitRow, ...]) -> tuple[Any, int, tuple[Entry, ...]]:
        """``(rows, version, entries)``: the entries checking ``rows`` here, ``(cell or None,
        max_value, limit, key)`` in check order (list order; for each limit counters, then
        gauges), kept in :attr:`checks` until a key or cell is added here. ``None`` stands for
        a key with no value yet, which only a held or pending amount can push over."""
        entries: list[Entry] = []
        counters, gauges = self.counters, self.gauges
        for is_prefix, key, top, limit in rows:
            if is_prefix:
                keys = self.keys_with(key)
                for name in keys:
                    count = counters.get(name)
                    if count is not None or name not in gauges:
                        entries.append((count, top, limit, name))
                entries.extend((gauges[name], top, limit, name) for name in keys if name in gauges)
                continue
            count = counters.get(key)
            amount = gauges.get(key)
            if count is not None:
                entries.append((count, top, limit, key))
            if amount is not None or count is None:
                entries.append((amount, top, limit, key))
        if len(self.checks) >= _CHECKS_MAX:
            self.checks.clear()
        compiled = (rows, self.version, tuple(entries))
        self.checks[id(rows)] = compiled
        return compiled


class Ticket:
    """A call in flight: its node, where its reservation is held, and who owns it.

    ``holds`` pairs each level whose limits watch the reservation with the keys held there;
    ``amounts`` gives each key's amount. ``owner`` is a weak reference to the object that will
    settle the ticket: if it dies first, the kernel ends the call itself.
    """

    __slots__ = ("amounts", "feed", "holds", "node", "owner", "thread")

    def __init__(
        self,
        node: Node,
        amounts: Mapping[str, float],
        holds: tuple[tuple[Level, tuple[str, ...]], ...],
        owner: object | None,
    ) -> None:
        self.node = node
        self.thread = threading.get_ident()
        self.amounts = amounts
        self.holds = holds
        self.owner: Callable[[], object] = _ALIVE if owner is None else weakref.ref(owner)
        # The (cell, amount) pairs of the settlement still to add: an iterator, so an
        # interrupted settlement resumes exactly where it stopped.
        self.feed: Iterator[tuple[Cell, Any]] | None = None


class Kernel:
    """The accounting state of one tree of contexts. See the module docstring."""

    __slots__ = (
        "chain_id",
        "evictable",
        "in_flight",
        "lock",
        "max_depth",
        "max_nodes",
        "next_id",
        "nodes",
        "open",
        "root_id",
        "settled",
        "total_cost_usd",
        "total_llm_calls",
        "total_retries",
        "total_tokens_in",
        "total_tokens_out",
        "total_tool_calls",
        "waiting",
    )

    def __init__(self, chain_id: str, max_nodes: int = 0) -> None:
        self.chain_id = chain_id
        self.lock = threading.Lock()
        # Notified when holds go away, for calls waiting for room (see admit).
        self.settled = threading.Condition(self.lock)
        self.waiting = 0
        self.nodes: dict[str, Node] = {}
        self.root_id: str | None = None
        self.next_id = 1
        self.max_nodes = max_nodes
        self.evictable: deque[str] = deque()
        self.open: dict[str, Ticket] = {}  # node id -> the call in flight
        self.total_cost_usd = 0.0
        self.total_llm_calls = 0
        self.total_tool_calls = 0
        self.total_retries = 0
        self.total_tokens_in = 0
        self.total_tokens_out = 0
        self.max_depth = 0
        self.in_flight = 0

    # -- nodes ---------------------------------------------------------------------------------

    def create_root(self, name: str, metadata: dict[str, Any]) -> Node:
        """Make the single root (``system``, depth 0, ``running``); RuntimeError if one exists."""
        with self.lock:
            if self.root_id is not None:
                raise RuntimeError(
                    f"graph {self.chain_id!r} already has a root ({self.root_id}); "
                    "a graph has exactly one root"
                )
            node = Node(self._new_id(), None, "system", name, now_ms(), status=_RUNNING,
                        metadata=metadata)  # fmt: skip
            self.nodes[node.node_id] = node
            self.root_id = node.node_id
        return node

    def begin(
        self, parent_id: str, kind: str, name: str, model: str | None, metadata: dict[str, Any]
    ) -> Node:
        """Make a ``created`` node under ``parent_id`` (KeyError if there is no such node)."""
        start = time.time_ns() // 1_000_000
        with self.lock:
            parent = self.nodes.get(parent_id)
            if parent is None:
                raise KeyError(self.unknown(parent_id, "parent_id"))
            depth = parent.depth + 1
            number = self.next_id
            self.next_id = number + 1
            node = Node("n" + str(number).zfill(6), parent_id, kind, name, start, None, _CREATED,
                        model, 0, 0.0, None, None, None, None, metadata, depth)  # fmt: skip
            self.nodes[node.node_id] = node
            if depth > self.max_depth:
                self.max_depth = depth
            if self.max_nodes and len(self.nodes) > self.max_nodes:
                self._evict()
        return node

    def _new_id(self) -> str:
        number = self.next_id
        self.next_id = number + 1
        return "n" + str(number).zfill(6)

    def node(self, node_id: str) -> Node:
        """The graph's own node object (KeyError naming the id when unknown or evicted)."""
        found = self.nodes.get(node_id)
        if found is None:
            raise KeyError(self.unknown(node_id, "node_id"))
        return found

    def unknown(self, node_id: str, what: str) -> str:
        """The message for an id that is not in the graph."""
        evicted = " (unknown or evicted)" if self.max_nodes and node_id.startswith("n") else ""
        return f"{what} {node_id!r} is not in graph {self.chain_id!r}{evicted}"

    def run(self, node: Node) -> None:
        """``created`` -> ``running``; no change otherwise."""
        with self.lock:
            if node.status == _CREATED:
                node.status = _RUNNING
                if node.parent_id is not None:
                    self.in_flight += 1

    def end(
        self,
        node: Node,
        status: str,
        cost_usd: float,
        tokens_in: int | None,
        tokens_out: int | None,
        error_class: str | None,
        stop_reason: str | None,
        metadata: Mapping[str, Any] | None,
    ) -> bool:
        """End an open node; False (and no change) if it had ended already."""
        end = now_ms()
        with self.lock:
            if node.status in TERMINAL_STATUSES:
                return False
            if node.parent_id is None and (cost_usd or tokens_in or tokens_out):
                raise ValueError("the root node carries no cost or tokens of its own")
            self._end_locked(node, status, end, cost_usd, tokens_in, tokens_out, error_class,
                             stop_reason, metadata)  # fmt: skip
        return True

    def _end_locked(
        self,
        node: Node,
        status: str,
        end: int,
        cost: float,
        t_in: int | None,
        t_out: int | None,
        error_class: str | None,
        stop_reason: str | None,
        metadata: Mapping[str, Any] | None,
    ) -> None:
        # Straight-line assignments and additions (no calls) until the metadata merge, so an
        # interrupt cannot land between them.
        previous = node.status
        node.status = status
        # A node shorter than 1 ms shares its start's int object: less memory per node.
        node.end_ts_ms = node.start_ts_ms if end == node.start_ts_ms else end
        node.cost_usd = cost
        node.tokens_in = t_in
        node.tokens_out = t_out
        node.error_class = error_class
        node.stop_reason = stop_reason
        if node.parent_id is not None:
            if previous == _RUNNING:
                self.in_flight -= 1
            self.total_cost_usd += cost
            self.total_retries += node.retries_used
            if t_in:
                self.total_tokens_in += t_in
            if t_out:
                self.total_tokens_out += t_out
            kind = node.kind
            if kind == "llm":
                self.total_llm_calls += 1
            elif kind == "tool":
                self.total_tool_calls += 1
        if metadata:
            node.metadata.update(metadata)
        if self.max_nodes and node.parent_id is not None:
            self.evictable.append(node.node_id)
            self._evict()

    def _evict(self) -> None:
        nodes, evictable = self.nodes, self.evictable
        while len(nodes) > self.max_nodes and evictable:
            nodes.pop(evictable.popleft(), None)

    def retry(self, node: Node, level: Level | None) -> None:
        """Count one retry on an open node (and ``amp:retries`` from ``level`` up)."""
        with self.lock:
            if node.status in TERMINAL_STATUSES:
                return
            node.retries_used += 1
            if level is not None:
                self._add_locked(level, "amp:retries", 1, False)

    def update(self, node: Node, values: Mapping[str, Any]) -> None:
        """Merge ``values`` into an open node's metadata."""
        with self.lock:
            if node.status not in TERMINAL_STATUSES:
                node.metadata.update(values)

    def aggregates(self) -> dict[str, Any]:
        """The chain aggregates (see :meth:`ampmeter.ExecutionGraph.snapshot`)."""
        self.sweep()
        with self.lock:
            return {
                "total_cost_usd": self.total_cost_usd,
                "total_llm_calls": self.total_llm_calls,
                "total_tool_calls": self.total_tool_calls,
                "total_retries": self.total_retries,
                "total_tokens_in": self.total_tokens_in,
                "total_tokens_out": self.total_tokens_out,
                "max_depth": self.max_depth,
                "in_flight": self.in_flight,
                # one root per graph; the per-root fields stay floats
                "llm_calls_per_root": float(self.total_llm_calls),
                "tool_calls_per_root": float(self.total_tool_calls),
                "retries_per_root": float(self.total_retries),
            }

    # -- stats ---------------------------------------------------------------------------------

    def add(self, level: Level, key: str, delta: float, gauge: bool) -> None:
        """Add ``delta`` to ``key`` at ``level`` and every ancestor (a local key: here only)."""
        with self.lock:
            self._add_locked(level, key, delta, gauge)

    def _add_locked(self, level: Level, key: str, delta: float, gauge: bool) -> None:
        chain = (level,) if key in LOCAL_KEYS else level.chain
        cells = [stats.cell(key, gauge) for stats in chain]  # made first: nothing added yet
        whole(_drain, zip(cells, (delta,) * len(cells), strict=True))

    def set(self, level: Level, key: str, value: float, gauge: bool) -> None:
        """Set ``key`` at ``level`` only."""
        with self.lock:
            level.cell(key, gauge).value = value

    def add_usage(self, level: Level, usage: Usage) -> None:
        """Add ``usage`` at ``level`` and every ancestor, in one step (a trace record)."""
        with self.lock:
            whole(_drain, self._feed(level, usage))

    @staticmethod
    def _feed(level: Level, usage: Usage) -> Iterator[tuple[Cell, Any]]:
        """The (cell, amount) pairs that add ``usage`` at ``level`` and every ancestor."""
        shape = usage.shape()
        cells = level.plans.get(shape) or level.plan(shape)
        # (same length; strict= would parse a keyword on every call)
        return zip(cells, shape.pick(usage) * len(level.chain))  # noqa: B905

    def bump(self, level: Level, key: str) -> int:
        """Add 1 to ``key`` at ``level`` only and return the new value (iterations)."""
        with self.lock:
            cell = level.cell(key, False)
            cell.value += 1
            return int(cell.value)

    @staticmethod
    def values(cells: Mapping[str, Cell]) -> dict[str, Any]:
        """A copy of ``{key: value}`` (no lock: a dict copy is one step, a repr may run under
        the lock)."""
        return {key: cell.value for key, cell in list(cells.items())}

    # -- calls -----------------------------------------------------------------------------------

    def admit(
        self,
        node: Node,
        owner: object,
        amounts: Mapping[str, float],
        holds: tuple[tuple[Level, tuple[str, ...]], ...],
        guards: tuple[Guard, ...],
        run: bool,
        wait_s: float = 0.0,
    ) -> tuple[int, Hit] | None:
        """Check ``guards`` with ``amounts`` pending; if none is exceeded, hold the amounts at
        ``holds`` and (when ``run``) mark the node running. Returns the guard index and the hit
        of a refusal (nothing changed), else None. Every key of ``amounts`` must have been made
        known at every guard level first (:meth:`note`).

        A call that does not fit only because of other calls' holds (what is *spent* leaves
        room for it) waits up to ``wait_s`` seconds for them to settle; if they have not, the
        hit comes back with ``BUSY`` as its limit's place: ``(index, (BUSY, key, value))``.
        """
        ticket = Ticket(node, amounts, holds, owner)
        with self.lock:
            hit = self._check(guards, amounts) if guards else None
            if hit is not None:
                deadline = None
                while hit is not None:
                    if self._check(guards, amounts, False) is not None:
                        return hit  # it does not fit what is spent: refused at once
                    if deadline is None:
                        deadline = time.monotonic() + wait_s
                    left = deadline - time.monotonic()
                    me = ticket.thread
                    if left <= 0.0 or all(t.thread == me for t in self.open.values()):
                        # Out of time, or only this thread's own calls hold the rest: waiting
                        # for them here would wait for ever.
                        index, (limit, key, value) = hit
                        return index, (Busy(limit), key, value)
                    self.waiting += 1
                    try:
                        self.settled.wait(left)
                    finally:
                        self.waiting -= 1
                    hit = self._check(guards, amounts)
            # One step: registered, running and counted in flight together.
            self.open[node.node_id] = ticket
            if run and node.status == _CREATED:
                node.status = _RUNNING
                self.in_flight += 1
        return None

    def settle(
        self,
        node: Node,
        level: Level,
        usage: Usage,
        status: str,
        cost: float,
        tokens_in: int | None,
        tokens_out: int | None,
        error_class: str | None,
        stop_reason: str | None,
        metadata: Mapping[str, Any] | None,
        guards: tuple[Guard, ...],
    ) -> tuple[int, Hit] | None:
        """End a call: drop its hold, add ``usage`` from ``level`` up, end its node, then check
        ``guards``. Each step runs once even if an interrupt lands between them."""
        end = time.time_ns() // 1_000_000
        with self.lock:
            if node.status in TERMINAL_STATUSES:
                return None
            # (a ticket made here records progress and holds nothing)
            ticket = self.open.get(node.node_id) or Ticket(node, {}, (), None)
            try:
                self._settle_steps(ticket, node, level, usage, status, end, cost, tokens_in,
                                   tokens_out, error_class, stop_reason, metadata)  # fmt: skip
            except BaseException:
                # An interrupt landed: finish the steps, then let it go on (the second attempt
                # covers an interrupt at the very start of the first).
                args = (ticket, node, level, usage, status, end, cost, tokens_in, tokens_out,
                        error_class, stop_reason, metadata)  # fmt: skip
                try:
                    finish(self._settle_steps, *args)
                except BaseException:
                    finish(self._settle_steps, *args)
                raise
            return self._check(guards, None) if guards else None

    def _settle_steps(
        self,
        ticket: Ticket,
        node: Node,
        level: Level,
        usage: Usage,
        status: str,
        end: int,
        cost: float,
        t_in: int | None,
        t_out: int | None,
        error_class: str | None,
        stop_reason: str | None,
        metadata: Mapping[str, Any] | None,
    ) -> None:
        # Resumable and idempotent (see finish()): the feed continues where it stopped, the node
        # ends once, the pop is safe to repeat.
        if ticket.feed is None:
            ticket.feed = self._feed(level, usage)
        for cell, amount in ticket.feed:
            cell.value += amount
        if node.status not in TERMINAL_STATUSES:
            self._end_locked(node, status, end, cost, t_in, t_out, error_class, stop_reason,
                             metadata)  # fmt: skip
        self.open.pop(node.node_id, None)
        if self.waiting:
            self.settled.notify_all()

    def open_ancestor(self, node_id: str, floor: str) -> str:
        """``node_id`` if it is open and owned, else its nearest such ancestor (at most up to
        ``floor``): where new nodes go when the block that set ``node_id`` as current ended
        without restoring it (an interrupt)."""
        node = self.nodes.get(node_id)
        if node is not None and node.status not in TERMINAL_STATUSES:
            ticket = self.open.get(node_id)
            if ticket is None or ticket.owner() is not None:
                return node_id
            self.sweep()
        while node is not None and node.node_id != floor and (node.status in TERMINAL_STATUSES):
            node = self.nodes.get(node.parent_id or "")
        return floor if node is None else node.node_id

    def hold_forever(self, level: Level, amounts: dict[str, float]) -> None:
        """Hold ``amounts`` at ``level`` with no node to settle them (the caller holds the
        lock): a stand-in for calls in flight."""
        node = Node(f"held-{len(self.open)}", None, "system", "held", now_ms())
        for key in amounts:
            level.note(key)
        self.open[node.node_id + f"@{id(amounts)}"] = Ticket(
            node, amounts, ((level, tuple(amounts)),), None
        )

    def release(self, node: Node) -> None:
        """Drop a call's hold without adding usage (its node was ended another way)."""
        with self.lock:
            self.open.pop(node.node_id, None)
            if self.waiting:
                self.settled.notify_all()

    def sweep(self) -> None:
        """End the calls whose owner disappeared without settling them (an interrupt at the
        one place no code of ours could run): their holds come back, their nodes halt."""
        if self.open:
            with self.lock:
                self._sweep_locked()

    # -- the limit check -----------------------------------------------------------------------

    def check(
        self,
        guards: tuple[Guard, ...],
        pending: Mapping[str, float] | None,
        holds: bool = True,
    ) -> tuple[int, Hit] | None:
        """The first guard (in order) with an exceeded limit, counting ``pending`` and (unless
        ``holds`` is False) what calls in flight hold."""
        with self.lock:
            if pending:  # prefix limits see pending keys new to a level
                for level, _ in guards:
                    for key in pending:
                        level.note(key)
            return self._check(guards, pending, holds)

    def _check(
        self,
        guards: tuple[Guard, ...],
        pending: Mapping[str, float] | None,
        holds: bool = True,
    ) -> tuple[int, Hit] | None:
        """:meth:`check` under the lock (every pending key known at every guard level);
        ``holds=False`` leaves out what calls in flight hold (what is spent, and ``pending``)."""
        index = -1
        for level, rows in guards:
            index += 1
            swept = False
            while True:
                found = level.checks.get(id(rows))
                if found is None or found[0] is not rows or found[1] != level.version:
                    found = level.compile(rows)
                # What is held here and what is pending, per key (None: nothing).
                extras: Mapping[str, float] | None = pending
                held = self.held_at(level) if self.open and holds else None
                if held:
                    if pending:
                        for name, amount in pending.items():  # held_at gave a fresh dict
                            held[name] = held.get(name, 0.0) + amount
                    extras = held
                for cell, top, limit, key in found[2]:  # noqa: B007 (read after break)
                    extra = extras.get(key, 0.0) if extras else 0.0
                    if cell is None:
                        if not extra or extra <= top:
                            continue
                        value = extra
                    else:
                        value = cell.value + extra
                        if value <= top:
                            continue
                    break  # exceeded
                else:
                    break  # nothing exceeded at this level
                if swept or not any(t.owner() is None for t in self.open.values()):
                    return index, (limit, key, value)
                # Holds of abandoned calls must not refuse anyone: sweep and look again.
                self._sweep_locked()
                swept = True
        return None

    def _sweep_locked(self) -> None:
        end = now_ms()
        for node_id, ticket in list(self.open.items()):
            if ticket.owner() is None:
                if ticket.node.status not in TERMINAL_STATUSES:
                    self._end_locked(ticket.node, "halt", end, 0.0, None, None, None,
                                     "interrupted before it was settled", None)  # fmt: skip
                self.open.pop(node_id, None)
        if self.waiting:
            self.settled.notify_all()

    def note(self, holds: tuple[tuple[Level, tuple[str, ...]], ...]) -> None:
        """Make each held key known at its level, so prefix limits see it from the start."""
        with self.lock:
            for level, keys in holds:
                for key in keys:
                    level.note(key)

    def held_at(self, level: Level) -> dict[str, float]:
        """What calls in flight hold at ``level``, per key (caller holds the lock)."""
        total: dict[str, float] = {}
        for ticket in self.open.values():
            for held_level, keys in ticket.holds:
                if held_level is level:
                    amounts = ticket.amounts
                    for key in keys:
                        total[key] = total.get(key, 0.0) + amounts[key]
        return total

    def reserved(self, level: Level) -> dict[str, float]:
        """What calls in flight hold at ``level`` (dust and zeros left out)."""
        self.sweep()
        with self.lock:
            return {k: v for k, v in self.held_at(level).items() if v > _DUST}


def _ALIVE() -> object:
    return True


class Busy:
    """In a hit, in place of the limit: the call did not fit only because of calls in flight,
    and they did not settle in time."""

    __slots__ = ("limit",)

    def __init__(self, limit: object) -> None:
        self.limit = limit


def _drain(feed: Iterator[tuple[Cell, Any]]) -> None:
    """Add each amount to its cell. An addition is straight-line bytecode and the iterator moves
    only when the next pair is taken, so an interrupt lands between two additions and draining
    the same iterator again resumes exactly there."""
    for cell, amount in feed:
        cell.value += amount


def whole(step: Callable[..., None], *args: Any) -> None:
    """Run a resumable, idempotent ``step`` to its end; if an interrupt lands in it, finish the
    step first and then let the interrupt go on."""
    try:
        step(*args)
    except BaseException:
        try:
            finish(step, *args)
        except BaseException:
            finish(step, *args)
        raise


def finish(step: Callable[..., None], *args: Any) -> None:
    """Run ``step`` again until it completes. Each attempt runs inside the previous one's
    handler, so an interrupt even at the start of an attempt is caught; it would take four more
    interrupts within one step to leave it unfinished. Interrupts caught here are dropped: the
    one that started the clean-up goes on."""
    try:
        step(*args)
    except BaseException:
        try:
            step(*args)
        except BaseException:
            try:
                step(*args)
            except BaseException:
                step(*args)
