"""A call's cost worked out by hand from a model's Decimal rates, in exact fractions: what the
integer pricing must equal to the last digit; and a price plan's price and estimate of counts."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from ampmeter.pricing.plan import PricePlan
from ampmeter.pricing.rates import Rates

__all__ = ["by_hand", "plan_estimate", "plan_price"]


def by_hand(rates: Rates, inp: int, out: int, read: int, write: int, reasoning: int) -> Fraction:
    """The cost in dollars of a call with these counts at ``rates`` (the band of its input)."""
    for threshold, band in rates.bands or ():
        if inp > threshold:
            rates = band
            break
    per_million = (
        (inp - read - write) * Fraction(rates.input)
        + read * Fraction(rates.cache_read)
        + write * Fraction(rates.cache_write)
        + (out - reasoning) * Fraction(rates.output)
        + reasoning * Fraction(rates.reasoning)
    )
    return per_million / 10**6 + Fraction(rates.per_call)


def plan_price(plan: PricePlan, *counts: int) -> tuple[int | None, dict[str, Any]]:
    """What ``plan`` prices an ended call of these counts (input, output, cache read, cache
    write, reasoning) at in nano-dollars (None when unpriced), and the metadata it leaves."""
    meta: dict[str, Any] = {}
    in_tokens, out_tokens, cache_read, cache_write, reasoning = counts
    checked = (in_tokens, out_tokens, cache_read, cache_write, reasoning, 0)
    cost, unpriced = plan.price(checked, None, meta, recorded=True, estimated=False)
    return (None if unpriced else cost), meta


def plan_estimate(plan: PricePlan, prompt_tokens: int, max_tokens: int | None) -> int | None:
    """What ``plan`` reserves for a call in nano-dollars (None when unpriced)."""
    reserved = plan.reserve(prompt_tokens=prompt_tokens, max_tokens=max_tokens)
    _, _, cost, priced, _ = reserved
    return cost if priced else None
