"""Tests of ampmeter.pricing against the real genai-prices table."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import date, datetime, time, timezone
from decimal import Decimal
from pathlib import Path

import genai_prices
import pytest
from genai_prices import Usage, calc_price, data_snapshot
from genai_prices.types import (
    ClauseEquals,
    ConditionalPrice,
    ModelInfo,
    ModelPrice,
    Provider,
    StartDateConstraint,
    TieredPrices,
    TimeOfDateConstraint,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ampmeter import ExecutionContext, pricing
from ampmeter.pricing import (
    CHARS_PER_TOKEN,
    DEFAULT_ESTIMATE_OUTPUT_TOKENS,
    USER_PRICING_VERSION,
    PriceResult,
    clear_prices,
    estimate,
    price,
    remove_price,
    set_price,
    table_version,
)

TABLE_VERSION = f"genai-prices@{genai_prices.__version__}"

# Model names as users pass them, with and without a provider.
USER_MODELS = [
    ("gpt-4o", None),
    ("gpt-4o", "openai"),
    ("gpt-4o-mini-2024-07-18", "openai"),
    ("claude-3-5-sonnet-20241022", "anthropic"),
    ("claude-sonnet-4-5", None),
    ("claude-sonnet-4-5", "anthropic"),
]


@pytest.fixture(autouse=True)
def _no_user_prices() -> Iterator[None]:
    clear_prices()
    yield
    clear_prices()


def table_price(model: str, provider: str | None) -> ModelPrice:
    """The table's current ModelPrice for a model, read from genai-prices itself."""
    calc = calc_price(Usage(input_tokens=0, output_tokens=0), model, provider_id=provider)
    return calc.model_price


def rate(model: str, provider: str | None, key: str) -> Decimal:
    """A USD-per-million rate from the table (the base rate if it is tiered: short prompts)."""
    value = getattr(table_price(model, provider), key)
    if isinstance(value, TieredPrices):
        value = value.base
    assert isinstance(value, Decimal), f"{model} {key} is {value!r}"
    return value


def per_million(amount: Decimal | int) -> Decimal:
    return Decimal(amount).scaleb(-6)


def reference_cost(model: str, provider: str | None, **usage: int) -> Decimal:
    """What genai-prices itself charges, with ampmeter's names mapped to its usage keys."""
    gp_usage = Usage(
        input_tokens=usage["input_tokens"],
        output_tokens=usage["output_tokens"],
        cache_read_tokens=usage.get("cached_tokens", 0),
        cache_write_tokens=usage.get("cache_write_tokens", 0),
        output_reasoning_tokens=usage.get("reasoning_tokens", 0),
    )
    calc = calc_price(gp_usage, model, provider_id=provider)
    return calc.total_price


def find_table_model(want: str) -> tuple[str, str]:
    """(model, provider) of a static table entry: ``"free"`` (no prices at all) or
    ``"non_token"`` (prices, but none per input/output token), that resolves to itself."""
    for provider in data_snapshot.get_snapshot().providers:
        for model in provider.models:
            prices = model.prices
            if not isinstance(prices, ModelPrice):
                continue
            keys = {k for k, v in vars(prices).items() if v is not None and not k.startswith("_")}
            if want == "free":
                ok = not keys
            else:
                ok = bool(keys) and not keys & {"input_mtok", "output_mtok"}
            if not ok:
                continue
            try:
                calc = calc_price(Usage(input_tokens=0), model.id, provider_id=provider.id)
            except LookupError:
                continue
            if calc.model is model:
                return model.id, provider.id
    pytest.skip(f"the installed price table has no {want} model")


# --------------------------------------------------------------------------- the table


def test_gpt_4o_well_known_rates() -> None:
    # OpenAI lists gpt-4o at $2.50 in / $10 out / $1.25 cached per million tokens.
    mp = table_price("gpt-4o", "openai")
    assert mp.input_mtok == Decimal("2.5")
    assert mp.output_mtok == Decimal("10")
    assert mp.cache_read_mtok == Decimal("1.25")
    result = price("gpt-4o", "openai", input_tokens=1_000_000, output_tokens=1_000_000)
    assert result == PriceResult(Decimal("12.5"), TABLE_VERSION, "priced")
    assert isinstance(result.cost_usd, Decimal)
    tiny = price("gpt-4o", "openai", input_tokens=1, output_tokens=0)
    assert tiny.cost_usd == Decimal("0.0000025")  # exact, not 2.4999999999999998e-06


@pytest.mark.parametrize(("model", "provider"), USER_MODELS)
def test_user_model_names_priced_from_table_rates(model: str, provider: str | None) -> None:
    r_in = rate(model, provider, "input_mtok")
    r_out = rate(model, provider, "output_mtok")
    result = price(model, provider, input_tokens=1234, output_tokens=567)
    assert result.status == "priced"
    assert result.pricing_version == TABLE_VERSION
    assert result.cost_usd == per_million(1234 * r_in + 567 * r_out)
    assert result.cost_usd > 0


