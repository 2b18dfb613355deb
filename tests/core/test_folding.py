"""Folding: a context that nothing reads live (no limit, no ledger) is not added to on every
settle; its stats are summed from its children when read, and a child that ends is folded into
it once. Every read must return what it would if every context were added to live.

The state machine runs the same random steps on two trees of the same shape: in one, contexts
have random limits or none (those without fold); in its twin every context has a limit on a key
no step writes, so none folds (what every context did before folding). After every step each
context's counters and gauges, in order, equal its twin's, and a naive recomputation from the
steps for the keys the steps write directly.
"""

from __future__ import annotations

import dis
import gc
import sys
import threading
import weakref
from dataclasses import dataclass, field
from decimal import Decimal
from types import FrameType
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from ampmeter import ExecutionContext, Limit, LimitType
from ampmeter._core import kernel as kernel_module
from ampmeter._core.cells import fold_in
from ampmeter._core.views import bound
from ampmeter.keys import KEY_COST, KEY_INPUT_TOKENS, KEY_LLM_CALLS
from ampmeter.trace import ModelCallTrace, ParseErrorTrace, ToolCallTrace

NEVER_WRITTEN = Limit("fold:never_written", 1e12)  # keeps a twin context live
LIMITS = st.sampled_from(
    [
        None,
        None,
        [Limit(KEY_INPUT_TOKENS, 1e12)],
        [Limit("amp:input_tokens:", 1e12, LimitType.PREFIX)],
        [Limit("user:n", 1e12)],
    ]
)
USER_KEYS = st.sampled_from(["user:n", "user:m"])
GAUGES = st.sampled_from(["user:g", KEY_COST, "amp:cost:by-hand"])
# Floats whose sums depend on their order: a gauge must be added in the same order as before.
FLOATS = st.sampled_from([0.1, 0.2, 0.7, -0.3, 1e6, 3.0])


@dataclass
class Pair:
    """One context and its twin, and the user keys the naive model expects."""

    ctx: ExecutionContext
    twin: ExecutionContext
    parent: Pair | None
    counters: dict[str, int] = field(default_factory=dict)
    closed: bool = False

    def lineage(self) -> list[Pair]:
        found, pair = [], self
        while pair is not None:
            found.append(pair)
            pair = pair.parent  # type: ignore[assignment]
        return found


