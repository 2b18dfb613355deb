"""Random sequences of calls against a tree of contexts, checked after every step.

A hypothesis state machine opens nested contexts, admits LLM and tool calls and keeps them
open across steps, then settles them (``record`` and a clean exit), releases them (an
exception leaves the block, after usage was recorded or not) or interrupts them
(``KeyboardInterrupt`` leaves the block, likewise), and closes contexts (after their calls and
children, or while those still run). A cost cap and a step cap make some admissions fail.
After every step:

* no hold is left once no call is open (``stats.reserved()`` is zero at every level), a
  refused call leaves the holds as they were, and while calls are open a capped context holds
  exactly the estimates of the open calls under it (and the root one step for each);
* the graph's views (nodes, aggregates, ``snapshot()`` of every context, the node a call shows
  and the one the graph shows for it) agree with the stats;
* every context's totals are its own calls' usage plus the sum of its children's totals, and
  equal what the machine itself recorded.

Money may come back as float or Decimal: it is compared through ``Decimal(str(x))``; every
amount used is a multiple of 1/8, so float sums are exact and the comparison is exact too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from ampmeter import BudgetBusy, ExecutionContext, LimitExceeded
from ampmeter.keys import KEY_COST, KEY_INPUT_TOKENS, KEY_OUTPUT_TOKENS, KEY_STEPS
from ampmeter.node import TERMINAL_STATUSES

amounts = st.integers(0, 6).map(lambda eighths: eighths / 8)
counts = st.integers(0, 50)
usages = st.tuples(counts, counts, amounts)  # tokens in, tokens out, cost


def dec(value: object) -> Decimal:
    """A money value (float or Decimal) as an exact Decimal."""
    return Decimal(str(value))


@dataclass
class Totals:
    """Input tokens, output tokens and cost."""

    tokens_in: int = 0
    tokens_out: int = 0
    cost: Decimal = Decimal(0)

    def add(self, other: Totals) -> None:
        self.tokens_in += other.tokens_in
        self.tokens_out += other.tokens_out
        self.cost += other.cost


@dataclass
class Scope:
    """One context of the tree and what the machine expects of it."""

    ctx: ExecutionContext
    parent: Scope | None
    cap: float | None = None
    children: list[Scope] = field(default_factory=list)
    own: Totals = field(default_factory=Totals)  # usage of its own settled calls
    closed: bool = False


@dataclass
class Open:
    """A call admitted and not yet ended."""

    call: Any
    scope: Scope
    estimate: Decimal


def stats_totals(ctx: ExecutionContext) -> Totals:
    counters = ctx.stats.counters()
    return Totals(
        counters.get(KEY_INPUT_TOKENS, 0),
        counters.get(KEY_OUTPUT_TOKENS, 0),
        dec(ctx.stats.gauges().get(KEY_COST, 0)),
    )


def as_tuple(totals: Totals) -> tuple[int, int, Decimal]:
    return (totals.tokens_in, totals.tokens_out, totals.cost)


class CoreMachine(RuleBasedStateMachine):
    """Admit, settle, release, interrupt and nest, against a model of the expected totals."""

    def __init__(self) -> None:
        super().__init__()
        self.scopes: list[Scope] = []
        self.calls: list[Open] = []
        self.refusals = 0
        # Ended calls are kept alive: a hold left behind must show, not be swept up when its
        # call object is collected.
        self.ended: list[Any] = []

    @initialize(
        max_cost=st.integers(1, 24).map(lambda eighths: eighths / 8), steps=st.integers(1, 8)
    )
    def open_root(self, max_cost: float, steps: int) -> None:
        root = ExecutionContext(
            "root", max_cost_usd=max_cost, max_steps=steps, admission_timeout_s=0
        )
        self.scopes.append(Scope(root, None, max_cost))

    def teardown(self) -> None:
        for scope in reversed(self.scopes):
            scope.ctx.close()

    # -- helpers ---------------------------------------------------------------------------

    def open_scopes(self) -> list[Scope]:
        return [s for s in self.scopes if not s.closed]

    def has_open_scope(self) -> bool:
        return bool(self.open_scopes())

    def has_open_call(self) -> bool:
        return bool(self.calls)

    def holds(self) -> list[dict[str, Decimal]]:
        return [{k: dec(v) for k, v in s.ctx.stats.reserved().items()} for s in self.scopes]

    # -- rules -----------------------------------------------------------------------------

    @precondition(has_open_scope)
    @rule(data=st.data(), cap=st.none() | amounts)
    def spawn_child(self, data: st.DataObject, cap: float | None) -> None:
        parent = data.draw(st.sampled_from(self.open_scopes()), label="parent")
        child = parent.ctx.spawn_child(f"child{len(self.scopes)}", max_cost_usd=cap)
        scope = Scope(child, parent, cap)
        parent.children.append(scope)
        self.scopes.append(scope)

    @precondition(has_open_scope)
    @rule(data=st.data(), kind=st.sampled_from(["llm", "tool"]), estimate=amounts)
    def admit(self, data: st.DataObject, kind: str, estimate: float) -> None:
        scope = data.draw(st.sampled_from(self.open_scopes()), label="scope")
        if kind == "llm":
            call = scope.ctx.llm_call("ask", model="machine-model", estimate_usd=estimate)
        else:
            call = scope.ctx.tool_call("search", estimate_usd=estimate)
        before = self.holds()
        try:
            call.__enter__()
        except (LimitExceeded, BudgetBusy):
            self.refusals += 1
            self.ended.append(call)
            assert self.holds() == before, "a refused call changed the holds"
            assert call.node.status == "halt"
            return
        self.calls.append(Open(call, scope, dec(estimate)))

    def take(self, data: st.DataObject) -> Open:
        return self.calls.pop(data.draw(st.integers(0, len(self.calls) - 1), label="call"))

    def record(self, admitted: Open, usage: tuple[int, int, float] | None) -> None:
        """Report ``usage`` on the call (a tool call has a cost and no tokens) and expect it
        in its context's totals however the call then ends: what was reported was billed."""
        if usage is None:
            return
        tokens_in, tokens_out, cost = usage
        if admitted.call.kind == "tool":
            tokens_in = tokens_out = 0
            admitted.call.record(cost_usd=cost)
        else:
            admitted.call.record(tokens_in, tokens_out, cost_usd=cost)
        admitted.scope.own.add(Totals(tokens_in, tokens_out, dec(cost)))

    @precondition(has_open_call)
    @rule(data=st.data(), usage=usages)
    def settle(self, data: st.DataObject, usage: tuple[int, int, float]) -> None:
        admitted = self.take(data)
        self.record(admitted, usage)
        admitted.call.__exit__(None, None, None)
        self.ended.append(admitted.call)
        assert admitted.call.node.status == "success"

    @precondition(has_open_call)
    @rule(data=st.data(), usage=st.none() | usages)
    def release(self, data: st.DataObject, usage: tuple[int, int, float] | None) -> None:
        admitted = self.take(data)
        self.record(admitted, usage)
        error = RuntimeError("the provider answered 500")
        assert not admitted.call.__exit__(RuntimeError, error, None)
        self.ended.append(admitted.call)
        assert admitted.call.node.status == "fail"

    @precondition(has_open_call)
    @rule(data=st.data(), usage=st.none() | usages)
    def interrupt(self, data: st.DataObject, usage: tuple[int, int, float] | None) -> None:
        admitted = self.take(data)
        self.record(admitted, usage)
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as interrupt:
            assert not admitted.call.__exit__(KeyboardInterrupt, interrupt, None)
        self.ended.append(admitted.call)
        if usage is None and (admitted.estimate > 0 or admitted.call.kind == "llm"):
            # In flight and maybe billed: charged at its reservation, as unsettled spend (an
            # LLM call names its model, so it was sent even when it reserved nothing).
            admitted.scope.own.add(Totals(0, 0, admitted.estimate))
            assert admitted.call.node.status == "fail"
        else:
            assert admitted.call.node.status == "halt"

    @precondition(has_open_scope)
    @rule(data=st.data(), early=st.booleans())
    def close(self, data: st.DataObject, early: bool) -> None:
        # In order, a context closes after its calls and children; early, it closes while they
        # still run (as when they run in other threads), and they end afterwards.
        busy = {id(c.scope) for c in self.calls}
        closable = [
            s
            for s in self.open_scopes()
            if s.parent is not None
            and (early or (id(s) not in busy and all(c.closed for c in s.children)))
        ]
        if not closable:
            return
        scope = data.draw(st.sampled_from(closable), label="context")
        scope.ctx.close()
        scope.closed = True

    # -- invariants ------------------------------------------------------------------------

    @invariant()
    def no_hold_without_an_open_call(self) -> None:
        for held in self.holds():
            assert all(v >= 0 for v in held.values()), held
            if not self.calls:
                assert all(v == 0 for v in held.values()), held

    @invariant()
    def holds_are_the_estimates_of_the_open_calls(self) -> None:
        for scope, held in zip(self.scopes, self.holds(), strict=True):
            under = [c for c in self.calls if self.encloses(scope, c.scope)]
            estimates = sum((c.estimate for c in under), Decimal(0))
            if scope.cap is not None:
                assert held.get(KEY_COST, 0) == estimates, (scope.ctx.name, held, estimates)
            else:  # a context without a cap of its own holds no money
                assert KEY_COST not in held, (scope.ctx.name, held)
        assert self.holds()[0].get(KEY_STEPS, 0) == len(self.calls)

    @staticmethod
    def encloses(outer: Scope, inner: Scope | None) -> bool:
        while inner is not None:
            if inner is outer:
                return True
            inner = inner.parent
        return False

    @invariant()
    def totals_roll_up(self) -> None:
        for scope in self.scopes:
            expected = Totals()
            expected.add(scope.own)
            for child in scope.children:
                expected.add(stats_totals(child.ctx))
            assert as_tuple(stats_totals(scope.ctx)) == as_tuple(expected), scope.ctx.name

    @invariant()
    def totals_match_the_calls_of_each_context(self) -> None:
        root = self.scopes[0].ctx
        nodes = {n.node_id: n for n in root.graph.nodes()}
        owner = {s.ctx.node_id: s for s in self.scopes}
        own = {s.ctx.node_id: Totals() for s in self.scopes}
        for node in nodes.values():
            if node.node_id in owner or node.kind not in ("llm", "tool"):
                continue
            parent = node.parent_id
            while parent not in owner:
                assert parent is not None, f"{node.node_id} is under no context"
                parent = nodes[parent].parent_id
            own[parent].add(Totals(node.tokens_in or 0, node.tokens_out or 0, dec(node.cost_usd)))
        for scope in self.scopes:
            assert as_tuple(own[scope.ctx.node_id]) == as_tuple(scope.own), scope.ctx.name

    @invariant()
    def views_agree_with_the_stats(self) -> None:
        root = self.scopes[0].ctx
        totals = stats_totals(root)
        counters = root.stats.counters()
        aggregates = root.graph.aggregates()
        assert aggregates["total_tokens_in"] == totals.tokens_in
        assert aggregates["total_tokens_out"] == totals.tokens_out
        assert dec(aggregates["total_cost_usd"]) == totals.cost
        nodes = root.graph.nodes()
        for kind in ("llm", "tool"):  # DESIGN.md: every terminal call node is counted
            ended = sum(n.kind == kind and n.status in TERMINAL_STATUSES for n in nodes)
            assert aggregates[f"total_{kind}_calls"] == ended
        snapshot = root.snapshot()
        assert snapshot["counters"] == counters
        assert {k: dec(v) for k, v in snapshot["reserved"].items()} == self.holds()[0]
        graph = snapshot["graph"]
        assert graph["aggregates"] == aggregates
        assert len(graph["nodes"]) == len(nodes)
        recount = Totals()
        for node in nodes:
            if node.kind in ("llm", "tool"):
                recount.add(Totals(node.tokens_in or 0, node.tokens_out or 0, dec(node.cost_usd)))
        assert as_tuple(recount) == as_tuple(totals)
        for scope, held in zip(self.scopes, self.holds(), strict=True):
            shown = scope.ctx.snapshot()
            assert shown["counters"] == scope.ctx.stats.counters(), scope.ctx.name
            assert {k: dec(v) for k, v in shown["reserved"].items()} == held, scope.ctx.name
        for call in [c.call for c in self.calls] + self.ended:
            assert root.graph.node(call.node_id) == call.node, call.node_id


CoreMachine.TestCase.settings = settings(
    max_examples=50,
    stateful_step_count=30,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
TestCoreMachine = CoreMachine.TestCase
