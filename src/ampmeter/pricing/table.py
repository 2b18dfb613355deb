"""Cost of one LLM call, from the genai-prices table or from prices the user sets.

Token conventions (OpenAI's): ``cached_tokens`` (prompt-cache reads) and ``cache_write_tokens``
(prompt-cache writes) are parts of ``input_tokens``; ``reasoning_tokens`` are part of
``output_tokens``. Nothing is charged twice: cache reads are billed at the cache-read rate, cache
writes at the cache-write rate, the rest of the input at the input rate; reasoning tokens are
billed as output (at the table's separate reasoning rate for the rare model that has one).
Integrations that receive Anthropic-style counts (cache tokens reported beside the input) add
them to ``input_tokens`` before calling :func:`price`.

Costs are exact :class:`~decimal.Decimal` dollars, worked out from genai-prices' own decimal
prices (or the user's, read as written), never through binary floats. A model the table does
not know is ``unpriced``: its cost is ``None``, never a silent zero. Nothing guesses a price
from a similar name: a fine-tune (``ft:gpt-4o-mini-...:org::id``) is unpriced until
:func:`set_price` prices it, which accepts fnmatch patterns (``"ft:gpt-4o-mini*"``) for that.

``pricing_version`` names where a price came from: ``"genai-prices@<package version>"`` for the
bundled table (with ``"+update@<timestamp>"`` when genai-prices' live updater replaced it), and
``"user"`` for prices set with :func:`set_price`, which do not depend on the table.
"""

from __future__ import annotations

import math
import operator
from decimal import Decimal
from typing import Final, Literal, NamedTuple, SupportsIndex, cast

from ampmeter import money
from ampmeter.pricing import genai_table, request_size, user_prices
from ampmeter.pricing.genai_table import (
    DatedRates,
    Unpriced,
    load,
    split_provider,
    table_entry,
    table_version,
)
from ampmeter.pricing.max_output import max_output_tokens
from ampmeter.pricing.rates import Rates
from ampmeter.pricing.request_size import CHARS_PER_TOKEN
from ampmeter.pricing.user_prices import (
    USER_PRICING_VERSION,
    clear_prices,
    model_arg,
    provider_arg,
    remove_price,
    set_price,
    user_rates,
)

__all__ = [
    "CHARS_PER_TOKEN",
    "DEFAULT_ESTIMATE_OUTPUT_TOKENS",
    "USER_PRICING_VERSION",
    "PriceResult",
    "PricingStatus",
    "clear_prices",
    "estimate",
    "estimate_nano",
    "load",
    "price",
    "price_nano",
    "remove_price",
    "set_price",
    "split_provider",
    "table_version",
]

PricingStatus = Literal["priced", "unpriced"]

DEFAULT_ESTIMATE_OUTPUT_TOKENS: Final = 1024
"""Output tokens :func:`estimate` assumes when the call sets no ``max_tokens`` and the model's
maximum output is not in :mod:`ampmeter.pricing.max_output`'s table."""


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
    rates = _rates_of(model, provider)
    if isinstance(rates, Unpriced):
        return PriceResult(None, rates.version, "unpriced")
    cost = rates.cost(
        input_tokens, output_tokens, cached_tokens, cache_write_tokens, reasoning_tokens
    )
    return PriceResult(cost, rates.version, "priced")


def price_nano(
    model: str,
    provider: str | None,
    input_tokens: int,
    output_tokens: int,
    cached_tokens: int,
    cache_write_tokens: int,
    reasoning_tokens: int,
) -> tuple[int | None, str]:
    """:func:`price` of counts already checked, in whole nano-dollars (rounded half to even;
    None when unpriced), and the pricing version: a context checks a call's counts when they
    are recorded and counts money in nano-dollars, so :data:`~ampmeter.pricing.TABLE` prices
    its calls with this. The model and provider names are checked here."""
    rates = _rates_of(model, provider)
    if isinstance(rates, Unpriced):
        return None, rates.version
    cost = rates.nano(
        input_tokens, output_tokens, cached_tokens, cache_write_tokens, reasoning_tokens
    )
    return cost, rates.version


_Entry = Rates | DatedRates | Unpriced
# (model, provider) -> (table source, user price changes, entry): each name's rates resolved
# once, and again only when the table's source or the user's prices change since.
_resolved: dict[tuple[str, str | None], tuple[object, int, _Entry]] = {}
_RESOLVED_MAX: Final = 4096


def _rates_of(model: str, provider: str | None) -> Rates | Unpriced:
    """The rates in force for ``model`` at ``provider``: a user price, else the table's. A
    name not resolved before is checked first (``TypeError``/``ValueError`` naming it)."""
    source, changes = genai_table.source(), user_prices.changes
    try:
        resolved_from, resolved_at, rates = _resolved[model, provider]
    except (KeyError, TypeError):  # TypeError: not a name at all, which _resolve reports
        rates = _resolve(model, provider, source, changes)
    else:
        if resolved_from is not source or resolved_at != changes:
            rates = _resolve(model, provider, source, changes)
    if isinstance(rates, DatedRates):
        return rates.in_force() or Unpriced(rates.version)
    return rates


def _resolve(model: str, provider: str | None, source: object, changes: int) -> _Entry:
    model, provider = model_arg(model), provider_arg(provider)
    user = user_rates(model, provider)
    rates = user if user is not None else table_entry(model, provider)
    if len(_resolved) >= _RESOLVED_MAX:
        _resolved.clear()
    _resolved[model, provider] = (source, changes, rates)
    return rates


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
    if prompt_tokens is not None:
        n_in = _count("prompt_tokens", prompt_tokens)
    elif prompt_text is not None:
        if not isinstance(prompt_text, str):
            raise TypeError(f"prompt_text must be a str, got {type(prompt_text).__name__}")
        n_in = request_size.prompt_tokens(prompt_text, model_arg(model))  # a name, first
    else:
        n_in = 0
    n_out = None if max_tokens is None else _count("max_tokens", max_tokens)
    cost = estimate_nano(model, provider, n_in, n_out)
    return None if cost is None else money.from_nano(cost)


def estimate_nano(
    model: str, provider: str | None, prompt_tokens: int, max_tokens: int | None
) -> int | None:
    """:func:`estimate` of counts already checked, in whole nano-dollars (None when unpriced):
    what a context reserves for a call, whose counts it checked when the call was made. The
    model and provider names are checked here."""
    rates = _rates_of(model, provider)
    if isinstance(rates, Unpriced):
        return None
    if max_tokens is None:
        max_tokens = max_output_tokens(model) or DEFAULT_ESTIMATE_OUTPUT_TOKENS
    return rates.nano(prompt_tokens, max_tokens, 0, 0, 0, "the price estimate", round_up=True)
