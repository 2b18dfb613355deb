"""A model's rates price a call exactly, in integers: the Decimal cost and the nano-dollars a
context counts are the sum a person works out by hand from the rates as written."""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ampmeter.money import MAX_NANO
from ampmeter.pricing.parts import PARTS
from ampmeter.pricing.plan import PricePlan
from ampmeter.pricing.rates import MAX_PLACES, Rates, rates_from_json, rates_to_json
from support.exact_prices import by_hand, plan_estimate, plan_price

# Rates as tables and users write them: up to nine significant digits, up to the most a rate
# may be ($1e9 per million tokens), whole numbers written with a positive exponent too (1E+2).
_RATES = st.builds(
    lambda digits, exponent: Decimal(f"{digits}E{exponent}"),
    st.integers(min_value=0, max_value=10**9 - 1),
    st.integers(min_value=-20, max_value=2),
).filter(lambda rate: rate <= 10**9)
_COUNT = st.integers(min_value=0, max_value=2**40)


def _flat(rates: tuple[Decimal, ...], bands: tuple[tuple[int, Rates], ...] | None = None) -> Rates:
    r_in, r_out, r_read, r_write, r_reasoning, r_call = rates
    return Rates(r_in, r_out, r_read, r_write, r_reasoning, r_call, version="v", bands=bands)


def _cost(rates: Rates, *counts: int) -> Decimal:
    """The exact Decimal cost a plan of ``rates`` prices a call of these counts at."""
    cost, _ = PricePlan("m", None, rates=rates).price_usd((*counts, 0))
    assert cost is not None
    return cost


def _nano(rates: Rates, *counts: int) -> int:
    """The nano-dollars a plan of ``rates`` prices an ended call of these counts at."""
    return _priced(rates, *counts)[0]


def _priced(rates: Rates, *counts: int) -> tuple[int, dict[str, object]]:
    cost, meta = plan_price(PricePlan("m", None, rates=rates), *counts)
    assert cost is not None
    return cost, meta


def _reserved(rates: Rates, prompt_tokens: int, max_tokens: int) -> int:
    """The nano-dollars a plan of ``rates`` reserves for a call (rounded up)."""
    cost = plan_estimate(PricePlan("m", None, rates=rates), prompt_tokens, max_tokens)
    assert cost is not None
    return cost


@given(st.tuples(*[_RATES] * 6), st.tuples(*[_COUNT] * 5))
def test_cost_and_nano_are_the_exact_sum_of_the_rates_as_written(
    amounts: tuple[Decimal, ...], counts: tuple[int, ...]
) -> None:
    rates = _flat(amounts)
    inp, out, read, write, reasoning = counts
    inp += read + write  # cache reads and writes are parts of the input,
    out += reasoning  # reasoning is part of the output
    exact = by_hand(rates, inp, out, read, write, reasoning)
    assert Fraction(_cost(rates, inp, out, read, write, reasoning)) == exact
    nano, meta = _priced(rates, inp, out, read, write, reasoning)
    if round(exact * 10**9) > MAX_NANO:  # charged as the most money counts, and said so
        assert (nano, meta["cost_clamped"]) == (MAX_NANO, True)
    else:
        assert (nano, "cost_clamped" in meta) == (round(exact * 10**9), False)
    estimate = math.ceil(by_hand(rates, inp, out, 0, 0, 0) * 10**9)
    if estimate > MAX_NANO:
        with pytest.raises(ValueError, match="the price estimate is too large to count"):
            _reserved(rates, inp, out)
    else:
        assert _reserved(rates, inp, out) == estimate


def test_a_band_prices_prompts_longer_than_its_threshold_with_its_own_places() -> None:
    short = ("0.15", "0.6", "0.075", "0.15", "0.6", "0")
    long = ("0.3", "1.2", "0.0375", "0.3", "1.2", "0.0000001")
    band = _flat(tuple(map(Decimal, long)))
    rates = _flat(tuple(map(Decimal, short)), ((1000, band),))
    assert _cost(rates, 1000, 10, 0, 0, 0) == Decimal("0.000156")  # 1000 x 0.15 + 10 x 0.6, / 1e6
    assert _cost(rates, 1001, 10, 1, 0, 0) == Decimal("0.0003121375")  # 1000 x 0.3 + 0.0375 + 12
    assert _nano(rates, 1001, 10, 1, 0, 0) == 312_138  # 312,137.5 n$: half to even
    assert _reserved(rates, 1001, 10) == 312_400  # 1001 x 0.3 + 10 x 1.2, and the fee
    assert _reserved(rates, 1000, 10) == 156_000


