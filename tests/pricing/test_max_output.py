"""A call without max_tokens reserves its model's documented maximum output."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from ampmeter import ExecutionContext, LimitExceeded, pricing
from ampmeter.pricing.max_output import max_output_tokens


@pytest.mark.parametrize(
    ("model", "tokens"),
    [
        ("gpt-4o", 16_384),
        ("gpt-4o-2024-08-06", 16_384),  # dated names match their family
        ("openai/gpt-4o-mini", 16_384),  # provider prefixes are ignored
        ("gpt-4-0613", 8_192),
        ("gpt-4-turbo-2024-04-09", 4_096),  # the longest entry wins
        ("gpt-4.1-mini-2025-04-14", 32_768),
        ("o1-mini-2024-09-12", 65_536),
        ("claude-opus-4-20250514", 32_000),
        ("claude-opus-4-1-20250805", 32_000),
        ("claude-sonnet-4-5-20250929", 64_000),
        # a newer model is not taken for an older family's prefix (4.6 writes 4x Opus 4's 32k)
        ("claude-opus-4-6", 128_000),
        ("claude-sonnet-4-6", 128_000),
        ("gpt-5.1", 128_000),
        ("gpt-5.1-2025-11-13", 128_000),
        ("models/gemini-2.5-flash-lite", 65_536),
        ("GPT-4o", 16_384),
    ],
)
def test_documented_models_are_found(model: str, tokens: int) -> None:
    assert max_output_tokens(model) == tokens


@pytest.mark.parametrize("model", ["gpt-4ox", "gpt-40", "o10", "smollm2", "llama-3.1-8b", ""])
def test_other_names_are_unknown(model: str) -> None:
    assert max_output_tokens(model) is None


def test_the_table_is_well_formed() -> None:
    raw = json.loads(
        resources.files("ampmeter.pricing").joinpath("max_output_tokens.json").read_text()
    )
    models = raw["models"]
    assert models and all(name == name.lower() and "/" not in name for name in models)
    assert all(isinstance(n, int) and 1_000 <= n <= 1_000_000 for n in models.values())


def test_an_estimate_without_max_tokens_reserves_the_models_maximum() -> None:
    with_max = pricing.estimate("gpt-4o", prompt_tokens=100, max_tokens=16_384)
    short = pricing.estimate("gpt-4o", prompt_tokens=100, max_tokens=1_024)
    assert pricing.estimate("gpt-4o", prompt_tokens=100) == with_max
    assert with_max is not None and short is not None and with_max > short


def test_an_unknown_model_reserves_the_documented_default() -> None:
    pricing.set_price("house-model-7", input_per_mtok=1.0, output_per_mtok=2.0)
    try:
        default = pricing.estimate("house-model-7", prompt_tokens=0)
        assert default == pricing.estimate(
            "house-model-7", prompt_tokens=0, max_tokens=pricing.DEFAULT_ESTIMATE_OUTPUT_TOKENS
        )
    finally:
        pricing.remove_price("house-model-7")


def test_a_call_that_could_write_past_the_budget_is_stopped_before_it_runs() -> None:
    # gpt-4o may write 16,384 tokens ($0.16 at list price): a $0.05 cap refuses the call that
    # sets no max_tokens, and lets through the same call capped at 1,024 tokens.
    ctx = ExecutionContext(max_cost_usd=0.05)
    with pytest.raises(LimitExceeded), ctx.llm_call("open-ended", model="gpt-4o", prompt_tokens=10):
        pytest.fail("ran")
    with ctx.llm_call("capped", model="gpt-4o", prompt_tokens=10, max_tokens=1_024) as call:
        call.record(10, 20)
    assert ctx.stats.reserved() == {}


def test_output_bound_is_max_tokens_else_the_model_maximum_else_the_default() -> None:
    from ampmeter.pricing.max_output import DEFAULT_OUTPUT_BOUND, output_bound

    assert output_bound("gpt-4o", 40) == 40
    assert output_bound("gpt-4o", 0) == 0
    assert output_bound("gpt-4o-2024-08-06", None) == 16384
    assert output_bound("surely-not-a-model", None) == DEFAULT_OUTPUT_BOUND
    assert output_bound(None, None) == DEFAULT_OUTPUT_BOUND
    for bad in (-1, 1.5, True, "40"):
        with pytest.raises(ValueError, match="max_tokens"):
            output_bound("gpt-4o", bad)  # type: ignore[arg-type]