def test_provider_and_model_names_are_case_insensitive() -> None:
    a = price("gpt-4o", "openai", input_tokens=100, output_tokens=10)
    b = price("GPT-4o", "OpenAI", input_tokens=100, output_tokens=10)
    assert a == b
    assert a.status == "priced"


@pytest.mark.parametrize(("model", "provider"), [("gpt-4o", "openai"), ("claude-sonnet-4-5", None)])
def test_cached_tokens_are_part_of_input(model: str, provider: str | None) -> None:
    r_in = rate(model, provider, "input_mtok")
    r_cache = rate(model, provider, "cache_read_mtok")
    assert r_cache < r_in  # otherwise this test could not tell the rates apart
    result = price(model, provider, input_tokens=1000, output_tokens=0, cached_tokens=600)
    assert result.cost_usd == per_million(400 * r_in + 600 * r_cache)
    uncached = price(model, provider, input_tokens=1000, output_tokens=0)
    assert result.cost_usd is not None and uncached.cost_usd is not None
    assert result.cost_usd < uncached.cost_usd


def test_cache_writes_are_part_of_input_at_the_write_rate() -> None:
    model, provider = "claude-3-5-sonnet-20241022", "anthropic"
    r_in = rate(model, provider, "input_mtok")
    r_read = rate(model, provider, "cache_read_mtok")
    r_write = rate(model, provider, "cache_write_mtok")
    assert len({r_in, r_read, r_write}) == 3
    result = price(
        model,
        provider,
        input_tokens=1000,
        output_tokens=0,
        cached_tokens=200,
        cache_write_tokens=300,
    )
    assert result.cost_usd == per_million(500 * r_in + 200 * r_read + 300 * r_write)


def test_reasoning_tokens_are_part_of_output_billed_as_output() -> None:
    plain = price("gpt-4o", "openai", input_tokens=100, output_tokens=500)
    with_reasoning = price(
        "gpt-4o", "openai", input_tokens=100, output_tokens=500, reasoning_tokens=300
    )
    assert with_reasoning == plain
    assert plain.cost_usd == per_million(
        100 * rate("gpt-4o", "openai", "input_mtok") + 500 * rate("gpt-4o", "openai", "output_mtok")
    )


def test_long_prompt_tier_is_applied() -> None:
    # claude-sonnet-4-5 costs more for prompts over a threshold; the tier re-prices every token.
    tiered = table_price("claude-sonnet-4-5", "anthropic").input_mtok
    if not isinstance(tiered, TieredPrices):
        pytest.skip("the installed table has no input tiers for claude-sonnet-4-5")
    top = tiered.tiers[-1]
    lower_rate = tiered.tiers[-2].price if len(tiered.tiers) > 1 else tiered.base
    below = price("claude-sonnet-4-5", "anthropic", input_tokens=top.start, output_tokens=0)
    above = price("claude-sonnet-4-5", "anthropic", input_tokens=top.start + 1, output_tokens=0)
    assert lower_rate < top.price
    assert below.cost_usd == per_million(top.start * lower_rate)
    assert above.cost_usd == per_million((top.start + 1) * top.price)


# Models with every pricing shape ampmeter handles: flat, cache read/write, input tiers, a
# separate reasoning rate, a per-request fee, and prices that depend on the time of day.
REFERENCE_MODELS = [
    *USER_MODELS,
    ("claude-3-5-haiku-20241022", "anthropic"),
    ("sonar-deep-research", "perplexity"),
    ("sonar", "perplexity"),
    ("deepseek-chat", "deepseek"),
    ("gemini-2.5-pro", "google"),
]


@st.composite
def usages(draw: st.DrawFn) -> dict[str, int]:
    input_tokens = draw(st.integers(0, 2_000_000))
    cached = draw(st.integers(0, input_tokens))
    cache_write = draw(st.integers(0, input_tokens - cached))
    output_tokens = draw(st.integers(0, 200_000))
    reasoning = draw(st.integers(0, output_tokens))
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cached_tokens": cached,
        "cache_write_tokens": cache_write,
        "reasoning_tokens": reasoning,
    }


