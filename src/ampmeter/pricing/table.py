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

from collections.abc import Mapping
from decimal import Decimal
from typing import Literal, NamedTuple

from ampmeter import _validate, money
from ampmeter.pricing.genai_table import load, split_provider, table_version
from ampmeter.pricing.parts import check_parts
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
# The counts price() checks, in order (the tool calls, which cost nothing here, last).
_COUNTS = (
    "input_tokens",
    "output_tokens",
    "cached_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
    "tool_calls",
)


class PriceResult(NamedTuple):
    """The cost of one call (a named tuple: it cannot be changed, and is cheap to make once per
    call).

    ``cost_usd`` is exact Decimal dollars, and ``None`` exactly when ``status`` is
    ``"unpriced"`` (the model is unknown).
    """

    cost_usd: Decimal | None
    pricing_version: str
    status: PricingStatus


def price(
    model: str,
    provider: str | None = None,
    *,
    input_tokens: int,
    output_tokens: int,
    cached_tokens: int = 0,
    cache_write_tokens: int = 0,
    reasoning_tokens: int = 0,
    parts: Mapping[str, int] | None = None,
) -> PriceResult:
    """Price one call of ``model`` (optionally at ``provider``, e.g. ``"openai"``).

    ``cached_tokens`` and ``cache_write_tokens`` are parts of ``input_tokens`` and
    ``reasoning_tokens`` is part of ``output_tokens`` (see the module docs). A price set with
    :func:`set_price` wins over the table. Unknown models give ``cost_usd=None`` and status
    ``"unpriced"``. ``parts``: billed parts as :meth:`ampmeter.Call.record` takes them
    (``{"input_audio_tokens": 120, "web_searches": 2}``), each at its own rate. Non-int or
    negative counts raise ``TypeError``/``ValueError``, as do parts larger than their whole.
    """
    counts = _validate.usage_counts(
        _COUNTS, input_tokens, output_tokens, cached_tokens, cache_write_tokens, reasoning_tokens, 0
    )
    checked = None if parts is None else check_parts(parts, counts)
    plan = plan_for(TABLE, model_arg(model), provider)
    cost, version = plan.price_usd(counts, checked)
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
    plan = plan_for(TABLE, model_arg(model), provider)  # (its reserve checks the counts)
    _, _, cost, priced, _ = plan.reserve(
        max_tokens=max_tokens, prompt_tokens=prompt_tokens, prompt_text=prompt_text
    )
    return money.from_nano(cost) if priced else None
