"""A context's prices come from its ``pricing=`` (inherited by children): the table by default,
loaded on first need; ``NO_PRICES`` prices nothing (unpriced, never $0); an embedder's own."""

from __future__ import annotations

import subprocess
import sys
from decimal import Decimal
from typing import Any

import pytest

from ampmeter import ExecutionContext, LimitExceeded
from ampmeter.context import open_contexts
from ampmeter.keys import KEY_COST, KEY_UNPRICED_LLM_CALLS
from ampmeter.pricing import NO_PRICES, TABLE, PriceResult


class FlatPrices:
    """An embedder's prices: $0.001 a token in, $0.002 out, for every model."""

    def __init__(self) -> None:
        self.priced: list[str] = []

    def price(self, model: str, provider: str | None = None, **tokens: int) -> PriceResult:
        self.priced.append(model)
        cost = (
            Decimal("0.001") * tokens["input_tokens"] + Decimal("0.002") * tokens["output_tokens"]
        )
        return PriceResult(cost, "flat-1", "priced")

    def estimate(
        self,
        model: str,
        provider: str | None = None,
        *,
        prompt_tokens: int | None = None,
        max_tokens: int | None = None,
    ) -> Decimal | None:
        return Decimal("0.001") * (prompt_tokens or 0) + Decimal("0.002") * (max_tokens or 0)


def test_the_default_is_the_table_and_a_child_inherits_it() -> None:
    with ExecutionContext() as ctx:
        child = ctx.spawn_child("sub")
        assert ctx.pricing is TABLE and child.pricing is TABLE
        with child.llm_call(model="gpt-4o-mini", max_tokens=5) as call:
            call.record(1_000_000, 0)
    assert call.node.metadata["cost_status"] == "priced"
    assert ctx.stats.get_gauge(KEY_COST) == Decimal("0.15")  # the table's $0.15 per Mtok in


def test_no_prices_makes_calls_unpriced_never_free() -> None:
    with ExecutionContext(pricing=NO_PRICES) as ctx:
        child = ctx.spawn_child("sub")
        assert child.pricing is NO_PRICES
        with child.llm_call(model="gpt-4o-mini", max_tokens=5) as call:
            call.record(10, 5)
    assert call.node.metadata["cost_status"] == "unpriced"
    assert ctx.stats.get_counter(KEY_UNPRICED_LLM_CALLS) == 1


def test_no_prices_under_a_cost_limit_refuses_a_call_without_an_estimate() -> None:
    with ExecutionContext(max_cost_usd=1.0, pricing=NO_PRICES) as ctx:
        with (
            pytest.raises(LimitExceeded, match="has no price") as refused,
            ctx.llm_call(model="gpt-4o-mini", max_tokens=5),
        ):
            pass
        # set_price changes the table, which NO_PRICES does not read: the fix named is another
        said = str(refused.value)
        assert "set_price" not in said and "ampmeter.pricing.NO_PRICES" in said
        assert "estimate_usd" in said
        with ctx.llm_call(model="gpt-4o-mini", estimate_usd=0.01) as call:  # the caller's price
            call.record(10, 5, cost_usd=0.01)
    assert ctx.stats.get_gauge(KEY_COST) == Decimal("0.01")


def test_an_unpriced_model_under_the_table_is_told_to_set_price() -> None:
    ctx = ExecutionContext(max_cost_usd=1.0)
    with (
        pytest.raises(LimitExceeded, match="has no price") as refused,
        ctx.llm_call(model="no-such-model-anywhere", max_tokens=5),
    ):
        pass
    ctx.close()
    assert "ampmeter.set_price('no-such-model-anywhere'" in str(refused.value)


def test_an_embedders_prices_reserve_and_price_the_call_exactly() -> None:
    flat = FlatPrices()
    with ExecutionContext(max_cost_usd=0.05, pricing=flat) as ctx:
        child = ctx.spawn_child("sub", pricing=NO_PRICES)  # a child may choose its own
        assert child.pricing is NO_PRICES
        with ctx.llm_call(model="any", prompt_tokens=10, max_tokens=10) as call:
            assert ctx.stats.reserved()[KEY_COST] == Decimal("0.03")  # 10 in + 10 out, before
            call.record(10, 4)
        # 0.018 spent + 0.04 reserved > 0.05
        with (
            pytest.raises(LimitExceeded),
            ctx.llm_call(model="any", prompt_tokens=20, max_tokens=10),
        ):
            pass
    assert flat.priced == ["any"]
    assert call.node.cost_usd == Decimal("0.018")
    assert call.node.metadata["pricing_version"] == "flat-1"


class FloatPrices:
    """An embedder's prices in float dollars: 0.1 + 0.2 (0.30000000000000004) for any call."""

    def price(self, model: str, provider: str | None = None, **tokens: int) -> PriceResult:
        return PriceResult(0.1 + 0.2, "floats", "priced")  # type: ignore[arg-type]

    def estimate(self, model: str, provider: str | None = None, **sizes: Any) -> float:
        return 0.1 + 0.2


def test_an_embedders_float_prices_are_read_as_written_in_nano_dollars() -> None:
    ctx = ExecutionContext(max_cost_usd=10, pricing=FloatPrices())  # type: ignore[arg-type]
    with ctx, ctx.llm_call(model="any", max_tokens=1) as call:
        assert ctx.stats.reserved()[KEY_COST] == Decimal("0.300000001")  # rounded up
        call.record(1, 1)
    assert call.node.cost_usd == Decimal("0.3")  # to the nearest nano-dollar
    assert call.node.metadata["pricing_version"] == "floats"


class AbsurdPrices:
    """An embedder's prices past what money counts for a call, and a tie for its estimate."""

    def price(self, model: str, provider: str | None = None, **tokens: int) -> PriceResult:
        return PriceResult(Decimal("1E+30"), "absurd", "priced")

    def estimate(self, model: str, provider: str | None = None, **sizes: Any) -> Decimal:
        return Decimal("0.0000000025")


def test_an_embedders_price_past_what_money_counts_is_charged_as_the_most_and_said() -> None:
    ctx = ExecutionContext(max_cost_usd=1, pricing=AbsurdPrices())  # type: ignore[arg-type]
    with ctx, ctx.llm_call(model="any", max_tokens=1) as call:
        assert ctx.stats.reserved()[KEY_COST] == Decimal("0.000000003")  # rounded up
        call.record(1, 1)
    assert call.node.cost_usd == Decimal("9223372036.854775807")
    assert call.node.metadata["cost_clamped"] is True


@pytest.mark.parametrize("bad", [object(), "table", 3])
def test_pricing_without_price_and_estimate_is_an_error_naming_the_keyword(bad: Any) -> None:
    with pytest.raises(TypeError, match="pricing must have price"):
        ExecutionContext(pricing=bad)
    with ExecutionContext() as ctx, pytest.raises(TypeError, match="pricing must have price"):
        ctx.spawn_child("half-made", pricing=bad)
    assert not any(c.name == "half-made" for c in open_contexts())  # nothing half made


def test_making_a_context_does_not_load_the_price_table() -> None:
    code = (
        "import sys, ampmeter\n"
        "with ampmeter.ExecutionContext(max_cost_usd=1.0) as ctx:\n"
        "    child = ctx.spawn_child('sub')\n"
        "print('ampmeter.pricing.table' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
