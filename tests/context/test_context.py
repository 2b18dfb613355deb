"""ExecutionContext: construction, calls, containment, wrap API, traces, iterations, children."""

from __future__ import annotations

import asyncio
import contextvars
import math
import threading
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ampmeter import (
    Decision,
    ExecutionCanceled,
    ExecutionContext,
    ExecutionStats,
    Limit,
    LimitExceeded,
    LimitType,
    ModelCallTrace,
    ParseErrorTrace,
    TerminationReason,
    ToolCallTrace,
    WrapOptions,
    current_context,
    current_node_id,
)
from ampmeter.call import Call
from ampmeter.graph import ExecutionGraph
from ampmeter.keys import (
    KEY_CACHED_INPUT_TOKENS,
    KEY_CACHED_INPUT_TOKENS_FOR,
    KEY_COST,
    KEY_COST_FOR,
    KEY_FORMAT_PARSE_ERROR_AT,
    KEY_FORMAT_PARSE_ERROR_CONSECUTIVE,
    KEY_FORMAT_PARSE_ERROR_TOTAL,
    KEY_INPUT_TOKENS,
    KEY_INPUT_TOKENS_FOR,
    KEY_ITERATIONS,
    KEY_LLM_CALLS,
    KEY_OUTPUT_TOKENS,
    KEY_OUTPUT_TOKENS_FOR,
    KEY_REASONING_TOKENS,
    KEY_REASONING_TOKENS_FOR,
    KEY_RETRIES,
    KEY_STEPS,
    KEY_TOOL_CALLS,
    KEY_TOOL_CALLS_FOR,
    KEY_TOOLCHAIN_PARSE_ERROR_AT,
    KEY_TOOLCHAIN_PARSE_ERROR_CONSECUTIVE,
    KEY_TOOLCHAIN_PARSE_ERROR_TOTAL,
)
from ampmeter.pricing import NO_PRICES
from ampmeter.sinks.memory import MemorySink


def _node(ctx: ExecutionContext, node_id: str) -> Any:
    return ctx.graph.node(node_id)


def _llm(
    ctx: ExecutionContext,
    cost: float,
    *,
    model: str = "gpt-4o",
    est: float | None = None,
    tokens: tuple[int, int] = (10, 5),
) -> str:
    with ctx.llm_call("plan", model=model, estimate_usd=est) as call:
        call.record(tokens_in=tokens[0], tokens_out=tokens[1], cost_usd=cost)
    return call.node_id


# -- construction -------------------------------------------------------------------------------


def test_defaults() -> None:
    ctx = ExecutionContext()
    assert ctx.name == "agent_run"
    assert ctx.limits == ()
    assert isinstance(ctx.stats, ExecutionStats)
    assert isinstance(ctx.graph, ExecutionGraph)
    root = _node(ctx, ctx.node_id)
    assert root.parent_id is None and root.status == "running" and root.name == "agent_run"
    assert ctx.iteration == 0
    assert ctx.termination_reason is None and ctx.exceeded_limit is None
    ctx.close()


def test_chain_id_and_metadata_reach_the_root() -> None:
    ctx = ExecutionContext("run", chain_id="chain-1", metadata={"user": "u1"})
    assert ctx.chain_id == "chain-1" == ctx.graph.chain_id
    assert _node(ctx, ctx.node_id).metadata["user"] == "u1"
    ctx.close()


