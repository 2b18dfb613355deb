"""Waiting instead of refusing, through a shared ledger and under ``async with``.

Real processes on one SQLite file and on one real Redis server share a cap: a call that fits
what is spent waits for the others' holds; only a call that does not fit what is spent is
refused, so no worker stops while the budget could still pay for its call, and none overshoots.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from ampmeter import BudgetBusy, ExecutionContext, LimitExceeded
from ampmeter.keys import KEY_COST, KEY_RETRIES
from ampmeter.ledgers import InMemoryLedger, Ledger, RedisLedger, SqliteLedger
from support.ledger_backends import reserve
from support.redis_server import RedisServer, redis_server_fixture  # noqa: F401

CAP = Decimal("1.0")
ESTIMATE = Decimal("0.07")  # money is exact: sums compare exactly
COSTS = (Decimal("0.03"), Decimal("0.05"), Decimal("0.07"))

# One worker process: calls of ESTIMATE (each costing one of COSTS, holding for a moment)
# until the shared cap refuses it; prints what it made and how it was stopped.
WORKER = """
import json, os, random, sys, time
from decimal import Decimal
from ampmeter import BudgetBusy, ExecutionContext, LimitExceeded

if os.environ["LEDGER"].startswith("redis"):
    from ampmeter.ledgers import RedisLedger
    ledger = RedisLedger(os.environ["LEDGER"], os.environ["SCOPE"], timeout_s=5.0)
else:
    from ampmeter.ledgers import SqliteLedger
    ledger = SqliteLedger(os.environ["LEDGER"], os.environ["SCOPE"])
costs = [Decimal(c) for c in json.loads(os.environ["COSTS"])]
rng = random.Random(int(os.environ["SEED"]))
made, spent, stop, busy = 0, Decimal(0), None, False
ctx = ExecutionContext(max_cost_usd=Decimal(os.environ["CAP"]), ledger=ledger,
                       admission_timeout_s=120)
start = float(os.environ["START"])
time.sleep(max(0.0, start - time.time()))
try:
    while True:
        with ctx.llm_call("work", estimate_usd=Decimal(os.environ["ESTIMATE"])) as call:
            time.sleep(rng.uniform(0.005, 0.03))
            cost = rng.choice(costs)
            call.record(10, 5, cost_usd=cost)
        made += 1
        spent += cost
except BudgetBusy as exc:
    stop, busy = str(exc), True
except LimitExceeded as exc:
    stop = str(exc)
ledger.close()
print(json.dumps({"made": made, "spent": str(spent), "stop": stop, "busy": busy}))
"""


def _run_workers(ledger_arg: str, scope: str, workers: int) -> list[dict[str, Any]]:
    start = time.time() + 2.0  # every process starts calling at once, after its imports
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER],
            env={
                **os.environ,
                "LEDGER": ledger_arg,
                "SCOPE": scope,
                "CAP": str(CAP),
                "ESTIMATE": str(ESTIMATE),
                "COSTS": json.dumps([str(cost) for cost in COSTS]),
                "SEED": str(seed),
                "START": repr(start),
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in range(workers)
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        results.append(json.loads(out))
    return results


def _check_the_cap_was_used_up(results: list[dict[str, Any]], spent: Decimal) -> None:
    # Nobody waited out its time, everyone was refused by what was spent: no early refusal.
    assert not any(r["busy"] for r in results), [r["stop"] for r in results if r["busy"]]
    # (by the shared ledger, or by the worker's own local check once its own spend was enough)
    assert all("amp:cost" in r["stop"] for r in results), [r["stop"] for r in results]
    # 0 overshoot, and what is left cannot pay for one more call (else someone stopped early).
    assert spent <= CAP
    assert CAP - spent < ESTIMATE
    # Exact accounting: the ledger holds what the workers recorded, once.
    assert spent == sum(Decimal(r["spent"]) for r in results)


def test_processes_on_one_sqlite_cap_wait_for_each_other_and_use_it_up(tmp_path: Path) -> None:
    path = tmp_path / "budget.sqlite3"
    results = _run_workers(str(path), "team", 8)
    with SqliteLedger(path, "team") as ledger:
        spent = ledger.spent()[KEY_COST]
        assert ledger.reserved() == {}
    _check_the_cap_was_used_up(results, spent)


def test_processes_on_one_redis_cap_wait_for_each_other_and_use_it_up(
    redis_server: RedisServer,
) -> None:
    scope = f"team-{uuid.uuid4().hex}"
    results = _run_workers(redis_server.url, scope, 8)
    with RedisLedger(redis_server.url, scope, timeout_s=5.0) as ledger:
        spent = ledger.spent()[KEY_COST]
        assert ledger.reserved() == {}
    _check_the_cap_was_used_up(results, spent)


def _hold_elsewhere(ledger: Ledger, amount: float) -> Any:
    """Another process's call in flight: a hold on the ledger that nothing here knows of."""
    held = reserve(ledger, {KEY_COST: amount}, {KEY_COST: CAP})
    assert held is not None
    return held


