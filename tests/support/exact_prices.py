"""A call's cost worked out by hand from a model's Decimal rates, in exact fractions: what the
integer pricing must equal to the last digit."""

from __future__ import annotations

from fractions import Fraction

from ampmeter.pricing.rates import Rates

__all__ = ["by_hand"]


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