def test_shortcuts_become_limits() -> None:
    extra = Limit("myapp:x", 3)
    ctx = ExecutionContext(limits=[extra], max_cost_usd=2, max_steps=4, max_retries=1)
    assert ctx.limits == (extra, Limit(KEY_COST, 2.0), Limit(KEY_STEPS, 4), Limit(KEY_RETRIES, 1))
    ctx.close()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"max_cost_usd": -0.01}, ValueError, "max_cost_usd"),
        ({"max_cost_usd": math.nan}, ValueError, "max_cost_usd"),
        ({"max_cost_usd": math.inf}, ValueError, "max_cost_usd"),
        ({"max_cost_usd": True}, TypeError, "max_cost_usd"),
        ({"max_cost_usd": "1"}, TypeError, "max_cost_usd"),
        ({"max_steps": -1}, ValueError, "max_steps"),
        ({"max_steps": True}, TypeError, "max_steps"),
        ({"max_steps": 2.5}, ValueError, "max_steps must be a whole number"),
        ({"max_retries": -3}, ValueError, "max_retries"),
        ({"max_retries": False}, TypeError, "max_retries"),
        ({"timeout_s": -1.0}, ValueError, "timeout_s"),
        ({"timeout_s": math.nan}, ValueError, "timeout_s"),
        ({"timeout_s": True}, TypeError, "timeout_s"),
        ({"limits": [("amp:cost", 1.0)]}, TypeError, "Limit"),
        ({"limits": Limit("amp:cost", 1.0)}, TypeError, "list of Limit"),
        ({"metadata": ["a"]}, TypeError, "metadata"),
        ({"sinks": [object()]}, TypeError, "sinks"),
    ],
)
def test_invalid_constructor_arguments(kwargs: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        ExecutionContext(**kwargs)


def test_empty_name_is_rejected() -> None:
    with pytest.raises(ValueError, match="name"):
        ExecutionContext("")


# -- recording calls ----------------------------------------------------------------------------


def test_llm_call_updates_every_standard_key() -> None:
    with ExecutionContext() as ctx:
        with ctx.llm_call("plan", model="gpt-4o") as call:
            assert _node(ctx, call.node_id).status == "running"
            call.record(
                tokens_in=1200,
                tokens_out=350,
                cost_usd=0.0125,
                cached_tokens=200,
                reasoning_tokens=50,
                tool_calls_made=2,
            )
        counters, gauges = ctx.stats.counters(), ctx.stats.gauges()
        assert counters[KEY_INPUT_TOKENS] == 1200
        assert counters[KEY_INPUT_TOKENS_FOR + "gpt-4o"] == 1200
        assert counters[KEY_OUTPUT_TOKENS] == 350
        assert counters[KEY_OUTPUT_TOKENS_FOR + "gpt-4o"] == 350
        assert counters[KEY_CACHED_INPUT_TOKENS] == 200
        assert counters[KEY_CACHED_INPUT_TOKENS_FOR + "gpt-4o"] == 200
        assert counters[KEY_REASONING_TOKENS] == 50
        assert counters[KEY_REASONING_TOKENS_FOR + "gpt-4o"] == 50
        assert counters[KEY_LLM_CALLS] == 1
        assert counters[KEY_STEPS] == 1
        assert KEY_RETRIES not in counters
        assert gauges[KEY_COST] == Decimal("0.0125") == gauges[KEY_COST_FOR + "gpt-4o"]
        node = _node(ctx, call.node_id)
        assert (node.status, node.kind, node.name) == ("success", "llm", "plan")
        assert node.model == "gpt-4o"
        assert (node.tokens_in, node.tokens_out, node.cost_usd) == (1200, 350, Decimal("0.0125"))
        assert node.metadata["cost_status"] == "given"
        assert node.metadata["cached_tokens"] == 200
        assert node.metadata["reasoning_tokens"] == 50
        assert node.metadata["tool_calls_made"] == 2
        assert ctx.stats.reserved() == {}


def test_cost_not_given_is_unpriced_zero() -> None:
    with ExecutionContext(pricing=NO_PRICES) as ctx:
        with ctx.llm_call("plan", model="gpt-4o-mini") as call:  # in the table, not here
            call.record(tokens_in=10, tokens_out=2)
        node = _node(ctx, call.node_id)
        assert node.cost_usd == 0.0
        assert node.metadata["cost_status"] == "unpriced"
        assert ctx.stats.get_gauge(KEY_COST) == 0.0


def test_tool_call_and_step_counts() -> None:
    with ExecutionContext() as ctx:
        with ctx.step("plan") as step:
            with ctx.tool_call("search") as tool:
                pass
            with ctx.tool_call("search"):
                pass
            with ctx.tool_call("shell"):
                pass
        assert ctx.stats.get_counter(KEY_TOOL_CALLS) == 3
        assert ctx.stats.get_counter(KEY_TOOL_CALLS_FOR + "search") == 2
        assert ctx.stats.get_counter(KEY_TOOL_CALLS_FOR + "shell") == 1
        assert ctx.stats.get_counter(KEY_STEPS) == 3  # system steps are not counted as steps
        assert ctx.stats.get_counter(KEY_LLM_CALLS) == 0
        step_node = _node(ctx, step.node_id)
        assert step_node.kind == "system" and step_node.status == "success"
        assert _node(ctx, tool.node_id).parent_id == step.node_id
        assert _node(ctx, tool.node_id).kind == "tool"


async def test_async_with_calls() -> None:
    async with ExecutionContext() as ctx:
        async with ctx.step("outer") as step:
            async with ctx.llm_call("plan", model="m") as call:
                assert current_node_id() == call.node_id
                call.record(tokens_in=3, tokens_out=4, cost_usd=0.5)
            async with ctx.tool_call("t") as tool:
                pass
        assert _node(ctx, call.node_id).parent_id == step.node_id
        assert _node(ctx, tool.node_id).status == "success"
        assert ctx.stats.get_gauge(KEY_COST) == 0.5
        assert ctx.stats.get_counter(KEY_TOOL_CALLS) == 1
    assert ctx.termination_reason is TerminationReason.SUCCESS


def test_record_validates_and_is_taken_once() -> None:
    with ExecutionContext() as ctx:
        with ctx.llm_call("plan", model="m") as call:
            for bad_kwargs, error in (
                ({"tokens_in": -1}, ValueError),
                ({"tokens_in": 1.5}, TypeError),
                ({"cost_usd": math.nan}, ValueError),
                ({"cost_usd": -1.0}, ValueError),
                ({"tokens_in": 5, "cached_tokens": 6}, ValueError),
                ({"tokens_out": 5, "reasoning_tokens": 6}, ValueError),
            ):
                with pytest.raises(error):
                    call.record(**bad_kwargs)
            call.record(tokens_in=100, tokens_out=10, cost_usd=0.2)
            with pytest.raises(RuntimeError, match="recorded already"):
                call.record(tokens_in=1, tokens_out=1, cost_usd=0.1)
        with pytest.raises(RuntimeError, match="has ended"):
            call.record(tokens_in=1, tokens_out=1, cost_usd=0.1)
        assert ctx.stats.total_input_tokens() == 100
        assert ctx.stats.total_cost() == Decimal("0.2")


def test_record_is_the_one_writer_and_takes_an_estimate_once() -> None:
    """record() keeps a tokens_in of None as None, marks counts that are an estimate, and is
    taken once and only while the call runs (there is no unchecked twin)."""
    assert not hasattr(Call, "record_checked") and not hasattr(
        Call, "offer_checked_idempotency_key"
    )
    with ExecutionContext(pricing=NO_PRICES) as ctx:
        with ctx.llm_call("plan", model="m") as call:
            call.record(None, 7, reasoning_tokens=3, tool_calls_made=2, estimated=True)
            with pytest.raises(RuntimeError, match="recorded already"):
                call.record(tokens_in=1, tokens_out=1)
        assert (call.tokens_in, call.tokens_out, call.reasoning_tokens) == (None, 7, 3)
        with pytest.raises(RuntimeError, match="has ended"):
            call.record(1, 1)
        node = _node(ctx, call.node_id)
        assert (node.tokens_in, node.tokens_out) == (None, 7)
        assert node.metadata["tool_calls_made"] == 2
        assert ctx.stats.total_output_tokens() == 7
        with ctx.llm_call("plan", model="m") as call:
            call.record(tokens_in=9, tokens_out=4, cached_tokens=5, cache_write_tokens=2)
        assert (call.cached_tokens, call.cache_write_tokens, call.tokens_in) == (5, 2, 9)


def test_offered_idempotency_keys_are_checked() -> None:
    with ExecutionContext() as ctx:
        with ctx.llm_call("plan", model="m") as call:
            with pytest.raises(TypeError, match="idempotency_key"):
                call.offer_idempotency_key(7)  # type: ignore[arg-type]
            with pytest.raises(ValueError, match="idempotency_key"):
                call.offer_idempotency_key("")
            assert call.offer_idempotency_key("run-1:step-1")
            assert call.offer_idempotency_key("run-1:step-1")
            assert not call.offer_idempotency_key("openai:chatcmpl-1")
            assert not call.offer_idempotency_key("other")
        with pytest.raises(RuntimeError, match="has ended"):
            call.offer_idempotency_key("openai:chatcmpl-2")
        assert call.node.metadata["idempotency_key"] == "run-1:step-1"


def test_llm_call_argument_validation() -> None:
    with ExecutionContext() as ctx:
        with pytest.raises(TypeError, match="model"):
            ctx.llm_call("x", model=3)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="estimate_usd"):
            ctx.llm_call("x", estimate_usd=-1.0)
        with pytest.raises(ValueError, match="max_tokens"):
            ctx.llm_call("x", max_tokens=-1)
        with pytest.raises(ValueError, match="tool name"):
            ctx.tool_call("")
        with pytest.raises(ValueError, match="llm_call"):
            ctx.step("x", kind="llm")


