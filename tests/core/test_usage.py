"""``Usage`` is the one translation from what a call used to the stats keys."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ampmeter import money
from ampmeter._core.usage import Usage
from ampmeter.keys import (
    KEY_CACHED_INPUT_TOKENS,
    KEY_COST,
    KEY_INPUT_TOKENS,
    KEY_LLM_CALLS,
    KEY_OUTPUT_TOKENS,
    KEY_REASONING_TOKENS,
    KEY_RETRIES,
    KEY_STEPS,
    KEY_TOOL_CALLS,
    KEY_UNPRICED_LLM_CALLS,
)


def keys(usage: Usage) -> list[str]:
    return [key for key, _, _ in usage.entries()]


def test_an_llm_call_names_its_input_output_and_cost_even_at_zero() -> None:
    usage = Usage("llm", "m1", calls=1)
    assert keys(usage) == [
        KEY_INPUT_TOKENS,
        KEY_INPUT_TOKENS + ":m1",
        KEY_OUTPUT_TOKENS,
        KEY_OUTPUT_TOKENS + ":m1",
        KEY_COST,
        KEY_COST + ":m1",
        KEY_LLM_CALLS,
    ]


def test_amounts_that_are_zero_are_left_out_unless_a_call_is_counted() -> None:
    assert keys(Usage("llm", "m1")) == []
    assert keys(Usage("llm", "", tokens_in=5)) == [KEY_INPUT_TOKENS]


def test_every_amount_goes_to_its_total_and_per_model_key() -> None:
    usage = Usage(
        "llm",
        "m1",
        tokens_in=10,
        tokens_out=4,
        cached_tokens=3,
        reasoning_tokens=2,
        cost_nano=500_000_000,
        calls=1,
        steps=1,
        retries=2,
        unpriced=1,
    )
    amounts = usage.amounts()
    assert amounts[KEY_INPUT_TOKENS] == amounts[KEY_INPUT_TOKENS + ":m1"] == 10
    assert amounts[KEY_OUTPUT_TOKENS] == amounts[KEY_OUTPUT_TOKENS + ":m1"] == 4
    assert amounts[KEY_CACHED_INPUT_TOKENS] == amounts[KEY_CACHED_INPUT_TOKENS + ":m1"] == 3
    assert amounts[KEY_REASONING_TOKENS] == amounts[KEY_REASONING_TOKENS + ":m1"] == 2
    assert amounts[KEY_COST] == amounts[KEY_COST + ":m1"] == Decimal("0.5")
    assert (amounts[KEY_LLM_CALLS], amounts[KEY_STEPS], amounts[KEY_RETRIES]) == (1, 1, 2)
    assert amounts[KEY_UNPRICED_LLM_CALLS] == 1
    gauges = {key for key, _, gauge in usage.entries() if gauge}
    assert gauges == {KEY_COST, KEY_COST + ":m1"}


def test_a_tool_call_counts_tool_calls_and_no_tokens() -> None:
    usage = Usage("tool", "", "search", calls=1, steps=1)
    assert keys(usage) == [KEY_TOOL_CALLS, KEY_TOOL_CALLS + ":search", KEY_STEPS]


def test_amounts_follow_the_shape_keys_in_order() -> None:
    usage = Usage("llm", "m1", tokens_in=7, tokens_out=3, calls=1)
    amounts = usage.amounts()
    assert list(amounts) == list(usage.shape().keys)
    assert amounts == {
        key: money.from_nano(usage[field]) if gauge else usage[field]
        for key, field, gauge in usage.entries()
    }
    assert Usage("llm", "", tokens_in=9).amounts() == {KEY_INPUT_TOKENS: 9}


def test_shapes_are_shared_by_usages_that_differ_only_in_nonzero_amounts() -> None:
    first = Usage("llm", "m1", tokens_in=1, tokens_out=2, calls=1)
    second = Usage("llm", "m1", tokens_in=50, tokens_out=60, calls=1)
    assert first.shape() is second.shape()
    assert Usage("llm", "m2", tokens_in=1, calls=1).shape() is not first.shape()
    assert Usage("llm", "m1", calls=1).shape() is not first.shape()


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"tokens_in": -1}, "tokens_in"),
        ({"tokens_out": 1.5}, "tokens_out"),
        ({"tokens_in": 2, "cached_tokens": 3}, "cached_tokens"),
        ({"tokens_out": 1, "reasoning_tokens": 2}, "reasoning_tokens"),
        ({"cost_usd": float("nan")}, "cost_usd"),
        ({"cost_usd": -0.5}, "cost_usd"),
        ({"calls": -1}, "calls"),
        ({"kind": ""}, "kind"),
    ],
)
def test_checked_refuses_bad_values_naming_the_argument(
    arguments: dict[str, object], named: str
) -> None:
    with pytest.raises((TypeError, ValueError), match=named):
        Usage.checked(**arguments)  # type: ignore[arg-type]


def test_checked_keeps_good_values() -> None:
    usage = Usage.checked(kind="tool", tool="search", calls=1, steps=1, cost_usd=0.25)
    assert (usage.kind, usage.tool, usage.calls, usage.steps) == ("tool", "search", 1, 1)
    assert usage.amounts()[KEY_COST] > 0


@given(
    model=st.sampled_from(["", "m1", "org/model-2"]),
    tokens_in=st.integers(0, 10**9),
    tokens_out=st.integers(0, 10**9),
    cost_nano=st.integers(0, 10**15),
    calls=st.integers(0, 3),
)
def test_each_amount_is_counted_once_in_its_total_and_once_per_model(
    model: str, tokens_in: int, tokens_out: int, cost_nano: int, calls: int
) -> None:
    usage = Usage(
        "llm", model, tokens_in=tokens_in, tokens_out=tokens_out, cost_nano=cost_nano, calls=calls
    )
    listed = keys(usage)
    assert len(listed) == len(set(listed))
    amounts = usage.amounts()
    for total, amount in (
        (KEY_INPUT_TOKENS, tokens_in),
        (KEY_OUTPUT_TOKENS, tokens_out),
        (KEY_COST, money.from_nano(cost_nano)),
    ):
        assert amounts.get(total, 0) == amount
        if model:
            assert amounts.get(f"{total}:{model}", 0) == amount
    assert amounts.get(KEY_LLM_CALLS, 0) == calls
    if not model:
        assert not any(":" in key.removeprefix("amp:") for key in amounts)
    assert list(amounts) == [key for key, _, _ in usage.entries()]


def test_shapes_past_the_one_shape_cache_are_not_kept_and_still_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The interned shapes are the one shape cache: past its cap a shape is made again each
    time, nothing per context keeps it, and the call counts as any other."""
    from ampmeter import ExecutionContext, Limit
    from ampmeter._core import usage as usage_module

    seen = Usage("llm", "shape-model-a", tokens_in=1, calls=1)
    assert seen.shape() is seen.shape() and seen.shape().interned
    monkeypatch.setattr(usage_module, "_SHAPES_MAX", 0)
    fresh = Usage("llm", "shape-model-b", tokens_in=1, calls=1)
    assert fresh.shape() is not fresh.shape() and not fresh.shape().interned
    limits = [Limit("amp:cost", 1, warn_at=(0.5,))]
    with ExecutionContext(limits=limits) as ctx:
        for _ in range(3):
            with ctx.llm_call("c", model="shape-model-b", estimate_usd=0.2) as call:
                call.record(tokens_in=3, tokens_out=2, cost_usd=0.25)
    assert ctx.stats.get_gauge("amp:cost:shape-model-b") == Decimal("0.75")
    assert [e["kind"] for e in ctx.snapshot()["limit_events"]] == ["warning"]
