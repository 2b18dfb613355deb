"""A model's price plan: compiled once, exact over the whole bundled table, never stale.

A plan prices in integers what the table's Decimal rates say; these tests work every model's
cost out by hand from those rates in exact fractions, and check that the next call's plan
follows the user's prices and a new table the moment they change (a stale price undercounts).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from datetime import datetime, timezone
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from genai_prices import data_snapshot
from genai_prices.types import ClauseEquals, ModelInfo, ModelPrice, Provider

import ampmeter
from ampmeter.pricing import NO_PRICES, TABLE, _cache, clear_prices, estimate, price, set_price
from ampmeter.pricing.genai_table import DatedRates, Unpriced, table_entry
from ampmeter.pricing.plan import PricePlan, plan_for
from support.entered import entered
from support.exact_prices import by_hand, plan_estimate, plan_price

# (input, output, cache read, cache write, reasoning): none, everything, and a long prompt that
# crosses every tier the table has.
COUNTS = [(0, 0, 0, 0, 0), (1_234, 567, 200, 100, 50), (1_000_001, 8_001, 1_003, 7, 3)]


@pytest.fixture(autouse=True)
def _no_user_prices() -> Iterator[None]:
    clear_prices()
    yield
    clear_prices()


def _half_even(amount: Fraction) -> int:
    return round(amount)  # Fraction.__round__ rounds half to even


def _price(plan: PricePlan, *counts: int) -> tuple[int | None, str]:
    cost, meta = plan_price(plan, *counts)
    return cost, meta.get("pricing_version", "")


_estimate = plan_estimate


@pytest.fixture
def _no_disk_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The disk index in a directory that cannot be made: resolving the whole table does not
    rewrite the index once per model (what a test of every model would spend its time on)."""
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("AMPMETER_CACHE_DIR", str(tmp_path / "file" / "index"))
    _cache.forget()
    yield
    _cache.forget()


@pytest.mark.usefixtures("_no_disk_index")
def test_the_plan_prices_every_model_of_the_bundled_table_exactly() -> None:
    names = [
        (model.id, provider.id)
        for provider in data_snapshot.get_snapshot().providers
        for model in provider.models
    ]
    priced = 0
    for model, provider in names:
        plan = plan_for(TABLE, model, provider)
        entry = table_entry(model, provider)
        rates = entry.in_force() if isinstance(entry, DatedRates) else entry
        if isinstance(rates, Unpriced) or rates is None:
            assert _price(plan, *COUNTS[1])[0] is None
            assert _estimate(plan, 10, None) is None
            continue
        priced += 1
        for counts in COUNTS:
            exact = by_hand(rates, *counts)
            assert plan.price_usd((*counts, 0)) == (exact, rates.version)
            assert _price(plan, *counts) == (_half_even(exact * 10**9), rates.version)
            inp, out = counts[:2]
            dollars = by_hand(rates, inp, out, 0, 0, 0)
            assert _estimate(plan, inp, out) == math.ceil(dollars * 10**9)
        default = by_hand(rates, 500, plan.output_default, 0, 0, 0)
        assert _estimate(plan, 500, None) == math.ceil(default * 10**9)
        # The public functions price through the same plan.
        result = price(model, provider, input_tokens=1_234, output_tokens=567, cached_tokens=200)
        assert result.cost_usd == by_hand(rates, 1_234, 567, 200, 0, 0)
        assert estimate(model, provider, prompt_tokens=500) == ampmeter.money.from_nano(
            math.ceil(default * 10**9)
        )
    assert priced > 500  # the bundled table, not an empty one


def test_a_model_is_compiled_once_and_its_plan_is_kept() -> None:
    assert plan_for(TABLE, "gpt-4o", "openai") is plan_for(TABLE, "gpt-4o", "openai")
    with pytest.raises(TypeError, match="model must be a str"):
        plan_for(TABLE, ["gpt-4o"], None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="provider must be a non-empty"):
        plan_for(TABLE, "gpt-4o", " ")


def test_the_next_plan_follows_user_prices_as_they_change() -> None:
    def plan() -> PricePlan:
        return plan_for(TABLE, "house-model-plan", None)

    assert _estimate(plan(), 1_000, 1_000) is None  # unpriced, never zero
    assert _price(plan(), 1_000, 1_000, 0, 0, 0) == (None, _price(plan(), 0, 0, 0, 0, 0)[1])
    set_price("house-model-plan", input_per_mtok="1.5", output_per_mtok=2)
    assert _price(plan(), 1_000_000, 1_000_000, 0, 0, 0) == (3_500_000_000, "user")
    set_price("house-model-plan", input_per_mtok="0.0025", output_per_mtok=2)
    assert _price(plan(), 1, 0, 0, 0, 0) == (2, "user")  # 2.5 n$: half to even
    assert _estimate(plan(), 1, 0) == 3  # rounded up
    clear_prices()
    assert _price(plan(), 1_000_000, 0, 0, 0, 0)[0] is None


