"""A call started by hand and lost by its owner without ``finish()`` was free: the kernel refers
to a call weakly, so once the call was collected its hold stopped counting at once (another call
could pass the cap) and the next sweep halted its node at $0, unlogged, though its request may
well have been billed. Its hold now counts until the sweep, which charges it at its reservation
as a call interrupted in flight is: at every enclosing level, in the log, in shared ledgers."""

from __future__ import annotations

import asyncio
import gc
import json
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest

from ampmeter import BudgetBusy, ExecutionContext, JsonlSink, LimitExceeded
from ampmeter.keys import KEY_COST, KEY_LLM_CALLS, KEY_UNSETTLED_COST
from ampmeter.ledgers import InMemoryLedger
from support.ledger_backends import MakeLedger, make_ledger_fixture  # noqa: F401
from support.redis_server import redis_server_fixture  # noqa: F401

RESERVED = Decimal("0.6")


def _start_and_drop(ctx: ExecutionContext, name: str = "dropped") -> str:
    """Start a call by hand and lose it (as an exception path of the caller's would)."""
    call = ctx.llm_call(name, model="gpt-4o-mini", estimate_usd=RESERVED)
    call.start()
    return call.node_id


def _assert_charged(ctx: ExecutionContext, node_id: str) -> None:
    node = ctx.graph.node(node_id)
    assert (node.status, node.error_class, node.cost_usd) == ("fail", "CallDropped", RESERVED)
    assert node.metadata["cost_status"] == "unsettled"
    assert "dropped by its owner after it was sent" in (node.stop_reason or "")


