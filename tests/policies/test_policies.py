"""Containment policies (ampmeter.policies) through the context's own calls: unpriced models,
warnings, soft limits, the final-answer reserve, windowed limits, the loop guard and the per-call
input cap. The SDK paths are in test_policies_sdk.py."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

import ampmeter
from ampmeter import (
    CONTINUE,
    ExecutionContext,
    Executor,
    InMemoryLedger,
    JsonlSink,
    Limit,
    LimitEvent,
    LimitExceeded,
    LimitType,
    MemorySink,
    validate_event,
)
from ampmeter.context import configured_policies
from ampmeter.keys import KEY_COST, KEY_INPUT_TOKENS, KEY_LLM_CALLS, KEY_TOOL_CALLS
from ampmeter.policies import (
    KEY_INPUT_TOKENS_PER_CALL,
    KEY_REPEATS_FOR,
    META_LIMIT_EVENTS,
    request_fingerprint,
)
from ampmeter.policies import windows as policies_module
from ampmeter.pricing import request_size

FINE_TUNE = "ft:gpt-4o-mini-2024-07-18:org::id"


@pytest.fixture(autouse=True)
def _clear_prices() -> Iterator[None]:
    yield
    ampmeter.clear_prices()


def paid(ctx: ExecutionContext, cost: float, **kwargs: Any) -> ampmeter.Call:
    """One LLM call the caller prices: reserves ``cost`` and records it."""
    with ctx.llm_call("step", model="m", estimate_usd=cost, **kwargs) as call:
        call.record(10, 5, cost_usd=cost)
    return call


# -- unpriced models ------------------------------------------------------------------------------


def test_an_unpriced_model_under_a_cost_limit_is_refused_before_it_runs() -> None:
    sink = MemorySink()
    ran = False
    with ExecutionContext(max_cost_usd=0.01, sinks=[sink]) as ctx:
        with pytest.raises(LimitExceeded) as info, ctx.llm_call(model=FINE_TUNE, max_tokens=9):
            ran = True
        snap = ctx.snapshot()
    assert not ran
    message = str(info.value)
    assert FINE_TUNE in message and "ampmeter.set_price(" in message
    (node,) = [n for n in sink.nodes if n.kind == "llm"]
    assert node.status == "halt" and FINE_TUNE in (node.stop_reason or "")
    assert info.value.node_id == node.node_id
    assert info.value.exceeded is not None
    assert info.value.exceeded.key == "amp:unpriced_llm_calls"
    assert snap["counters"].get(KEY_LLM_CALLS, 0) == 0
    assert ctx.termination_reason is ampmeter.TerminationReason.LIMIT_EXCEEDED


def test_a_child_of_a_cost_limited_context_refuses_unpriced_models_too() -> None:
    with ExecutionContext(max_cost_usd=1.0) as ctx:
        child = ctx.spawn_child("sub")
        with pytest.raises(LimitExceeded, match="has a cost limit"), child.llm_call(model="x9"):
            pass


def test_without_a_cost_limit_unpriced_models_run_and_policies_cost_nothing() -> None:
    with ExecutionContext(max_steps=5) as ctx, ctx.llm_call(model=FINE_TUNE) as call:
        call.record(3, 4)
    assert configured_policies(ctx).steps == ()  # no policy step in the chain
    assert ctx.stats.get_counter("amp:unpriced_llm_calls") == 1


def test_an_estimate_or_a_set_price_makes_a_call_priced() -> None:
    with ExecutionContext(max_cost_usd=1.0) as ctx:
        with ctx.llm_call(model=FINE_TUNE, estimate_usd=0.01) as call:  # priced by the caller
            call.record(1, 1, cost_usd=0.01)
        ampmeter.set_price("ft:gpt-4o-mini*", input_per_mtok=0.3, output_per_mtok=1.2)
        with ctx.llm_call(model=FINE_TUNE, max_tokens=10) as call:
            call.record(1000, 10)
    assert call.node.cost_usd == Decimal("0.000312")
    assert call.node.metadata["pricing_version"] == "user"


def test_warn_lets_the_call_through_and_reports_it() -> None:
    events: list[LimitEvent] = []
    with ExecutionContext(
        max_cost_usd=1.0, on_unpriced="warn", on_limit_event=events.append
    ) as ctx:
        child = ctx.spawn_child("sub")  # inherits "warn"
        with pytest.warns(RuntimeWarning, match="set_price"), child.llm_call(model="x9") as call:
            call.record(5, 5)
    assert [e.kind for e in events] == ["unpriced"]
    assert events[0].node_id == call.node_id
    assert child.snapshot()["limit_events"][0]["kind"] == "unpriced"


def test_allow_lets_the_call_through_silently() -> None:
    with ExecutionContext(max_cost_usd=1.0, on_unpriced="allow") as ctx, warnings.catch_warnings():
        warnings.simplefilter("error")
        with ctx.llm_call(model="x9") as call:
            call.record(5, 5)
    assert ctx.stats.get_counter("amp:unpriced_llm_calls") == 1


@pytest.mark.parametrize("value", ["deny", 1, True])
def test_bad_on_unpriced_is_refused(value: object) -> None:
    with pytest.raises(ValueError, match="on_unpriced"):
        ExecutionContext(max_cost_usd=1, on_unpriced=value)  # type: ignore[arg-type]


def test_provider_prefixed_names_are_priced_as_the_model_they_name() -> None:
    base = ampmeter.price("gpt-4o", "openai", input_tokens=1000, output_tokens=100)
    prefixed = ampmeter.price("openai/gpt-4o", input_tokens=1000, output_tokens=100)
    assert prefixed.status == "priced" and prefixed.cost_usd == base.cost_usd
    haiku = ampmeter.price("anthropic/claude-3-haiku", "openai", input_tokens=10, output_tokens=1)
    assert (
        haiku.cost_usd
        == ampmeter.price("claude-3-haiku", "anthropic", input_tokens=10, output_tokens=1).cost_usd
    )
    # an unknown prefix guesses nothing, and neither does a fine-tune of a priced base
    assert ampmeter.price("someorg/gpt-4o", input_tokens=1, output_tokens=1).status == "unpriced"
    assert ampmeter.price(FINE_TUNE, input_tokens=1, output_tokens=1).status == "unpriced"


def test_price_patterns() -> None:
    ampmeter.set_price("ft:*", input_per_mtok=1, output_per_mtok=1)
    ampmeter.set_price("ft:gpt-4o-mini*", input_per_mtok=2, output_per_mtok=2)
    ampmeter.set_price(FINE_TUNE.upper(), input_per_mtok=3, output_per_mtok=3)

    def rate(model: str) -> float | None:
        return ampmeter.price(model, input_tokens=10**6, output_tokens=0).cost_usd

    assert rate(FINE_TUNE) == 3  # exact beats any pattern
    assert rate("ft:gpt-4o-mini-2024-07-18:org::other") == 2  # the longer pattern
    assert rate("ft:gpt-4o:org::x") == 1
    assert rate("openai/ft:gpt-4o:org::x") == 1  # prefixed names find user prices too
    ampmeter.remove_price("ft:gpt-4o-mini*")
    assert rate("ft:gpt-4o-mini-2024-07-18:org::other") == 1
    with pytest.raises(KeyError, match="pattern"):
        ampmeter.remove_price("ft:gpt-4o-mini*")


# -- the measured hole, through the real openai SDK and the replay server is in
#    test_policies_sdk.py; warnings ------------------------------------------------------


def test_warnings_fire_once_per_threshold_with_their_values(tmp_path: Path) -> None:
    events: list[LimitEvent] = []
    path = tmp_path / "run.jsonl"
    limit = Limit(KEY_COST, 1.0, warn_at=(0.8, 0.5))
    with (
        JsonlSink(path) as sink,
        ExecutionContext(limits=[limit], on_limit_event=events.append, sinks=[sink]) as ctx,
    ):
        calls = [paid(ctx, 0.3) for _ in range(3)]
        paid(ctx, 0.05)
        snap = ctx.snapshot()
    assert limit.warn_at == (0.5, 0.8)
    assert [(e.kind, e.threshold, e.node_id) for e in events] == [
        ("warning", 0.5, calls[1].node_id),
        ("warning", 0.8, calls[2].node_id),
    ]
    first = events[0]
    assert first.limit == limit and first.key == KEY_COST and first.context == ctx.name
    assert first.value == Decimal("0.6") and first.fraction == pytest.approx(0.6)
    assert [e["threshold"] for e in snap["limit_events"]] == [0.5, 0.8]
    assert calls[1].node.metadata[META_LIMIT_EVENTS] == [first.to_dict()]
    assert META_LIMIT_EVENTS not in calls[0].node.metadata
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for line in lines:
        validate_event(line)
    logged = [
        line["metadata"][META_LIMIT_EVENTS]
        for line in lines
        if META_LIMIT_EVENTS in line.get("metadata", {})
    ]
    assert logged == [[first.to_dict()], [events[1].to_dict()]]


def test_the_report_marks_a_run_s_limit_events(tmp_path: Path) -> None:
    from ampmeter.report import build_report

    path = tmp_path / "run.jsonl"
    quiet = tmp_path / "quiet.jsonl"
    with (
        JsonlSink(path) as sink,
        ExecutionContext(max_cost_usd=1, warn_at=(0.5,), sinks=[sink]) as ctx,
    ):
        paid(ctx, 0.3)
        call = paid(ctx, 0.3)
    with JsonlSink(quiet) as sink, ExecutionContext(max_cost_usd=1, sinks=[sink]) as other:
        paid(other, 0.9)
    page = build_report([path, quiet])
    assert page.count("1 limit event(s)") == 1
    assert (
        'warning: amp:cost (60%) <span class="muted">limit amp:cost &gt; $1.00, '
        f"node {call.node_id}" in page
    )


def test_warn_at_on_the_shortcuts_and_per_key_on_prefix_limits() -> None:
    events: list[LimitEvent] = []
    per_model = Limit("amp:input_tokens:", 100, LimitType.PREFIX, warn_at=(0.5,))
    with ExecutionContext(
        max_cost_usd=1.0,
        max_steps=4,
        warn_at=(0.5,),
        limits=[per_model],
        on_limit_event=events.append,
    ) as ctx:
        assert per_model in ctx.limits
        assert {lim.key: lim.warn_at for lim in ctx.limits} == {
            "amp:input_tokens:": (0.5,),
            KEY_COST: (0.5,),
            "amp:steps": (0.5,),
        }
        with ctx.llm_call(model="a", estimate_usd=0.1) as call:
            call.record(60, 1, cost_usd=0.1)
        with ctx.llm_call(model="b", estimate_usd=0.5) as call:
            call.record(70, 1, cost_usd=0.5)
    assert sorted(e.key for e in events) == [
        KEY_COST,
        "amp:input_tokens:a",
        "amp:input_tokens:b",
        "amp:steps",
    ]


def test_warnings_of_a_parent_fire_on_a_child_call_and_a_child_inherits_the_callback() -> None:
    events: list[LimitEvent] = []
    with ExecutionContext(max_cost_usd=1.0, warn_at=(0.5,), on_limit_event=events.append) as ctx:
        child = ctx.spawn_child("sub", limits=[Limit(KEY_LLM_CALLS, 2, warn_at=(1.0,))])
        paid(child, 0.3)
        call = paid(child, 0.3)
    assert sorted((e.context, e.key) for e in events) == [
        ("agent_run", KEY_COST),
        ("sub", KEY_LLM_CALLS),
    ]
    assert all(e.node_id == call.node_id for e in events)
    assert [e["key"] for e in ctx.snapshot()["limit_events"]] == [KEY_COST]
    assert [e["key"] for e in child.snapshot()["limit_events"]] == [KEY_LLM_CALLS]


def test_a_failing_callback_does_not_fail_the_call() -> None:
    def broken(event: LimitEvent) -> None:
        raise RuntimeError("boom")

    ctx = ExecutionContext(max_cost_usd=1.0, warn_at=(0.1,), on_limit_event=broken)
    with ctx, pytest.warns(RuntimeWarning, match="boom"):
        call = paid(ctx, 0.5)
    assert call.node.status == "success"
    assert ctx.snapshot()["limit_events"][0]["threshold"] == 0.1


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ((0,), ValueError),
        ((1.5,), ValueError),
        ((-0.1,), ValueError),
        ("0.5", TypeError),
        ((True,), TypeError),
        (0.5, TypeError),
    ],
)
def test_bad_warn_at_is_refused(value: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="warn_at"):
        Limit(KEY_COST, 1, warn_at=value)  # type: ignore[arg-type]
    with pytest.raises(error, match="warn_at"):
        ExecutionContext(max_cost_usd=1, warn_at=value)  # type: ignore[arg-type]


def test_trace_records_warn_and_soften_too() -> None:
    events: list[LimitEvent] = []
    limits = [Limit(KEY_COST, 1.0, warn_at=(0.5,)), Limit(KEY_TOOL_CALLS, 1, soft=True)]
    with ExecutionContext(limits=limits, on_limit_event=events.append) as ctx:
        ctx.trace(ampmeter.ModelCallTrace(model="m", input_tokens=5, output_tokens=5, cost_usd=0.6))
        ctx.trace(ampmeter.ToolCallTrace(tool_name="search"))
        ctx.trace(ampmeter.ToolCallTrace(tool_name="search"))
        assert ctx.wrap_up
    assert [(e.kind, e.node_id) for e in events] == [
        ("warning", ctx.node_id),
        ("soft_limit", ctx.node_id),
    ]
    root = ctx.graph.node(ctx.node_id)
    assert [e["kind"] for e in root.metadata[META_LIMIT_EVENTS]] == ["warning", "soft_limit"]


# -- soft limits ----------------------------------------------------------------------------------


def test_a_soft_limit_refuses_nothing_and_sets_wrap_up() -> None:
    events: list[LimitEvent] = []
    soft = Limit(KEY_LLM_CALLS, 2, soft=True)
    with ExecutionContext(limits=[soft], max_cost_usd=1.0, on_limit_event=events.append) as ctx:
        child = ctx.spawn_child("sub")
        for _ in range(3):
            assert not ctx.wrap_up
            paid(ctx, 0.1)
        assert ctx.wrap_up and child.wrap_up  # the whole subtree is asked to wrap up
        paid(ctx, 0.1)  # still not refused
        with pytest.raises(LimitExceeded, match="amp:cost"):  # the hard limit holds
            paid(ctx, 0.7)
    assert [e.kind for e in events] == ["soft_limit"]
    assert ctx.stats.get_counter(KEY_LLM_CALLS) == 4


def test_the_executor_loop_sees_wrap_up() -> None:
    def loop(ctx: ExecutionContext) -> Any:
        if ctx.wrap_up:
            return f"answer after {ctx.iteration - 1} steps"
        paid(ctx, 0.1)
        return CONTINUE

    result = Executor(loop, limits=[Limit(KEY_COST, 0.25, soft=True)], max_cost_usd=5.0).execute()
    assert result.result == "answer after 3 steps"
    assert result.termination_reason is ampmeter.TerminationReason.SUCCESS


def test_a_soft_limit_is_counted_in_a_ledger_but_refuses_nothing() -> None:
    ledger = InMemoryLedger()
    soft = Limit(KEY_LLM_CALLS, 1, soft=True)
    with ExecutionContext(limits=[soft], ledger=ledger) as ctx:
        for _ in range(3):
            paid(ctx, 0.1)
    assert ctx.wrap_up
    assert ledger.spent() == {KEY_LLM_CALLS: 3.0}  # the shared total the soft limit reads


def test_bad_soft_and_window_values_are_refused() -> None:
    with pytest.raises(TypeError, match="soft"):
        Limit(KEY_COST, 1, soft=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="window_s"):
        Limit(KEY_COST, 1, window_s=0)
    with pytest.raises(ValueError, match="exact key"):
        Limit("amp:cost:", 1, LimitType.PREFIX, window_s=5)
    with pytest.raises(ValueError, match="soft"):
        Limit(KEY_COST, 1, window_s=5, soft=True)


# -- the final-answer reserve ---------------------------------------------------------------------


def test_ordinary_calls_leave_the_reserve_and_a_final_call_may_use_it() -> None:
    with ExecutionContext(max_cost_usd=1.0, final_reserve_usd=0.3) as ctx:
        paid(ctx, 0.5)
        with pytest.raises(LimitExceeded, match="final-answer reserve") as info:
            paid(ctx, 0.25)  # 0.5 + 0.25 > 1.0 - 0.3
        assert info.value.exceeded is not None
        assert info.value.exceeded.value == pytest.approx(0.75)
        assert info.value.exceeded.limit.max_value == Decimal("0.7")
        final = paid(ctx, 0.45, final=True)
        with pytest.raises(LimitExceeded, match="limit exceeded: amp:cost"):  # the hard ceiling
            paid(ctx, 0.1, final=True)
    assert final.node.status == "success"
    assert ctx.stats.get_gauge(KEY_COST) == Decimal("0.95")


def test_the_reserve_counts_calls_in_flight_and_children() -> None:
    with ExecutionContext(max_cost_usd=1.0, final_reserve_usd=0.5) as ctx:
        child = ctx.spawn_child("sub")
        with child.llm_call(model="m", estimate_usd=0.4) as held:
            with pytest.raises(LimitExceeded, match="reserve"):
                paid(ctx, 0.2)  # 0.4 held + 0.2 > 0.5
            paid(ctx, 0.2, final=True)
            held.record(1, 1, cost_usd=0.4)


def test_steps_and_embedding_requests_are_held_to_the_plain_ceiling_not_the_reserve() -> None:
    with ExecutionContext(max_cost_usd=1.0, final_reserve_usd=0.5) as ctx:
        paid(ctx, 0.4)
        paid(ctx, 0.3, final=True)  # into the reserve: 0.7 spent
        with ctx.step("wrap up"):
            pass
        with ctx.embedding_call(model="m", estimate_usd=0.1) as call:  # 0.8 <= 1.0
            call.record(10, cost_usd=0.1)
        with pytest.raises(LimitExceeded, match="final-answer reserve"):
            paid(ctx, 0.01)  # an ordinary LLM call is held to 1.0 - 0.5
    assert ctx.stats.get_gauge(KEY_COST) == Decimal("0.8")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"final_reserve_usd": 0.1}, "needs a cost limit"),
        ({"final_reserve_usd": 1.0, "max_cost_usd": 1.0}, "less than"),
        ({"final_reserve_usd": -1, "max_cost_usd": 1.0}, "final_reserve_usd"),
    ],
)
def test_bad_reserves_are_refused(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ExecutionContext(**kwargs)


def test_the_reserve_holds_across_processes_through_a_shared_ledger(tmp_path: Path) -> None:
    # Two contexts on two ledger objects over one SQLite file: what two processes would have.
    path = tmp_path / "budget.sqlite"
    with ampmeter.SqliteLedger(path, "team") as other_ledger:
        other = ExecutionContext(ledger=other_ledger, max_cost_usd=1.0)
        with other:
            paid(other, 0.5)
    with ampmeter.SqliteLedger(path, "team") as ledger:
        with ExecutionContext(ledger=ledger, max_cost_usd=1.0, final_reserve_usd=0.3) as ctx:
            with pytest.raises(
                LimitExceeded, match=r"shared budget .*amp:cost = \$0\.75 > \$0\.70$"
            ):
                paid(ctx, 0.25)  # locally 0.25 fits; the shared 0.5 + 0.25 > 1.0 - 0.3
            paid(ctx, 0.45, final=True)
        assert ledger.spent()[KEY_COST] == Decimal("0.95")


# -- windowed limits ------------------------------------------------------------------------------


class Clock:
    """The policies' monotonic clock, moved by the test (no sleeping, no timing assertions)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(policies_module, "time", fake)
    return fake


