"""The resolved rates of one model, and the exact cost of one call at those rates.

Rates are genai-prices' own :class:`~decimal.Decimal` prices in USD per million tokens, kept
as they are (never through float), and beside them as integers scaled by a power of ten, so a
cost is the exact decimal sum a person would work out by hand, worked out in integers. Tiered
prices are compiled once into bands; the per-request fee is held per call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Final

from ampmeter import money
from ampmeter.pricing.parts import PARTS, resolve_part_rates

if TYPE_CHECKING:
    from genai_prices.types import ModelPrice

__all__ = [
    "MAX_PLACES",
    "MAX_RATE",
    "Rates",
    "compile_price",
    "rate_arg",
    "rates_from_json",
    "rates_to_json",
]

_ZERO: Final = Decimal(0)
MAX_PLACES: Final = 24
"""The most decimal places a rate (USD per million tokens) may have: a yocto-dollar per million
tokens is far below any price, and the integers a call is priced with stay small."""
MAX_RATE: Final = Decimal(10**9)
"""The highest rate (USD per million tokens, or per request for the fee): a thousand dollars a
token is far above any price, and a rate past it would only make pricing slow (a rate of
``1E+999999`` is a number with a million digits)."""
_MAX_RATE_INT: Final = int(MAX_RATE)
_KINDS: Final = ("input", "output", "cache read", "cache write", "reasoning", "per-request")
_AMOUNTS: Final = ("input", "output", "cache_read", "cache_write", "reasoning", "per_call")
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
    version: str = field(kw_only=True)
    # Tiered prices: (threshold, rates for prompts longer than that), highest threshold first.
    bands: tuple[tuple[int, Rates], ...] | None = field(default=None, kw_only=True)
    # The billed parts' rates in USD per million units (tokens, or uses of a server tool), in
    # the order of parts.PARTS; None when the model prices none (each costs what its parent
    # count does: see ampmeter.pricing.parts).
    parts: tuple[Decimal, ...] | None = field(default=None, kw_only=True)
    # The same rates as integers, made once here so that pricing a call is integer arithmetic:
    # every rate in nano-dollars per token (the fee per call) times divisor, a power of ten.
    # Exact: places is the most decimals any rate has (per million tokens), and a rate per
    # million tokens is 1,000 times its nano-dollars per token, so divisor is 10**(places - 3).
    places: int = field(init=False, repr=False, compare=False)
    divisor: int = field(init=False, repr=False, compare=False)
    scaled: tuple[int, int, int, int, int, int] = field(init=False, repr=False, compare=False)
    scaled_parts: tuple[int, ...] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        token_rates: tuple[Decimal, ...] = (
            self.input,
            self.output,
            self.cache_read,
            self.cache_write,
            self.reasoning,
        )
        kinds: tuple[str, ...] = _KINDS
        if self.parts is not None:
            if len(self.parts) != len(PARTS):
                raise ValueError(f"parts must hold {len(PARTS)} rates, got {len(self.parts)}")
            token_rates += self.parts
            kinds = (*_KINDS[:5], *PARTS, _KINDS[5])
        rates = (*token_rates, self.per_call)
        for kind, rate in zip(kinds, rates, strict=True):
            if not rate.is_finite():
                raise ValueError(f"the {kind} rate must be finite, got {rate}")
            if rate < 0:
                raise ValueError(f"the {kind} rate must be >= 0, got {rate}")
            if rate > MAX_RATE:
                raise ValueError(f"the {kind} rate must be at most {MAX_RATE:,}, got {rate}")
        # Decimals per million tokens: the fee, in USD per request, may have six more.
        decimals = (*(_decimals(rate) for rate in token_rates), _decimals(self.per_call) - 6)
        most = max(decimals)
        if most > MAX_PLACES:
            at = decimals.index(most)
            fee = at == len(token_rates)
            limit, unit = (MAX_PLACES + 6, "") if fee else (MAX_PLACES, " per million tokens")
            raise ValueError(
                f"the {kinds[at]} rate may have at most {limit} decimal places{unit}, "
                f"got {rates[at]}"
            )
        places = max(0, most)
        finest = max(places, 3)
        scaled = (
            *(_scaled(rate, finest) for rate in token_rates),
            _scaled(self.per_call, finest + 6),
        )
        object.__setattr__(self, "places", places)
        object.__setattr__(self, "divisor", 10 ** (finest - 3))
        object.__setattr__(self, "scaled", scaled[:5] + scaled[-1:])
        object.__setattr__(self, "scaled_parts", None if self.parts is None else scaled[5:-1])

    def band(self, input_tokens: int) -> Rates:
        """The rates of a call of ``input_tokens`` (tiered prices: the band it falls in)."""
        for threshold, band in self.bands or ():
            if input_tokens > threshold:
                return band
        return self


def rate_arg(value: object, what: str, unit: str = "USD per million tokens") -> Decimal:
    """``value`` (see :func:`ampmeter.money.usd`) as a rate in ``unit`` (or a tool's dollars a
    call), checked before any work that grows with its size: ``ValueError`` naming ``what`` for
    a rate above :data:`MAX_RATE` or with more than :data:`MAX_PLACES` decimal places."""
    limit = f"{what} must be at most {MAX_RATE:,} {unit}"
    # An int is compared as an int: comparing it with a Decimal reads all its digits.
    if isinstance(value, int) and value > _MAX_RATE_INT:
        raise ValueError(f"{limit}, got an integer of {value.bit_length():,} bits")
    rate = money.usd(value, what)
    if rate > MAX_RATE:
        raise ValueError(f"{limit}, got {_short(rate)}")
    if _decimals(rate) > MAX_PLACES:
        raise ValueError(
            f"{what} may have at most {MAX_PLACES} decimal places ({unit}), got {_short(rate)}"
        )
    return rate


def _short(rate: Decimal) -> str:
    """A rate as written, or in scientific notation when that would be long."""
    text = str(rate)
    return text if len(text) <= 40 else f"{rate:.6E}"


def _decimals(rate: Decimal) -> int:
    """How many decimal places ``rate`` (finite) is written with (negative for ``1E+2``)."""
    return -int(rate.as_tuple().exponent)


def _scaled(rate: Decimal, places: int) -> int:
    """``rate`` × 10**places, exactly (``places`` is at least the rate's decimals)."""
    numerator, denominator = rate.as_integer_ratio()  # the denominator divides 10**places
    scale: int = 10**places
    return numerator * scale // denominator


def compile_price(model_price: ModelPrice, version: str) -> Rates | None:
    """Turn a genai-prices ``ModelPrice`` into :class:`Rates`; None if it prices no tokens.

    The six rates of a text call (input, output, cache read/write, reasoning and a
    per-request fee), and the billed parts' (:mod:`ampmeter.pricing.parts`: audio, images,
    1-hour cache writes, server tools) where the model prices one. Prices of other units
    (audio hours, pages) have no count here.
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
    part_steps = resolve_part_rates(lambda key: _part_steps(model_price, key), zero) or ()

    def flat(input_tokens: int, bands: tuple[tuple[int, Rates], ...] | None = None) -> Rates:
        # The first step the call's input exceeds (the base step's threshold is -1).
        def rate(steps: _Steps) -> Decimal:
            return next(r for t, r in steps if input_tokens > t)

        parts = tuple(map(rate, part_steps)) or None
        return Rates(*map(rate, all_steps), version=version, bands=bands, parts=parts)

    thresholds = sorted(
        {t for steps in (*all_steps, *part_steps) for t, _ in steps if t >= 0}, reverse=True
    )
    bands = tuple((t, flat(t + 1)) for t in thresholds)
    return flat(0, bands or None)


def _part_steps(model_price: ModelPrice, key: str) -> _Steps | None:
    """A part's price steps per million units (a server tool's price is per thousand uses)."""
    steps = _steps(getattr(model_price, key, None))
    if steps is None or not key.endswith("_kcount"):
        return steps
    return tuple((threshold, rate.scaleb(3)) for threshold, rate in steps)


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
    bands, parts = rates.bands, rates.parts
    return {
        "usd": [str(getattr(rates, name)) for name in _AMOUNTS],
        "version": rates.version,
        "bands": None if bands is None else [[t, rates_to_json(b)] for t, b in bands],
        "parts": None if parts is None else dict(zip(PARTS, map(str, parts), strict=True)),
    }


def rates_from_json(value: dict[str, Any]) -> Rates:
    """The :class:`Rates` :func:`rates_to_json` wrote; ``TypeError``, ``ValueError``,
    ``KeyError`` or ``ArithmeticError`` for anything else (an index written by another version
    is not trusted: :class:`Rates` checks every amount as it checks the table's). An index
    written before the billed parts (no ``"parts"``), or naming other parts, is a ``KeyError``:
    its rates would price every part as its parent, so it is rebuilt."""
    amounts, bands, parts = value["usd"], value["bands"], value["parts"]
    if not isinstance(amounts, list) or not all(isinstance(amount, str) for amount in amounts):
        raise TypeError("rates must be decimal strings")
    if parts is not None:
        if not isinstance(parts, dict) or not all(isinstance(p, str) for p in parts.values()):
            raise TypeError("part rates must be decimal strings by part")
        parts = tuple(Decimal(parts[name]) for name in PARTS)
    return Rates(
        *map(Decimal, amounts),
        version=str(value["version"]),
        bands=None if bands is None else tuple((int(t), rates_from_json(b)) for t, b in bands),
        parts=parts,
    )