# -- containment ----------------------------------------------------------------------------------


def test_call_that_would_exceed_is_halted_before_user_code() -> None:
    sink = MemorySink()
    ran = []
    with ExecutionContext(max_cost_usd=1.0, sinks=[sink]) as ctx:
        _llm(ctx, 0.6, est=0.5)
        with pytest.raises(LimitExceeded) as info, ctx.llm_call("plan", estimate_usd=0.5):
            ran.append(True)
        assert ran == []
        err = info.value
        assert err.exceeded is not None
        assert err.exceeded.key == KEY_COST and err.exceeded.limit == Limit(KEY_COST, 1.0)
        assert err.exceeded.value == Decimal("1.1")
        node = _node(ctx, err.node_id)  # type: ignore[arg-type]
        assert node.status == "halt" and node.kind == "llm"
        assert node.stop_reason is not None and "amp:cost" in node.stop_reason
        assert ctx.exceeded_limit == err.exceeded
        assert ctx.termination_reason is TerminationReason.LIMIT_EXCEEDED
        assert ctx.stats.reserved() == {}  # nothing left reserved
        assert ctx.stats.get_counter(KEY_LLM_CALLS) == 1  # the halted call was never sent
        # A smaller call still fits.
        _llm(ctx, 0.3, est=0.3)
    root = _node(ctx, ctx.node_id)
    assert root.status == "halt" and root.stop_reason == str(err.exceeded)
    assert [n.status for n in sink.nodes] == ["success", "halt", "success", "halt"]


@pytest.mark.parametrize(
    ("limit_kwargs", "make_call"),
    [
        ({"limits": [Limit(KEY_LLM_CALLS, 0)]}, lambda c: c.llm_call("p")),
        ({"limits": [Limit(KEY_TOOL_CALLS, 0)]}, lambda c: c.tool_call("t")),
        ({"limits": [Limit(KEY_TOOL_CALLS_FOR, 0, LimitType.PREFIX)]}, lambda c: c.tool_call("t")),
        ({"max_steps": 0}, lambda c: c.llm_call("p")),
        ({"max_steps": 0}, lambda c: c.tool_call("t")),
        ({"max_cost_usd": 0}, lambda c: c.llm_call("p", estimate_usd=0.001)),
        ({"limits": [Limit(KEY_INPUT_TOKENS, 0)]}, lambda c: c.llm_call("p", prompt_tokens=5)),
        (
            {"limits": [Limit(KEY_OUTPUT_TOKENS_FOR, 0, LimitType.PREFIX)]},
            lambda c: c.llm_call("p", model="m", max_tokens=5),
        ),
    ],
)
def test_a_limit_of_zero_halts_the_first_billable_call(
    limit_kwargs: dict[str, Any], make_call: Any
) -> None:
    with ExecutionContext(**limit_kwargs) as ctx:
        with pytest.raises(LimitExceeded) as info, make_call(ctx):
            pytest.fail("user code ran")
        assert _node(ctx, info.value.node_id).status == "halt"  # type: ignore[arg-type]
        assert info.value.exceeded is not None and info.value.exceeded.limit.max_value == 0
        assert ctx.stats.counters().get(KEY_LLM_CALLS, 0) == 0
        assert ctx.stats.counters().get(KEY_TOOL_CALLS, 0) == 0