def test_a_windowed_limit_counts_only_the_window(clock: Clock) -> None:
    per_minute = Limit(KEY_LLM_CALLS, 2, window_s=60)
    with ExecutionContext(limits=[per_minute]) as ctx:
        paid(ctx, 0.1)
        clock.now += 30
        paid(ctx, 0.1)
        with pytest.raises(LimitExceeded, match="in 60s") as info:
            paid(ctx, 0.1)
        assert info.value.exceeded is not None
        assert info.value.exceeded.value == 3 and info.value.exceeded.limit is per_minute
        clock.now += 31  # the first call has left the window
        paid(ctx, 0.1)
        with pytest.raises(LimitExceeded):
            paid(ctx, 0.1)
    assert ctx.stats.get_counter(KEY_LLM_CALLS) == 3


def test_a_windowed_cost_limit_counts_holds_of_calls_in_flight(clock: Clock) -> None:
    per_hour = Limit(KEY_COST, 1.0, window_s=3600)
    with ExecutionContext(limits=[per_hour]) as ctx:
        child = ctx.spawn_child("sub")
        with child.llm_call(model="m", estimate_usd=0.7) as held:
            with pytest.raises(LimitExceeded, match=r"amp:cost = \$1\.10"):
                paid(child, 0.4)
            held.record(1, 1, cost_usd=0.7)
        clock.now += 3601
        paid(child, 0.9)