def test_a_cost_is_written_to_the_finest_place_of_the_models_rates() -> None:
    rates = _flat(tuple(map(Decimal, ("2.5", "10", "1.25", "2.5", "10", "0"))))
    assert str(_cost(rates, 1200, 350, 0, 0, 0)) == "0.00650000"  # 1.25 per 1e6 tokens: 8 places
    assert _nano(rates, 1200, 350, 0, 0, 0) == 6_500_000


@pytest.mark.parametrize(
    ("amounts", "match"),
    [
        (("NaN", "1", "1", "1", "1", "0"), "the input rate must be finite, got NaN"),
        (("1", "Infinity", "1", "1", "1", "0"), "the output rate must be finite"),
        (("1", "1", "1", "1", "1", "sNaN"), "the per-request rate must be finite"),
        (("1", "1", "1", "-0.5", "1", "0"), "the cache write rate must be >= 0, got -0.5"),
        (
            ("1", "1", f"1E-{MAX_PLACES + 1}", "1", "1", "0"),
            f"the cache read rate may have at most {MAX_PLACES} decimal places per million "
            "tokens, got 1E-25",
        ),
        (
            ("1", "1", "1", "1", "1", f"1E-{MAX_PLACES + 7}"),  # the fee is per request
            f"the per-request rate may have at most {MAX_PLACES + 6} decimal places, got 1E-31$",
        ),
    ],
)
def test_rates_that_cannot_be_counted_are_refused(amounts: tuple[str, ...], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _flat(tuple(map(Decimal, amounts)))


def test_the_finest_rate_allowed_still_prices_exactly() -> None:
    finest = Decimal(f"1E-{MAX_PLACES}")
    fee = Decimal(f"1E-{MAX_PLACES + 6}")  # per request: as fine per million requests
    rates = _flat((finest, finest, finest, finest, finest, fee))
    assert _cost(rates, 10**6, 0, 0, 0, 0) == finest + fee
    assert _nano(rates, 10**6, 0, 0, 0, 0) == 0
    assert _reserved(rates, 10**6, 0) == 1  # rounded up


_ENTRY: dict[str, object] = {"version": "v", "bands": None, "parts": None}


@pytest.mark.parametrize(
    ("entry", "error"),
    [
        ({**_ENTRY, "usd": ["1", "1", "1", "-1", "1", "0"]}, ValueError),
        ({**_ENTRY, "usd": ["1", "1", "1"]}, TypeError),
        ({**_ENTRY, "usd": [1.5, 1, 1, 1, 1, 0]}, TypeError),
        ({**_ENTRY, "usd": ["1", "1", "1", "1", "1", "x"]}, ArithmeticError),
        ({**_ENTRY, "rates": ["1"] * 6}, KeyError),
        # Written before the billed parts: its rates would price 1-hour writes, audio and web
        # searches as their parents, so the entry is refused and worked out again.
        ({"usd": ["1"] * 6, "version": "v", "bands": None}, KeyError),
        ({**_ENTRY, "usd": ["1"] * 6, "parts": {"web_searches": "10000"}}, KeyError),
        ({**_ENTRY, "usd": ["1"] * 6, "parts": ["1"] * len(PARTS)}, TypeError),
    ],
)
def test_a_disk_index_entry_that_is_not_rates_is_refused(
    entry: dict[str, object], error: type[Exception]
) -> None:
    with pytest.raises(error):
        rates_from_json(entry)
    good = {**_ENTRY, "usd": ["2.5", "10", "1.25", "2.5", "10", "0"]}
    assert rates_to_json(rates_from_json(good)) == good
    parts = dict.fromkeys(PARTS, "3")
    with_parts = {**good, "parts": {**parts, "web_searches": "10000"}}
    assert rates_to_json(rates_from_json(with_parts)) == with_parts