def test_a_call_blocked_by_another_process_hold_waits_until_it_settles(tmp_path: Path) -> None:
    ledger = SqliteLedger(tmp_path / "budget.sqlite3", "team")
    other = SqliteLedger(tmp_path / "budget.sqlite3", "team")
    held = _hold_elsewhere(other, 0.75)
    threading.Timer(0.3, other.commit, (held, {KEY_COST: 0.5})).start()
    ctx = ExecutionContext(max_cost_usd=CAP, ledger=ledger, admission_timeout_s=60)
    with ctx.llm_call("waits", estimate_usd=0.5) as call:  # 0.75 held elsewhere: no room yet
        call.record(1, 1, cost_usd=0.25)
    assert ledger.spent() == {KEY_COST: Decimal("0.75")}
    assert ledger.reserved() == {}
    ledger.close()
    other.close()


def test_a_wait_for_other_processes_is_bounded_then_budget_busy(tmp_path: Path) -> None:
    ledger = SqliteLedger(tmp_path / "budget.sqlite3", "team")
    held = _hold_elsewhere(ledger, 0.75)
    ctx = ExecutionContext(max_cost_usd=CAP, ledger=ledger, admission_timeout_s=0.3)
    started = time.monotonic()
    with pytest.raises(BudgetBusy) as info, ctx.llm_call("busy", estimate_usd=0.5):
        pytest.fail("ran")
    assert time.monotonic() - started >= 0.25
    assert "admission_timeout_s" in str(info.value) and "'team'" in str(info.value)
    assert info.value.exceeded is not None and info.value.exceeded.key == KEY_COST
    node = ctx.graph.node(info.value.node_id or "")
    assert node.status == "halt" and "in flight" in (node.stop_reason or "")
    assert ctx.stats.reserved() == {}
    assert ledger.reserved() == {KEY_COST: Decimal("0.75")}  # only the other's hold
    ledger.release(held)
    ledger.close()


def test_a_call_that_does_not_fit_what_another_process_spent_is_refused_at_once(
    tmp_path: Path,
) -> None:
    ledger = SqliteLedger(tmp_path / "budget.sqlite3", "team")
    ledger.commit(_hold_elsewhere(ledger, 0.75), {KEY_COST: 0.75})
    _hold_elsewhere(ledger, 0.125)  # held too, but the spend alone refuses
    ctx = ExecutionContext(max_cost_usd=CAP, ledger=ledger, admission_timeout_s=60)
    started = time.monotonic()
    with pytest.raises(LimitExceeded) as info, ctx.llm_call("late", estimate_usd=0.5):
        pytest.fail("ran")
    assert type(info.value) is LimitExceeded
    assert time.monotonic() - started < 30  # no waiting for money that is spent
    assert ctx.exceeded_limit is not None and ctx.exceeded_limit.key == KEY_COST
    ledger.close()


def test_an_enclosing_calls_own_hold_is_not_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call nested in the call holding the rest of a parent's budget (checked only in the
    ledger: it is a hand-off's ancestor) could wait only for itself: busy at once."""
    monkeypatch.setenv("AMPMETER_HANDOFF_KEY", "test-handoff-key")  # tokens are signed
    ledger = SqliteLedger(tmp_path / "budget.sqlite3", "team")
    parent = ExecutionContext(max_cost_usd=CAP, ledger=ledger)
    child = ExecutionContext.from_handoff(parent.handoff("child"), ledger=ledger)
    started = time.monotonic()
    with child.llm_call("outer", estimate_usd=0.75) as outer:
        with pytest.raises(BudgetBusy) as info, child.llm_call("inner", estimate_usd=0.5):
            pytest.fail("ran")
        outer.record(1, 1, cost_usd=0.25)
    assert time.monotonic() - started < 30
    assert "'team'" in str(info.value)
    assert ledger.reserved() == {}
    assert ledger.spent()[KEY_COST] == Decimal("0.25")
    child.close()
    parent.close()
    assert parent.stats.total_cost() == Decimal("0.25")
    ledger.close()


# -- async with: awaited, not blocking the loop and not refused at once ------------------------


def _contexts() -> list[tuple[str, Callable[..., ExecutionContext]]]:
    return [
        (
            "in-process",
            lambda wait=60: ExecutionContext(max_cost_usd=CAP, admission_timeout_s=wait),
        ),
        (
            "ledger",
            lambda wait=60: ExecutionContext(
                max_cost_usd=CAP,
                ledger=InMemoryLedger(f"team-{uuid.uuid4().hex}"),
                admission_timeout_s=wait,
            ),
        ),
    ]


