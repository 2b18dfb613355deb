"""Prices the user sets, which win over the genai-prices table.

Rates are read as written (:func:`ampmeter.money.usd`: ``0.3`` is exactly ``Decimal("0.3")``).
Names match case-insensitively (:func:`ampmeter.pricing.names.user_price_names`), exactly
or as fnmatch patterns (``"ft:gpt-4o-mini*"``): a :class:`~ampmeter.pricing.price_book.PriceBook`.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Final

from ampmeter.pricing.names import user_price_names
from ampmeter.pricing.parts import PRICE_KEYS, resolve_part_rates
from ampmeter.pricing.price_book import PriceBook, is_pattern
from ampmeter.pricing.rates import MAX_RATE, Rates, rate_arg

__all__ = [
    "USER_PRICING_VERSION",
    "book",
    "clear_prices",
    "model_arg",
    "provider_arg",
    "remove_price",
    "set_price",
    "user_rates",
]

USER_PRICING_VERSION: Final = "user"
"""``pricing_version`` of a price that comes from :func:`set_price`."""

_ZERO: Final = Decimal(0)

book: PriceBook[Rates] = PriceBook()
"""The prices :func:`set_price` set, by ``(model, provider)`` in lower case."""


def model_arg(model: object, what: str = "model") -> str:
    """``model`` checked: a non-empty name (``TypeError``/``ValueError`` naming ``what``)."""
    if not isinstance(model, str):
        raise TypeError(f"{what} must be a str, got {type(model).__name__} {model!r}")
    if not model or model.isspace():
        raise ValueError(f"{what} must be a non-empty {what} name")
    return model


def provider_arg(provider: object) -> str | None:
    """``provider`` checked: None or a non-empty name (as :func:`model_arg` checks one)."""
    return None if provider is None else model_arg(provider, "provider")


def _key(model: str, provider: str | None) -> tuple[str, str | None]:
    return (model.lower(), None if provider is None else provider.lower())


def set_price(
    model: str,
    *,
    input_per_mtok: Decimal | float | int | str,
    output_per_mtok: Decimal | float | int | str,
    cached_input_per_mtok: Decimal | float | int | str | None = None,
    cache_write_per_mtok: Decimal | float | int | str | None = None,
    provider: str | None = None,
    part_prices: Mapping[str, Decimal | float | int | str] | None = None,
) -> None:
    """Set (or replace) the price of ``model`` in USD per million tokens; it wins over the table.

    Use it for a model the table lacks (a self-hosted model at ``0``, a fine-tune) or to
    correct a price. Rates are read as written (``0.15`` is exactly 0.15). Names match
    case-insensitively and exactly, or, when ``model`` holds ``*``, ``?`` or ``[``, as an
    fnmatch pattern: ``set_price("ft:gpt-4o-mini*", ...)`` prices every such fine-tune (an exact
    price wins over a pattern, a longer pattern over a shorter one). A provider-prefixed name
    (``openai/x``) also finds the price set for ``x``. With ``provider`` the price applies only
    to calls that name that provider; without it, to every call of ``model``. Cache reads and
    writes without their own rate are billed at the input rate, reasoning tokens at the output
    rate. ``part_prices`` prices billed parts (:mod:`ampmeter.pricing.parts`) by genai-prices'
    price keys: ``{"cache_write_1h_mtok": 6, "input_audio_mtok": 40, "web_searches_kcount":
    10}`` (USD per million tokens, or per thousand uses for ``*_kcount``); a part without a
    price is billed as its parent kind (audio input as input, a 1-hour write as a cache
    write), a server tool without one at 0. Results carry ``pricing_version == "user"``. A
    rate is at most 1,000,000,000 (a thousand dollars a token) with at most 24 decimal places;
    ``ValueError`` names the argument that is not, and no price changes.
    """
    key = _key(model_arg(model), provider_arg(provider))
    r_in = rate_arg(input_per_mtok, "input_per_mtok")
    r_out = rate_arg(output_per_mtok, "output_per_mtok")
    cache_rates = (
        ("cached_input_per_mtok", cached_input_per_mtok),
        ("cache_write_per_mtok", cache_write_per_mtok),
    )
    # A cache rate not given is the input rate.
    r_cr, r_cw = (None if rate is None else rate_arg(rate, name) for name, rate in cache_rates)
    given = {"input_mtok": r_in, "output_mtok": r_out, "cache_read_mtok": r_cr}
    given["cache_write_mtok"] = r_cw
    given.update(_part_prices(part_prices))
    parts = resolve_part_rates(given.get, _ZERO) if part_prices else None
    cache = (r_in if rate is None else rate for rate in (r_cr, r_cw))
    rates = (r_in, r_out, *cache, r_out, _ZERO)
    book.set(key, Rates(*rates, version=USER_PRICING_VERSION, parts=parts))


def _part_prices(prices: Mapping[str, object] | None) -> dict[str, Decimal | None]:
    """``set_price``'s ``part_prices`` checked, per million units (``ValueError`` naming an
    unknown key or a rate :func:`rate_arg` refuses)."""
    if prices is None:
        return {}
    if not isinstance(prices, Mapping):
        raise TypeError(f"part_prices must be a mapping of price keys to rates, got {prices!r}")
    checked: dict[str, Decimal | None] = {}
    for price_key, value in prices.items():
        if price_key not in PRICE_KEYS:
            known = ", ".join(PRICE_KEYS)
            raise ValueError(f"unknown part price {price_key!r}; known: {known}")
        what = f"part_prices[{price_key!r}]"
        if not price_key.endswith("_kcount"):
            checked[price_key] = rate_arg(value, what)
            continue
        # Kept per million uses, as every other rate is per million units.
        rate = rate_arg(value, what, "USD per thousand uses").scaleb(3)
        if rate > MAX_RATE:
            raise ValueError(f"{what} must be at most {MAX_RATE / 1000:,} USD per thousand uses")
        checked[price_key] = rate
    return checked


def remove_price(model: str, *, provider: str | None = None) -> None:
    """Remove a price set with :func:`set_price`; ``KeyError`` if there is none."""
    key = _key(model_arg(model), provider_arg(provider))
    if not book.remove(key):
        kind = "pattern" if is_pattern(key[0]) else "model"
        where = "" if provider is None else f" for provider {provider!r}"
        raise KeyError(f"no price was set for {kind} {model!r}{where}")


def clear_prices() -> None:
    """Remove every price set with :func:`set_price` (the table is untouched)."""
    book.clear()


def user_rates(model: str, provider: str | None) -> Rates | None:
    """The price :func:`set_price` gave ``model`` (exact first, then patterns), or None."""
    if not book:
        return None
    names, prefix = user_price_names(model)
    provider = provider if provider is not None else prefix
    return book.find(names, (None,) if provider is None else (provider.lower(), None))
