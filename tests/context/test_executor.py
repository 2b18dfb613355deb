"""The executor loop: every scenario of the stats-and-limits example usage, and how runs end."""

from __future__ import annotations

import contextvars
import threading
import time
from typing import Any

import pytest

from ampmeter import (
    CONTINUE,
    ExecutionContext,
    ExecutionResult,
    Executor,
    HookAbort,
    Limit,
    LimitType,
    ModelCallTrace,
    ParseErrorTrace,
    TerminationReason,
    default_limits,
)
from ampmeter.keys import (
    KEY_COST,
    KEY_FORMAT_PARSE_ERROR_CONSECUTIVE,
    KEY_FORMAT_PARSE_ERROR_TOTAL,
    KEY_INPUT_TOKENS,
    KEY_INPUT_TOKENS_FOR,
    KEY_ITERATIONS,
    KEY_TOOLCHAIN_PARSE_ERROR_CONSECUTIVE,
)
from ampmeter.sinks.memory import MemorySink

SPEC_LIMITS = [
    Limit(KEY_ITERATIONS, 100),
    Limit(KEY_FORMAT_PARSE_ERROR_CONSECUTIVE, 3),
    Limit(KEY_TOOLCHAIN_PARSE_ERROR_CONSECUTIVE, 3),
    Limit(KEY_INPUT_TOKENS, 100_000),
    Limit(KEY_INPUT_TOKENS_FOR, 50_000, LimitType.PREFIX),
    Limit(KEY_COST, 10.0),
]


class CountingLoop:
    """Calls ``body(ctx, iteration)`` each iteration; returns its non-None value as the result."""

    def __init__(self, body: Any) -> None:
        self.body = body
        self.iterations = 0

    def next(self, ctx: ExecutionContext) -> Any:
        self.iterations += 1
        assert ctx.iteration == self.iterations
        out = self.body(ctx, self.iterations)
        return CONTINUE if out is None else out


def _root(result: ExecutionResult) -> Any:
    ctx = result.context
    return ctx.graph.node(ctx.node_id)


# -- spec scenarios -------------------------------------------------------------------------------


def test_iteration_limit() -> None:
    loop = CountingLoop(lambda ctx, i: None)
    result = Executor(loop, [Limit(KEY_ITERATIONS, 5)]).execute()
    assert loop.iterations == 5
    assert result.termination_reason is TerminationReason.LIMIT_EXCEEDED
    assert result.exceeded_limit is not None
    assert result.exceeded_limit.limit == Limit(KEY_ITERATIONS, 5)
    assert (result.exceeded_limit.key, result.exceeded_limit.value) == (KEY_ITERATIONS, 6)
    assert result.result is None
    assert result.context.termination_reason is TerminationReason.LIMIT_EXCEEDED
    root = _root(result)
    assert root.status == "halt" and root.stop_reason == str(result.exceeded_limit)


def test_default_limits_stop_at_100_iterations() -> None:
    loop = CountingLoop(lambda ctx, i: None)
    result = Executor(loop).execute()
    assert Executor(loop).limits == default_limits()
    assert loop.iterations == 100
    assert result.exceeded_limit is not None and result.exceeded_limit.key == KEY_ITERATIONS


def test_input_token_limit() -> None:
    def body(ctx: ExecutionContext, i: int) -> None:
        with ctx.llm_call("think", model="gpt-4o") as call:
            call.record(tokens_in=30_000, tokens_out=100, cost_usd=0.01)

    loop = CountingLoop(body)
    limits = [Limit(KEY_INPUT_TOKENS, 100_000)]
    result = Executor(loop, limits).execute()
    assert loop.iterations == 4  # 120k after the 4th; the 5th iteration does not start
    assert result.termination_reason is TerminationReason.LIMIT_EXCEEDED
    assert result.exceeded_limit is not None
    assert (result.exceeded_limit.key, result.exceeded_limit.value) == (KEY_INPUT_TOKENS, 120_000)
    assert result.context.stats.total_input_tokens() == 120_000


def test_per_model_prefix_limit_reports_the_model_key() -> None:
    def body(ctx: ExecutionContext, i: int) -> None:
        ctx.trace(ModelCallTrace(model="gpt-4o", input_tokens=20_000, output_tokens=10))
        ctx.trace(ModelCallTrace(model="claude", input_tokens=5_000, output_tokens=10))

    loop = CountingLoop(body)
    result = Executor(loop, SPEC_LIMITS).execute()
    # gpt-4o passes 50k after the 3rd iteration (60k); the total (75k) stays under 100k.
    assert loop.iterations == 3
    exceeded = result.exceeded_limit
    assert exceeded is not None and exceeded.limit is SPEC_LIMITS[4]
    assert (exceeded.key, exceeded.value) == ("amp:input_tokens:gpt-4o", 60_000)
    assert result.termination_reason is TerminationReason.LIMIT_EXCEEDED