@pytest.mark.parametrize(("model", "provider"), REFERENCE_MODELS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(usage=usages())
def test_cost_equals_genai_prices_own_calculation(
    model: str, provider: str, usage: dict[str, int]
) -> None:
    try:
        expected = reference_cost(model, provider, **usage)
    except LookupError:
        pytest.skip(f"{model} is not in the installed table")
    result = price(model, provider, **usage)
    assert result.status == "priced"
    assert result.cost_usd == expected  # exactly genai-prices' own Decimal total


def test_per_request_fee_is_charged_once_per_call() -> None:
    try:
        fee = table_price("sonar", "perplexity").requests_kcount
    except LookupError:
        pytest.skip("sonar is not in the installed table")
    if not isinstance(fee, Decimal):
        pytest.skip("sonar has no flat per-request fee in the installed table")
    result = price("sonar", "perplexity", input_tokens=0, output_tokens=0)
    assert result.cost_usd == fee.scaleb(-3)


def test_free_table_model_costs_zero_and_is_priced() -> None:
    model, provider = find_table_model("free")
    free = price(model, provider, input_tokens=5000, output_tokens=500)
    assert free == PriceResult(Decimal(0), TABLE_VERSION, "priced")
    assert free.cost_usd is not None  # priced at zero, which unpriced (None) is not


def test_model_priced_in_other_units_is_unpriced() -> None:
    model, provider = find_table_model("non_token")
    result = price(model, provider, input_tokens=5000, output_tokens=500)
    assert result == PriceResult(None, TABLE_VERSION, "unpriced")


@pytest.mark.parametrize(
    ("model", "provider"),
    [
        ("smollm2-135m-instruct", None),
        ("no-such-model-xyz", "openai"),
        ("no-such-model-xyz", "no-such-provider"),
    ],
)
def test_unknown_model_is_unpriced_not_zero(model: str, provider: str | None) -> None:
    result = price(model, provider, input_tokens=1000, output_tokens=100)
    assert result.cost_usd is None
    assert result.status == "unpriced"
    assert result.pricing_version == TABLE_VERSION
    assert estimate(model, provider, prompt_tokens=10) is None


@pytest.mark.parametrize("provider", ["no-such-provider", "anthropic"])
def test_a_model_its_provider_does_not_list_is_priced_where_the_table_lists_it(
    provider: str,
) -> None:
    """The provider a call names is often its wire format's (the openai SDK pointed at
    another vendor's API, a gateway taking any model on Anthropic's API): a model it does not
    list is priced at the provider that does, not left unpriced (refused under a cost cap, $0
    where allowed)."""
    listed = price("gpt-4o", None, input_tokens=1000, output_tokens=100)
    assert listed.cost_usd is not None
    assert price("gpt-4o", provider, input_tokens=1000, output_tokens=100) == listed


def test_table_version_names_the_package() -> None:
    assert table_version() == TABLE_VERSION


def test_live_table_snapshot_replaces_cached_rates() -> None:
    before = price("gpt-4o", "openai", input_tokens=1_000_000, output_tokens=0)
    live = data_snapshot.DataSnapshot(
        providers=[
            Provider(
                id="openai",
                name="OpenAI",
                api_pattern="",
                models=[
                    ModelInfo(
                        id="gpt-4o",
                        match=ClauseEquals(equals="gpt-4o"),
                        prices=ModelPrice(input_mtok=Decimal("7"), output_mtok=Decimal("9")),
                    )
                ],
            )
        ],
        from_auto_update=True,
        timestamp=datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone.utc),
    )
    data_snapshot.set_custom_snapshot(live)
    try:
        during = price("gpt-4o", "openai", input_tokens=1_000_000, output_tokens=0)
        assert during.cost_usd == Decimal(7)
        assert during.pricing_version == f"{TABLE_VERSION}+update@2030-01-02T03:04:05+00:00"
        assert table_version() == during.pricing_version
    finally:
        data_snapshot.set_custom_snapshot(None)
    after = price("gpt-4o", "openai", input_tokens=1_000_000, output_tokens=0)
    assert after == before
    assert after.pricing_version == TABLE_VERSION


def _snapshot_with(*models: ModelInfo) -> data_snapshot.DataSnapshot:
    provider = Provider(id="openai", name="OpenAI", api_pattern="", models=list(models))
    return data_snapshot.DataSnapshot(providers=[provider], from_auto_update=False)


