"""Lifecycle holes a new user falls into (issue 22): each ends in a clear state."""

from __future__ import annotations

import gc
import sys
from decimal import Decimal
from pathlib import Path
from types import FrameType

import pytest

from ampmeter import ExecutionContext, Limit, LimitExceeded, current_context
from ampmeter.keys import KEY_INPUT_TOKENS, KEY_LLM_CALLS, KEY_OUTPUT_TOKENS
from ampmeter.ledgers import SqliteLedger
from ampmeter.pricing.max_output import DEFAULT_OUTPUT_BOUND


def test_contexts_closed_out_of_order_never_leave_a_closed_one_current() -> None:
    a = ExecutionContext("a")
    b = ExecutionContext("b")
    a.__enter__()
    b.__enter__()
    a.__exit__(None, None, None)
    assert current_context() is not a
    b.__exit__(None, None, None)
    assert current_context() is None  # not the closed 'a'
    with ExecutionContext("c") as c, c.llm_call("works", estimate_usd=0.0) as call:
        call.record(1, 1, cost_usd=0.0)


def test_a_child_closed_after_its_parent_falls_back_to_no_context() -> None:
    parent = ExecutionContext("parent")
    parent.__enter__()
    child = parent.spawn_child("child")
    child.__enter__()
    parent.__exit__(None, None, None)
    child.__exit__(None, None, None)
    assert current_context() is None


def test_record_after_the_call_ended_and_a_second_record_raise() -> None:
    with ExecutionContext() as ctx:
        with ctx.llm_call("once", estimate_usd=0.0) as call:
            call.record(3, 2, cost_usd=0.01)
            with pytest.raises(RuntimeError, match="recorded already"):
                call.record(3, 2, cost_usd=0.01)
        with pytest.raises(RuntimeError, match="has ended"):
            call.record(5, 5, cost_usd=0.02)
        assert ctx.stats.get_counter(KEY_INPUT_TOKENS) == 3  # nothing added after the end


def test_an_empty_model_name_is_unpriced_and_refused_under_a_cost_cap() -> None:
    with ExecutionContext(max_cost_usd=1.0) as ctx:
        call = ctx.llm_call("nameless", model="")
        with pytest.raises(LimitExceeded, match="no price"), call:
            pytest.fail("sent")
    with ExecutionContext(max_cost_usd=1.0, on_unpriced="allow") as ctx:
        with ctx.llm_call("nameless", model="") as call:
            call.record(5, 5)
        assert ctx.graph.node(call.node_id).metadata["cost_status"] == "unpriced"


def test_a_call_dropped_between_creation_and_start_ends_halt() -> None:
    ctx = ExecutionContext()
    node_id = ctx.llm_call("never started", estimate_usd=0.01).node_id
    gc.collect()  # the interrupted frame that held the call is gone
    ctx.graph.aggregates()  # a read ends what was left behind
    node = ctx.graph.node(node_id)
    assert node.status == "halt" and node.stop_reason == "interrupted before it started"
    ctx.close()


def test_a_handoff_childs_spend_reaches_the_parents_graph_aggregates(tmp_path: Path) -> None:
    ledger = SqliteLedger(tmp_path / "budget.sqlite3", "team", handoff_key="lifecycle-test-key")
    parent = ExecutionContext("parent", max_cost_usd=1.0, ledger=ledger)
    with ExecutionContext.from_handoff(parent.handoff("child"), ledger=ledger) as child:
        for _ in range(3):
            with child.llm_call("work", estimate_usd=0.05) as call:
                call.record(10, 4, cost_usd=0.05)
    parent.close()
    aggregates = parent.graph.aggregates()
    assert aggregates["total_llm_calls"] == 3
    assert (aggregates["total_tokens_in"], aggregates["total_tokens_out"]) == (30, 12)
    assert aggregates["total_cost_usd"] == Decimal("0.15")
    assert parent.stats.get_counter(KEY_LLM_CALLS) == 3
    ledger.close()


def test_bound_estimates_reserve_a_ceiling_and_children_inherit_the_mode() -> None:
    from ampmeter.pricing.request_size import RequestSize

    size = RequestSize(chars=400, utf8_bytes=900, framing=7, media=0)
    watched = [Limit(KEY_INPUT_TOKENS, 10**9), Limit(KEY_OUTPUT_TOKENS, 10**9)]
    with ExecutionContext(limits=watched, estimate="bound") as ctx:
        child = ctx.spawn_child("worker")
        assert child.estimate == "bound"
        with child.llm_call("big", model="gpt-4o", request=size, max_tokens=50):
            assert ctx.stats.reserved()[KEY_INPUT_TOKENS] == 907  # every byte, and the framing
        with child.llm_call("open-ended", model="no-such-model", estimate_usd=0.0, request=size):
            assert ctx.stats.reserved()[KEY_OUTPUT_TOKENS] == DEFAULT_OUTPUT_BOUND
    with ExecutionContext(limits=watched) as learned:
        assert learned.estimate == "learned"
        with learned.llm_call("big", model="gpt-4o", request=size, max_tokens=50):
            assert learned.stats.reserved()[KEY_INPUT_TOKENS] < 907
    with pytest.raises(ValueError, match="estimate"):
        ExecutionContext(estimate="exact")  # type: ignore[arg-type]


def test_a_call_ends_in_one_outcome_with_what_an_integration_read() -> None:
    """What an integration read from the response (``finish(exc, metadata)``) goes into the
    call's outcome as it is made, under the call's own price (a response cannot say it was
    priced otherwise), not by copying the made outcome again: no named tuple is remade."""
    remade: list[str] = []

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call" and frame.f_code.co_name in ("_replace", "_make"):
            remade.append(frame.f_code.co_qualname)

    with ExecutionContext() as ctx:
        call = ctx.llm_call("read", model="gpt-4o-mini", max_tokens=10)
        call.start()
        call.record(10, 5)
        sys.setprofile(profile)
        try:
            call.finish(None, {"response_id": "openai:r1", "cost_status": "given"})
        finally:
            sys.setprofile(None)
    assert remade == []
    meta = call.node.metadata
    assert meta["response_id"] == "openai:r1" and meta["cost_status"] == "priced"