def test_max_steps_allows_exactly_n_successful_calls() -> None:
    with ExecutionContext(max_steps=3) as ctx:
        done = 0
        with pytest.raises(LimitExceeded) as info:
            for _ in range(10):
                _llm(ctx, 0.0)
                done += 1
        assert done == 3
        assert ctx.stats.get_counter(KEY_STEPS) == 3
        assert info.value.exceeded is not None and info.value.exceeded.key == KEY_STEPS


def test_a_failed_call_gives_its_step_back_and_counts_a_retry() -> None:
    with ExecutionContext(max_steps=2) as ctx:
        with pytest.raises(RuntimeError), ctx.llm_call("p"):
            raise RuntimeError("provider 500")
        assert ctx.stats.get_counter(KEY_STEPS) == 0
        assert ctx.stats.get_counter(KEY_RETRIES) == 1
        assert ctx.stats.get_counter(KEY_LLM_CALLS) == 1  # it was sent
        _llm(ctx, 0.0)
        _llm(ctx, 0.0)
        with pytest.raises(LimitExceeded):
            _llm(ctx, 0.0)
        assert ctx.stats.get_counter(KEY_STEPS) == 2


def test_max_retries_stops_calls_once_exceeded() -> None:
    with ExecutionContext(max_retries=1) as ctx:
        for _ in range(2):  # retries 1, then 2 (> 1, seen by the check after the call)
            with pytest.raises(ValueError), ctx.tool_call("t"):
                raise ValueError("bad input")
        assert ctx.exceeded_limit is not None and ctx.exceeded_limit.key == KEY_RETRIES
        with pytest.raises(LimitExceeded) as info, ctx.tool_call("t"):
            pytest.fail("user code ran")
        assert info.value.exceeded is not None and info.value.exceeded.value == 2


def test_exception_marks_fail_with_class_name_and_reraises() -> None:
    class ProviderError(Exception):
        pass

    with ExecutionContext() as ctx:
        with pytest.raises(ProviderError), ctx.llm_call("p", model="m") as call:
            call.record(tokens_in=10, tokens_out=0, cost_usd=0.01)  # billed, then failed
            raise ProviderError("stream cut")
        node = _node(ctx, call.node_id)
        assert node.status == "fail" and node.error_class == "ProviderError"
        assert node.cost_usd == Decimal("0.01")
        assert ctx.stats.total_cost() == Decimal("0.01")  # billed usage is counted even on failure
    assert _node(ctx, ctx.node_id).status == "success"  # the exception was handled inside


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit])
def test_interrupts_are_never_swallowed(interrupt: type[BaseException]) -> None:
    ctx = ExecutionContext()
    with pytest.raises(interrupt), ctx.llm_call("p") as call:
        raise interrupt()
    node = _node(ctx, call.node_id)
    assert node.status == "halt" and node.stop_reason == "interrupted"
    assert ctx.stats.get_counter(KEY_RETRIES) == 0 and ctx.stats.get_counter(KEY_STEPS) == 0
    assert ctx.stats.reserved() == {}
    # The wrap API lets them through too.
    with pytest.raises(interrupt):
        ctx.wrap_tool_call(lambda: (_ for _ in ()).throw(interrupt()))
    tool = next(n for n in ctx.graph.nodes() if n.kind == "tool")
    assert tool.status == "halt" and tool.stop_reason == "interrupted"
    ctx.close()


def test_retry_counts_on_node_and_stats() -> None:
    with ExecutionContext() as ctx:
        child = ctx.spawn_child("sub")
        with child.llm_call("p") as call:
            call.retry()
            child.retry(call)
        assert _node(ctx, call.node_id).retries_used == 2
        assert child.stats.get_counter(KEY_RETRIES) == 2
        assert ctx.stats.get_counter(KEY_RETRIES) == 2
        assert ctx.graph.aggregates()["total_retries"] == 2
        child.close()


def test_start_failure_then_finish_releases_nothing_twice() -> None:
    """An integration that calls finish() after a refused start() must not touch reservations."""
    with ExecutionContext(max_cost_usd=1.0) as ctx:
        held = ctx.llm_call("a", estimate_usd=0.9).start()
        refused = ctx.llm_call("b", estimate_usd=0.5)
        with pytest.raises(LimitExceeded):
            refused.start()
        refused.finish(RuntimeError("gave up"))
        assert ctx.stats.reserved() == {
            KEY_COST: Decimal("0.9")
        }  # held only where a limit watches it
        assert ctx.stats.get_counter(KEY_RETRIES) == 0
        assert ctx.stats.get_counter(KEY_LLM_CALLS) == 0
        assert _node(ctx, refused.node_id).status == "halt"
        held.record(tokens_in=1, tokens_out=1, cost_usd=0.9)
        held.finish()
        assert ctx.stats.reserved() == {}
        with pytest.raises(RuntimeError, match="already started"):
            held.start()


# -- wrap API -------------------------------------------------------------------------------------


def test_wrap_options_validation() -> None:
    assert WrapOptions() == WrapOptions("", 0.0, None)
    for bad in (-0.01, math.nan, math.inf):
        with pytest.raises(ValueError, match="cost_estimate_hint"):
            WrapOptions(cost_estimate_hint=bad)
    with pytest.raises(TypeError, match="cost_estimate_hint"):
        WrapOptions(cost_estimate_hint="1")  # type: ignore[arg-type]
    assert [d.value for d in Decision] == ["allow", "retry", "halt"]
    assert str(Decision.HALT) == "halt"