def test_time_dependent_table_prices_follow_the_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    def flat(usd: int) -> ModelPrice:
        return ModelPrice(input_mtok=Decimal(usd), output_mtok=Decimal(0))

    timed = ModelInfo(
        id="timed",
        match=ClauseEquals(equals="timed"),
        prices=[  # the last condition in force wins
            ConditionalPrice(prices=flat(1)),
            ConditionalPrice(
                constraint=StartDateConstraint(start_date=date(2031, 5, 7)), prices=flat(4)
            ),
            ConditionalPrice(
                constraint=TimeOfDateConstraint(start_time=time(1, 0), end_time=time(3, 0)),
                prices=flat(2),
            ),
        ],
    )
    now = [0.0]
    monkeypatch.setattr(pricing.genai_table, "now", lambda: now[0])
    data_snapshot.set_custom_snapshot(_snapshot_with(timed))
    try:
        for stamp, usd in [
            (datetime(2031, 5, 6, 0, 59, 59), 1.0),
            (datetime(2031, 5, 6, 1, 0, 0), 2.0),
            (datetime(2031, 5, 6, 2, 59, 59), 2.0),
            (datetime(2031, 5, 6, 3, 0, 0), 1.0),
            (datetime(2031, 5, 6, 23, 59, 59), 1.0),
            (datetime(2031, 5, 7, 0, 0, 0), 4.0),
            (datetime(2031, 5, 7, 1, 30, 0), 2.0),
            (datetime(2031, 5, 7, 3, 0, 1), 4.0),
            (datetime(2031, 5, 8, 1, 30, 0), 2.0),  # the off-peak window comes back every day
        ]:
            stamp = stamp.replace(tzinfo=timezone.utc)
            now[0] = stamp.timestamp()
            got = price("timed", "openai", input_tokens=1_000_000, output_tokens=0)
            reference = calc_price(
                Usage(input_tokens=1_000_000, output_tokens=0),
                "timed",
                provider_id="openai",
                genai_request_timestamp=stamp,
            )
            assert reference.total_price == usd
            assert got.cost_usd == usd, stamp
    finally:
        data_snapshot.set_custom_snapshot(None)


# --------------------------------------------------------------------------- user prices


def test_zero_cost_local_model() -> None:
    assert price("smollm2", input_tokens=100, output_tokens=10).status == "unpriced"
    set_price("smollm2", input_per_mtok=0, output_per_mtok=0)
    result = price("smollm2", input_tokens=100, output_tokens=10)
    assert result == PriceResult(Decimal(0), USER_PRICING_VERSION, "priced")
    assert price("smollm2", "local", input_tokens=1, output_tokens=1).cost_usd == 0


def test_user_price_wins_over_table_and_removal_restores_it() -> None:
    table = price("gpt-4o", "openai", input_tokens=1000, output_tokens=1000)
    set_price("gpt-4o", input_per_mtok=1.0, output_per_mtok=3.0)
    user = price("gpt-4o", "openai", input_tokens=1000, output_tokens=1000)
    assert user == PriceResult(Decimal("0.004"), "user", "priced")
    remove_price("gpt-4o")
    assert price("gpt-4o", "openai", input_tokens=1000, output_tokens=1000) == table


def test_user_price_cache_and_reasoning_rates() -> None:
    set_price("mine", input_per_mtok=2.0, output_per_mtok=8.0)
    cost = price(
        "mine", input_tokens=1000, output_tokens=500, cached_tokens=600, reasoning_tokens=200
    )
    assert cost.cost_usd == Decimal("0.006")  # cache at the input rate
    set_price(
        "mine",
        input_per_mtok=2.0,
        output_per_mtok=8.0,
        cached_input_per_mtok=0.5,
        cache_write_per_mtok=2.5,
    )
    cost = price(
        "mine",
        input_tokens=1000,
        output_tokens=500,
        cached_tokens=600,
        cache_write_tokens=100,
        reasoning_tokens=200,
    )
    assert cost.cost_usd == Decimal("0.00515")  # (300*2 + 600*0.5 + 100*2.5 + 500*8) / 1e6


def test_user_price_for_one_provider_only() -> None:
    set_price("gpt-4o", input_per_mtok=0, output_per_mtok=0, provider="Azure")
    assert price("gpt-4o", "azure", input_tokens=10, output_tokens=10).cost_usd == 0
    openai = price("gpt-4o", "openai", input_tokens=1000, output_tokens=0)
    assert openai.pricing_version == TABLE_VERSION
    assert openai.cost_usd == per_million(1000 * rate("gpt-4o", "openai", "input_mtok"))
    assert price("gpt-4o", input_tokens=1000, output_tokens=0) == openai
    with pytest.raises(KeyError, match="gpt-4o"):
        remove_price("gpt-4o")  # only the azure one exists
    remove_price("GPT-4o", provider="azure")
    assert price("gpt-4o", "azure", input_tokens=10, output_tokens=10).pricing_version != "user"


def test_user_prices_are_read_as_written() -> None:
    set_price("d", input_per_mtok=Decimal("2.5"), output_per_mtok="0.5")
    assert price("d", input_tokens=1_000_000, output_tokens=1_000_000).cost_usd == 3
    set_price("f", input_per_mtok=0.1, output_per_mtok=0.2)  # floats as written, not binary
    cost = price("f", input_tokens=3_000_000, output_tokens=0).cost_usd
    assert cost == Decimal("0.3")  # 3 x 0.1 in binary floats is 0.30000000000000004