def test_the_next_plan_follows_a_new_table() -> None:
    def plan() -> PricePlan:
        return plan_for(TABLE, "gpt-4o", "openai")

    before = _price(plan(), 1_000_000, 0, 0, 0, 0)
    model = ModelInfo(
        id="gpt-4o",
        match=ClauseEquals(equals="gpt-4o"),
        prices=ModelPrice(input_mtok=Decimal("7.25"), output_mtok=Decimal("9")),
    )
    provider = Provider(id="openai", name="OpenAI", api_pattern="", models=[model])
    stamp = datetime(2030, 1, 2, tzinfo=timezone.utc)
    live = data_snapshot.DataSnapshot([provider], from_auto_update=True, timestamp=stamp)
    data_snapshot.set_custom_snapshot(live)
    try:
        cost, version = _price(plan(), 1_000_000, 0, 0, 0, 0)
        assert cost == 7_250_000_000
        assert version.endswith("+update@2030-01-02T00:00:00+00:00")
        assert _estimate(plan(), 1_000_000, 0) == 7_250_000_000
    finally:
        data_snapshot.set_custom_snapshot(None)
    assert _price(plan(), 1_000_000, 0, 0, 0, 0) == before


def test_another_pricing_is_asked_on_every_use() -> None:
    plan = plan_for(NO_PRICES, "gpt-4o", None)
    assert _estimate(plan, 10, 10) is None
    assert _price(plan, 10, 10, 0, 0, 0) == (None, "")


def _calls_into(names: set[str], work: Any) -> list[str]:
    """The functions named ``names`` (qualified) that ``work()`` enters."""
    return entered(work, lambda frame: frame.f_code.co_qualname in names)


def test_a_call_finds_its_plan_once_and_resolves_no_rates_after_its_models_first_call() -> None:
    set_price("plan-model", input_per_mtok=1, output_per_mtok=1)
    watched = {"plan_for", "_compile", "user_rates", "table_entry"}

    def one_call() -> None:
        with (
            ampmeter.ExecutionContext(max_cost_usd=1) as ctx,
            ctx.llm_call(model="plan-model", prompt_tokens=1_000, max_tokens=10) as call,
        ):
            call.record(tokens_in=1_000, tokens_out=10)
        assert ctx.stats.total_cost() == Decimal("0.00101")

    one_call()
    assert _calls_into(watched, one_call) == ["plan_for"]


def test_a_call_in_flight_keeps_its_plan_and_the_next_call_takes_the_new_price() -> None:
    set_price("flight-model", input_per_mtok=1, output_per_mtok=1)
    with ampmeter.ExecutionContext(max_cost_usd=1) as ctx:
        with ctx.llm_call(model="flight-model", prompt_tokens=1_000, max_tokens=0) as call:
            set_price("flight-model", input_per_mtok=3, output_per_mtok=1)
            call.record(tokens_in=1_000, tokens_out=0)
        assert call.node.cost_usd == Decimal("0.001")  # the price it was reserved at
        with ctx.llm_call(model="flight-model", prompt_tokens=1_000, max_tokens=0) as call:
            call.record(tokens_in=1_000, tokens_out=0)
        assert call.node.cost_usd == Decimal("0.003")


def test_a_calls_estimate_and_price_are_one_plan_in_integers() -> None:
    """One call's pricing: its plan found once, one estimate, one price in integers (the
    request's input estimate is the request measure's), and nothing else of pricing or money:
    no rates resolved, no table asked, no rounding helper."""
    from ampmeter.pricing.request_size import measure_text

    size = measure_text("What is the weather in Paris? " * 20)
    entered: list[str] = []
    package = Path(ampmeter.__file__).parent

    def profile(frame: FrameType, event: str, arg: object) -> None:
        path = Path(frame.f_code.co_filename)
        if event == "call" and (path.parent == package / "pricing" or path.name == "money.py"):
            entered.append(frame.f_code.co_qualname)

    with ampmeter.ExecutionContext(max_cost_usd=1) as ctx:
        for measured in (False, True):
            if measured:
                sys.setprofile(profile)
            try:
                with ctx.llm_call(model="gpt-4o-mini", request=size, max_tokens=64) as call:
                    call.record(tokens_in=150, tokens_out=20, cached_tokens=100)
            finally:
                sys.setprofile(None)
    assert entered == [
        "plan_for",
        "PricePlan.reserve",
        "input_tokens",
        "PricePlan.price",
        "PricePlan._units",
        "learn",  # the request measure learns from the bill (the node keeps nano-dollars)
    ]
    exact = price("gpt-4o-mini", input_tokens=150, output_tokens=20, cached_tokens=100).cost_usd
    assert exact is not None and call.node.cost_usd == exact.quantize(Decimal("1E-9"))