def test_wrap_llm_call_allow_records_the_hint_as_cost() -> None:
    calls = []
    with ExecutionContext() as ctx:
        opts = WrapOptions(operation_name="summarize", cost_estimate_hint=0.25, model="gpt-4o")
        assert ctx.wrap_llm_call(lambda: calls.append(1), opts) is Decision.ALLOW
        assert calls == [1]
        node = next(n for n in ctx.graph.nodes() if n.kind == "llm")
        assert (node.status, node.name, node.model, node.cost_usd) == (
            "success",
            "summarize",
            "gpt-4o",
            0.25,
        )
        assert ctx.stats.total_cost() == 0.25
        assert ctx.stats.get_gauge(KEY_COST_FOR + "gpt-4o") == 0.25
        assert ctx.stats.get_counter(KEY_LLM_CALLS) == 1
        # Without options: the node is named after its kind.
        assert ctx.wrap_llm_call(lambda: None) is Decision.ALLOW
        assert ctx.graph.nodes()[-1].name == "llm"


def test_wrap_retry_on_exception() -> None:
    def boom() -> None:
        raise TimeoutError("slow")

    with ExecutionContext() as ctx:
        assert ctx.wrap_llm_call(boom) is Decision.RETRY
        assert ctx.wrap_tool_call(boom, WrapOptions(operation_name="fetch")) is Decision.RETRY
        failed = [n for n in ctx.graph.nodes() if n.parent_id is not None]
        assert [(n.status, n.error_class) for n in failed] == [("fail", "TimeoutError")] * 2
        assert ctx.stats.get_counter(KEY_RETRIES) == 2
        assert ctx.stats.get_gauge(KEY_COST) == 0.0


def test_wrap_halt_when_a_limit_would_be_exceeded() -> None:
    calls = []
    with ExecutionContext(max_cost_usd=1.0) as ctx:
        opts = WrapOptions(cost_estimate_hint=0.6)
        assert ctx.wrap_llm_call(lambda: calls.append(1), opts) is Decision.ALLOW
        assert ctx.wrap_llm_call(lambda: calls.append(2), opts) is Decision.HALT
        assert calls == [1]
        halted = ctx.graph.nodes()[-1]
        assert halted.status == "halt" and "amp:cost" in (halted.stop_reason or "")
        assert ctx.stats.total_cost() == Decimal("0.6")


def test_wrap_tool_call_counts_tool_and_cost() -> None:
    with ExecutionContext(limits=[Limit(KEY_TOOL_CALLS_FOR + "search", 1)]) as ctx:
        opts = WrapOptions(operation_name="search", cost_estimate_hint=0.01)
        assert ctx.wrap_tool_call(lambda: None, opts) is Decision.ALLOW
        assert ctx.stats.get_counter(KEY_TOOL_CALLS_FOR + "search") == 1
        assert ctx.stats.total_cost() == Decimal("0.01")
        assert ctx.wrap_tool_call(lambda: None, opts) is Decision.HALT
        assert ctx.wrap_tool_call(lambda: None, WrapOptions(operation_name="other")) is (
            Decision.ALLOW
        )


def test_wrap_after_cancel_halts() -> None:
    with ExecutionContext() as ctx:
        ctx.cancel()
        assert ctx.wrap_llm_call(lambda: pytest.fail("ran")) is Decision.HALT


# -- trace records --------------------------------------------------------------------------------


def test_model_call_trace_aggregates_like_the_spec() -> None:
    with ExecutionContext() as ctx:
        child = ctx.spawn_child("sub")
        child.trace(
            ModelCallTrace(
                model="claude",
                input_tokens=100,
                output_tokens=20,
                cost_usd=0.03,
                cached_tokens=40,
                reasoning_tokens=5,
            )
        )
        child.trace(ModelCallTrace(model="gpt", input_tokens=1, output_tokens=2, cost_usd=0.01))
        for stats in (child.stats, ctx.stats):
            c, g = stats.counters(), stats.gauges()
            assert c[KEY_INPUT_TOKENS] == 101 and c[KEY_OUTPUT_TOKENS] == 22
            assert c[KEY_INPUT_TOKENS_FOR + "claude"] == 100
            assert c[KEY_OUTPUT_TOKENS_FOR + "gpt"] == 2
            assert c[KEY_CACHED_INPUT_TOKENS_FOR + "claude"] == 40
            assert c[KEY_REASONING_TOKENS] == 5
            assert c[KEY_LLM_CALLS] == 2
            assert g[KEY_COST] == Decimal("0.04")
            assert g[KEY_COST_FOR + "claude"] == Decimal("0.03")
        assert len(ctx.graph) == 2  # traces update stats only, they add no nodes
        child.close()


def test_tool_call_trace() -> None:
    with ExecutionContext() as ctx:
        ctx.trace(ToolCallTrace(tool_name="search"))
        ctx.trace(ToolCallTrace(tool_name="search"))
        assert ctx.stats.tool_call_count() == 2
        assert ctx.stats.get_counter(KEY_TOOL_CALLS_FOR + "search") == 2
        with pytest.raises(ValueError, match="tool_name"):
            ctx.trace(ToolCallTrace(tool_name=""))