def test_user_price_names_match_case_insensitively() -> None:
    set_price("My-Model", input_per_mtok=1, output_per_mtok=1)
    assert price("my-model", input_tokens=1_000_000, output_tokens=0).cost_usd == 1
    assert price("MY-MODEL", input_tokens=1_000_000, output_tokens=0).cost_usd == 1


def test_clear_prices_removes_all_user_prices() -> None:
    set_price("a", input_per_mtok=1, output_per_mtok=1)
    set_price("b", input_per_mtok=1, output_per_mtok=1, provider="p")
    clear_prices()
    assert price("a", input_tokens=1, output_tokens=1).status == "unpriced"
    assert price("b", "p", input_tokens=1, output_tokens=1).status == "unpriced"


def test_remove_missing_price_raises_key_error() -> None:
    with pytest.raises(KeyError, match="never-set"):
        remove_price("never-set")


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"input_per_mtok": -1.0}, ValueError),
        ({"input_per_mtok": math.nan}, ValueError),
        ({"output_per_mtok": math.inf}, ValueError),
        ({"output_per_mtok": True}, TypeError),
        ({"input_per_mtok": "two"}, ValueError),
        ({"input_per_mtok": None}, TypeError),
        ({"cached_input_per_mtok": -0.1}, ValueError),
        ({"cache_write_per_mtok": math.nan}, ValueError),
        ({"cache_write_per_mtok": "1E-25"}, ValueError),  # finer than a rate may be written
        ({"provider": ""}, ValueError),
        ({"provider": 3}, TypeError),
    ],
)
def test_bad_user_price_raises_and_changes_nothing(
    kwargs: dict[str, object], error: type[Exception]
) -> None:
    set_price("m", input_per_mtok=1, output_per_mtok=1)
    before = price("m", input_tokens=1_000_000, output_tokens=0)
    args: dict[str, object] = {"input_per_mtok": 5.0, "output_per_mtok": 5.0, **kwargs}
    with pytest.raises(error):
        set_price("m", **args)  # type: ignore[arg-type]
    assert price("m", input_tokens=1_000_000, output_tokens=0) == before


@pytest.mark.parametrize(
    ("model", "error"), [("", ValueError), ("  ", ValueError), (None, TypeError)]
)
def test_bad_user_price_model(model: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="model"):
        set_price(model, input_per_mtok=1, output_per_mtok=1)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- estimate


def test_estimate_uses_prompt_tokens_and_max_tokens() -> None:
    got = estimate("gpt-4o", "openai", prompt_tokens=2000, max_tokens=300)
    assert got == price("gpt-4o", "openai", input_tokens=2000, output_tokens=300).cost_usd
    assert got is not None and got > 0


def test_estimate_counts_text_at_a_token_a_character_until_the_model_is_learned() -> None:
    text = "x" * 4001  # -> 4001 tokens: the prior, above any but the densest text
    assert CHARS_PER_TOKEN == 4  # what prose comes down to once learned
    got = estimate("gpt-4o", "openai", prompt_text=text, max_tokens=0)
    assert got == price("gpt-4o", "openai", input_tokens=4001, output_tokens=0).cost_usd


def test_estimate_prefers_the_given_token_count_over_text() -> None:
    set_price("m", input_per_mtok=1_000_000, output_per_mtok=0)  # $1 per input token
    assert estimate("m", prompt_tokens=3, prompt_text="x" * 400, max_tokens=0) == 3


def test_estimate_default_output_when_max_tokens_is_none() -> None:
    set_price("m", input_per_mtok=0, output_per_mtok=1_000_000)  # $1 per output token
    assert estimate("m", prompt_text="hello") == DEFAULT_ESTIMATE_OUTPUT_TOKENS
    assert estimate("m") == DEFAULT_ESTIMATE_OUTPUT_TOKENS
    assert estimate("m", max_tokens=7) == 7


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"prompt_tokens": -1}, ValueError),
        ({"prompt_tokens": 1.5}, TypeError),
        ({"prompt_text": b"bytes"}, TypeError),
        ({"max_tokens": -5}, ValueError),
        ({"max_tokens": True}, TypeError),
    ],
)
def test_estimate_bad_input(kwargs: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error):
        estimate("gpt-4o", "openai", **kwargs)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- bad input

TOKEN_ARGS = [
    "input_tokens",
    "output_tokens",
    "cached_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
]


@pytest.mark.parametrize("arg", TOKEN_ARGS)
@pytest.mark.parametrize(
    ("value", "error"),
    [
        (-1, ValueError),
        (math.nan, TypeError),
        (1.5, TypeError),
        (2.0, TypeError),
        (True, TypeError),
        ("3", TypeError),
        (None, TypeError),
    ],
)
def test_bad_token_counts(arg: str, value: object, error: type[Exception]) -> None:
    counts: dict[str, object] = {"input_tokens": 10, "output_tokens": 10, arg: value}
    with pytest.raises(error, match=arg):
        price("gpt-4o", "openai", **counts)  # type: ignore[arg-type]


