"""The accounting kernel: the only place where accounting state changes.

One :class:`Kernel` serves one tree of contexts (one graph and its stats levels). It owns, behind
one lock taken only with ``with``:

* the graph's nodes and the aggregates kept as nodes end (its base, :class:`NodeTable`);
* the stats of every level (a context's :class:`~ampmeter.ExecutionStats`) as cells;
* the calls in flight (each a :class:`Ticket`, referred to weakly) with their reservations;
* the limit check.

Its interface is narrow: begin, run and end a node; add a :class:`~ampmeter._core.usage.Usage` or a
single key; admit a call (check its reservation and hold it where its plan says); settle it
(replace the hold by the actual usage, added where its plan says); check; read. The public
classes validate their arguments and call in here.

Interrupts. ``KeyboardInterrupt`` is raised by CPython only between bytecodes at calls, loop
back-edges and function entries. Every change here is written so that such a point falls only
between whole steps, each step records its progress, and a step interrupted half-way is finished
before the interrupt goes on (see :meth:`Kernel.settle`). A call whose owner disappears without
settling (an interrupt that landed where no Python code of ours could run, a call started by
hand and lost) keeps its hold until it is found by its dead weak reference, at the next read,
refused admission or close, and charged as a call interrupted in flight is
(:mod:`ampmeter._core.interrupted`).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, MutableSet
from types import MappingProxyType
from typing import Any, Final

from ampmeter._core.cells import Cell, Level, fold_in, summed
from ampmeter._core.check import Guard, Hit, Refused
from ampmeter._core.interrupted import settle_dropped
from ampmeter._core.nodes import NodeTable, now_ms
from ampmeter._core.outcome import Ending, Outcome
from ampmeter._core.ticket import Held, Reserved, Ticket
from ampmeter._core.usage import Spent, Usage
from ampmeter.keys import LOCAL_KEYS
from ampmeter.node import TERMINAL_STATUSES, Node

__all__ = ["Cell", "Kernel", "Level", "now_ms"]

_NOT_STARTED: Final = Outcome("halt", stop_reason="interrupted before it started")
_NOTHING_HELD: Final[Mapping[str, Any]] = MappingProxyType({})


class Kernel(NodeTable):
    """The accounting state of one tree of contexts. See the module docstring."""

    __slots__ = ("_dropping", "_open", "_settled", "_waiting")

    def __init__(self, chain_id: str, max_nodes: int = 0) -> None:
        super().__init__(chain_id, max_nodes)
        # Notified when holds go away, for calls waiting for room (see admit).
        self._settled = threading.Condition(self._lock)
        self._waiting = 0
        # node id -> the call in flight, weakly, with what it holds: one whose owner dropped it
        # holds on until the next sweep charges it (the ids of those being charged now).
        self._open: dict[str, Held] = {}
        self._dropping: set[str] = set()

    def retry(self, node: Node, level: Level | None) -> None:
        """Count one retry on an open node (and ``amp:retries`` from ``level`` up)."""
        with self._lock:
            if node.status in TERMINAL_STATUSES:
                return
            node.retries_used += 1
            if level is not None:
                self._add_locked(level, "amp:retries", 1, False)

    def aggregates(self) -> dict[str, Any]:
        """The chain aggregates, calls whose owner disappeared ended first."""
        self.sweep()
        return super().aggregates()

    # -- stats ---------------------------------------------------------------------------------

    def add(self, level: Level, key: str, delta: Any, gauge: bool) -> None:
        """Add ``delta`` to ``key`` at ``level`` and every ancestor (a local key: here only)."""
        with self._lock:
            self._add_locked(level, key, delta, gauge)

    def _add_locked(self, level: Level, key: str, delta: Any, gauge: bool) -> None:
        if key in LOCAL_KEYS:
            levels: tuple[Level, ...] = (level,)
        else:  # (a float gauge is kept whole at every level: see ampmeter._core.cells)
            levels = level.targets if summed(key, gauge) else level.lineage
            for stats in level.lineage:
                stats.cell(key, gauge)
        # The cells are made first (nothing is added yet); each adds field 0 of ``(delta,)``.
        cells = [(stats.cell(key, gauge), 0) for stats in levels]
        whole(_drain, iter(cells), (delta,))

    def set(self, level: Level, key: str, value: Any, gauge: bool) -> None:
        """Set ``key`` at ``level`` only (the levels above read the same as before)."""
        with self._lock:
            cell = level.cell(key, gauge)
            if not summed(key, gauge):
                cell.value = value
                return
            change = value - level.read(key, gauge)
            above = level.pulled_by
            # One step: the cell takes the change, the level that reads this one takes it back.
            feed = [(cell, 0)] if above is None else [(cell, 0), (above.offset_cell(key, gauge), 1)]
            whole(_drain, iter(feed), (change, -change))

    def fold(self, level: Level) -> None:
        """Make a new ``level`` (no children yet) folded: nothing reads it live, so what is
        added below it is summed when it is read (see :mod:`ampmeter._core.cells`)."""
        with self._lock:
            level.live = False

    def retire(self, level: Level) -> None:
        """Fold an ended context's ``level`` into the level that reads it, once: its totals are
        added there and from now on what is added at or below it reaches that level directly,
        so the level above no longer keeps it."""
        with self._lock:
            above = level.pulled_by
            if above is None:
                return
            # The offsets' cells are made first (nothing is added yet).
            totals = [
                (above.offset_cell(key, gauge), value)
                for gauge in (False, True)
                for key, value in level.values(gauge).items()
                if summed(key, gauge)
            ]
            whole(fold_in, level, above, iter(totals))

    def add_usage(self, level: Level, usage: Usage) -> None:
        """Add ``usage`` at ``level`` and every ancestor, in one step (a trace record)."""
        with self._lock:
            whole(_drain, iter(level.cells(usage.shape().entries)), usage)

    def bump(self, level: Level, key: str) -> int:
        """Add 1 to ``key`` at ``level`` only and return the new value (iterations)."""
        with self._lock:
            cell = level.cell(key, False)
            cell.value += 1
            return int(cell.value)

    def value(self, level: Level, key: str, gauge: bool) -> Any:
        """The value of ``key`` at ``level`` (None if never written)."""
        if level.pulled or level.offset:
            with self._lock:
                return level.read(key, gauge)
        cell = (level.gauges if gauge else level.counters).get(key)
        return None if cell is None else cell.value

    def values(self, level: Level, gauge: bool, locked: bool = True) -> dict[str, Any]:
        """The counters (or gauges) at ``level``: under the lock when it reads children it
        folds, else (and for a repr, which may be asked under the lock) copied unlocked."""
        if locked and (level.pulled or level.offset):
            with self._lock:
                return level.values(gauge)
        return level.values(gauge)

    # -- calls -----------------------------------------------------------------------------------

    def admit(
        self, ticket: Ticket, reserved: Reserved, guards: tuple[Guard, ...], run: bool
    ) -> Refused | None:
        """Hold ``ticket``'s reservation (``reserved``) where its plan says, unless it would
        exceed a limit of ``guards``, and (when ``run``) mark its node running, in one step.
        None when held, else why not (see :data:`~ampmeter._core.check.Refused`)."""
        plan = ticket.plan
        amounts: dict[str, Any] | Mapping[str, Any]
        with self._lock:
            if guards:
                holds, places = plan.hold or plan.hold_plan()
                amounts = {}  # (a loop: a third of what dict(zip(...)) costs here)
                for key, place in places:
                    amounts[key] = reserved[place]
                hit = self._check(guards, amounts)
                if hit is not None:
                    return (*hit, self._check(guards, amounts, False) is None)
            else:  # nothing above can stop it: nothing to hold
                holds, amounts = (), _NOTHING_HELD
            node = ticket.kernel_node
            owner = self._unstarted.pop(node.node_id, None)  # begin()'s weak reference to it
            self._open[node.node_id] = (
                owner or weakref.ref(ticket),
                amounts,
                holds,
                threading.get_ident(),
                plan,
                reserved,
                (),  # (its ledger holds: see run_held)
            )
            if run:  # (a call's node is made, not yet running, until it is admitted)
                node.status = "running"
                self._in_flight += 1
        return None

    def run_held(self, ticket: Ticket) -> None:
        """Mark admitted ``ticket``'s node running once the shared ledgers hold it too, keeping
        its ledger holds beside it: a call its owner drops is committed there when swept."""
        node = ticket.kernel_node
        with self._lock:
            self._open[node.node_id] = (*self._open[node.node_id][:6], ticket.ledger_holds)
        self.run(node)

    def wait_for_settlement(self, seconds: float) -> None:
        """Block up to ``seconds``, or until a call in flight gives its hold back."""
        with self._lock:
            self._waiting += 1
            try:
                self._settled.wait(seconds)
            finally:
                self._waiting -= 1

    def wake(self) -> None:
        """Wake every thread waiting for room (a ceiling was raised)."""
        with self._lock:
            if self._waiting:
                self._settled.notify_all()

    def holders(self, node: Node, thread: int | None) -> tuple[list[object], bool]:
        """Who holds room ``node``'s call might wait for: the calls it cannot outwait (those it
        runs inside, and with ``thread`` every call of that thread), and whether any other call
        in flight holds anything."""
        with self._lock:
            enclosing: set[str] = set()
            parent = self._nodes.get(node.parent_id or "")
            while parent is not None:
                enclosing.add(parent.node_id)
                parent = self._nodes.get(parent.parent_id or "")
            stuck: list[object] = []
            others = False
            for node_id, held in self._open.items():
                ticket = held[0]()
                if node_id == node.node_id or ticket is None:  # (a dropped call: see sweep)
                    continue
                if node_id in enclosing or (thread is not None and held[3] == thread):
                    stuck.append(ticket)
                else:
                    others = True
            return stuck, others

    def settle(self, ticket: Ticket, spent: Spent, ending: Ending) -> tuple[Guard, Hit] | None:
        """End a call: drop its hold, add what it ``spent`` where its plan says, end its node as
        ``ending`` says, then check what is spent (holds stop calls at admission only) at the
        guards the plan says the usage can push over a ceiling: the first passed, and what
        passes it. Each step runs once even if an interrupt lands between them."""
        with self._lock:
            if ticket.kernel_node.status in TERMINAL_STATUSES:
                return None
            adds, guards = ticket.plan.settlement(ticket, spent)
            ticket.feed = iter(adds)
            whole(self._settle_steps, ticket, spent, ending)
            return self._spent_past(guards) if guards else None

    def _settle_steps(self, ticket: Ticket, spent: Spent, ending: Ending) -> None:
        # Resumable and idempotent (see finish()): the feed (of the plan's cells) continues
        # where it stopped, the node ends once, the pop is safe to repeat.
        for cell, field in ticket.feed:
            cell.value += spent[field]
        node = ticket.kernel_node
        if node.status not in TERMINAL_STATUSES:
            self._end_locked(node, ending)
        self._open.pop(node.node_id, None)
        if self._waiting:
            self._settled.notify_all()

    def is_held(self, node: Node) -> bool:
        """Whether ``node``'s call holds a reservation (admitted, not settled)."""
        return node.node_id in self._open

    def end_unowned(self, node_id: str, ending: Ending) -> bool:
        """End node ``node_id`` (its lookup checks the id) as ``ending`` says, if open; False and
        no change if a call owns it: only the call ends it. ValueError for a cost on the root."""
        node = self.node(node_id)
        if node_id in self._open or node_id in self._unstarted:
            self.sweep()  # (a call its owner dropped is ended now: nothing to refuse)
        with self._lock:
            if node.status not in TERMINAL_STATUSES:
                if node_id in self._open or node_id in self._unstarted:
                    return False
                if node.parent_id is None and any(ending[1:4]):  # (cost, tokens in and out)
                    raise ValueError("the root node carries no cost or tokens of its own")
                self._end_locked(node, ending)
        return True

    def open_ancestor(self, node_id: str, floor: str) -> str:
        """``node_id`` if it is open and owned, else its nearest such ancestor (at most up to
        ``floor``): where new nodes go when the block that set ``node_id`` as current ended
        without restoring it (an interrupt)."""
        node = self._nodes.get(node_id)
        if node is not None and node.status not in TERMINAL_STATUSES:
            held = self._open.get(node_id)
            if held is None or held[0]() is not None:
                return node_id
            self.sweep()
        while node is not None and node.node_id != floor and node.status in TERMINAL_STATUSES:
            node = self._nodes.get(node.parent_id or "")
        return floor if node is None else node.node_id

    def release(self, node: Node) -> None:
        """Drop a call's hold without adding usage (its node was ended another way)."""
        with self._lock:
            self._open.pop(node.node_id, None)
            if self._waiting:
                self._settled.notify_all()

    def abort(self, node: Node, outcome: Outcome) -> bool:
        """Drop a call's hold and end its node as ``outcome`` says, in one step (an admission
        refused or interrupted half-way); False if the node had ended already."""
        with self._lock:
            ended = node.status in TERMINAL_STATUSES
            whole(self._abort_steps, node, outcome)
            return not ended

    def _abort_steps(self, node: Node, outcome: Outcome) -> None:
        if node.status not in TERMINAL_STATUSES:
            self._end_locked(node, outcome)
        self._open.pop(node.node_id, None)
        if self._waiting:
            self._settled.notify_all()

    def sweep(self) -> bool:
        """End the calls whose owner disappeared without ending them (an interrupt at the one
        place no code of ours could run, a call started by hand and lost): one not admitted
        halts (it was never sent), one admitted is settled through its context's admission,
        charged as a call interrupted in flight (see
        :func:`~ampmeter._core.interrupted.settle_dropped`). True if one admitted was."""
        settled = False
        # Until a pass finds none: a settlement allocates, and a collection it sets off may
        # free more dropped calls (those kept alive by a cycle until then).
        while self._open or self._unstarted:
            dropped: list[tuple[Node, Held]] = []
            claimed: set[str] = set()
            try:
                with self._lock:
                    self._sweep_locked(dropped, claimed)
                for node, held in dropped:  # (settling takes the lock, may commit to a ledger)
                    settle_dropped(node, held)
            finally:  # (interrupted: what is not settled yet is the next sweep's)
                # One operation, no loop: an interrupt cannot land half-way and leave a claim
                # that no sweep would take again (its hold counted for ever).
                self._dropping -= claimed
            if not dropped:
                break
            settled = True
        return settled

    # -- the limit check -----------------------------------------------------------------------

    def check(
        self,
        guards: tuple[Guard, ...],
        pending: Mapping[str, Any] | None,
        holds: bool = True,
    ) -> tuple[int, Hit] | None:
        """The first guard (in order) with an exceeded limit, counting ``pending`` and (unless
        ``holds`` is False) what calls in flight hold."""
        with self._lock:
            if pending:  # prefix limits see pending keys new to a level
                for guard in guards:
                    for key in pending:
                        guard.level.note(key)
            return self._check(guards, pending, holds)

    def _check(
        self,
        guards: tuple[Guard, ...],
        pending: Mapping[str, Any] | None,
        holds: bool = True,
    ) -> tuple[int, Hit] | None:
        """:meth:`check` under the lock (every pending key known at every guard level):
        the first guard with an exceeded limit, and what exceeds it. ``holds=False`` leaves out
        what calls in flight hold (what is spent, and ``pending``)."""
        holds = holds and bool(self._open)
        for index, guard in enumerate(guards):
            level = guard.level
            extras = self.held_at(level, pending) if holds else pending
            rows, version, entries = guard.compiled
            if rows is not guard.rows or version != level.version:
                entries = guard.compile()
            for cell, top, limit, key in entries:
                extra = extras.get(key, 0) if extras else 0
                value = extra if cell is None else cell.value + extra
                # (A key never written exceeds nothing unless an amount is pending or held.)
                if value > top and (cell is not None or extra):
                    return index, (limit, key, value)
        return None

    def _spent_past(self, guards: tuple[Guard, ...]) -> tuple[Guard, Hit] | None:
        """:meth:`_check` of what is spent alone: the guard passed, and what passes it."""
        for guard in guards:
            rows, version, entries = guard.compiled
            if rows is not guard.rows or version != guard.level.version:
                entries = guard.compile()
            for cell, top, limit, key in entries:
                if cell is not None and cell.value > top:
                    return guard, (limit, key, cell.value)
        return None

    def _sweep_locked(self, dropped: list[tuple[Node, Held]], claimed: MutableSet[str]) -> None:
        """End the dropped calls not admitted; put the dropped calls admitted in ``dropped``,
        each claimed for its settlement (which the caller runs, the lock released; ``claimed``:
        their ids, for the caller to release), their holds still counting until then."""
        for node_id, owner in list(self._unstarted.items()):
            if owner() is None:
                node = self._nodes.get(node_id)
                if node is not None and node.status not in TERMINAL_STATUSES:
                    self._end_locked(node, _NOT_STARTED)
                self._unstarted.pop(node_id, None)
        ended = []
        for node_id, held in self._open.items():
            if held[0]() is None and node_id not in self._dropping:
                node = self._nodes.get(node_id)
                if node is None or node.status in TERMINAL_STATUSES:
                    ended.append(node_id)  # (ended another way: it holds nothing more)
                    continue
                dropped.append((node, held))
                claimed.add(node_id)  # (first: the caller's clean-up ends the claim)
                self._dropping.add(node_id)
        for node_id in ended:
            self._open.pop(node_id)
        if ended and self._waiting:
            self._settled.notify_all()

    def held_at(self, level: Level, pending: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """What calls in flight hold at ``level``, per key, and ``pending`` (caller holds the
        lock)."""
        total: dict[str, Any] = {} if pending is None else dict(pending)
        for held in self._open.values():  # (a call its owner dropped too, until it is charged)
            for held_level, keys in held[2]:  # (see Held)
                if held_level is level:
                    amounts = held[1]
                    for key in keys:
                        total[key] = total.get(key, 0) + amounts[key]
        return total

    def reserved(self, level: Level) -> dict[str, Any]:
        """What calls in flight hold at ``level`` (zeros left out), once the calls their owners
        dropped were charged (also one a collection frees while this reads)."""
        while True:
            self.sweep()
            with self._lock:
                held = {k: v for k, v in self.held_at(level).items() if v > 0}
                if all(h[0]() is not None or i in self._dropping for i, h in self._open.items()):
                    return held


def _drain(feed: Iterator[tuple[Cell, int]], amounts: tuple[Any, ...]) -> None:
    """Add ``amounts[field]`` to each cell of ``feed``'s (cell, field) pairs. An addition is
    straight-line bytecode and the iterator moves only when the next pair is taken, so an
    interrupt lands between two additions and draining the same iterator again resumes exactly
    there."""
    for cell, field in feed:
        cell.value += amounts[field]


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