def test_a_dropped_call_keeps_its_hold_then_is_charged_at_every_level(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    run = ExecutionContext("run", max_cost_usd=1.0, sinks=[JsonlSink(log)])
    with run, run.spawn_child("worker") as worker:
        node_id = _start_and_drop(worker)
        gc.collect()
        # Its 0.60 still holds: a second 0.60 would pass the $1 cap (it was let through).
        with pytest.raises(LimitExceeded), worker.llm_call("second", estimate_usd=RESERVED):
            pytest.fail("sent past the cap")
        _assert_charged(worker, node_id)
        for ctx in (worker, run):
            assert ctx.stats.get_gauge(KEY_COST) == RESERVED
            assert ctx.stats.get_gauge(KEY_UNSETTLED_COST) == RESERVED
            assert ctx.stats.get_counter(KEY_LLM_CALLS) == 1
            assert ctx.stats.reserved() == {}
        assert run.graph.aggregates()["total_cost_usd"] == RESERVED
    (line,) = [e for e in map(json.loads, log.read_text().splitlines()) if e["span_id"] == node_id]
    assert line["cost_usd"] == float(RESERVED) and line["metadata"]["status"] == "fail"
    assert line["metadata"]["cost_status"] == "unsettled"


def test_closing_the_context_charges_and_logs_a_call_dropped_in_it(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    ctx = ExecutionContext("run", sinks=[JsonlSink(log)])
    node_id = _start_and_drop(ctx)
    ctx.close()
    _assert_charged(ctx, node_id)
    (line,) = [json.loads(text) for text in log.read_text().splitlines()]
    assert line["span_id"] == node_id and line["metadata"]["cost_status"] == "unsettled"


def test_a_dropped_call_of_a_model_without_a_price_counts_as_an_unpriced_sent_call() -> None:
    with ExecutionContext("run", on_unpriced="allow", max_cost_usd=1.0) as ctx:
        call = ctx.llm_call("local", model="local-model")
        call.start()
        node_id = call.node_id
        del call
        ctx.graph.aggregates()
        node = ctx.graph.node(node_id)
        assert node.status == "fail" and node.metadata["cost_status"] == "unpriced"
        assert ctx.stats.get_counter("amp:unpriced_llm_calls") == 1


def test_a_bare_dropped_call_with_nothing_to_say_it_was_sent_halts_free() -> None:
    with ExecutionContext("run") as ctx:
        call = ctx.tool_call("lookup")
        call.start()
        node_id = call.node_id
        del call
        ctx.graph.aggregates()
        node = ctx.graph.node(node_id)
        assert (node.status, node.error_class, node.cost_usd) == ("halt", "CallDropped", 0)


def test_a_dropped_replay_of_a_counted_call_adds_nothing() -> None:
    with ExecutionContext("run", max_cost_usd=1.0) as ctx:
        with ctx.llm_call("step", estimate_usd=RESERVED, idempotency_key="step-1") as call:
            call.record(10, 5, cost_usd=0.25)
        replay = ctx.llm_call("step", estimate_usd=RESERVED, idempotency_key="step-1")
        replay.start()
        node_id = replay.node_id
        del replay
        assert ctx.stats.reserved() == {}  # (a read sweeps what was dropped)
        assert ctx.stats.get_gauge(KEY_COST) == Decimal("0.25")
        assert ctx.graph.node(node_id).metadata["duplicate_of"] == call.node_id


def test_a_dropped_call_is_committed_to_the_shared_ledger(make_ledger: MakeLedger) -> None:
    ledger = make_ledger(lease_s=30.0)
    with ExecutionContext("run", max_cost_usd=1.0, ledger=ledger) as ctx:
        node_id = _start_and_drop(ctx)
        assert ledger.reserved()[KEY_COST] == RESERVED  # still held (and renewed) in the ledger
    _assert_charged(ctx, node_id)
    # Committed as a finished call is, at once: not left to run out as an unsettled lease.
    assert ledger.spent()[KEY_COST] == RESERVED and ledger.reserved().get(KEY_COST, 0) == 0
    assert ledger.unsettled() == {}


def test_a_call_waiting_on_the_ledger_for_a_dropped_calls_hold_is_refused_not_kept_waiting(
    make_ledger: MakeLedger,
) -> None:
    """The ledger keeps a tighter ceiling than the context's own: only the ledger sees that a
    second call does not fit beside the dropped one's hold, which nobody would ever end."""
    ledger = make_ledger(lease_s=30.0)
    ledger.set_ceilings(ledger.scope, {KEY_COST: 1})
    with ExecutionContext("run", max_cost_usd=10, ledger=ledger, admission_timeout_s=5) as ctx:
        node_id = _start_and_drop(ctx)
        second = ctx.llm_call("second", estimate_usd=RESERVED)
        with pytest.raises(LimitExceeded) as refused, second:
            pytest.fail("sent past the ledger's ceiling")
        assert not isinstance(refused.value, BudgetBusy)  # (it did not wait in vain)
        assert "$1.20 > $1.00" in str(refused.value)  # (the ledger's ceiling, not the context's)
        _assert_charged(ctx, node_id)
    assert ledger.spent()[KEY_COST] == RESERVED


def _in_generator(ctx: ExecutionContext) -> Iterator[int]:
    with ctx.llm_call("in a generator", model="gpt-4o-mini", estimate_usd=RESERVED):
        yield 1
        yield 2


def test_a_generator_closed_inside_a_call_block_is_charged() -> None:
    with ExecutionContext("run", max_cost_usd=1.0) as ctx:
        steps = _in_generator(ctx)
        next(steps)
        del steps  # never resumed: closing it ends the block with GeneratorExit
        (node,) = [n for n in ctx.graph.nodes() if n.kind == "llm"]
        assert node.status == "fail" and node.cost_usd == RESERVED
        assert node.metadata["cost_status"] == "unsettled"


def test_a_task_canceled_between_start_and_finish_is_charged() -> None:
    async def work(ctx: ExecutionContext, started: asyncio.Event) -> None:
        call = ctx.llm_call("in a task", model="gpt-4o-mini", estimate_usd=RESERVED)
        call.start()
        started.set()
        await asyncio.sleep(60)
        call.finish()

    async def main(ctx: ExecutionContext) -> None:
        started = asyncio.Event()
        task = asyncio.create_task(work(ctx, started))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with ExecutionContext("run", max_cost_usd=1.0) as ctx:
        asyncio.run(main(ctx))
        gc.collect()
        assert ctx.stats.reserved() == {}  # (a read sweeps what was dropped)
        (node,) = [n for n in ctx.graph.nodes() if n.kind == "llm"]
        assert node.status == "fail" and node.cost_usd == RESERVED
        assert ctx.stats.get_gauge(KEY_UNSETTLED_COST) == RESERVED


def test_an_async_call_block_in_a_coroutine_closed_unfinished_is_charged_once() -> None:
    """A task left pending when its loop closed is closed when collected: its ``async with``
    block ends with GeneratorExit and cannot await the ledger's commit on a worker thread. It
    left the call ended but unsettled (its hold never given back, its unsettled cost counted
    without its cost); it now settles at once."""
    ledger = InMemoryLedger("dropped")

    async def work(ctx: ExecutionContext, started: asyncio.Event) -> None:
        async with ctx.llm_call("async", model="gpt-4o-mini", estimate_usd=RESERVED):
            started.set()
            await asyncio.Event().wait()

    async def begin(ctx: ExecutionContext) -> asyncio.Task[None]:
        started = asyncio.Event()
        task = asyncio.ensure_future(work(ctx, started))
        await started.wait()
        return task

    with ExecutionContext("run", max_cost_usd=1.0, ledger=ledger) as ctx:
        loop = asyncio.new_event_loop()
        task = loop.run_until_complete(begin(ctx))
        loop.close()  # the task is left pending, never resumed
        del task
        gc.collect()
        assert ctx.stats.reserved() == {}
        (node,) = [n for n in ctx.graph.nodes() if n.kind == "llm"]
        assert (node.status, node.error_class, node.cost_usd) == ("fail", "GeneratorExit", RESERVED)
        assert ctx.stats.get_gauge(KEY_COST) == ctx.stats.get_gauge(KEY_UNSETTLED_COST) == RESERVED
    assert ledger.spent()[KEY_COST] == RESERVED and ledger.reserved().get(KEY_COST, 0) == 0