@pytest.mark.parametrize(("kind", "make"), _contexts(), ids=[k for k, _ in _contexts()])
async def test_async_tasks_on_one_cap_await_each_other_and_use_it_up(
    kind: str, make: Callable[..., ExecutionContext]
) -> None:
    ctx = make()
    refused: list[BaseException] = []
    made: list[Decimal] = []

    async def worker(seed: int) -> None:
        step = 0
        while True:
            try:
                async with ctx.llm_call("work", estimate_usd=ESTIMATE) as call:
                    await asyncio.sleep(0.002 * ((seed + step) % 5))
                    cost = COSTS[(seed + step) % len(COSTS)]
                    call.record(1, 1, cost_usd=cost)
                made.append(cost)
                step += 1
            except LimitExceeded as exc:
                refused.append(exc)
                return

    await asyncio.gather(*(worker(seed) for seed in range(32)))
    assert len(refused) == 32
    assert not any(isinstance(exc, BudgetBusy) for exc in refused)  # nobody refused early
    spent = ctx.stats.total_cost()
    assert spent == sum(made)
    assert spent <= CAP and CAP - spent < ESTIMATE
    assert ctx.stats.reserved() == {}
    if ctx.ledger is not None:
        assert ctx.ledger.spent() == {KEY_COST: spent} and ctx.ledger.reserved() == {}


@pytest.mark.parametrize(("kind", "make"), _contexts(), ids=[k for k, _ in _contexts()])
async def test_an_async_wait_is_bounded_and_the_loop_runs_meanwhile(
    kind: str, make: Callable[..., ExecutionContext]
) -> None:
    ctx = make(0.3)  # the test's own short bound
    ticks = 0
    holding = asyncio.Event()
    release = asyncio.Event()

    async def holder() -> None:
        async with ctx.llm_call("big", estimate_usd=0.75) as call:
            holding.set()
            await release.wait()
            call.record(1, 1, cost_usd=0.25)

    async def ticker() -> None:
        nonlocal ticks
        while not release.is_set():
            ticks += 1
            await asyncio.sleep(0.01)

    task = asyncio.create_task(holder())
    await holding.wait()
    clock = asyncio.create_task(ticker())
    with pytest.raises(BudgetBusy):
        async with ctx.llm_call("small", estimate_usd=0.5):
            pytest.fail("ran")
    assert ticks >= 5  # the loop went on while the call waited
    release.set()
    await asyncio.gather(task, clock)
    async with ctx.llm_call("after", estimate_usd=0.5) as call:  # room again
        call.record(1, 1, cost_usd=0.5)
    assert ctx.stats.total_cost() == Decimal("0.75")
    assert ctx.stats.reserved() == {}


async def test_an_async_call_cancelled_while_it_waits_holds_nothing() -> None:
    ledger = InMemoryLedger(f"team-{uuid.uuid4().hex}")
    ctx = ExecutionContext(max_cost_usd=CAP, ledger=ledger, admission_timeout_s=60)
    other = _hold_elsewhere(ledger, 0.75)

    async def waiter() -> None:
        async with ctx.llm_call("waits", estimate_usd=0.5):
            pytest.fail("ran")

    task = asyncio.create_task(waiter())
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    (node,) = [n for n in ctx.graph.nodes() if n.kind == "llm"]
    assert node.status == "halt" and node.stop_reason == "interrupted"
    assert ctx.stats.reserved() == {}
    assert ledger.reserved() == {KEY_COST: Decimal("0.75")}
    ledger.release(other)


# -- retries roll up through the ledger ---------------------------------------------------------


def test_retries_reach_a_shared_retries_ceiling(tmp_path: Path) -> None:
    path = tmp_path / "budget.sqlite3"
    first = ExecutionContext(max_retries=3, ledger=SqliteLedger(path, "team"))
    second = ExecutionContext(max_retries=3, ledger=SqliteLedger(path, "team"))
    with first.llm_call("flaky", estimate_usd=0.0) as call:
        call.retry()
        call.retry()
        call.record(1, 1, cost_usd=0.0)
    assert first.ledger is not None and first.ledger.spent()[KEY_RETRIES] == 2.0
    with second.llm_call("flaky", estimate_usd=0.0) as call:
        call.retry()
        call.record(1, 1, cost_usd=0.0)
    # 3 retries spent across both processes' contexts: the ceiling (3) is reached, not passed
    assert second.ledger is not None and second.ledger.spent()[KEY_RETRIES] == 3.0