# -- the loop guard -------------------------------------------------------------------------------


def test_the_same_request_more_than_max_repeats_times_is_a_loop() -> None:
    sink = MemorySink()
    with ExecutionContext(max_repeats=2, sinks=[sink]) as ctx:
        for _ in range(2):
            with ctx.llm_call(model="m", prompt_text="same question") as call:
                call.record(3, 3)
        with ctx.llm_call(model="m", prompt_text="another question") as call:
            call.record(3, 3)
        child = ctx.spawn_child("sub")  # counted for the whole run
        repeated = child.llm_call(model="m", prompt_text="same question")
        with pytest.raises(LimitExceeded, match=r"^llm call .*: loop detected") as info, repeated:
            pass
    stop = info.value.exceeded
    assert stop is not None and stop.key.startswith(KEY_REPEATS_FOR)
    assert stop.limit.key == stop.key and stop.value == 3 and stop.limit.max_value == 2
    halted = [n for n in sink.nodes if n.status == "halt" and n.kind == "llm"]
    assert [n.stop_reason.split(":")[0] for n in halted] == [
        "loop detected (the same request 3 times, max_repeats=2)"
    ]
    assert ctx.termination_reason is ampmeter.TerminationReason.LIMIT_EXCEEDED


def test_the_same_tool_with_the_same_arguments_is_a_loop() -> None:
    with ExecutionContext(max_repeats=1) as ctx:
        with ctx.tool_call("search", arguments={"q": "paris", "n": 3}):
            pass
        with ctx.tool_call("search", arguments={"q": "oslo", "n": 3}):
            pass
        with ctx.tool_call("search"):  # no arguments: nothing to compare
            pass
        with (
            pytest.raises(LimitExceeded, match="loop detected"),
            ctx.tool_call("search", arguments={"n": 3, "q": "paris"}),
        ):
            pass
    assert ctx.stats.get_counter(KEY_TOOL_CALLS) == 3