@pytest.mark.parametrize(
    ("kind", "total", "at", "consecutive"),
    [
        (
            "format",
            KEY_FORMAT_PARSE_ERROR_TOTAL,
            KEY_FORMAT_PARSE_ERROR_AT,
            KEY_FORMAT_PARSE_ERROR_CONSECUTIVE,
        ),
        (
            "toolchain",
            KEY_TOOLCHAIN_PARSE_ERROR_TOTAL,
            KEY_TOOLCHAIN_PARSE_ERROR_AT,
            KEY_TOOLCHAIN_PARSE_ERROR_CONSECUTIVE,
        ),
    ],
)
def test_parse_error_trace_and_parse_ok(kind: Any, total: str, at: str, consecutive: str) -> None:
    with ExecutionContext() as ctx:
        child = ctx.spawn_child("sub")
        child.start_iteration()
        child.trace(ParseErrorTrace(error_type=kind, raw_content="{bad", error="oops"))
        child.trace(ParseErrorTrace(error_type=kind, error=ValueError("x")))
        child.start_iteration()
        child.trace(ParseErrorTrace(error_type=kind))
        c = child.stats.counters()
        assert (c[total], c[at + "1"], c[at + "2"], c[consecutive]) == (3, 2, 1, 3)
        parent = ctx.stats.counters()
        assert (parent[total], parent[at + "1"], parent[at + "2"]) == (3, 2, 1)
        assert consecutive not in parent  # per context
        child.parse_ok(kind)
        assert child.stats.get_counter(consecutive) == 0
        assert child.stats.get_counter(total) == 3
        child.close()


def test_trace_rejects_unknown_records() -> None:
    with ExecutionContext() as ctx:
        with pytest.raises(ValueError, match="error_type"):
            ctx.trace(ParseErrorTrace(error_type="yaml"))  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="ModelCallTrace"):
            ctx.trace({"model": "x"})  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="kind"):
            ctx.parse_ok("yaml")  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            ctx.trace(ModelCallTrace(model="m", input_tokens=-1))
        with pytest.raises(ValueError):
            ctx.trace(ModelCallTrace(model="m", cost_usd=math.nan))
        assert ctx.stats.counters() == {} and ctx.stats.gauges() == {}


def test_trace_updates_are_seen_by_limits_on_the_next_call() -> None:
    with ExecutionContext(limits=[Limit(KEY_INPUT_TOKENS_FOR, 100, LimitType.PREFIX)]) as ctx:
        ctx.trace(ModelCallTrace(model="m", input_tokens=101))
        with pytest.raises(LimitExceeded) as info, ctx.llm_call("p"):
            pass
        assert info.value.exceeded is not None
        assert info.value.exceeded.key == KEY_INPUT_TOKENS_FOR + "m"


# -- iterations, cancel, close, snapshot ----------------------------------------------------------


def test_iteration_limit_of_five_runs_exactly_five() -> None:
    ran = 0
    with ExecutionContext(limits=[Limit(KEY_ITERATIONS, 5)]) as ctx:
        with pytest.raises(LimitExceeded) as info:
            while True:
                ctx.start_iteration()
                ran += 1
        assert ran == 5
        assert ctx.iteration == 5 and ctx.stats.get_counter(KEY_ITERATIONS) == 5  # ran, not refused
        assert info.value.node_id is None
        assert info.value.exceeded is not None and info.value.exceeded.key == KEY_ITERATIONS
        assert info.value.exceeded.value == 6  # the iteration it would have started
        assert ctx.termination_reason is TerminationReason.LIMIT_EXCEEDED


def test_cancel_halts_further_calls_in_context_and_children() -> None:
    with ExecutionContext() as ctx:
        child = ctx.spawn_child("sub")
        _llm(ctx, 0.0)
        ctx.cancel()
        assert ctx.canceled and child.canceled
        for target in (ctx, child):
            with pytest.raises(ExecutionCanceled) as info, target.llm_call("p"):
                pytest.fail("ran")
            assert _node(ctx, info.value.node_id).status == "halt"  # type: ignore[arg-type]
        with pytest.raises(ExecutionCanceled):
            ctx.start_iteration()
        child.close()
    assert ctx.termination_reason is TerminationReason.CONTEXT_CANCELED
    root = _node(ctx, ctx.node_id)
    assert root.status == "halt" and root.stop_reason == "context_canceled"


def test_close_is_idempotent_and_ends_the_root() -> None:
    sink = MemorySink()
    ctx = ExecutionContext(sinks=[sink])
    _llm(ctx, 0.1)
    ctx.close()
    ctx.close()
    assert ctx.termination_reason is TerminationReason.SUCCESS
    root = _node(ctx, ctx.node_id)
    assert root.status == "success"
    assert [n.node_id for n in sink.nodes].count(ctx.node_id) == 1
    with pytest.raises(RuntimeError, match="closed"):
        ctx.llm_call("p")
    with pytest.raises(RuntimeError, match="closed"):
        ctx.spawn_child("late")
    with pytest.raises(RuntimeError, match="closed"):
        ctx.start_iteration()


def test_context_exit_with_error_fails_the_root() -> None:
    with pytest.raises(KeyError), ExecutionContext() as ctx:
        raise KeyError("x")
    assert ctx.termination_reason is TerminationReason.ERROR
    root = _node(ctx, ctx.node_id)
    assert root.status == "fail" and root.error_class == "KeyError"