def test_total_input_limit_comes_first_in_list_order() -> None:
    def body(ctx: ExecutionContext, i: int) -> None:
        for model in ("a", "b", "c"):
            ctx.trace(ModelCallTrace(model=model, input_tokens=20_000))

    result = Executor(CountingLoop(body), SPEC_LIMITS).execute()
    # After two iterations: 120k in total (limit 4) and 40k per model: the total is reported,
    # as soon as the second iteration completes (no third one starts).
    assert result.exceeded_limit is not None and result.exceeded_limit.limit is SPEC_LIMITS[3]
    assert result.context.iteration == 2


def test_cost_limit_via_traces() -> None:
    def body(ctx: ExecutionContext, i: int) -> None:
        ctx.trace(ModelCallTrace(model="m", input_tokens=10, output_tokens=10, cost_usd=3.0))

    loop = CountingLoop(body)
    result = Executor(loop, SPEC_LIMITS).execute()
    assert loop.iterations == 4
    assert result.exceeded_limit is not None and result.exceeded_limit.key == KEY_COST
    assert result.exceeded_limit.value == 12.0


def test_cost_limit_stops_the_call_before_it_is_made() -> None:
    made: list[int] = []

    def body(ctx: ExecutionContext, i: int) -> None:
        with ctx.llm_call("step", model="m", estimate_usd=3.0) as call:
            made.append(i)
            call.record(tokens_in=10, tokens_out=10, cost_usd=3.0)

    sink = MemorySink()
    result = Executor(CountingLoop(body), SPEC_LIMITS, sinks=[sink]).execute()
    assert made == [1, 2, 3]  # a 4th call would reach $12
    assert result.termination_reason is TerminationReason.LIMIT_EXCEEDED
    assert result.exceeded_limit is not None and result.exceeded_limit.value == 12.0
    assert result.context.stats.total_cost() == 9.0
    statuses = [n.status for n in sink.nodes if n.kind == "llm"]
    assert statuses == ["success", "success", "success", "halt"]
    assert sink.nodes[-1].node_id == result.context.node_id  # the root ends last


def test_consecutive_parse_errors_with_resets() -> None:
    # Per iteration: True = the output parsed, False = a format parse error.
    plan = [False, False, True, False, False, False, True, False, False, False, False, True]

    def body(ctx: ExecutionContext, i: int) -> None:
        if plan[i - 1]:
            ctx.parse_ok("format")
        else:
            ctx.trace(ParseErrorTrace(error_type="format", raw_content="??", error="no header"))

    loop = CountingLoop(body)
    result = Executor(loop).execute()  # default limits: more than 3 in a row stops the run
    assert loop.iterations == 11  # the 4th consecutive error (iterations 8-11) stops it
    exceeded = result.exceeded_limit
    assert exceeded is not None and exceeded.key == KEY_FORMAT_PARSE_ERROR_CONSECUTIVE
    assert exceeded.value == 4
    stats = result.context.stats
    assert stats.format_parse_error_total() == 9
    assert [stats.get_counter(f"amp:format_parse_error:{i}") for i in range(1, 12)] == [
        0 if ok else 1 for ok in plan[:11]
    ]


def test_toolchain_parse_errors_use_their_own_counter() -> None:
    def body(ctx: ExecutionContext, i: int) -> None:
        ctx.trace(ParseErrorTrace(error_type="toolchain", raw_content="{", error="json"))
        if i % 2:
            ctx.parse_ok("format")  # resets the other counter only

    result = Executor(CountingLoop(body)).execute()
    assert result.exceeded_limit is not None
    assert result.exceeded_limit.key == KEY_TOOLCHAIN_PARSE_ERROR_CONSECUTIVE
    assert result.context.iteration == 4  # the fourth error ends the run when it completes
    assert result.context.stats.get_counter(KEY_FORMAT_PARSE_ERROR_TOTAL) == 0