def test_bad_max_repeats_is_refused() -> None:
    with pytest.raises(TypeError, match="max_repeats"):
        ExecutionContext(max_repeats=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_repeats"):
        ExecutionContext(max_repeats=-1)


# -- the per-call input cap -----------------------------------------------------------------------


def test_a_call_whose_estimated_input_is_too_large_is_refused() -> None:
    with ExecutionContext(max_input_tokens_per_call=100) as ctx:
        child = ctx.spawn_child("sub")  # inherits the cap
        large = child.llm_call(model="m", prompt_tokens=101)
        with pytest.raises(LimitExceeded, match="max_input_tokens_per_call") as info, large:
            pass
        estimated = ctx.llm_call(model="m", prompt_text="x" * 404)  # 101 tokens estimated
        with pytest.raises(LimitExceeded), estimated:
            pass
        with ctx.llm_call(model="m", prompt_tokens=100) as call:
            call.record(100, 1)
    assert info.value.exceeded is not None
    assert info.value.exceeded.key == KEY_INPUT_TOKENS_PER_CALL
    assert info.value.exceeded.value == 101
    assert ctx.stats.get_counter(KEY_LLM_CALLS) == 1


def test_an_actual_input_over_the_cap_is_recorded_exactly_and_reported() -> None:
    events: list[LimitEvent] = []
    ctx = ExecutionContext(max_input_tokens_per_call=60, on_limit_event=events.append)
    with ctx, ctx.llm_call(model="m", prompt_tokens=50) as call:
        call.record(80, 2)
    assert ctx.stats.get_counter(KEY_INPUT_TOKENS) == 80
    (event,) = events
    assert event.kind == "input_over_limit" and event.value == 80
    assert call.node.metadata[META_LIMIT_EVENTS] == [event.to_dict()]


def test_an_instrumented_call_is_final_inside_final_call_and_known_by_what_it_sends() -> None:
    """The instrumentation's entry takes finality from ``final_call()`` (a plain ``llm_call``
    from its own argument) and its loop-guard identity from the request it sends."""
    size = request_size.measure_text("hello")
    sent = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
    with ExecutionContext(max_cost_usd=1.0, final_reserve_usd=0.5, max_repeats=1) as ctx:
        first = ctx.model_call(
            "llm", {}, ("chat", "m", "openai"), max_tokens=10, request=size, final=None, sent=sent
        )
        with ampmeter.final_call():
            final = ctx.model_call(
                "llm", {"k": 1}, ("chat", "m", "openai"), max_tokens=10, request=size, final=None
            )
            plain = ctx.llm_call("chat", model="m", estimate_usd=0.01)
        marks = [call.policy for call in (first, final, plain)]
        assert [m.final for m in marks if m is not None] == [False, True, False]
        assert marks[0] is not None and marks[0].fingerprint == request_fingerprint(sent)
        assert marks[1] is not None and marks[1].fingerprint is None
        assert ctx.graph.node(final.node_id).metadata["k"] == 1