class Folding(RuleBasedStateMachine):
    """See the module docstring."""

    def __init__(self) -> None:
        super().__init__()
        self.pairs: list[Pair] = []

    @initialize(limits=LIMITS)
    def root(self, limits: list[Limit] | None) -> None:
        ctx = ExecutionContext("root", limits=limits or [])
        twin = ExecutionContext("root", limits=[*(limits or []), NEVER_WRITTEN])
        self.pairs.append(Pair(ctx, twin, None))

    def pick(self, data: st.DataObject, open_only: bool = False) -> Pair:
        pairs = [p for p in self.pairs if not (open_only and p.closed)]
        return data.draw(st.sampled_from(pairs), label="context")

    def both(self, pair: Pair, step: Any) -> None:
        step(pair.ctx)
        step(pair.twin)

    @precondition(lambda self: len(self.pairs) < 9)
    @rule(data=st.data(), limits=LIMITS)
    def spawn(self, data: st.DataObject, limits: list[Limit] | None) -> None:
        parent = self.pick(data, open_only=True)
        name = f"c{len(self.pairs)}"
        ctx = parent.ctx.spawn_child(name, limits=limits or [])
        twin = parent.twin.spawn_child(name, limits=[*(limits or []), NEVER_WRITTEN])
        self.pairs.append(Pair(ctx, twin, parent))

    @rule(data=st.data(), tokens=st.integers(0, 90), eighths=st.integers(0, 9))
    def call(self, data: st.DataObject, tokens: int, eighths: int) -> None:
        model = data.draw(st.sampled_from(["gpt-4o-mini", "m-b"]), label="model")

        def step(ctx: ExecutionContext) -> None:
            with ctx.llm_call("step", model=model, estimate_usd=0.001) as call:
                call.record(tokens_in=tokens, tokens_out=tokens // 3, cost_usd=eighths / 8)

        self.both(self.pick(data, open_only=True), step)

    @rule(data=st.data(), tokens=st.integers(0, 90), tool=st.booleans(), parse=st.booleans())
    def trace(self, data: st.DataObject, tokens: int, tool: bool, parse: bool) -> None:
        records: list[Any] = [ModelCallTrace(model="m-t", input_tokens=tokens, cost_usd=0.25)]
        if tool:
            records.append(ToolCallTrace(tool_name="search"))
        if parse:
            records.append(ParseErrorTrace(error_type="format", raw_content="{"))
        pair = self.pick(data, open_only=True)
        for record in records:
            self.both(pair, lambda ctx, r=record: ctx.trace(r))

    @rule(data=st.data(), key=USER_KEYS, delta=st.integers(0, 5))
    def incr_counter(self, data: st.DataObject, key: str, delta: int) -> None:
        pair = self.pick(data)
        self.both(pair, lambda ctx: ctx.stats.incr_counter(key, delta))
        for each in pair.lineage():
            each.counters[key] = each.counters.get(key, 0) + delta

    @rule(data=st.data(), key=USER_KEYS, value=st.integers(0, 40))
    def set_counter(self, data: st.DataObject, key: str, value: int) -> None:
        pair = self.pick(data)
        if value == 0:
            self.both(pair, lambda ctx: ctx.stats.reset_counter(key))
        else:
            self.both(pair, lambda ctx: ctx.stats.set_counter(key, value))
        pair.counters[key] = value

    @rule(data=st.data(), key=GAUGES, amount=FLOATS, setting=st.booleans())
    def gauge(self, data: st.DataObject, key: str, amount: float, setting: bool) -> None:
        pair = self.pick(data)
        if setting:
            self.both(pair, lambda ctx: ctx.stats.set_gauge(key, amount))
        else:
            self.both(pair, lambda ctx: ctx.stats.incr_gauge(key, amount))

    @rule(data=st.data())
    def retry(self, data: st.DataObject) -> None:
        def step(ctx: ExecutionContext) -> None:
            with ctx.tool_call("flaky") as call:
                ctx.retry(call)

        self.both(self.pick(data, open_only=True), step)

    @rule(data=st.data())
    def close(self, data: st.DataObject) -> None:
        # A context may close while its children still run; they go on afterwards.
        pairs = [p for p in self.pairs if p.parent is not None and not p.closed]
        if pairs:
            pair = data.draw(st.sampled_from(pairs), label="closing")
            self.both(pair, lambda ctx: ctx.close())
            pair.closed = True

    @invariant()
    def every_context_reads_what_its_twin_reads(self) -> None:
        for pair in self.pairs:
            stats, twin = pair.ctx.stats, pair.twin.stats
            assert list(stats.counters().items()) == list(twin.counters().items()), pair.ctx.name
            assert list(stats.gauges().items()) == list(twin.gauges().items()), pair.ctx.name
            for key, value in pair.counters.items():
                assert stats.get_counter(key) == value
            assert stats.total_cost() == twin.total_cost()
            assert stats.get_counter(KEY_LLM_CALLS) == twin.get_counter(KEY_LLM_CALLS)
            assert repr(stats) == repr(twin)
            snapshot, twin_snapshot = pair.ctx.snapshot(), pair.twin.snapshot()
            for part in ("counters", "gauges", "reserved"):
                assert snapshot[part] == twin_snapshot[part]


TestFolding = Folding.TestCase
TestFolding.settings = settings(
    max_examples=60,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def _calls(ctx: ExecutionContext, count: int, tokens: int = 3) -> None:
    for _ in range(count):
        with ctx.llm_call("step", model="gpt-4o-mini", estimate_usd=0.001) as call:
            call.record(tokens_in=tokens, tokens_out=1, cost_usd=0.125)


def test_a_call_below_a_context_without_limits_is_not_added_to_it_but_read_there() -> None:
    root = ExecutionContext("root")
    planner = root.spawn_child("planner")
    worker = planner.spawn_child("worker", max_cost_usd=10)
    _calls(worker, 4)
    _, level = bound(planner.stats)
    assert level is not None
    # Nothing reads the planner live: the worker's calls were not added to its cells...
    assert level.counters[KEY_INPUT_TOKENS].value == 0
    # ...and every read sums them.
    assert planner.stats.total_input_tokens() == root.stats.total_input_tokens() == 12
    assert planner.stats.total_cost() == Decimal("0.5")
    assert planner.snapshot()["counters"][KEY_LLM_CALLS] == 4


def test_an_ended_child_is_folded_in_once_and_its_level_is_let_go() -> None:
    root = ExecutionContext("root")
    with root.spawn_child("worker") as worker:
        _calls(worker, 3)
        gone = weakref.ref(bound(worker.stats)[1])  # type: ignore[arg-type]
    _, level = bound(root.stats)
    assert level is not None and not level.pulled  # the root no longer reads it
    worker.stats.incr_counter("late", 2)  # a write after the end still reaches the root
    assert root.stats.get_counter("late") == 2
    del worker
    for _ in range(3):  # (a level is in a cycle with its own lineage: a later pass frees it)
        gc.collect()
    assert gone() is None
    assert root.stats.total_input_tokens() == 9
    assert root.stats.total_cost() == Decimal("0.375")


def test_a_call_compiled_before_its_parent_ended_reaches_the_levels_above_after() -> None:
    root = ExecutionContext("root")
    child = root.spawn_child("child")
    grandchild = child.spawn_child("grandchild", max_cost_usd=10)
    _calls(grandchild, 1)  # its plan is compiled while the child reads it
    child.close()  # from now on the root reads the grandchild's calls directly
    _calls(grandchild, 1)
    assert root.stats.total_input_tokens() == child.stats.total_input_tokens() == 6


def test_a_child_ending_while_its_own_children_run_in_threads_loses_nothing() -> None:
    root = ExecutionContext("root")
    planners = [root.spawn_child(f"p{i}") for i in range(3)]
    workers = [p.spawn_child("w", max_cost_usd=100 if i else None) for i, p in enumerate(planners)]
    halfway = threading.Barrier(len(workers) + 1)

    def work(ctx: ExecutionContext) -> None:
        _calls(ctx, 100)  # plans compiled while the planners read them
        halfway.wait()
        _calls(ctx, 200)

    threads = [threading.Thread(target=work, args=(w,)) for w in workers]
    for thread in threads:
        thread.start()
    halfway.wait()
    for planner in planners:  # their children keep running, and are read through the root
        planner.close()
    for thread in threads:
        thread.join()
    assert root.stats.total_input_tokens() == 3 * 300 * 3
    assert root.stats.get_counter(KEY_LLM_CALLS) == 900
    assert root.stats.total_cost() == Decimal("112.5")
    assert [p.stats.get_counter(KEY_LLM_CALLS) for p in planners] == [300, 300, 300]


def test_a_set_below_a_folded_context_leaves_what_it_reads_and_sums_stay_exact() -> None:
    root = ExecutionContext("root")
    child = root.spawn_child("child")
    child.stats.incr_counter("n", 5)
    child.stats.set_counter("n", 1)  # the child only
    child.stats.incr_counter("n", 2)
    assert (root.stats.get_counter("n"), child.stats.get_counter("n")) == (7, 3)
    root.stats.set_counter("n", 100)  # the root only; later adds below still reach it
    child.stats.incr_counter("n", 1)
    assert (root.stats.get_counter("n"), child.stats.get_counter("n")) == (101, 4)
    child.stats.set_counter("only-here", 9)  # a key the root never had stays unknown there
    assert "only-here" not in root.stats.counters()
    child.close()
    assert root.stats.counters()["n"] == 101
    assert "only-here" not in root.stats.counters()


# Where CPython raises a signal's KeyboardInterrupt: on entering a function, after a call
# returns and at a loop's back-edge (its eval-breaker checks).
_BREAKERS = frozenset({"CALL", "JUMP_BACKWARD", "CALL_FUNCTION_EX"})


@pytest.mark.parametrize("at", range(1, 30))
def test_an_interrupt_anywhere_in_a_fold_leaves_every_read_exact(at: int) -> None:
    root = ExecutionContext("root")
    child = root.spawn_child("child")
    grandchild = child.spawn_child("grandchild")
    _calls(grandchild, 2)
    child.stats.incr_counter("n", 3)
    fold = (kernel_module.Kernel.retire.__code__, fold_in.__code__)
    seen = [0]

    def land(frame: FrameType, point: bool) -> None:
        if point and frame.f_code in fold:
            seen[0] += 1
            if seen[0] == at:
                raise KeyboardInterrupt

    def interrupt(frame: FrameType, event: str, arg: object) -> Any:
        # The ``at``-th such point in the fold (``retire`` and its step; 27 here).
        land(frame, event == "call")
        frame.f_trace_opcodes = True
        last: list[str] = [""]

        def local(frame: FrameType, event: str, arg: object) -> Any:
            if event == "opcode":
                land(frame, last[0] in _BREAKERS)
                last[0] = dis.opname[frame.f_code.co_code[frame.f_lasti]]
            return local

        return local

    sys.settrace(interrupt)
    try:
        child.close()
    except KeyboardInterrupt:
        pass
    finally:
        sys.settrace(None)
    _calls(grandchild, 1)
    child.stats.incr_counter("n", 1)
    assert root.stats.total_input_tokens() == child.stats.total_input_tokens() == 9
    assert root.stats.get_counter("n") == 4
    assert root.stats.total_cost() == Decimal("0.375")
