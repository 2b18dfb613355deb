"""Hand-offs: a context hands part of its run to another process, and counts what it spent
(``docs/shared-budgets.md``). The child's calls hold and commit in a ledger scope under the
parent's (and at every scope above), so they stop at the child's limits and at its parents'
remaining budget; the parent adds the child's spend, read from the ledger, to its stats and its
graph's aggregates (:meth:`Handoffs.refresh`). The holds of a dead child, and of any dead worker
on the context's own scope, become nodes of their own (:mod:`ampmeter.shared.unsettled`).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ampmeter._core.outcome import Outcome
from ampmeter._core.usage import internal_amount
from ampmeter.errors import HandoffError
from ampmeter.keys import (
    KEY_COST,
    KEY_INPUT_TOKENS,
    KEY_LLM_CALLS,
    KEY_OUTPUT_TOKENS,
    KEY_TOOL_CALLS,
    is_money,
)
from ampmeter.limits import LimitType
from ampmeter.shared.unsettled import record_unsettled

if TYPE_CHECKING:
    from ampmeter._core.emit import Emitter
    from ampmeter._core.frame import Frame
    from ampmeter._core.kernel import Kernel
    from ampmeter.ledgers.base import Ledger
    from ampmeter.limits import Limit
    from ampmeter.node import Node

__all__ = ["HandoffSpend", "Handoffs"]

# The counts whose hand-off spend also counts in the graph's aggregates (with its cost).
_AGGREGATED = (KEY_LLM_CALLS, KEY_TOOL_CALLS, KEY_INPUT_TOKENS, KEY_OUTPUT_TOKENS)


@dataclass(slots=True, eq=False)
class HandoffSpend:
    """A hand-off made by a context, and how much of its spend the context has counted."""

    node: Node
    ledger: Ledger
    scope: str
    counted: dict[str, Any] = field(default_factory=dict)
    # the child's unsettled holds recorded as nodes here: id -> the hold's amounts
    recorded: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    error: Exception | None = None  # the last read's, None once one succeeded
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take_new(self, spent: Mapping[str, Any]) -> dict[str, Any]:
        """What ``spent`` (a fresh read) holds beyond what was counted; now counted too."""
        with self.lock:
            self.error = None
            new = {k: v - self.counted.get(k, 0) for k, v in spent.items()}
            new = {k: d for k, d in new.items() if d > 0}
            self.counted.update((k, spent[k]) for k in new)
            return new


class Handoffs:
    """The hand-offs one context made."""

    __slots__ = ("emitter", "frame", "kernel", "made", "own_recorded")

    def __init__(self, frame: Frame, kernel: Kernel, emitter: Emitter) -> None:
        self.frame = frame
        self.kernel = kernel
        self.emitter = emitter
        # The dead workers' holds at this context's own scope recorded so far (id -> amounts).
        self.own_recorded: dict[str, Mapping[str, Any]] = {}
        self.made: list[HandoffSpend] = []

    def count_spent_before(self) -> None:
        """Count what this context's ledger scope spent before this process resumed it, less
        the holds a dead process left unsettled (its parent records those)."""
        shared = self.frame.ledger
        assert shared is not None  # a hand-off always has its ledger
        charged = shared.unsettled()
        level = self.frame.level
        for key, value in shared.spent().items():
            held = charged.get(key, 0)
            self.kernel.add(level, key, internal_amount(key, value - held), is_money(key))

    def give(
        self,
        name: str,
        parent_id: str,
        metadata: dict[str, Any],
        limits: tuple[Limit, ...],
        timeout: float | None,
    ) -> str:
        """The token of a new hand-off, whose node goes under ``parent_id`` (see the module
        docstring)."""
        from ampmeter.propagation import Handoff, encode  # ledgers load only when used

        owner = next((f for f in self.frame.ancestry if f.ledger is not None), None)
        if owner is None or owner.ledger is None:
            raise HandoffError(
                f"context {self.frame.name!r} cannot hand off {name!r}: a hand-off needs a "
                "shared ledger, so give this context (or one above it) ledger=SqliteLedger(path) "
                "for processes of one machine or ledger=RedisLedger(url, scope) for many"
            )
        ledger = owner.ledger
        try:
            location = ledger.location()
        except TypeError as error:
            raise HandoffError(f"cannot hand off {name!r}: {error}") from None
        node = self.kernel.begin(parent_id, "system", name, None, metadata)
        self.kernel.run(node)
        root = self.frame.root  # the context that owns the graph: its ids are logged prefixed
        logged_id = root.span_prefix + node.node_id
        scope = ledger.child(f"{logged_id}-{uuid.uuid4().hex[:8]}").scope
        above = owner.handoff_from
        # Soft and windowed limits are the owner's policies, not ceilings a child may not pass.
        ceilings = tuple(limit for limit in owner.limits if limit.is_ceiling)
        ancestors = ((ledger.scope, ceilings), *(above.ancestors if above else ()))
        depth = node.depth + (root.handoff_from.depth + 1 if root.handoff_from else 0)
        deadline = None if timeout is None else time.time() + timeout
        # The child obeys the ledger, not the token: its ceilings and its ancestors' are kept
        # there (only ever tightened), so an edited token cannot lift them.
        for kept_scope, kept in ((scope, limits), *ancestors):
            exact = {
                lim.key: lim.max_value
                for lim in kept
                if lim.is_ceiling and lim.type is LimitType.EXACT
            }
            if exact:
                ledger.set_ceilings(kept_scope, exact)
        self.made.append(HandoffSpend(node, ledger, scope))
        # The child pauses where this context would (a callback cannot travel: it pauses).
        exhaustion = self.frame.exhaustion
        handoff = Handoff(
            self.kernel.chain_id,
            logged_id,
            depth,
            name,
            scope,
            location,
            limits,
            ancestors=ancestors,
            deadline=deadline,
            on_exhausted=exhaustion.mode,
            pause_timeout_s=exhaustion.timeout_s,
            # The child's holds end as this context's would (its rule, else the ledger's).
            on_expired_hold=self.frame.on_expired_hold or ledger.on_expired_hold,
        )
        return encode(handoff, ledger=ledger)

    def refresh(self) -> dict[str, Any]:
        """Read the spend of the hand-offs from the ledger again; add what is new to the stats
        (here and above) and to the graph's aggregates. Returns what was added, per key (money
        as exact Decimal dollars, as the ledger gives it).

        The unsettled holds under a hand-off that this context is the first to claim are
        recorded as nodes (which count themselves) and left out of the spend counted here,
        also once their worker commits after all, so each counts once (what a late commit
        adds beyond the charge is counted). Holds another reader claimed (a process between,
        which handed off in turn) count here as the child's spend. Then the dead workers'
        holds at this context's own ledger scope are recorded."""
        added: dict[str, Any] = {}
        level = self.frame.level
        for handoff in list(self.made):
            ledger = handoff.ledger
            try:
                spent = ledger.spent(handoff.scope)  # first: a hold reaped in between is listed
                holds = ledger.unsettled_holds(handoff.scope)
                node_id = handoff.node.node_id
                record_unsettled(
                    holds, ledger, self.kernel, level, self.emitter, node_id, handoff.recorded
                )
            except Exception as error:
                handoff.error = error
                continue
            settled = _less(spent, handoff.recorded.values())
            for key, delta in handoff.take_new(settled).items():
                self.kernel.add(level, key, internal_amount(key, delta), is_money(key))
                added[key] = added.get(key, 0) + delta
        if added:
            calls, tools, t_in, t_out = (int(added.get(key, 0)) for key in _AGGREGATED)
            cost = internal_amount(KEY_COST, added.get(KEY_COST, 0))
            self.kernel.add_handed_off(calls, tools, t_in, t_out, cost)
        self.record_own_unsettled()
        return added

    def record_own_unsettled(self) -> None:
        """Record the unsettled holds of dead workers that held at this context's own ledger
        scope itself (a ledger that cannot be read now records nothing; the next read catches
        up). The holds of hand-offs are their parents' to record, so a context made from a
        hand-off records none, and holds taken below this scope are left to theirs, as are
        those whose ids do not carry its ledger's ``hold_prefix`` (another run's)."""
        ledger = self.frame.ledger
        if ledger is None or self.frame.handoff_from is not None:
            return
        try:
            holds = [
                h
                for h in ledger.unsettled_holds()
                if h.scopes[0] == ledger.scope and h.id.startswith(ledger.hold_prefix)
            ]
            if holds:
                node_id = self.frame.node_id
                level = self.frame.level
                record_unsettled(
                    holds, ledger, self.kernel, level, self.emitter, node_id, self.own_recorded
                )
        except Exception as error:  # a survivor's close must not fail on this read
            import logging  # only now: importing ampmeter loads no logging

            logging.getLogger("ampmeter.shared").warning(
                "context %r: unsettled holds not read: %s", self.frame.name, error
            )

    def settle(self) -> None:
        """End the hand-off nodes, adding each child's spend (read from the ledger) to the
        stats and aggregates; the nodes carry no cost, so logs do not count it twice. The
        hand-offs are kept: :meth:`refresh` adds what a child spends later."""
        self.refresh()
        for handoff in self.made:
            node = handoff.node
            if handoff.error is not None:
                outcome = Outcome(
                    "fail",
                    error_class=type(handoff.error).__name__,
                    stop_reason=f"the hand-off's spend could not be read: {handoff.error}",
                )
            else:
                meta = {"handoff_scope": handoff.scope, "handoff_spent": dict(handoff.counted)}
                outcome = Outcome("success", metadata=meta)
            if self.kernel.end(node, outcome):
                self.emitter.emit(node)


def _less(spent: Mapping[str, Any], charged: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """``spent`` without the amounts of the ``charged`` holds recorded here."""
    settled = dict(spent)
    for amounts in charged:
        for key, value in amounts.items():
            if key in settled:
                settled[key] -= value
    return settled
