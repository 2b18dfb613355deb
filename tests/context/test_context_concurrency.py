"""Concurrent calls against one cost ceiling: reservations keep them from jointly overshooting.

The admission rule is ``committed + reserved + estimate <= ceiling``. Right after any admission
``committed + reserved`` is therefore within the ceiling; it can rise above it only when calls in
flight settle with an actual cost above their estimate. So the overshoot is bounded by the sum of
the positive ``actual - estimate`` differences of the calls that were in flight together: with
one call at a time that is the largest single difference, with ``k`` workers at most the ``k``
largest ones.
"""

from __future__ import annotations

import asyncio
import math
import random
import threading
import time
from decimal import Decimal

import pytest

from ampmeter import ExecutionContext, LimitExceeded
from ampmeter.keys import KEY_COST, KEY_LLM_CALLS, KEY_STEPS

CEILING = 1.0
WORKERS = 32
TOL = 1e-9


def _committed_plus_reserved(ctx: ExecutionContext) -> float:
    # What is spent first, then what is held: a call settling between the two reads moves its
    # amount from held to spent, so the sum read is never above the true one at the second read.
    spent = ctx.stats.get_gauge(KEY_COST)
    return float(spent + ctx.stats.reserved().get(KEY_COST, 0))


def _top_positive_sum(diffs: list[float], k: int) -> float:
    return math.fsum(sorted((d for d in diffs if d > 0), reverse=True)[:k])


def _draw(rng: random.Random) -> tuple[float, float]:
    """An estimate and a cost in whole nano-dollars (as written), so sums compare exactly."""
    estimate = round(rng.uniform(0.002, 0.01), 9)
    actual = round(estimate * rng.uniform(0.6, 1.25), 9)  # about a quarter cost more
    return estimate, actual


def _exact(costs: list[float]) -> Decimal:
    """The exact sum of costs written as floats, each read as written."""
    return sum((Decimal(repr(cost)) for cost in costs), Decimal(0))


def test_threads_racing_against_a_cost_ceiling() -> None:
    ctx = ExecutionContext(max_cost_usd=CEILING)
    recorded: list[float] = []
    diffs: list[float] = []
    refused: list[int] = []
    samples: list[float] = []
    barrier = threading.Barrier(WORKERS + 1)
    stop = threading.Event()

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        barrier.wait()
        while True:
            estimate, actual = _draw(rng)
            try:
                with ctx.llm_call("c", model="m", estimate_usd=estimate) as call:
                    time.sleep(rng.uniform(0, 0.002))
                    call.record(tokens_in=1, tokens_out=1, cost_usd=actual)
            except LimitExceeded:
                refused.append(seed)
                return
            recorded.append(actual)
            diffs.append(actual - estimate)

    def sampler() -> None:
        barrier.wait()
        while not stop.is_set():
            samples.append(_committed_plus_reserved(ctx))
            time.sleep(0.0002)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(WORKERS)]
    watcher = threading.Thread(target=sampler)
    watcher.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    watcher.join()
    ctx.close()

    assert sorted(refused) == list(range(WORKERS))  # every worker ran into the ceiling
    assert any(d > 0 for d in diffs)  # some calls did cost more than their estimate
    bound = CEILING + _top_positive_sum(diffs, WORKERS)
    total = float(ctx.stats.total_cost())
    assert total <= bound + TOL
    assert max(samples) <= bound + TOL
    assert total >= CEILING / 2  # the race really ran up to the ceiling
    # Totals are the recorded costs exactly, in the stats and in the graph.
    assert ctx.stats.total_cost() == _exact(recorded)
    assert ctx.graph.aggregates()["total_cost_usd"] == _exact(recorded)
    assert ctx.stats.get_counter(KEY_LLM_CALLS) == len(recorded)
    assert ctx.stats.get_counter(KEY_STEPS) == len(recorded)
    assert ctx.stats.reserved() == {}
    halted = [n for n in ctx.graph.nodes() if n.status == "halt" and n.parent_id is not None]
    assert len(halted) == WORKERS