def test_context_exit_with_limit_exceeded_halts_the_root() -> None:
    with pytest.raises(LimitExceeded), ExecutionContext(max_steps=1) as ctx:
        _llm(ctx, 0.0)
        _llm(ctx, 0.0)
    root = _node(ctx, ctx.node_id)
    assert root.status == "halt" and root.stop_reason == str(ctx.exceeded_limit)
    assert ctx.termination_reason is TerminationReason.LIMIT_EXCEEDED


def test_snapshot() -> None:
    with ExecutionContext("snap", max_cost_usd=0.5) as ctx:
        ctx.start_iteration()
        _llm(ctx, 0.2, tokens=(7, 3))
        with pytest.raises(LimitExceeded):
            _llm(ctx, 0.0, est=0.4)
        snap = ctx.snapshot()
    assert snap["name"] == "snap" and snap["chain_id"] == ctx.chain_id
    assert snap["iteration"] == 1
    assert snap["counters"][KEY_INPUT_TOKENS] == 7
    assert snap["gauges"][KEY_COST] == 0.2  # a snapshot is JSON: money as numbers
    assert snap["reserved"] == {}
    assert snap["termination_reason"] == "limit_exceeded"
    assert snap["exceeded_limit"] == {
        "key": KEY_COST,
        "value": pytest.approx(0.6),
        "limit_key": KEY_COST,
        "limit_type": "exact",
        "max_value": 0.5,
    }
    graph = snap["graph"]
    assert graph["root_id"] == ctx.node_id
    assert sorted(n["status"] for n in graph["nodes"].values()) == ["halt", "running", "success"]
    # A copy: changing it changes nothing.
    snap["counters"][KEY_INPUT_TOKENS] = 0
    assert ctx.stats.get_counter(KEY_INPUT_TOKENS) == 7


def test_timeout_stops_the_next_call() -> None:
    import time

    with ExecutionContext(timeout_s=0.01) as ctx:
        time.sleep(0.05)
        with pytest.raises(LimitExceeded) as info, ctx.llm_call("p"):
            pytest.fail("ran")
        assert info.value.exceeded is not None and info.value.exceeded.key == "amp:elapsed_s"
        assert info.value.exceeded.value >= 0.01
    assert ctx.termination_reason is TerminationReason.TIMEOUT


# -- children -------------------------------------------------------------------------------------


def test_spawn_child_nodes_hang_under_a_system_node_of_the_same_graph() -> None:
    with ExecutionContext() as ctx:
        with ctx.step("delegate") as step:
            child = ctx.spawn_child("researcher", metadata={"role": "r"})
        assert child.graph is ctx.graph and child.chain_id == ctx.chain_id
        sys_node = _node(ctx, child.node_id)
        assert sys_node.kind == "system" and sys_node.name == "researcher"
        assert sys_node.parent_id == step.node_id and sys_node.status == "running"
        assert sys_node.metadata["role"] == "r"
        grandchild = child.spawn_child("helper")
        call_id = _llm(grandchild, 0.25, tokens=(10, 1))
        assert _node(ctx, call_id).parent_id == grandchild.node_id
        assert _node(ctx, grandchild.node_id).parent_id == child.node_id
        for stats in (grandchild.stats, child.stats, ctx.stats):
            assert stats.total_cost() == 0.25 and stats.total_input_tokens() == 10
        grandchild.close()
        child.close()
        assert _node(ctx, child.node_id).status == "success"
    assert ctx.termination_reason is TerminationReason.SUCCESS


def test_each_context_checks_its_own_limits() -> None:
    with ExecutionContext(max_cost_usd=10.0) as ctx:
        child = ctx.spawn_child("sub", max_cost_usd=1.0)
        _llm(child, 0.9)
        with pytest.raises(LimitExceeded) as info:
            _llm(child, 0.2, est=0.2)
        assert info.value.exceeded is not None and info.value.exceeded.limit.max_value == 1.0
        assert child.termination_reason is TerminationReason.LIMIT_EXCEEDED
        # The parent is not stopped by its child's own limit.
        assert ctx.termination_reason is None and ctx.exceeded_limit is None
        _llm(ctx, 5.0, est=5.0)
        child.close()
    assert _node(ctx, child.node_id).status == "halt"
    assert ctx.termination_reason is TerminationReason.SUCCESS


def test_a_child_cannot_escape_the_parent_cap() -> None:
    with ExecutionContext(max_cost_usd=1.0) as ctx:
        child = ctx.spawn_child("sub", max_cost_usd=100.0)
        other = ctx.spawn_child("other")  # no limits of its own
        _llm(child, 0.7)
        with pytest.raises(LimitExceeded) as info:
            _llm(other, 0.0, est=0.5)
        assert info.value.exceeded is not None and info.value.exceeded.limit == Limit(KEY_COST, 1.0)
        assert ctx.termination_reason is TerminationReason.LIMIT_EXCEEDED
        assert other.termination_reason is TerminationReason.LIMIT_EXCEEDED
        assert child.termination_reason is None
        child.close()
        other.close()


def test_in_flight_reservations_of_a_child_count_for_the_parent() -> None:
    with ExecutionContext(max_cost_usd=1.0) as ctx:
        a, b = ctx.spawn_child("a"), ctx.spawn_child("b")
        held = a.llm_call("p", estimate_usd=0.8).start()
        assert ctx.stats.reserved()[KEY_COST] == Decimal("0.8")
        with pytest.raises(LimitExceeded), b.llm_call("p", estimate_usd=0.3):
            pytest.fail("ran")
        held.record(tokens_in=1, tokens_out=1, cost_usd=0.5)
        held.finish()
        with b.llm_call("p", estimate_usd=0.3) as call:
            call.record(tokens_in=1, tokens_out=1, cost_usd=0.3)
        assert ctx.stats.total_cost() == Decimal("0.8")
        a.close()
        b.close()