def test_numpy_style_integers_are_accepted() -> None:
    np = pytest.importorskip("numpy")
    got = price("gpt-4o", "openai", input_tokens=np.int64(1000), output_tokens=np.int32(10))
    assert got == price("gpt-4o", "openai", input_tokens=1000, output_tokens=10)
    # A call's record() checks its counts as price() does: the same integers are taken, as
    # plain ints, and parts larger than their whole are refused the same way.
    with ExecutionContext("np") as ctx, ctx.llm_call("c", model="gpt-4o") as call:
        with pytest.raises(ValueError, match=r"cached_tokens \(11\) .* exceed tokens_in \(10\)"):
            call.record(np.int64(10), 0, cached_tokens=np.int64(11))
        call.record(np.int64(1000), np.int32(10), cached_tokens=np.int64(5))
        assert (call.tokens_in, call.cached_tokens) == (1000, 5)
        assert type(call.tokens_in) is int and type(call.cached_tokens) is int
    with pytest.raises(ValueError, match=r"cached_tokens \(11\) .* exceed input_tokens \(10\)"):
        price("gpt-4o", "openai", input_tokens=10, output_tokens=0, cached_tokens=11)


@pytest.mark.parametrize(
    ("counts", "match"),
    [
        ({"input_tokens": 10, "output_tokens": 0, "cached_tokens": 11}, "cached_tokens"),
        (
            {"input_tokens": 10, "output_tokens": 0, "cached_tokens": 6, "cache_write_tokens": 5},
            "cache_write_tokens",
        ),
        ({"input_tokens": 10, "output_tokens": 5, "reasoning_tokens": 6}, "reasoning_tokens"),
    ],
)
def test_parts_larger_than_their_whole(counts: dict[str, int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        price("gpt-4o", "openai", **counts)


@pytest.mark.parametrize(
    ("model", "provider", "error"),
    [
        ("", None, ValueError),
        (None, None, TypeError),
        (42, None, TypeError),
        ("gpt-4o", "", ValueError),
        ("gpt-4o", 7, TypeError),
    ],
)
def test_bad_model_or_provider(model: object, provider: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        price(model, provider, input_tokens=1, output_tokens=1)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- the result


def test_price_result_cannot_be_changed() -> None:
    result = price("gpt-4o", "openai", input_tokens=1, output_tokens=1)
    with pytest.raises(AttributeError):
        result.cost_usd = Decimal(0)  # type: ignore[misc]
    with pytest.raises(AttributeError):
        result.note = "added"  # type: ignore[attr-defined]
    assert not hasattr(result, "__dict__")


def test_importing_pricing_does_not_import_genai_prices(tmp_path: Path) -> None:
    code = (
        "import sys, ampmeter.pricing as p; assert 'genai_prices' not in sys.modules; "
        "p.price('gpt-4o', input_tokens=1, output_tokens=1); assert 'genai_prices' in sys.modules"
    )
    env = {**os.environ, "AMPMETER_CACHE_DIR": str(tmp_path)}  # an empty index: the table loads
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr


# --------------------------------------------------------------------------- concurrency


def test_set_price_under_concurrent_price_calls() -> None:
    table = price("gpt-4o", "openai", input_tokens=1000, output_tokens=1000)
    user_cost = Decimal("0.002")
    allowed = {(table.cost_usd, TABLE_VERSION), (user_cost, USER_PRICING_VERSION)}
    stop = threading.Event()
    seen: set[tuple[Decimal | None, str]] = set()
    errors: list[BaseException] = []

    def reader() -> None:
        try:
            while not stop.is_set():
                r = price("gpt-4o", "openai", input_tokens=1000, output_tokens=1000)
                seen.add((r.cost_usd, r.pricing_version))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def writer(provider: str | None) -> None:
        try:
            for i in range(300):
                set_price(f"w{provider}-{i}", input_per_mtok=i, output_per_mtok=i)
                set_price("gpt-4o", input_per_mtok=1.0, output_per_mtok=1.0, provider=provider)
                remove_price("gpt-4o", provider=provider)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    readers = [threading.Thread(target=reader) for _ in range(3)]
    writers = [threading.Thread(target=writer, args=(p,)) for p in (None, "openai")]
    for t in readers + writers:
        t.start()
    for t in writers:
        t.join()
    clear_prices()  # after both writers: one clearing mid-way would remove the other's price
    stop.set()
    for t in readers:
        t.join()
    assert not errors
    assert seen <= allowed
    assert len(seen) >= 1


def test_concurrent_set_price_loses_no_update() -> None:
    def writer(n: int) -> None:
        for i in range(100):
            set_price(f"t{n}-{i}", input_per_mtok=n + 1, output_per_mtok=0)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for n in range(4):
        for i in range(100):
            r = price(f"t{n}-{i}", input_tokens=1_000_000, output_tokens=0)
            assert r == PriceResult(Decimal(n + 1), "user", "priced")


# --------------------------------------------------------------------------- properties


@settings(max_examples=150, deadline=None)
@given(
    model=st.sampled_from([m for m, _ in USER_MODELS] + ["mine"]),
    usage=usages(),
    extra=st.integers(1, 100_000),
)
def test_cost_is_never_negative_and_grows_with_output(
    model: str, usage: dict[str, int], extra: int
) -> None:
    pricing.set_price("mine", input_per_mtok=0.3, output_per_mtok=1.2, cached_input_per_mtok=0.1)
    base = price(model, **usage)
    more = price(model, **{**usage, "output_tokens": usage["output_tokens"] + extra})
    assert base.cost_usd is not None and more.cost_usd is not None
    assert base.cost_usd >= 0
    assert more.cost_usd >= base.cost_usd


def test_a_fresh_process_prices_known_models_from_the_disk_index(tmp_path: Path) -> None:
    """The first priced call of a later process reads the index instead of loading the table,
    and gets the same answer as the table."""
    import subprocess
    import sys

    script = (
        "import sys, ampmeter\n"
        "r = ampmeter.price('gpt-4o', input_tokens=1000, output_tokens=100, cached_tokens=200)\n"
        "u = ampmeter.price('surely-not-a-model', input_tokens=1, output_tokens=1)\n"
        "print(r.cost_usd, r.status, u.status, 'genai_prices' in sys.modules)\n"
    )
    env = {**os.environ, "AMPMETER_CACHE_DIR": str(tmp_path)}
    first = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    second = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    cost, status, unpriced, loaded = first.stdout.split()
    assert status == "priced" and unpriced == "unpriced" and loaded == "True"
    cost2, status2, unpriced2, loaded2 = second.stdout.split()
    assert (cost2, status2, unpriced2) == (cost, status, unpriced)
    assert loaded2 == "False"  # the table was never loaded: the index answered
    (index,) = tmp_path.glob("prices-*.json")
    index.write_text("{not json")  # a broken index is ignored, never an error
    third = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert third.returncode == 0 and third.stdout.split()[:3] == [cost, status, unpriced]


def test_a_price_from_the_disk_index_follows_a_table_loaded_later(tmp_path: Path) -> None:
    """A plan the disk index answered is compiled again once genai-prices is imported: a live
    table set then prices the next call."""
    script = (
        "import sys, ampmeter\n"
        "from decimal import Decimal\n"
        "def cost():\n"
        "    return ampmeter.price('gpt-4o', 'openai', input_tokens=10**6, output_tokens=0)\n"
        "before, loaded = cost(), 'genai_prices' in sys.modules\n"
        "from genai_prices import data_snapshot as d\n"
        "from genai_prices.types import ClauseEquals, ModelInfo, ModelPrice, Provider\n"
        "price = ModelPrice(input_mtok=Decimal('7.25'), output_mtok=Decimal('9'))\n"
        "model = ModelInfo(id='gpt-4o', match=ClauseEquals(equals='gpt-4o'), prices=price)\n"
        "openai = Provider(id='openai', name='OpenAI', api_pattern='', models=[model])\n"
        "d.set_custom_snapshot(d.DataSnapshot([openai], from_auto_update=True))\n"
        "print(before.cost_usd, loaded, cost().cost_usd)\n"
    )
    before, loaded, after = _run_twice(script, tmp_path)
    assert loaded == "False"  # the index answered first
    assert Decimal(before) != Decimal("7.25") and Decimal(after) == Decimal("7.25")


def test_rates_from_the_disk_index_are_decoded_once_per_process(tmp_path: Path) -> None:
    """Every priced call asks the index (for the reservation and for the price): a process
    reads and decodes a model's entry once, and prices it the same way every time."""
    script = (
        "import ampmeter, ampmeter.pricing as p, ampmeter.pricing._cache as c\n"
        "asked = []\n"
        "lookup = c.lookup\n"
        "c.lookup = lambda *a: asked.append(a) or lookup(*a)\n"
        "costs = {p.price('gpt-4o', input_tokens=1000, output_tokens=100).cost_usd "
        "for _ in range(5)}\n"
        "print(len(asked), len(costs), 'genai_prices' in __import__('sys').modules)\n"
    )
    assert _run_twice(script, tmp_path) == ["1", "1", "False"]


def _run_twice(script: str, index: Path) -> list[str]:
    """What ``script`` prints (split) in a second fresh process with the disk index in
    ``index`` (the first wrote it)."""
    import subprocess
    import sys

    env = {**os.environ, "AMPMETER_CACHE_DIR": str(index)}
    subprocess.run([sys.executable, "-c", script], env=env, check=True, capture_output=True)
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    return done.stdout.split()


def test_a_loaded_table_writes_each_answer_to_the_disk_index_once(tmp_path: Path) -> None:
    """Once the table is loaded, a model's answer is resolved and written to the index once:
    later reservations and prices of it read neither the table nor the index again."""
    script = (
        "import ampmeter.pricing as p, ampmeter.pricing._cache as c\n"
        "p.load()\n"
        "stored = []\n"
        "store = c.store\n"
        "c.store = lambda *a: stored.append(a[:2]) or store(*a)\n"
        "for _ in range(5):\n"
        "    p.estimate('gpt-4o', prompt_tokens=10, max_tokens=20)\n"
        "    p.price('gpt-4o', input_tokens=10, output_tokens=20)\n"
        "    p.price('surely-not-a-model', input_tokens=1, output_tokens=1)\n"
        "print(sorted(m for m, _ in stored))\n"
    )
    env = {**os.environ, "AMPMETER_CACHE_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.split("\n")[0] == "['gpt-4o', 'surely-not-a-model']"


def test_estimate_is_the_price_of_the_prompt_and_the_output_cap() -> None:
    """The reservation is exactly the price of the estimated prompt and ``max_tokens`` output,
    user prices and unpriced models included."""
    for model, provider in [("gpt-4o", None), ("claude-sonnet-4-5", "anthropic")]:
        expected = price(model, provider, input_tokens=120, output_tokens=300).cost_usd
        assert estimate(model, provider, prompt_tokens=120, max_tokens=300) == expected
    pricing.set_price("mine", input_per_mtok=2.0, output_per_mtok=8.0)
    assert estimate("mine", prompt_tokens=1_000_000, max_tokens=1_000_000) == 10
    assert estimate("surely-not-a-model", prompt_tokens=1, max_tokens=1) is None
    with pytest.raises(TypeError, match="model must be a str"):
        estimate(None, prompt_tokens=1, max_tokens=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_tokens must be >= 0"):
        estimate("gpt-4o", prompt_tokens=1, max_tokens=-1)


def test_estimate_rounds_up_to_a_whole_nano_dollar() -> None:
    set_price("tiny", input_per_mtok="0.0001", output_per_mtok=0)  # 1e-10 dollars a token
    assert price("tiny", input_tokens=1, output_tokens=0).cost_usd == Decimal("1E-10")
    reserved = estimate("tiny", prompt_tokens=1, max_tokens=0)
    assert reserved == Decimal("0.000000001")  # never below what the call may cost
    assert estimate("tiny", prompt_tokens=30, max_tokens=0) == Decimal("0.000000003")
    assert estimate("tiny", prompt_tokens=0, max_tokens=0) == 0


def test_a_cap_of_one_dollar_holds_exactly_twenty_calls_of_five_cents() -> None:
    set_price("nickel", input_per_mtok=50_000, output_per_mtok=0)  # $0.05 a million... per token
    costs = [price("nickel", input_tokens=1, output_tokens=0).cost_usd for _ in range(20)]
    assert sum(costs, Decimal(0)) == Decimal(1)  # in floats: 1.0000000000000002 at 14 + $0.30


def test_an_index_written_with_float_rates_is_not_trusted(tmp_path: Path) -> None:
    """An index from a version that kept float rates is read as a miss: the table answers."""
    import json

    script = (
        "import sys, ampmeter.pricing as p\n"
        "r = p.price('gpt-4o', input_tokens=1, output_tokens=0)\n"
        "print(r.cost_usd, 'genai_prices' in sys.modules)\n"
    )
    env = {**os.environ, "AMPMETER_CACHE_DIR": str(tmp_path)}
    run = [sys.executable, "-c", script]
    subprocess.run(run, env=env, check=True, capture_output=True)
    (index,) = tmp_path.glob("prices-*.json")
    entries = json.loads(index.read_text())
    assert entries["gpt-4o\x00"]["usd"][0] == "2.5"  # decimal strings, never rounded
    entries["gpt-4o\x00"] = {"rates": [9.9, 9.9, 9.9, 9.9, 9.9, 0.0], "version": "x", "bands": None}
    index.write_text(json.dumps(entries))
    done = subprocess.run(run, env=env, capture_output=True, text=True, check=True)
    cost, loaded = done.stdout.split()
    assert (Decimal(cost), loaded) == (Decimal("0.0000025"), "True")
