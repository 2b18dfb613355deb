"""The resolved rates of one model, and the exact cost of one call at those rates.

Rates are genai-prices' own :class:`~decimal.Decimal` prices in USD per million tokens, kept
as they are (never through float), so a cost is the exact decimal sum a person would work
out by hand. Tiered prices are compiled once into bands; the per-request fee is held per call.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from genai_prices.types import ModelPrice

__all__ = ["Rates", "compile_price", "rates_from_json", "rates_to_json"]

_ZERO: Final = Decimal(0)
_PER_MILLION: Final = Decimal("1E-6")  # coefficient 1: multiplying by it only moves the exponent
# A rate as (threshold, USD per million units) steps, highest threshold first; the last step is
# the base rate with threshold -1. A step applies when the call's input tokens exceed its
# threshold (genai-prices' "cliff" tiers: crossing a threshold re-prices every token of a kind).
_Steps = tuple[tuple[int, Decimal], ...]


@dataclass(frozen=True, slots=True)
class Rates:
    """Resolved USD-per-million-token rates of one model at one time, and its fee per call."""

    input: Decimal
    output: Decimal
    cache_read: Decimal
    cache_write: Decimal
    reasoning: Decimal
    per_call: Decimal  # USD per request
    version: str
    # Tiered prices: (threshold, rates for prompts longer than that), highest threshold first.
    bands: tuple[tuple[int, Rates], ...] | None = None

    def cost(
        self, inp: int, out: int, cache_read: int, cache_write: int, reasoning: int
    ) -> Decimal:
        """Exact USD for one call with these (already validated) counts."""
        r = self
        if self.bands is not None:
            for threshold, band in self.bands:
                if inp > threshold:
                    r = band
                    break
        # Kinds a call did not use are skipped: each Decimal product costs as much as the rest.
        per_million = (inp - cache_read - cache_write) * r.input + (out - reasoning) * r.output
        if cache_read:
            per_million += cache_read * r.cache_read
        if cache_write:
            per_million += cache_write * r.cache_write
        if reasoning:
            per_million += reasoning * r.reasoning
        cost = per_million * _PER_MILLION
        return cost + r.per_call if r.per_call else cost


def _step_rate(steps: _Steps, input_tokens: int) -> Decimal:
    for threshold, rate in steps:
        if input_tokens > threshold:
            return rate
    return steps[-1][1]  # not reached: the base step's threshold is -1


def compile_price(model_price: ModelPrice, version: str) -> Rates | None:
    """Turn a genai-prices ``ModelPrice`` into :class:`Rates`; None if it prices no tokens.

    Only the units a text call reports matter: input, output, cache read/write, reasoning and a
    per-request fee. Prices of other units (audio, images, web searches) apply to counts that
    are zero here.
    """
    inp = _steps(getattr(model_price, "input_mtok", None))
    out = _steps(getattr(model_price, "output_mtok", None))
    zero: _Steps = ((-1, _ZERO),)
    if inp is None and out is None and _has_any_price(model_price):
        return None  # priced per audio hour, page, ...: a token cost of 0 would be a lie
    inp = inp or zero
    out = out or zero
    # A kind without its own rate is billed as its parent, as genai-prices does.
    cache_read = _steps(getattr(model_price, "cache_read_mtok", None)) or inp
    cache_write = _steps(getattr(model_price, "cache_write_mtok", None)) or inp
    reasoning = _steps(getattr(model_price, "output_reasoning_mtok", None)) or out
    per_kcall = _steps(getattr(model_price, "requests_kcount", None)) or zero
    per_call = tuple((threshold, rate.scaleb(-3)) for threshold, rate in per_kcall)
    all_steps = (inp, out, cache_read, cache_write, reasoning, per_call)

    def flat(input_tokens: int, bands: tuple[tuple[int, Rates], ...] | None = None) -> Rates:
        r_in, r_out, r_cr, r_cw, r_rs, r_call = (_step_rate(s, input_tokens) for s in all_steps)
        return Rates(r_in, r_out, r_cr, r_cw, r_rs, r_call, version, bands)

    thresholds = sorted({t for steps in all_steps for t, _ in steps if t >= 0}, reverse=True)
    bands = tuple((t, flat(t + 1)) for t in thresholds)
    return flat(0, bands or None)


def _has_any_price(model_price: ModelPrice) -> bool:
    # A table entry with no price at all is a free model (genai-prices prices it at 0).
    return any(v is not None for k, v in vars(model_price).items() if not k.startswith("_"))


def _steps(value: object) -> _Steps | None:
    from genai_prices.types import TieredPrices

    if isinstance(value, Decimal):
        return ((-1, value),)
    if isinstance(value, TieredPrices):
        tiers = sorted(value.tiers, key=lambda tier: tier.start, reverse=True)
        return (*((tier.start, tier.price) for tier in tiers), (-1, value.base))
    return None


def rates_to_json(rates: Rates) -> dict[str, object]:
    """``rates`` as JSON for the disk index: every amount a decimal string, so none is rounded."""
    amounts = (
        rates.input,
        rates.output,
        rates.cache_read,
        rates.cache_write,
        rates.reasoning,
        rates.per_call,
    )
    bands = rates.bands
    return {
        "usd": [str(amount) for amount in amounts],
        "version": rates.version,
        "bands": None if bands is None else [[t, rates_to_json(b)] for t, b in bands],
    }


def rates_from_json(value: dict[str, Any]) -> Rates:
    """The :class:`Rates` :func:`rates_to_json` wrote; ``TypeError``, ``ValueError`` or
    ``KeyError`` for anything else (an index written by another version is not trusted)."""
    amounts = value["usd"]
    if not isinstance(amounts, list) or len(amounts) != 6:
        raise ValueError("rates must hold six amounts")
    if not all(isinstance(amount, str) for amount in amounts):
        raise TypeError("rates must be decimal strings")
    r_in, r_out, r_read, r_write, r_reasoning, r_call = (Decimal(a) for a in amounts)
    if not all(a.is_finite() and a >= 0 for a in (r_in, r_out, r_read, r_write, r_reasoning)):
        raise ValueError("rates must be finite and >= 0")
    bands = value["bands"]
    return Rates(
        r_in,
        r_out,
        r_read,
        r_write,
        r_reasoning,
        r_call,
        str(value["version"]),
        None if bands is None else tuple((int(t), rates_from_json(b)) for t, b in bands),
    )