def test_parallel_children_all_count_toward_the_parent() -> None:
    children_seen: list[ExecutionContext] = []
    lock = threading.Lock()

    def sub_agent(ctx: ExecutionContext, i: int, n: int) -> None:
        child = ctx.spawn_child(f"sub{i}.{n}")
        with lock:
            children_seen.append(child)
        child.trace(ModelCallTrace(model="gpt-4o-mini", input_tokens=10_000, output_tokens=100))
        child.close()

    def body(ctx: ExecutionContext, i: int) -> None:
        threads = [
            threading.Thread(target=contextvars.copy_context().run, args=(sub_agent, ctx, i, n))
            for n in range(4)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    loop = CountingLoop(body)
    limits = [Limit(KEY_INPUT_TOKENS, 100_000)]
    result = Executor(loop, limits).execute()
    # 40k per iteration from four children: 120k after the 3rd, so the 4th never starts.
    assert loop.iterations == 3
    exceeded = result.exceeded_limit
    assert exceeded is not None and exceeded.limit is limits[0]
    assert exceeded.value == 120_000
    assert len(children_seen) == 12
    assert all(c.stats.total_input_tokens() == 10_000 for c in children_seen)
    parent = result.context
    assert parent.stats.total_input_tokens() == 120_000
    assert parent.stats.get_counter(KEY_INPUT_TOKENS_FOR + "gpt-4o-mini") == 120_000
    systems = [n for n in parent.graph.nodes() if n.kind == "system" and n.parent_id]
    assert len(systems) == 12 and all(n.status == "success" for n in systems)
    assert all(n.parent_id == parent.node_id for n in systems)


def test_parallel_children_calls_stopped_by_the_parent_cap() -> None:
    made: list[str] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def sub_agent(ctx: ExecutionContext, n: int) -> None:
        child = ctx.spawn_child(f"sub{n}", max_cost_usd=100.0)  # its own cap is no way out
        try:
            for _ in range(50):
                with child.llm_call("work", estimate_usd=0.125) as call:
                    time.sleep(0.001)
                    call.record(tokens_in=1, tokens_out=1, cost_usd=0.125)
                with lock:
                    made.append(child.name)
        except Exception as exc:
            with lock:
                errors.append(exc)
        finally:
            child.close()

    def body(ctx: ExecutionContext, i: int) -> None:
        threads = [threading.Thread(target=sub_agent, args=(ctx, n)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]  # a sub-agent was stopped: so is the run

    loop = CountingLoop(body)
    result = Executor(loop, [Limit(KEY_COST, 1.0)]).execute()
    assert loop.iterations == 1
    assert len(made) == 8  # exactly $1.00 of $0.125 calls
    assert [type(e).__name__ for e in errors] == ["LimitExceeded"] * 4
    assert result.context.stats.total_cost() == 1.0
    assert result.exceeded_limit is not None and result.exceeded_limit.key == KEY_COST
    assert result.exceeded_limit.value == 1.125
    assert result.termination_reason is TerminationReason.LIMIT_EXCEEDED
    assert result.context.stats.reserved() == {}


# -- how runs end ---------------------------------------------------------------------------------


def test_success_returns_the_result_and_data_is_available() -> None:
    def body(ctx: ExecutionContext, i: int) -> Any:
        return f"answer to {ctx.data}" if i == 3 else None

    result = Executor(CountingLoop(body), SPEC_LIMITS).execute("q")
    assert result.result == "answer to q"
    assert result.termination_reason is TerminationReason.SUCCESS
    assert result.exceeded_limit is None and result.error is None
    assert _root(result).status == "success"


def test_a_plain_callable_is_a_loop() -> None:
    result = Executor(lambda ctx: 42 if ctx.iteration == 2 else CONTINUE).execute()
    assert (result.result, result.context.iteration) == (42, 2)
    with pytest.raises(TypeError, match="loop"):
        Executor(object())  # type: ignore[arg-type]


def test_hook_abort() -> None:
    def body(ctx: ExecutionContext, i: int) -> None:
        if i == 2:
            raise HookAbort("reviewer said stop")

    result = Executor(CountingLoop(body)).execute()
    assert result.termination_reason is TerminationReason.HOOK_ABORT
    assert isinstance(result.error, HookAbort)
    assert result.exceeded_limit is None
    root = _root(result)
    assert root.status == "halt" and root.stop_reason == "hook_abort"


def test_an_exception_ends_with_error() -> None:
    def body(ctx: ExecutionContext, i: int) -> None:
        with ctx.llm_call("p"):
            raise ConnectionError("provider down")

    result = Executor(CountingLoop(body)).execute()
    assert result.termination_reason is TerminationReason.ERROR
    assert isinstance(result.error, ConnectionError)
    root = _root(result)
    assert root.status == "fail" and root.error_class == "ConnectionError"
    call = next(n for n in result.context.graph.nodes() if n.kind == "llm")
    assert call.status == "fail" and call.error_class == "ConnectionError"


def test_cancel_ends_with_context_canceled() -> None:
    def body(ctx: ExecutionContext, i: int) -> None:
        if i == 2:
            ctx.cancel()

    loop = CountingLoop(body)
    result = Executor(loop).execute()
    assert loop.iterations == 2
    assert result.termination_reason is TerminationReason.CONTEXT_CANCELED
    root = _root(result)
    assert root.status == "halt" and root.stop_reason == "context_canceled"


def test_cancel_from_another_thread_stops_a_call() -> None:
    started = threading.Event()

    def body(ctx: ExecutionContext, i: int) -> None:
        if i == 1:

            def cancel_later() -> None:
                started.wait(10)
                ctx.cancel()

            threading.Thread(target=cancel_later).start()
            started.set()
            time.sleep(0.05)
        with ctx.llm_call("p"):
            pass

    result = Executor(CountingLoop(body)).execute()
    assert result.termination_reason is TerminationReason.CONTEXT_CANCELED


def test_timeout() -> None:
    def body(ctx: ExecutionContext, i: int) -> None:
        time.sleep(0.03)

    loop = CountingLoop(body)
    result = Executor(loop, timeout_s=0.02).execute()
    assert loop.iterations == 1
    assert result.termination_reason is TerminationReason.TIMEOUT
    assert result.exceeded_limit is not None and result.exceeded_limit.key == "amp:elapsed_s"
    assert _root(result).status == "halt"


def test_termination_reason_values() -> None:
    assert {r.value for r in TerminationReason} == {
        "success",
        "error",
        "context_canceled",
        "hook_abort",
        "limit_exceeded",
        "timeout",
    }
