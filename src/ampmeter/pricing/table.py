"""Cost of one LLM call, from the genai-prices table or from prices the user sets.

Token conventions (OpenAI's): ``cached_tokens`` (prompt-cache reads) and ``cache_write_tokens``
(prompt-cache writes) are parts of ``input_tokens``; ``reasoning_tokens`` are part of
``output_tokens``. Nothing is charged twice: cache reads are billed at the cache-read rate, cache
writes at the cache-write rate, the rest of the input at the input rate; reasoning tokens are
billed as output (at the table's separate reasoning rate for the rare model that has one).

Costs are exact :class:`~decimal.Decimal` dollars, worked out from genai-prices' own decimal
prices (or the user's, read as written), never through binary floats. A model the table does
not know is ``unpriced``: its cost is ``None``, never a silent zero, and nothing guesses a price
from a similar name (a fine-tune is unpriced until :func:`set_price` prices it).
``pricing_version`` names where a price came from: ``"genai-prices@<package version>"`` (with
``"+update@<timestamp>"`` when genai-prices' live updater replaced the table), or ``"user"``.
"""

from __future__ import annotations

import math
import operator
from decimal import Decimal
from typing import Literal, NamedTuple, SupportsIndex, cast

from ampmeter import money
from ampmeter.pricing.genai_table import load, split_provider, table_version
from ampmeter.pricing.plan import DEFAULT_ESTIMATE_OUTPUT_TOKENS, plan_for
from ampmeter.pricing.request_size import CHARS_PER_TOKEN
from ampmeter.pricing.source import TABLE
from ampmeter.pricing.user_prices import (
    USER_PRICING_VERSION,
    clear_prices,
    model_arg,
    remove_price,
    set_price,
)

__all__ = [
    "CHARS_PER_TOKEN",
    "DEFAULT_ESTIMATE_OUTPUT_TOKENS",
    "USER_PRICING_VERSION",
    "PriceResult",
    "PricingStatus",
    "clear_prices",
    "estimate",
    "load",
    "price",
    "remove_price",
    "set_price",
    "split_provider",
    "table_version",
]

PricingStatus = Literal["priced", "unpriced"]


class PriceResult(NamedTuple):
    """The cost of one call (a named tuple: it cannot be changed, and is cheap to make once per
    call).

    ``cost_usd`` is exact Decimal dollars, and ``None`` exactly when ``status`` is
    ``"unpriced"`` (the model is unknown).
    """

    cost_usd: Decimal | None
    pricing_version: str
    status: PricingStatus


def _count(name: str, value: object) -> int:
    if type(value) is int:
        count = value
    elif isinstance(value, (bool, float)) or not hasattr(value, "__index__"):
        what = "NaN" if isinstance(value, float) and math.isnan(value) else repr(value)
        raise TypeError(f"{name} must be an int token count, got {type(value).__name__} {what}")
    else:
        count = operator.index(cast(SupportsIndex, value))  # numpy and other int types
    if count < 0:
        raise ValueError(f"{name} must be >= 0, got {count}")
    return count


def price(
    model: str,
    provider: str | None = None,
    *,
    input_tokens: int,
    output_tokens: int,
    cached_tokens: int = 0,
    cache_write_tokens: int = 0,
    reasoning_tokens: int = 0,
) -> PriceResult:
    """Price one call of ``model`` (optionally at ``provider``, e.g. ``"openai"``).

    ``cached_tokens`` and ``cache_write_tokens`` are parts of ``input_tokens`` and
    ``reasoning_tokens`` is part of ``output_tokens`` (see the module docs). A price set with
    :func:`set_price` wins over the table. Unknown models give ``cost_usd=None`` and status
    ``"unpriced"``. Non-int or negative counts raise ``TypeError``/``ValueError``, as do parts
    larger than their whole.
    """
    input_tokens = _count("input_tokens", input_tokens)
    output_tokens = _count("output_tokens", output_tokens)
    cached_tokens = _count("cached_tokens", cached_tokens)
    cache_write_tokens = _count("cache_write_tokens", cache_write_tokens)
    reasoning_tokens = _count("reasoning_tokens", reasoning_tokens)
    if cached_tokens + cache_write_tokens > input_tokens:
        raise ValueError(
            f"cached_tokens ({cached_tokens}) + cache_write_tokens ({cache_write_tokens}) exceed "
            f"input_tokens ({input_tokens}); they are parts of the input (add Anthropic-style "
            "separate cache counts to input_tokens first)"
        )
    if reasoning_tokens > output_tokens:
        raise ValueError(
            f"reasoning_tokens ({reasoning_tokens}) exceed output_tokens ({output_tokens}); "
            "reasoning tokens are part of the output"
        )
    cost, version = plan_for(TABLE, model_arg(model), provider).price_usd(
        input_tokens, output_tokens, cached_tokens, cache_write_tokens, reasoning_tokens
    )
    return PriceResult(cost, version, "unpriced" if cost is None else "priced")


def estimate(
    model: str,
    provider: str | None = None,
    *,
    prompt_tokens: int | None = None,
    prompt_text: str | None = None,
    max_tokens: int | None = None,
) -> Decimal | None:
    """Upper-bound cost in dollars of a call before it is made (the budget reservation),
    rounded up to a whole nano-dollar so that rounding never admits a call.

    The prompt counts ``prompt_tokens`` when given (e.g. a measured request's
    :func:`~ampmeter.pricing.request_size.input_tokens`), else the ``"learned"`` estimate of
    ``prompt_text``, else 0; the output counts ``max_tokens``, or when the call sets none the
    model's documented maximum output (:mod:`ampmeter.pricing.max_output`), else
    :data:`DEFAULT_ESTIMATE_OUTPUT_TOKENS`. ``None`` if unpriced.
    """
    n_in = None if prompt_tokens is None else _count("prompt_tokens", prompt_tokens)
    n_out = None if max_tokens is None else _count("max_tokens", max_tokens)
    _, _, cost, priced, _ = plan_for(TABLE, model_arg(model), provider).reserve(
        estimate_usd=None,
        max_tokens=n_out,
        prompt_tokens=n_in,
        prompt_text=prompt_text,
        request=None,
        mode="learned",
    )
    return money.from_nano(cost) if priced else None
