"""Prices a user sets are bounded before any work that grows with their size: a rate of
``1E+999999`` (a number with a million digits) is refused at once, naming the argument, and no
price changes."""

from __future__ import annotations

import time
from collections.abc import Iterator
from decimal import Decimal

import pytest

import ampmeter
from ampmeter.pricing import clear_tool_prices, price, tool_price

HUGE: list[object] = [Decimal("1E+999999"), 10**100_000, "9" * 5_000, 1_000_000_001]


@pytest.fixture(autouse=True)
def clean() -> Iterator[None]:
    yield
    ampmeter.clear_prices()
    clear_tool_prices()


@pytest.mark.parametrize("value", HUGE, ids=["1E+999999", "10**100000", "5000 nines", "1e9+1"])
@pytest.mark.parametrize(
    "argument",
    ["input_per_mtok", "output_per_mtok", "cached_input_per_mtok", "cache_write_per_mtok"],
)
def test_a_rate_too_large_is_refused_naming_its_argument(value: object, argument: str) -> None:
    ampmeter.set_price("bounded-model", input_per_mtok=1, output_per_mtok=2)
    rates: dict[str, object] = {"input_per_mtok": 3, "output_per_mtok": 4, argument: value}
    started = time.perf_counter()
    with pytest.raises(
        ValueError, match=f"^{argument} must be at most 1,000,000,000 USD per million tokens, got"
    ):
        ampmeter.set_price("bounded-model", **rates)  # type: ignore[arg-type]
    assert time.perf_counter() - started < 0.1  # refused before reading a million digits
    # The price set before is the one in force.
    assert price(
        "bounded-model", input_tokens=1_000_000, output_tokens=1_000_000
    ).cost_usd == Decimal(3)


def test_the_largest_and_finest_rates_allowed_still_price() -> None:
    ampmeter.set_price("dear-model", input_per_mtok=10**9, output_per_mtok=Decimal("1E-24"))
    assert price("dear-model", input_tokens=1, output_tokens=10**6).cost_usd == Decimal(
        "1000"
    ) + Decimal("1E-24")
    with pytest.raises(ValueError, match=r"^output_per_mtok may have at most 24 decimal places"):
        ampmeter.set_price("dear-model", input_per_mtok=1, output_per_mtok="1E-999999")


def test_a_tool_price_too_large_is_refused() -> None:
    ampmeter.set_tool_price("search", usd="0.01")
    for value in (Decimal("1E+999999"), 10**100_000):
        with pytest.raises(ValueError, match=r"^usd must be at most 1,000,000,000 dollars a call"):
            ampmeter.set_tool_price("search", usd=value)  # type: ignore[arg-type]
    # A price written with a million decimal places is refused before it is worked with.
    with pytest.raises(ValueError, match=r"^usd may have at most 24 decimal places"):
        ampmeter.set_tool_price("search", usd="1E-999999")
    assert tool_price("search") == Decimal("0.01")