async def test_asyncio_tasks_racing_against_a_cost_ceiling() -> None:
    ctx = ExecutionContext(max_cost_usd=CEILING)
    recorded: list[float] = []
    diffs: list[float] = []
    in_flight: dict[int, float] = {}  # call number -> actual - estimate
    after_admission: list[float] = []
    last: dict[str, float] = {}

    async def worker(seed: int) -> None:
        rng = random.Random(seed)
        n = 0
        while True:
            n += 1
            key = seed * 100_000 + n
            estimate, actual = _draw(rng)
            try:
                async with ctx.llm_call("c", model="m", estimate_usd=estimate) as call:
                    # No other task runs between admission and here: the state is exact.
                    level = _committed_plus_reserved(ctx)
                    after_admission.append(level)
                    in_flight[key] = actual - estimate
                    last["level"] = level
                    last["in_flight"] = math.fsum(in_flight.values())
                    await asyncio.sleep(rng.uniform(0, 0.002))
                    call.record(tokens_in=1, tokens_out=1, cost_usd=actual)
                del in_flight[key]
            except LimitExceeded:
                return
            recorded.append(actual)
            diffs.append(actual - estimate)

    await asyncio.gather(*(worker(i) for i in range(WORKERS)))
    ctx.close()

    assert after_admission and max(after_admission) <= CEILING + TOL
    total = float(ctx.stats.total_cost())
    # After the last admission nothing new was reserved; every call then in flight settled at
    # its actual cost, so the final total is exactly that level plus their differences.
    assert total == pytest.approx(last["level"] + last["in_flight"], abs=TOL)
    assert total <= CEILING + _top_positive_sum(diffs, WORKERS) + TOL
    assert ctx.stats.total_cost() == _exact(recorded)
    assert ctx.graph.aggregates()["total_cost_usd"] == _exact(recorded)
    assert ctx.stats.reserved() == {}


def test_one_call_at_a_time_overshoots_by_at_most_the_largest_difference() -> None:
    rng = random.Random(7)
    ctx = ExecutionContext(max_cost_usd=CEILING)
    diffs: list[float] = []
    recorded: list[float] = []
    with pytest.raises(LimitExceeded):
        while True:
            estimate, actual = _draw(rng)
            with ctx.llm_call("c", estimate_usd=estimate) as call:
                call.record(tokens_in=1, tokens_out=1, cost_usd=actual)
            diffs.append(actual - estimate)
            recorded.append(actual)
    total = float(ctx.stats.total_cost())
    assert total <= CEILING + max(0.0, max(diffs)) + TOL
    assert ctx.stats.total_cost() == _exact(recorded)
    ctx.close()


def test_calls_in_flight_together_add_their_overshoots() -> None:
    """Two admitted calls that both cost more than estimated: both overshoots land (bound = sum)."""
    ctx = ExecutionContext(max_cost_usd=CEILING)
    both_inside = threading.Barrier(2)

    def call() -> None:
        with ctx.llm_call("c", estimate_usd=0.5) as c:
            both_inside.wait(timeout=10)
            c.record(tokens_in=1, tokens_out=1, cost_usd=0.6)

    threads = [threading.Thread(target=call) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert ctx.stats.total_cost() == Decimal("1.2")
    # Once over, nothing more is admitted, not even a call with no estimate of its own.
    with pytest.raises(LimitExceeded), ctx.llm_call("c"):
        pytest.fail("ran")
    ctx.close()


def test_children_in_threads_share_the_parent_ceiling() -> None:
    parent = ExecutionContext(max_cost_usd=CEILING)
    children = [parent.spawn_child(f"sub{i}", max_cost_usd=0.5) for i in range(8)]
    diffs: list[float] = []
    recorded: list[float] = []

    def worker(i: int) -> None:
        rng = random.Random(100 + i)
        child = children[i % len(children)]
        while True:
            estimate, actual = _draw(rng)
            try:
                with child.llm_call("c", estimate_usd=estimate) as call:
                    time.sleep(rng.uniform(0, 0.001))
                    call.record(tokens_in=1, tokens_out=1, cost_usd=actual)
            except LimitExceeded:
                return
            recorded.append(actual)
            diffs.append(actual - estimate)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total = float(parent.stats.total_cost())
    assert total <= CEILING + _top_positive_sum(diffs, 16) + TOL
    assert parent.stats.total_cost() == _exact(recorded)
    assert sum(c.stats.total_cost() for c in children) == parent.stats.total_cost()
    for child in children:
        assert child.stats.total_cost() <= 0.5 + _top_positive_sum(diffs, 2) + TOL
        child.close()
    parent.close()