# -- current context and node ----------------------------------------------------------------------


def test_current_context_and_node() -> None:
    assert current_context() is None and current_node_id() is None
    with ExecutionContext() as ctx:
        assert current_context() is ctx and current_node_id() == ctx.node_id
        with ctx.step("s") as step:
            assert current_node_id() == step.node_id
            with ctx.llm_call("p") as call:
                assert current_node_id() == call.node_id
            assert current_node_id() == step.node_id
        child = ctx.spawn_child("sub")
        with child:
            assert current_context() is child
        assert current_context() is ctx
        child.close()
    assert current_context() is None and current_node_id() is None


def test_current_node_across_threads_with_copy_context() -> None:
    results: dict[str, Any] = {}
    with ExecutionContext() as ctx:
        with ctx.step("fanout") as step:

            def work(i: int) -> None:
                results[f"ctx{i}"] = current_context()
                with ctx.llm_call(f"call{i}") as call:
                    results[f"call{i}"] = call.node_id

            threads = [
                threading.Thread(target=contextvars.copy_context().run, args=(work, i))
                for i in range(4)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        # A plain thread without the copied context sees no current context.
        plain = threading.Thread(target=lambda: results.update(plain=current_context()))
        plain.start()
        plain.join()
    assert results["plain"] is None
    for i in range(4):
        assert results[f"ctx{i}"] is ctx
        assert _node(ctx, results[f"call{i}"]).parent_id == step.node_id


async def test_current_node_across_asyncio_tasks() -> None:
    parents: dict[str, str] = {}

    async def agent(ctx: ExecutionContext, i: int) -> None:
        async with ctx.step(f"task{i}") as step:
            await asyncio.sleep(0)
            async with ctx.llm_call(f"call{i}") as call:
                await asyncio.sleep(0.001 * (3 - i))
                call.record(tokens_in=1, tokens_out=1, cost_usd=0.0)
            parents[call.node_id] = step.node_id
            assert current_node_id() == step.node_id

    async with ExecutionContext() as ctx:
        async with ctx.step("gather") as outer:
            await asyncio.gather(*(agent(ctx, i) for i in range(3)))
            assert current_node_id() == outer.node_id
        for call_id, step_id in parents.items():
            assert _node(ctx, call_id).parent_id == step_id
            assert _node(ctx, step_id).parent_id == outer.node_id
        assert len(parents) == 3


def _usage(model: str, t_in: int, t_out: int, cost: float) -> dict[str, float]:
    return {
        KEY_INPUT_TOKENS: t_in,
        KEY_INPUT_TOKENS_FOR + model: t_in,
        KEY_OUTPUT_TOKENS: t_out,
        KEY_OUTPUT_TOKENS_FOR + model: t_out,
        KEY_COST: cost,
        KEY_COST_FOR + model: cost,
    }


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 2),
            st.sampled_from(["llm", "tool", "fail", "trace"]),
            st.sampled_from(["m1", "m2"]),
            st.integers(0, 500),
            st.integers(0, 100),
            st.sampled_from([0.0, 0.25, 0.5, 1.0]),
        ),
        max_size=25,
    )
)
def test_every_level_holds_the_sum_of_its_subtree(
    ops: list[tuple[int, str, str, int, int, float]],
) -> None:
    root = ExecutionContext()
    child = root.spawn_child("child")
    grandchild = child.spawn_child("grandchild")
    tree = (root, child, grandchild)
    expected = [dict[str, float]() for _ in tree]
    for level, op, model, t_in, t_out, cost in ops:
        ctx = tree[level]
        delta: dict[str, float] = {}
        if op == "llm":
            with ctx.llm_call("p", model=model, estimate_usd=cost) as call:
                call.record(tokens_in=t_in, tokens_out=t_out, cost_usd=cost)
            delta = _usage(model, t_in, t_out, cost) | {KEY_LLM_CALLS: 1, KEY_STEPS: 1}
        elif op == "tool":
            with ctx.tool_call(model, estimate_usd=cost):
                pass
            delta = {KEY_TOOL_CALLS: 1, KEY_TOOL_CALLS_FOR + model: 1, KEY_STEPS: 1}
        elif op == "fail":
            with pytest.raises(OSError), ctx.llm_call("p", model=model) as call:
                call.record(tokens_in=t_in, tokens_out=0, cost_usd=cost)
                raise OSError("cut")
            delta = _usage(model, t_in, 0, cost) | {KEY_LLM_CALLS: 1, KEY_RETRIES: 1}
        else:
            ctx.trace(ModelCallTrace(model=model, input_tokens=t_in, output_tokens=t_out))
            delta = _usage(model, t_in, t_out, 0.0) | {KEY_LLM_CALLS: 1}
        for upper in range(level + 1):
            for key, value in delta.items():
                expected[upper][key] = expected[upper].get(key, 0) + value
    for ctx, want in zip(tree, expected, strict=True):
        values = {**ctx.stats.counters(), **ctx.stats.gauges()}
        for key, value in want.items():
            assert values.get(key, 0) == pytest.approx(value), key
        assert ctx.stats.reserved() == {}
    for ctx in reversed(tree):
        ctx.close()
