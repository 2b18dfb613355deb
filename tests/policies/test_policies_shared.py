"""Policies through a shared ledger, across real processes: windowed limits, the loop guard,
warnings, soft limits and budget pressure on one SqliteLedger file and on a real redis-server."""

from __future__ import annotations

import multiprocessing
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import openai
import pytest

import ampmeter
from ampmeter import ExecutionContext, LimitExceeded
from ampmeter.integrations import instrument, uninstrument
from ampmeter.keys import KEY_COST, KEY_LLM_CALLS
from ampmeter.ledgers import Ledger, RedisLedger, SqliteLedger
from ampmeter.limits import Limit
from ampmeter.policies import KEY_REPEATS_FOR, SHARED_READ_S
from ampmeter.testing.replay import ReplayServer
from support.processes import gather
from support.redis_server import RedisServer, redis_server_fixture  # noqa: F401
from support.wire import chat_completion

PROCESSES = 3

# Where a worker process finds the ledger: ("sqlite", path) or ("redis", url).
Place = tuple[str, str]


def _open(place: Place, scope: str) -> Ledger:
    backend, where = place
    if backend == "sqlite":
        return SqliteLedger(where, scope, timeout_s=30.0)
    return RedisLedger(where, scope, timeout_s=10.0)


@pytest.fixture(params=["sqlite", "redis"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Place:
    if request.param == "sqlite":
        return ("sqlite", str(tmp_path / "budget.db"))
    server: RedisServer = request.getfixturevalue("redis_server")
    return ("redis", server.url)


def _in_processes(
    work: Callable[[ExecutionContext], dict[str, Any]],
    place: Place,
    scope: str,
    options: dict[str, Any],
) -> list[dict[str, Any]]:
    """Run ``work`` in PROCESSES forked processes, each with its own context on the ledger
    scope, started together; return what each returned."""
    mp = multiprocessing.get_context("fork")
    out = mp.Queue()
    start = mp.Barrier(PROCESSES)

    def worker(index: int) -> None:
        try:
            ledger = _open(place, scope)
            ctx = ExecutionContext(f"worker-{index}", ledger=ledger, **options)
            start.wait(timeout=60)  # all begin together, so their calls interleave
            with ctx:
                result = work(ctx)
            ledger.close()
            out.put(result)
        except BaseException:
            out.put({"error": traceback.format_exc()})

    workers = [mp.Process(target=worker, args=(index,)) for index in range(PROCESSES)]
    results = gather(workers, out)
    for result in results:
        assert "error" not in result, result["error"]
    return results


# -- windowed limits ------------------------------------------------------------------------------


def _calls(attempts: int) -> Callable[[ExecutionContext], dict[str, Any]]:
    def work(ctx: ExecutionContext) -> dict[str, Any]:
        made, refused = 0, []
        for index in range(attempts):
            try:
                with ctx.llm_call(f"call-{index}", estimate_usd=0.01) as call:
                    call.record(10, 5, cost_usd=0.01)
                made += 1
            except LimitExceeded as stop:
                refused.append(str(stop))
        return {"made": made, "refused": refused}

    return work


def test_a_window_caps_the_calls_of_every_process_together(place: Place) -> None:
    scope = f"window-{uuid.uuid4().hex}"
    per_hour = Limit(KEY_LLM_CALLS, 5, window_s=3600)
    results = _in_processes(_calls(4), place, scope, {"limits": [per_hour]})
    assert sum(r["made"] for r in results) == 5  # 12 attempts, 5 fit the shared window
    refused = [text for r in results for text in r["refused"]]
    assert len(refused) == 7
    assert all("limit exceeded in 3600s" in text for text in refused), refused
    with _open(place, scope) as ledger:
        assert ledger.recent(KEY_LLM_CALLS, 3600) == 5.0
        assert ledger.reserved() == {}


def test_a_window_slides_in_the_shared_ledger(place: Place) -> None:
    scope = f"slide-{uuid.uuid4().hex}"
    with _open(place, scope) as ledger:
        limits = [Limit(KEY_LLM_CALLS, 2, window_s=1.0)]
        with ExecutionContext(limits=limits, ledger=ledger) as ctx:
            assert _calls(3)(ctx)["made"] == 2
            deadline = time.monotonic() + 30
            while ledger.recent(KEY_LLM_CALLS, 1.0) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert _calls(1)(ctx)["made"] == 1  # the first two left the window
        assert ledger.spent()[KEY_LLM_CALLS] == 3.0


# -- the loop guard -------------------------------------------------------------------------------


def _same_search(ctx: ExecutionContext) -> dict[str, Any]:
    made, refused = 0, []
    for _ in range(2):  # under max_repeats in each process alone
        try:
            with ctx.tool_call("search", arguments={"q": "paris"}):
                made += 1
        except LimitExceeded as stop:
            assert stop.exceeded is not None
            refused.append((str(stop), stop.exceeded.key))
    return {"made": made, "refused": refused}


def test_the_same_request_in_several_processes_is_a_loop(place: Place) -> None:
    scope = f"loop-{uuid.uuid4().hex}"
    results = _in_processes(_same_search, place, scope, {"max_repeats": 3})
    assert sum(r["made"] for r in results) == 3
    refused = [item for r in results for item in r["refused"]]
    assert len(refused) == 3
    assert all(
        "loop detected" in text and key.startswith(KEY_REPEATS_FOR) for text, key in refused
    ), refused
    with _open(place, scope) as ledger:
        spent = ledger.spent()
        assert [value for key, value in spent.items() if key.startswith(KEY_REPEATS_FOR)] == [3.0]


def test_a_failed_repeat_still_counts_in_the_shared_budget(place: Place) -> None:
    with _open(place, f"fail-{uuid.uuid4().hex}") as ledger:
        ctx = ExecutionContext(max_repeats=1, ledger=ledger)
        with ctx, pytest.raises(RuntimeError), ctx.tool_call("fetch", arguments=["x"]):
            raise RuntimeError("the tool failed")
        other = ExecutionContext(max_repeats=1, ledger=ledger)  # a fresh local count
        with other:
            stopped = pytest.raises(LimitExceeded, match="loop detected")
            with stopped, other.tool_call("fetch", arguments=["x"]):
                pytest.fail("the second identical call ran")
            with other.tool_call("fetch", arguments=["y"]):  # other arguments: not a repeat
                pass


# -- warnings and soft limits ---------------------------------------------------------------------


def _spend(ctx: ExecutionContext) -> dict[str, Any]:
    for index in range(4):
        with ctx.llm_call(f"step-{index}", estimate_usd=0.1) as call:
            call.record(10, 5, cost_usd=0.1)
    events = [event["kind"] for event in ctx.snapshot()["limit_events"]]
    time.sleep(SHARED_READ_S)  # past the cached read: wrap_up reads the shared total again
    return {"events": events, "wrapped": ctx.wrap_up}


def test_a_warning_and_a_soft_stop_come_from_the_shared_total(place: Place) -> None:
    scope = f"warn-{uuid.uuid4().hex}"
    options = {
        "max_cost_usd": 5.0,
        "limits": [Limit(KEY_COST, 0.5, soft=True), Limit(KEY_COST, 2.0, warn_at=(0.25,))],
    }
    # 3 processes x 4 calls x 0.1: no process alone reaches 0.5 (soft) or 0.5 (a quarter of 2.0)
    results = _in_processes(_spend, place, scope, options)
    events = [kind for r in results for kind in r["events"]]
    assert sorted(events) == ["soft_limit", "warning"]  # each once, across the processes
    assert all(r["wrapped"] for r in results)  # every process winds down
    with _open(place, scope) as ledger:
        assert ledger.spent()[KEY_COST] == Decimal("1.2")


def test_warnings_fall_back_to_local_totals_when_the_ledger_cannot_be_read(
    tmp_path: Path,
) -> None:
    seen: list[ampmeter.LimitEvent] = []
    ledger = SqliteLedger(tmp_path / "budget.db", "local")
    with ExecutionContext(
        max_cost_usd=1.0, warn_at=(0.5,), on_limit_event=seen.append, ledger=ledger
    ) as ctx:
        with ctx.llm_call("a", estimate_usd=0.3) as call:
            call.record(10, 5, cost_usd=0.3)
        ledger.spent = _unreadable  # type: ignore[method-assign]
        ledger.claim = _unreadable  # type: ignore[method-assign]
        with ctx.llm_call("b", estimate_usd=0.3) as call:
            call.record(10, 5, cost_usd=0.3)
    assert [(e.kind, e.value) for e in seen] == [("warning", Decimal("0.6"))]
    ledger.close()


def _unreadable(*args: Any) -> Any:
    raise ampmeter.BudgetUnavailable("the ledger cannot be read right now")


# -- budget pressure from the shared spend -------------------------------------------------------


@pytest.fixture
def instrumented() -> Iterator[None]:
    instrument()
    yield
    uninstrument()
    ampmeter.clear_prices()


def _spend_elsewhere(place: Place, scope: str, cost: float) -> None:
    """Another process spends ``cost`` of the shared budget."""

    def work(ctx: ExecutionContext) -> dict[str, Any]:
        with ctx.llm_call("elsewhere", estimate_usd=cost) as call:
            call.record(10, 5, cost_usd=cost)
        return {}

    mp = multiprocessing.get_context("fork")
    process = mp.Process(target=lambda: _run_alone(work, place, scope))
    process.start()
    process.join(timeout=60)
    assert process.exitcode == 0


def _run_alone(
    work: Callable[[ExecutionContext], dict[str, Any]], place: Place, scope: str
) -> None:
    with _open(place, scope) as ledger, ExecutionContext(max_cost_usd=1.0, ledger=ledger) as ctx:
        work(ctx)


@pytest.mark.usefixtures("instrumented")
def test_budget_pressure_reads_what_other_processes_spent(place: Place) -> None:
    ampmeter.set_price("big-model", input_per_mtok=10, output_per_mtok=10)
    ampmeter.set_price("cheap-model", input_per_mtok=0.1, output_per_mtok=0.1)
    scope = f"pressure-{uuid.uuid4().hex}"
    asked: list[str] = []

    def cheaper(ctx: ExecutionContext, request: dict[str, Any]) -> dict[str, Any]:
        asked.append(request["model"])
        return {**request, "model": "cheap-model"}

    with ReplayServer() as replay, _open(place, scope) as ledger:
        replay.script(
            "/v1/chat/completions",
            chat_completion("big-model", 10, 10),
            chat_completion("cheap-model", 10, 10),
        )
        client = openai.OpenAI(base_url=replay.openai_base_url, api_key="sk-x", max_retries=0)
        messages = [{"role": "user", "content": "hi"}]
        with ExecutionContext(
            max_cost_usd=1.0, on_budget_pressure=cheaper, pressure_at=0.5, ledger=ledger
        ) as ctx:
            client.chat.completions.create(model="big-model", messages=messages, max_tokens=5)
            assert asked == []  # nothing spent anywhere yet
            _spend_elsewhere(place, scope, 0.7)
            assert ctx.stats.get_gauge(KEY_COST) < 0.5  # this process alone is far from it
            time.sleep(SHARED_READ_S)  # past the cached read
            client.chat.completions.create(model="big-model", messages=messages, max_tokens=5)
        sent = [request.json()["model"] for request in replay.requests]
    assert asked == ["big-model"]
    assert sent == ["big-model", "cheap-model"]


def test_the_shared_totals_cache_does_not_keep_a_ledger_alive(tmp_path: Path) -> None:
    import gc
    import weakref

    ledger = SqliteLedger(tmp_path / "budget.db", "gone")
    ctx = ExecutionContext(max_cost_usd=1.0, warn_at=(0.5,), ledger=ledger)
    with ctx, ctx.llm_call("a", estimate_usd=0.6) as call:
        call.record(10, 5, cost_usd=0.6)
    assert [event["kind"] for event in ctx.snapshot()["limit_events"]] == ["warning"]
    ledger.close()
    seen = weakref.ref(ledger)
    del ledger, ctx, call
    gc.collect()
    assert seen() is None
