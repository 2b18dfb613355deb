"""ExecutionContext with a shared budget ledger, end to end: processes, threads, dead Redis."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import random
import signal
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator, Mapping
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ampmeter.context import Decision, ExecutionContext, TerminationReason
from ampmeter.errors import BudgetUnavailable, LimitExceeded
from ampmeter.keys import (
    KEY_COST,
    KEY_INPUT_TOKENS_FOR,
    KEY_LLM_CALLS,
    KEY_STEPS,
    KEY_TOOL_CALLS_FOR,
)
from ampmeter.ledgers import InMemoryLedger, Ledger, LedgerUnavailable, RedisLedger
from ampmeter.limits import Limit, LimitType
from support.ledger_backends import reserve
from support.processes import gather
from support.redis_server import RedisServer, free_port, redis_server_fixture  # noqa: F401

CEILING = 60.0
CALLS = 200
PROCESSES = 8
THREADS = 16


def _scope() -> str:
    return f"ctx-test-{uuid.uuid4().hex}"


def _dead_url() -> str:
    return f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there


# -- many workers against one ceiling ------------------------------------------------------------


def _run_calls(ctx: ExecutionContext, seed: int) -> dict[str, Any]:
    """CALLS calls with random estimates (whole nano-dollars); the actual cost is sometimes
    above the estimate."""
    rng = random.Random(seed)
    pairs: list[tuple[Decimal, Decimal]] = []
    stopped = 0
    wrong_nodes = 0
    for index in range(CALLS):
        estimate = Decimal(rng.randrange(50_000_000, 1_000_000_000)).scaleb(-9)
        actual = (estimate * rng.randrange(300, 1600) / 1000).quantize(Decimal("1e-9"))
        try:
            with ctx.llm_call(f"call-{index}", estimate_usd=estimate) as call:
                if rng.random() < 0.2:
                    time.sleep(0)  # let other workers in while this call is in flight
                call.record(cost_usd=actual)
        except LimitExceeded as exc:
            stopped += 1
            assert exc.node_id is not None
            node = ctx.graph.node(exc.node_id)
            if node.status != "halt" or "shared budget" not in (node.stop_reason or ""):
                wrong_nodes += 1
            continue
        pairs.append((estimate, actual))
    return {
        "pairs": pairs,
        "stopped": stopped,
        "wrong_nodes": wrong_nodes,
        "local_cost": ctx.stats.get_gauge(KEY_COST),
        "local_reserved": ctx.stats.reserved(),
    }


def _process_worker(url: str, scope: str, seed: int, start: Any, out: Any) -> None:
    try:
        ledger = RedisLedger(url, scope, lease_s=30.0, timeout_s=10.0)
        ctx = ExecutionContext(f"worker-{seed}", max_cost_usd=CEILING, ledger=ledger)
        start.wait(timeout=60)  # all workers begin together, so their calls overlap
        with ctx:
            result = _run_calls(ctx, seed)
        ledger.close()
        out.put(result)
    except BaseException:
        out.put({"error": traceback.format_exc()})


def _check_shared_ceiling(results: list[dict[str, Any]], ledger: Ledger) -> None:
    for result in results:
        assert "error" not in result, result.get("error")
        assert result["wrong_nodes"] == 0
        assert result["local_reserved"] == {}
        assert result["local_cost"] == sum(actual for _, actual in result["pairs"])
    recorded = sum(actual for r in results for _, actual in r["pairs"])
    spent = ledger.spent()
    assert spent[KEY_COST] == recorded  # exact: every amount is whole nano-dollars
    # Every admission leaves spent + reserved <= CEILING. After the last one only the calls then
    # in flight - at most one per worker - can commit more than they reserved, so the overshoot
    # is at most the sum over workers of each worker's largest (actual - estimate).
    bound = sum(
        max([actual - estimate for estimate, actual in r["pairs"]] + [Decimal(0)]) for r in results
    )
    assert spent[KEY_COST] <= Decimal(repr(CEILING)) + bound
    assert sum(r["stopped"] for r in results) > 0  # the shared ceiling did stop calls
    assert ledger.reserved() == {}


def test_processes_share_one_ceiling_through_their_contexts(redis_server: RedisServer) -> None:
    scope = _scope()
    mp = multiprocessing.get_context("fork")
    out = mp.Queue()
    start = mp.Barrier(PROCESSES)
    workers = [
        mp.Process(target=_process_worker, args=(redis_server.url, scope, seed, start, out))
        for seed in range(PROCESSES)
    ]
    results = gather(workers, out)
    ledger = RedisLedger(redis_server.url, scope)
    try:
        _check_shared_ceiling(results, ledger)
        assert ledger.reservation_ids() == set()
    finally:
        ledger.close()


def test_threads_share_one_in_memory_ledger_across_contexts() -> None:
    ledger = InMemoryLedger("threads")
    results: list[dict[str, Any]] = []
    lock = threading.Lock()
    start = threading.Barrier(THREADS)

    def work(seed: int) -> None:
        try:
            ctx = ExecutionContext(f"thread-{seed}", max_cost_usd=CEILING, ledger=ledger)
            start.wait()
            with ctx:
                result = _run_calls(ctx, 1000 + seed)
        except BaseException:
            result = {"error": traceback.format_exc()}
        with lock:
            results.append(result)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(results) == THREADS
    _check_shared_ceiling(results, ledger)


def _stuck_worker(url: str, scope: str, ready: Any) -> None:
    # "release": this test is about the hold coming back (the default charges it as unsettled)
    ledger = RedisLedger(url, scope, lease_s=1.0, timeout_s=10.0, on_expired_hold="release")
    ctx = ExecutionContext("stuck", max_cost_usd=1.0, ledger=ledger)
    with ctx.llm_call("hangs", estimate_usd=0.75):
        ready.put(True)
        time.sleep(600)


def test_hold_of_a_killed_worker_returns_after_its_lease(redis_server: RedisServer) -> None:
    scope = _scope()
    mp = multiprocessing.get_context("fork")
    ready = mp.Queue()
    process = mp.Process(target=_stuck_worker, args=(redis_server.url, scope, ready))
    process.start()
    assert ready.get(timeout=60) is True
    assert process.pid is not None
    os.kill(process.pid, signal.SIGKILL)
    process.join(timeout=30)
    ledger = RedisLedger(redis_server.url, scope, timeout_s=10.0)
    try:
        assert ledger.reserved() == {
            KEY_COST: Decimal("0.75")
        }  # reads never reap: the hold is still there
        ctx = ExecutionContext("survivor", max_cost_usd=1.0, ledger=ledger)
        admitted = False
        deadline = time.monotonic() + 60
        while not admitted and time.monotonic() < deadline:
            try:
                with ctx.llm_call("retry", estimate_usd=0.5) as call:
                    call.record(cost_usd=0.5)
                admitted = True
            except LimitExceeded:
                time.sleep(0.1)
        assert admitted
        assert ledger.spent() == {KEY_COST: Decimal("0.5")}
        assert ledger.reserved() == {}
        assert ctx.stats.reserved() == {}
    finally:
        ledger.close()


# -- an unreachable ledger -------------------------------------------------------------------


def test_unreachable_ledger_halts_the_call_before_it_runs() -> None:
    ledger = RedisLedger(_dead_url(), _scope(), timeout_s=0.2)
    ctx = ExecutionContext(max_cost_usd=5.0, ledger=ledger)
    ran: list[str] = []
    # code that handles budget stops sees it
    with pytest.raises(LimitExceeded) as caught, ctx.llm_call("plan", estimate_usd=0.1) as call:
        ran.append("body")
        call.record(cost_usd=0.1)
    error = caught.value
    assert isinstance(error, BudgetUnavailable)
    assert error.exceeded is None
    assert ran == []
    assert error.node_id is not None
    node = ctx.graph.node(error.node_id)
    assert node.status == "halt"
    assert node.stop_reason is not None and "unavailable" in node.stop_reason
    assert "fail closed" in node.stop_reason
    assert ctx.stats.reserved() == {}
    assert ctx.stats.get_gauge(KEY_COST) == 0.0
    assert ctx.stats.get_counter(KEY_LLM_CALLS) == 0
    ledger.close()


def test_unreachable_ledger_makes_wrap_calls_halt_without_running() -> None:
    ledger = RedisLedger(_dead_url(), _scope(), timeout_s=0.2)
    ctx = ExecutionContext(max_steps=10, ledger=ledger)
    ran: list[str] = []
    assert ctx.wrap_tool_call(lambda: ran.append("tool")) is Decision.HALT
    assert ran == []
    assert [n.status for n in ctx.graph.nodes() if n.kind == "tool"] == ["halt"]
    ledger.close()


def test_ledger_that_goes_down_mid_run() -> None:
    server = RedisServer().start()
    try:
        ledger = RedisLedger(server.url, _scope(), timeout_s=0.5)
        ctx = ExecutionContext(max_cost_usd=5.0, ledger=ledger)
        with ctx.llm_call("first", estimate_usd=0.2) as call:
            call.record(cost_usd=0.25)
        assert ledger.spent() == {KEY_COST: Decimal("0.25")}
        with ctx.llm_call("second", estimate_usd=0.2) as call:
            server.stop()  # admitted while Redis was up; the commit finds it gone
            call.record(cost_usd=0.5)
        second = ctx.graph.node(call.node_id)
        assert second.status == "success"
        assert "unavailable" in second.metadata["ledger_error"]
        with pytest.raises(BudgetUnavailable), ctx.llm_call("third", estimate_usd=0.2):
            pytest.fail("the third call must not run")
        assert ctx.stats.get_gauge(KEY_COST) == Decimal("0.75")
        assert ctx.stats.reserved() == {}
        ledger.close()
    finally:
        server.stop()


def test_allow_lets_calls_through_and_marks_the_budget_unenforced() -> None:
    ledger = RedisLedger(_dead_url(), _scope(), timeout_s=0.2)
    ctx = ExecutionContext(max_cost_usd=1.0, ledger=ledger, on_ledger_error="allow")
    with ctx.llm_call("plan", estimate_usd=0.2) as call:
        call.record(cost_usd=0.3)
    node = ctx.graph.node(call.node_id)
    assert node.status == "success"
    assert node.metadata["budget_enforced"] is False
    assert "unavailable" in node.metadata["ledger_error"]
    assert ctx.stats.get_gauge(KEY_COST) == Decimal("0.3")
    # the local ceiling still holds while the shared one cannot be checked
    with pytest.raises(LimitExceeded) as caught, ctx.llm_call("big", estimate_usd=0.8):
        pytest.fail("the local limit must stop this call")
    assert not isinstance(caught.value, BudgetUnavailable)
    # a sub-agent inherits the choice
    child = ctx.spawn_child("helper")
    with child.tool_call("search") as tool:
        pass
    assert ctx.graph.node(tool.node_id).metadata["budget_enforced"] is False
    ledger.close()


def test_enforced_calls_are_not_marked_unenforced() -> None:
    ctx = ExecutionContext(max_cost_usd=1.0, ledger=InMemoryLedger(), on_ledger_error="allow")
    with ctx.llm_call("plan", estimate_usd=0.2) as call:
        call.record(cost_usd=0.3)
    assert "budget_enforced" not in ctx.graph.node(call.node_id).metadata


# -- a budget spent elsewhere ----------------------------------------------------------------


@pytest.fixture(params=["memory", "redis"])
def make_ledger(
    request: pytest.FixtureRequest,
) -> Iterator[Callable[[], Ledger]]:
    """Ledgers on one scope: the same object in memory, a new connection per call for Redis."""
    made: list[Ledger] = []
    if request.param == "memory":
        shared = InMemoryLedger(_scope())

        def make() -> Ledger:
            return shared

    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        scope = _scope()

        def make() -> Ledger:
            ledger = RedisLedger(server.url, scope, timeout_s=5.0)
            made.append(ledger)
            return ledger

    yield make
    for ledger in made:
        ledger.close()


def _spend_elsewhere(ledger: Ledger, key: str, amount: float) -> None:
    held = reserve(ledger, {key: amount}, {})
    assert held is not None
    ledger.commit(held, {key: amount})


def test_budget_spent_by_another_worker_halts_the_local_call(
    make_ledger: Callable[[], Ledger],
) -> None:
    _spend_elsewhere(make_ledger(), KEY_COST, 0.9)
    ledger = make_ledger()
    # the steps limit comes first: the stop must still name the ceiling that was hit
    ctx = ExecutionContext(limits=[Limit(KEY_STEPS, 100)], max_cost_usd=1.0, ledger=ledger)
    ran: list[str] = []
    with pytest.raises(LimitExceeded) as caught, ctx.llm_call("late", estimate_usd=0.2):
        ran.append("body")
    error = caught.value
    assert type(error) is LimitExceeded
    assert ran == []
    assert error.node_id is not None
    node = ctx.graph.node(error.node_id)
    assert node.status == "halt"
    assert node.stop_reason is not None and "shared budget" in node.stop_reason
    assert KEY_COST in node.stop_reason
    exceeded = ctx.exceeded_limit
    assert exceeded is not None and exceeded is error.exceeded
    assert exceeded.key == KEY_COST
    assert exceeded.limit.max_value == Decimal("1.0")
    assert exceeded.value == Decimal("1.1")
    assert ctx.termination_reason is TerminationReason.LIMIT_EXCEEDED
    assert ctx.stats.reserved() == {}
    assert ledger.reserved() == {}
    assert ledger.spent() == {KEY_COST: Decimal("0.9")}
    # a call that still fits goes through, and its spend is shared
    with ctx.llm_call("small", estimate_usd=0.05) as call:
        call.record(cost_usd=0.05)
    assert ledger.spent()[KEY_COST] == Decimal("0.95")


def test_call_without_estimate_commits_its_cost_and_is_stopped_when_over(
    make_ledger: Callable[[], Ledger],
) -> None:
    ledger = make_ledger()
    ctx = ExecutionContext(max_cost_usd=1.0, ledger=ledger)
    with ctx.llm_call("unestimated") as call:
        call.record(cost_usd=0.7)
    with ctx.tool_call("priced_tool") as tool:
        tool.record(cost_usd=0.2)
    assert ledger.spent()[KEY_COST] == Decimal("0.9")
    _spend_elsewhere(make_ledger(), KEY_COST, 0.4)  # the shared total is now over the ceiling
    other = ExecutionContext(max_cost_usd=1.0, ledger=make_ledger())
    with pytest.raises(LimitExceeded), other.llm_call("also_unestimated"):
        pytest.fail("a shared budget already over its ceiling must stop every call")
    assert other.exceeded_limit is not None and other.exceeded_limit.key == KEY_COST
    assert ledger.reserved() == {}


def test_a_prefix_limit_is_shared_for_each_key_of_its_family(
    make_ledger: Callable[[], Ledger],
) -> None:
    """Input tokens per model, capped at 100 for each model across every worker."""
    _spend_elsewhere(make_ledger(), KEY_INPUT_TOKENS_FOR + "m1", 80)
    per_model = Limit(KEY_INPUT_TOKENS_FOR, 100, LimitType.PREFIX)
    ledger = make_ledger()
    ctx = ExecutionContext(limits=[per_model], ledger=ledger)
    with pytest.raises(LimitExceeded) as caught, ctx.llm_call("a", model="m1", prompt_tokens=30):
        pytest.fail("m1 has 20 tokens left of its shared 100")
    exceeded = caught.value.exceeded
    assert exceeded is not None
    assert exceeded.limit is per_model  # the prefix limit itself, not a stand-in
    assert exceeded.key == KEY_INPUT_TOKENS_FOR + "m1"
    assert exceeded.value == 110
    other = ExecutionContext(limits=[per_model], ledger=make_ledger())
    with other.llm_call("b", model="m2", prompt_tokens=30) as call:  # another model: its own 100
        call.record(tokens_in=25, tokens_out=5, cost_usd=0.0)
    with other.llm_call("c", model="m1") as call:  # no estimate: holds 0, commits what it used
        call.record(tokens_in=40, tokens_out=5, cost_usd=0.0)
    spent = ledger.spent()
    assert spent[KEY_INPUT_TOKENS_FOR + "m2"] == 25
    assert spent[KEY_INPUT_TOKENS_FOR + "m1"] == 120
    with pytest.raises(LimitExceeded), other.llm_call("d", model="m1"):
        pytest.fail("m1 is over its shared ceiling: even an unestimated call must stop")
    assert ledger.reserved() == {}


def test_a_tool_prefix_limit_is_shared(make_ledger: Callable[[], Ledger]) -> None:
    per_tool = Limit(KEY_TOOL_CALLS_FOR, 2, LimitType.PREFIX)
    first = ExecutionContext(limits=[per_tool], ledger=make_ledger())
    second = ExecutionContext(limits=[per_tool], ledger=make_ledger())
    for ctx in (first, second):
        with ctx.tool_call("search"):
            pass
    with pytest.raises(LimitExceeded) as caught, second.tool_call("search"):
        pytest.fail("the two workers already made the two searches allowed")
    assert caught.value.exceeded is not None
    assert caught.value.exceeded.key == KEY_TOOL_CALLS_FOR + "search"
    with first.tool_call("fetch"):  # another tool has its own count
        pass


def test_failed_call_commits_what_it_was_billed(make_ledger: Callable[[], Ledger]) -> None:
    ledger = make_ledger()
    ctx = ExecutionContext(max_cost_usd=1.0, ledger=ledger)
    with (
        pytest.raises(ValueError, match="stream cut"),
        ctx.llm_call("streamed", estimate_usd=0.5) as call,
    ):
        call.record(cost_usd=0.125)
        raise ValueError("stream cut")
    assert ctx.graph.node(call.node_id).status == "fail"
    assert ledger.spent() == {KEY_COST: Decimal("0.125")}
    assert ledger.reserved() == {}


def test_shared_call_count_limit(make_ledger: Callable[[], Ledger]) -> None:
    limits = [Limit(KEY_LLM_CALLS, 3)]
    first = ExecutionContext("first", limits=limits, ledger=make_ledger())
    second = ExecutionContext("second", limits=limits, ledger=make_ledger())
    made = 0
    stopped = 0
    for ctx in (first, second, first, second):
        try:
            with ctx.llm_call("step"):
                made += 1
        except LimitExceeded as exc:
            stopped += 1
            assert exc.exceeded is not None and exc.exceeded.key == KEY_LLM_CALLS
    assert (made, stopped) == (3, 1)
    assert make_ledger().spent() == {KEY_LLM_CALLS: 3.0}
    assert second.exceeded_limit is not None and first.exceeded_limit is None


class _UnreadableLedger(InMemoryLedger):
    """Fault injection: reservations work, but reading the totals fails (a flaky backend)."""

    def spent(self) -> dict[str, float]:
        raise LedgerUnavailable("totals cannot be read right now")


def test_refusal_is_reported_even_when_the_totals_cannot_be_read() -> None:
    ledger = _UnreadableLedger()
    _spend_elsewhere(ledger, KEY_COST, 1.0)
    ctx = ExecutionContext(max_cost_usd=1.0, ledger=ledger)
    with pytest.raises(LimitExceeded) as caught, ctx.llm_call("late", estimate_usd=0.25):
        pytest.fail("the shared budget is spent")
    assert type(caught.value) is LimitExceeded
    assert ctx.exceeded_limit is not None and ctx.exceeded_limit.key == KEY_COST
    assert caught.value.node_id is not None
    assert ctx.graph.node(caught.value.node_id).status == "halt"
    assert ctx.stats.reserved() == {}
    assert ledger.reserved() == {}


# -- sub-agents --------------------------------------------------------------------------------


def test_child_calls_reserve_in_the_parent_ledger(make_ledger: Callable[[], Ledger]) -> None:
    ledger = make_ledger()
    parent = ExecutionContext("planner", max_cost_usd=1.0, ledger=ledger)
    child = parent.spawn_child("researcher")
    with child.llm_call("read", estimate_usd=0.4) as call:
        assert ledger.reserved() == {KEY_COST: Decimal("0.4")}
        call.record(cost_usd=0.5)
    assert ledger.spent() == {KEY_COST: Decimal("0.5")}
    assert ledger.reserved() == {}
    _spend_elsewhere(make_ledger(), KEY_COST, 0.4)
    with pytest.raises(LimitExceeded) as caught, child.llm_call("more", estimate_usd=0.2):
        pytest.fail("the parent's shared budget must stop the child's call")
    assert caught.value.node_id is not None
    assert parent.graph.node(caught.value.node_id).parent_id == child.node_id
    for ctx in (child, parent):
        assert ctx.exceeded_limit is not None and ctx.exceeded_limit.key == KEY_COST
        assert ctx.termination_reason is TerminationReason.LIMIT_EXCEEDED
        assert ctx.stats.reserved() == {}
    assert ledger.reserved() == {}


def test_child_with_its_own_ledger_holds_in_both_and_releases_on_a_stop() -> None:
    outer = InMemoryLedger("tenant")
    inner = InMemoryLedger("run")
    parent = ExecutionContext("planner", max_cost_usd=10.0, ledger=outer)
    child = parent.spawn_child("researcher", max_cost_usd=1.0, ledger=inner)
    with child.llm_call("read", estimate_usd=0.5) as call:
        assert outer.reserved() == {KEY_COST: Decimal("0.5")}
        assert inner.reserved() == {KEY_COST: Decimal("0.5")}
        call.record(cost_usd=0.75)
    assert outer.spent() == inner.spent() == {KEY_COST: Decimal("0.75")}
    # the tenant budget is spent by others: the run's ledger admits, the tenant's refuses,
    # and the hold already taken in the run's ledger must be returned
    _spend_elsewhere(outer, KEY_COST, 9.25)
    with pytest.raises(LimitExceeded) as caught, child.llm_call("more", estimate_usd=0.125):
        pytest.fail("the parent's shared budget is spent")
    assert caught.value.exceeded is not None
    assert caught.value.exceeded.limit.max_value == 10.0
    assert outer.reserved() == {} and inner.reserved() == {}
    assert inner.spent() == {KEY_COST: Decimal("0.75")}
    assert child.exceeded_limit is not None and parent.exceeded_limit is not None
    # and the other way round: the run's own ledger refuses first
    fresh_outer = InMemoryLedger("tenant2")
    other = ExecutionContext("planner2", max_cost_usd=10.0, ledger=fresh_outer)
    sub = other.spawn_child("researcher2", max_cost_usd=1.0, ledger=inner)
    with pytest.raises(LimitExceeded) as caught, sub.llm_call("over", estimate_usd=0.5):
        pytest.fail("the run's shared budget is spent")
    assert caught.value.exceeded is not None
    assert caught.value.exceeded.limit.max_value == 1.0
    assert fresh_outer.reserved() == {} and fresh_outer.spent() == {}
    assert sub.exceeded_limit is not None and other.exceeded_limit is None


# -- a sequential model ------------------------------------------------------------------------

_EIGHTHS = st.integers(min_value=0, max_value=12).map(lambda n: n / 8)  # exact in binary


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    calls=st.lists(
        st.tuples(st.integers(0, 1), _EIGHTHS, _EIGHTHS, st.booleans()), min_size=1, max_size=30
    )
)
def test_sequential_calls_match_a_plain_model(calls: list[tuple[int, float, float, bool]]) -> None:
    ceiling = 3.0
    ledger = InMemoryLedger()
    contexts = [ExecutionContext(f"w{i}", max_cost_usd=ceiling, ledger=ledger) for i in range(2)]
    spent = 0.0
    for which, estimate, actual, fails in calls:
        admit = spent + estimate <= ceiling
        try:
            with contexts[which].llm_call("c", estimate_usd=estimate or None) as call:
                call.record(cost_usd=actual)
                if fails:
                    raise RuntimeError("provider error after billing")
        except LimitExceeded:
            assert not admit
            continue
        except RuntimeError:
            assert fails
        assert admit
        spent += actual
        assert ledger.spent().get(KEY_COST, 0.0) == spent
        assert ledger.reserved() == {}
    for ctx in contexts:
        assert ctx.stats.reserved() == {}


# -- settings ----------------------------------------------------------------------------------


def test_bad_ledger_settings_raise() -> None:
    with pytest.raises(ValueError, match="on_ledger_error"):
        ExecutionContext(ledger=InMemoryLedger(), on_ledger_error="ignore")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="ledger must be a Ledger"):
        ExecutionContext(ledger={"amp:cost": 1.0})  # type: ignore[arg-type]


# -- asyncio: ledger round trips run off the event loop ---------------------------------------


class _GatedLedger(InMemoryLedger):
    """An in-memory ledger whose reserve() waits until the test opens a gate (a slow Redis)."""

    def __init__(self, scope: str) -> None:
        super().__init__(scope)
        self.entered = threading.Event()
        self.gate = threading.Event()

    def try_reserve(
        self, amounts: Mapping[str, float], ceilings: Mapping[str, float], **kwargs: Any
    ) -> Any:
        self.entered.set()
        if not self.gate.wait(timeout=30):
            raise AssertionError("the gate was never opened: the event loop was blocked")
        return super().try_reserve(amounts, ceilings, **kwargs)


async def test_async_calls_reserve_off_the_event_loop() -> None:
    ledger = _GatedLedger(_scope())
    ctx = ExecutionContext(max_cost_usd=1.0, ledger=ledger)

    async def open_gate() -> None:
        await asyncio.to_thread(ledger.entered.wait, 30)
        ledger.gate.set()  # runs only if the loop is free while reserve() waits

    opener = asyncio.create_task(open_gate())
    async with ctx.llm_call("slow_ledger", estimate_usd=0.1) as call:
        call.record(tokens_in=1, tokens_out=1, cost_usd=0.05)
    await opener
    assert ledger.spent() == {KEY_COST: Decimal("0.05")}
    assert ledger.reserved() == {}
    assert ctx.stats.total_cost() == Decimal("0.05")


async def test_a_task_cancelled_while_its_ledger_reserves_leaves_nothing_held() -> None:
    ledger = _GatedLedger(_scope())
    ctx = ExecutionContext(max_cost_usd=1.0, ledger=ledger)
    ran: list[str] = []

    async def worker() -> None:
        async with ctx.llm_call("cancelled", estimate_usd=0.3):
            ran.append("body")

    task = asyncio.create_task(worker())
    await asyncio.to_thread(ledger.entered.wait, 30)
    task.cancel()
    await asyncio.sleep(0)
    ledger.gate.set()  # the reserve completes on its thread after the cancel
    with pytest.raises(asyncio.CancelledError):
        await task
    assert ran == []
    assert ledger.reserved() == {}
    assert ctx.stats.reserved() == {}
    (node,) = [n for n in ctx.graph.nodes() if n.kind == "llm"]
    assert node.status == "halt" and node.stop_reason == "interrupted"


async def test_concurrent_async_calls_share_a_ledger_exactly(
    make_ledger: Callable[[], Ledger],
) -> None:
    ctx = ExecutionContext(max_cost_usd=1.0, ledger=make_ledger())

    async def one(i: int) -> None:
        async with ctx.llm_call(f"c{i}", estimate_usd=0.02) as call:
            await asyncio.sleep(0)
            call.record(tokens_in=3, tokens_out=1, cost_usd=0.01)

    await asyncio.gather(*(one(i) for i in range(40)))
    ledger = make_ledger()
    assert ledger.spent()[KEY_COST] == Decimal("0.4")
    assert ledger.reserved() == {}
    assert ctx.stats.total_cost() == Decimal("0.4")
    assert ctx.stats.get_counter(KEY_LLM_CALLS) == 40
