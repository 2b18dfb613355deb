"""Waiting instead of refusing: a call that fits what is spent waits for calls in flight."""

from __future__ import annotations

import threading
import time
from decimal import Decimal

import pytest

from ampmeter import BudgetBusy, ExecutionContext, LimitExceeded
from ampmeter.keys import KEY_COST


def test_a_call_blocked_only_by_calls_in_flight_waits_for_them() -> None:
    ctx = ExecutionContext(max_cost_usd=1.0)
    held = threading.Event()
    release = threading.Event()

    def holder() -> None:
        with ctx.llm_call("big", estimate_usd=0.9) as call:
            held.set()
            release.wait(10)
            call.record(tokens_in=1, tokens_out=1, cost_usd=0.3)  # cheaper than reserved

    worker = threading.Thread(target=holder)
    worker.start()
    assert held.wait(10)
    threading.Timer(0.2, release.set).start()
    started = time.monotonic()
    with ctx.llm_call("small", estimate_usd=0.5) as call:  # 0.9 held: does not fit yet
        call.record(tokens_in=1, tokens_out=1, cost_usd=0.5)
    assert time.monotonic() - started >= 0.15  # it waited for the holder to settle
    worker.join()
    assert ctx.stats.total_cost() == Decimal("0.8")
    assert ctx.stats.reserved() == {}


def test_a_call_that_does_not_fit_what_is_spent_is_refused_at_once() -> None:
    ctx = ExecutionContext(max_cost_usd=1.0, admission_timeout_s=30)
    with ctx.llm_call("a", estimate_usd=0.1) as call:
        call.record(tokens_in=1, tokens_out=1, cost_usd=0.8)
    started = time.monotonic()
    with pytest.raises(LimitExceeded) as info, ctx.llm_call("b", estimate_usd=0.5):
        pytest.fail("ran")
    assert not isinstance(info.value, BudgetBusy)
    assert time.monotonic() - started < 5  # no wait: the money is spent
    assert info.value.exceeded is not None and info.value.exceeded.key == KEY_COST


def test_the_wait_is_bounded_and_then_budget_busy() -> None:
    ctx = ExecutionContext(max_cost_usd=1.0, admission_timeout_s=0.3)
    held = threading.Event()
    release = threading.Event()

    def holder() -> None:
        with ctx.llm_call("big", estimate_usd=0.9) as call:
            held.set()
            release.wait(10)
            call.record(tokens_in=1, tokens_out=1, cost_usd=0.1)

    worker = threading.Thread(target=holder)
    worker.start()
    assert held.wait(10)
    try:
        with pytest.raises(BudgetBusy) as info, ctx.llm_call("small", estimate_usd=0.5):
            pytest.fail("ran")
        assert "admission_timeout_s" in str(info.value)
        node = ctx.graph.node(info.value.node_id or "")
        assert node.status == "halt" and "in flight" in (node.stop_reason or "")
    finally:
        release.set()
        worker.join()


def test_own_calls_in_flight_are_not_waited_for() -> None:
    """One thread holding the budget itself cannot wait for itself: refused at once."""
    ctx = ExecutionContext(max_cost_usd=1.0, admission_timeout_s=30)
    outer = ctx.llm_call("outer", estimate_usd=0.9).start()
    started = time.monotonic()
    with pytest.raises(BudgetBusy):
        ctx.llm_call("inner", estimate_usd=0.5).start()
    assert time.monotonic() - started < 5
    outer.finish()


@pytest.mark.parametrize("workers", [8, 32, 128])
def test_many_workers_on_one_cap_never_overshoot_and_none_is_refused_early(workers: int) -> None:
    """Estimates are 1.5x the real cost: without waiting, in-flight holds refused workers while
    money remained. With waiting, every refusal happens only once the spent money is close to
    the cap, and the cap is never passed."""
    cap = Decimal("1.0")
    ctx = ExecutionContext(max_cost_usd=cap, admission_timeout_s=30)
    early: list[Decimal] = []
    lock = threading.Lock()
    barrier = threading.Barrier(workers)

    def worker() -> None:
        barrier.wait()
        while True:
            try:
                with ctx.llm_call("c", estimate_usd=0.015) as call:
                    time.sleep(0.001)
                    call.record(tokens_in=1, tokens_out=1, cost_usd=0.01)
            except LimitExceeded:
                spent = ctx.stats.total_cost()
                if spent + Decimal("0.015") <= cap:  # refused although the spent money left room
                    with lock:
                        early.append(spent)
                return

    threads = [threading.Thread(target=worker) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert ctx.stats.total_cost() <= cap
    assert ctx.stats.total_cost() > cap - Decimal("0.015")  # the cap was used up
    assert early == []
