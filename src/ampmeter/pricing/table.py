"""Cost of one LLM call, from the genai-prices table or from prices the user sets.

Token conventions (OpenAI's): ``cached_tokens`` (prompt-cache reads) and ``cache_write_tokens``
(prompt-cache writes) are parts of ``input_tokens``; ``reasoning_tokens`` are part of
``output_tokens``. Nothing is charged twice: cache reads are billed at the cache-read rate, cache
writes at the cache-write rate, the rest of the input at the input rate; reasoning tokens are
billed as output (at the table's separate reasoning rate for the rare model that has one).
Integrations that receive Anthropic-style counts (cache tokens reported beside the input) add
them to ``input_tokens`` before calling :func:`price`.

A model the table does not know is ``unpriced``: its cost is ``None``, never a silent ``0.0``.
Provider-prefixed names (LiteLLM's ``openai/gpt-4o``, ``anthropic/claude-3-haiku``) are priced
as the model they name at that provider. Nothing guesses a price from a similar name: a
fine-tune (``ft:gpt-4o-mini-...:org::id``) is unpriced until :func:`set_price` prices it, which
accepts fnmatch patterns (``"ft:gpt-4o-mini*"``) for that.

``pricing_version`` names where a price came from: ``"genai-prices@<package version>"`` for the
bundled table (with ``"+update@<timestamp>"`` when genai-prices' live updater replaced it), and
``"user"`` for prices set with :func:`set_price`, which do not depend on the table.

genai-prices is imported on first use, so importing ampmeter stays fast. Rates are resolved once
per ``(model, provider)`` and then priced with plain float arithmetic.
"""

from __future__ import annotations

import fnmatch
import math
import numbers
import operator
import sys
import threading
import time as _time
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Final, Literal, SupportsIndex, cast

from ampmeter.pricing import _cache as _price_cache
from ampmeter.pricing import request_size as estimates
from ampmeter.pricing.max_output import max_output_tokens
from ampmeter.pricing.request_size import CHARS_PER_TOKEN

if TYPE_CHECKING:
    from genai_prices.types import ModelInfo, ModelPrice

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
    "table_version",
]

PricingStatus = Literal["priced", "unpriced"]

USER_PRICING_VERSION: Final = "user"
"""``pricing_version`` of a price that comes from :func:`set_price`."""
DEFAULT_ESTIMATE_OUTPUT_TOKENS: Final = 1024
"""Output tokens :func:`estimate` assumes when the call sets no ``max_tokens`` and the model's
maximum output is not in :mod:`ampmeter.max_output`'s table."""

_UTC: Final = timezone.utc
_clock = _time.time  # seconds since the epoch; tests move it


@dataclass(frozen=True, slots=True)
class PriceResult:
    """The cost of one call.

    ``cost_usd`` is ``None`` exactly when ``status`` is ``"unpriced"`` (the model is unknown).
    """

    cost_usd: float | None
    pricing_version: str
    status: PricingStatus


# A rate as (threshold, USD per million units) steps, highest threshold first; the last step is the
# base rate with threshold -1. A step applies when the call's input tokens exceed its threshold
# (genai-prices' "cliff" tiers: crossing a threshold re-prices every token of that kind).
_Steps = tuple[tuple[int, float], ...]


@dataclass(frozen=True, slots=True)
class _Rates:
    """Resolved USD-per-million rates of one model at one time."""

    input: float
    output: float
    cache_read: float
    cache_write: float
    reasoning: float
    per_call: float  # USD per million calls, so that one division by 1e6 covers every term
    version: str
    # Tiered prices: (threshold, rates for prompts longer than that), highest threshold first.
    bands: tuple[tuple[int, _Rates], ...] | None = None

    def cost(self, inp: int, out: int, cache_read: int, cache_write: int, reasoning: int) -> float:
        """USD for one call with these (already validated) counts."""
        r = self
        if self.bands is not None:
            for threshold, band in self.bands:
                if inp > threshold:
                    r = band
                    break
        micro = (
            (inp - cache_read - cache_write) * r.input
            + cache_read * r.cache_read
            + cache_write * r.cache_write
            + (out - reasoning) * r.output
            + reasoning * r.reasoning
            + r.per_call
        )
        return micro / 1e6


def _step_rate(steps: _Steps, input_tokens: int) -> float:
    for threshold, rate in steps:
        if input_tokens > threshold:
            return rate
    return steps[-1][1]  # not reached: the base step's threshold is -1


# --------------------------------------------------------------------------- the price table


class _Table:
    """The lazily imported genai-prices entry points and the snapshot rates were resolved from."""

    __slots__ = ("calc_price", "generation", "get_snapshot", "snapshot", "unpriced", "version")

    def __init__(self) -> None:
        import genai_prices
        from genai_prices import data_snapshot

        self.calc_price = genai_prices.calc_price
        self.get_snapshot = data_snapshot.get_snapshot
        self.version = ""
        self.generation = 0
        self.snapshot: object = None
        self.unpriced = PriceResult(None, "", "unpriced")
        self.refresh(self.get_snapshot())

    def refresh(self, snapshot: object) -> None:
        """Start a new generation of cached rates for ``snapshot`` (the bundled or a live table)."""
        import genai_prices

        version = f"genai-prices@{genai_prices.__version__}"
        if getattr(snapshot, "from_auto_update", False):
            stamp = getattr(snapshot, "timestamp", None)
            if isinstance(stamp, datetime):
                version += f"+update@{stamp.isoformat(timespec='seconds')}"
        self.version = version
        self.unpriced = PriceResult(None, version, "unpriced")
        self.snapshot = snapshot
        self.generation += 1
        _table_entry.cache_clear()


_table: _Table | None = None
_table_lock = threading.Lock()


def _current_table() -> _Table:
    table = _table
    if table is None:
        table = _load_table()
    snapshot = table.get_snapshot()
    if snapshot is not table.snapshot:
        with _table_lock:
            if snapshot is not table.snapshot:
                table.refresh(snapshot)
    return table


def _load_table() -> _Table:
    global _table
    with _table_lock:
        if _table is None:
            _table = _Table()
        return _table


class _DatedRates:
    """Rates of a model whose table price depends on the request time (start dates, off-peak).

    The rates in force are kept until the next instant any of the model's conditions changes.
    """

    __slots__ = ("model_info", "state", "version")

    def __init__(self, model_info: ModelInfo, version: str) -> None:
        self.model_info = model_info
        self.version = version
        self.state: tuple[float, _Rates | None] = (-math.inf, None)  # (valid until, rates)

    def now(self) -> _Rates | None:
        now = _clock()
        until, rates = self.state
        if now < until:
            return rates
        stamp = datetime.fromtimestamp(now, _UTC)
        rates = _compiled(self.model_info.get_prices(stamp), self.version)
        self.state = (_next_change(self.model_info, stamp), rates)
        return rates


def _next_change(model_info: ModelInfo, stamp: datetime) -> float:
    """The first instant after ``stamp`` at which a price condition of the model may flip."""
    from genai_prices.types import StartDateConstraint, TimeOfDateConstraint

    prices = model_info.prices
    changes = [math.inf]
    for conditional in prices if isinstance(prices, list) else ():
        constraint = conditional.constraint
        if constraint is None:
            continue
        if isinstance(constraint, StartDateConstraint):
            changes.append(datetime.combine(constraint.start_date, time(), _UTC).timestamp())
        elif isinstance(constraint, TimeOfDateConstraint):
            for moment in (constraint.start_time, constraint.end_time):
                at = datetime.combine(stamp.date(), _as_utc(moment))
                if at <= stamp:
                    at += timedelta(days=1)
                changes.append(at.timestamp())
        else:  # a condition this module does not know: re-resolve on every call
            return stamp.timestamp()
    now = stamp.timestamp()
    return min((c for c in changes if c > now), default=math.inf)


def _as_utc(moment: time) -> time:
    # Naive times of day are UTC, as in genai-prices.
    if moment.tzinfo is None:
        return moment.replace(tzinfo=_UTC)
    return datetime.combine(date(1970, 1, 1), moment).astimezone(_UTC).timetz()


# id(ModelPrice) -> (the ModelPrice, kept alive so its id stays unique, its compiled rates)
_compiled_prices: dict[tuple[int, str], tuple[object, _Rates | None]] = {}


def _compiled(model_price: ModelPrice, version: str) -> _Rates | None:
    key = (id(model_price), version)
    hit = _compiled_prices.get(key)
    if hit is not None and hit[0] is model_price:
        return hit[1]
    rates = _compile(model_price, version)
    _compiled_prices[key] = (model_price, rates)
    return rates


@lru_cache(maxsize=4096)
def _table_entry(model: str, provider: str | None, generation: int) -> _Rates | _DatedRates | None:
    """Resolve ``model`` in the table and keep the answer in the disk index; ``generation``
    keys the cache to one table snapshot (so each answer is resolved and stored once)."""
    rates = _look_up(model, provider)
    _to_disk(model, provider, rates)
    return rates


def _look_up(model: str, provider: str | None) -> _Rates | _DatedRates | None:
    table = _table
    assert table is not None  # _current_table() ran first
    from genai_prices import Usage

    try:
        calc = table.calc_price(Usage(input_tokens=0, output_tokens=0), model, provider_id=provider)
    except LookupError:
        prefixed = split_provider(model)
        if prefixed is None:
            return None
        named_provider, named_model = prefixed
        try:
            calc = table.calc_price(Usage(input_tokens=0, output_tokens=0), named_model,
                                    provider_id=named_provider)  # fmt: skip
        except LookupError:
            return None
    if isinstance(calc.model.prices, list):  # conditional prices: pick by request time
        return _DatedRates(calc.model, table.version)
    return _compile(calc.model_price, table.version)


def _compile(model_price: ModelPrice, version: str) -> _Rates | None:
    """Turn a genai-prices ``ModelPrice`` into float rates; ``None`` if it prices no tokens.

    Only the units a text call reports matter: input, output, cache read/write, reasoning and a
    per-request fee. Prices of other units (audio, images, web searches) apply to counts that are
    zero here.
    """
    inp = _steps(getattr(model_price, "input_mtok", None))
    out = _steps(getattr(model_price, "output_mtok", None))
    zero: _Steps = ((-1, 0.0),)
    if inp is None and out is None and _has_any_price(model_price):
        return None  # priced per audio hour, page, ...: a token cost of 0 would be a lie
    inp = inp or zero
    out = out or zero
    # A kind without its own rate is billed as its parent, as genai-prices does.
    cache_read = _steps(getattr(model_price, "cache_read_mtok", None)) or inp
    cache_write = _steps(getattr(model_price, "cache_write_mtok", None)) or inp
    reasoning = _steps(getattr(model_price, "output_reasoning_mtok", None)) or out
    per_kcall = _steps(getattr(model_price, "requests_kcount", None)) or zero
    per_call = tuple((threshold, rate * 1000.0) for threshold, rate in per_kcall)
    all_steps = (inp, out, cache_read, cache_write, reasoning, per_call)

    def flat(input_tokens: int, bands: tuple[tuple[int, _Rates], ...] | None = None) -> _Rates:
        r_in, r_out, r_cr, r_cw, r_rs, r_call = (_step_rate(s, input_tokens) for s in all_steps)
        return _Rates(r_in, r_out, r_cr, r_cw, r_rs, r_call, version, bands)

    thresholds = sorted({t for steps in all_steps for t, _ in steps if t >= 0}, reverse=True)
    bands = tuple((t, flat(t + 1)) for t in thresholds)
    return flat(0, bands or None)


def _has_any_price(model_price: ModelPrice) -> bool:
    # A table entry with no price at all is a free model (genai-prices prices it at 0).
    return any(v is not None for k, v in vars(model_price).items() if not k.startswith("_"))


def _steps(value: object) -> _Steps | None:
    from genai_prices.types import TieredPrices

    if isinstance(value, Decimal):
        return ((-1, float(value)),)
    if isinstance(value, TieredPrices):
        tiers = sorted(value.tiers, key=lambda tier: tier.start, reverse=True)
        return (*((tier.start, float(tier.price)) for tier in tiers), (-1, float(value.base)))
    return None


# --------------------------------------------------------------------------- the disk index


# What the disk index said of each (model, provider), decoded once: every priced call asks
# (twice: the reservation and the price), and decoding its JSON form each time was ~15% of
# what metering adds to an SDK call. A miss is kept too: the table loads right after one.
_decoded: dict[tuple[str, str | None], _Rates | PriceResult | None] = {}
_DECODED_MAX: Final = 4096


def _from_disk(model: str, provider: str | None) -> _Rates | PriceResult | None:
    """Rates from the on-disk index while the table is not loaded in this process (a loaded
    table, maybe auto-updated, is always asked instead); None when the index has no answer."""
    if _table is not None or "genai_prices" in sys.modules:
        return None
    key = (model, provider)
    try:
        return _decoded[key]
    except KeyError:
        known = _decode(model, _price_cache.lookup(model, provider))
        if len(_decoded) < _DECODED_MAX:
            _decoded[key] = known
        return known


def _decode(model: str, found: Any) -> _Rates | PriceResult | None:
    if found is _price_cache.MISS:
        return None
    if isinstance(found, str):  # unpriced, with the table version that said so
        if "/" in model:
            return None  # maybe written before provider-prefixed names were resolved: ask again
        return PriceResult(None, found, "unpriced")
    try:
        return _rates_from_json(found)
    except (TypeError, ValueError, KeyError):
        return None


def _to_disk(model: str, provider: str | None, rates: _Rates | _DatedRates | None) -> None:
    if type(rates) is _DatedRates:
        return  # depends on the time of the request: always asked of the table
    table = _table
    if table is None or table.generation != 1:
        return  # only the bundled snapshot's answers (not an auto-updated table's) are kept
    value: object = table.version if rates is None else _rates_to_json(cast(_Rates, rates))
    _price_cache.store(model, provider, value)


def _rates_to_json(rates: _Rates) -> dict[str, object]:
    return {
        "rates": [rates.input, rates.output, rates.cache_read, rates.cache_write,
                  rates.reasoning, rates.per_call],
        "version": rates.version,
        "bands": None if rates.bands is None
        else [[threshold, _rates_to_json(band)] for threshold, band in rates.bands],
    }  # fmt: skip


def _rates_from_json(value: dict[str, Any]) -> _Rates:
    r_in, r_out, r_read, r_write, r_reasoning, r_call = (float(x) for x in value["rates"])
    bands = value["bands"]
    return _Rates(
        r_in,
        r_out,
        r_read,
        r_write,
        r_reasoning,
        r_call,
        str(value["version"]),
        None if bands is None else tuple((int(t), _rates_from_json(b)) for t, b in bands),
    )


def load() -> None:
    """Load the price table now (it is otherwise loaded by the first priced call)."""
    _current_table()


def table_version() -> str:
    """The ``pricing_version`` of table prices right now, e.g. ``"genai-prices@0.2.3"``."""
    return _current_table().version


# Provider prefixes in LiteLLM's spelling that differ from genai-prices' provider ids.
_PROVIDER_ALIASES: Final = {
    "gemini": "google",
    "vertex_ai": "google",
    "bedrock": "aws",
    "xai": "x-ai",
    "together_ai": "together",
    "fireworks_ai": "fireworks",
    "azure_ai": "azure",
    "mistralai": "mistral",
}


def split_provider(model: str) -> tuple[str, str] | None:
    """``("openai", "gpt-4o")`` for ``"openai/gpt-4o"``: a name prefixed with a provider the
    price table knows (or a LiteLLM alias of one); None for any other name."""
    prefix, slash, rest = model.partition("/")
    if not slash or not rest:
        return None
    provider = _PROVIDER_ALIASES.get(prefix.lower(), prefix.lower())
    if provider not in _known_providers():
        return None
    return provider, rest


@lru_cache(maxsize=1)
def _known_providers() -> frozenset[str]:
    from genai_prices import data_snapshot

    return frozenset(p.id for p in data_snapshot.get_snapshot().providers)


# --------------------------------------------------------------------------- user prices

_overrides: dict[tuple[str, str | None], _Rates] = {}  # replaced, never mutated (lock-free reads)
# Prices set for fnmatch patterns: (pattern, provider, rates), longest pattern first.
_patterns: tuple[tuple[str, str | None, _Rates], ...] = ()
_PATTERN_CHARS: Final = frozenset("*?[")


def _is_pattern(model: str) -> bool:
    return not _PATTERN_CHARS.isdisjoint(model)


_overrides_lock = threading.Lock()


def _rate_arg(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, Decimal)):
        raise TypeError(f"{name} must be a number of USD per million tokens, got {value!r}")
    rate = float(value)
    if not math.isfinite(rate) or rate < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return rate


def _model_arg(model: object) -> str:
    if not isinstance(model, str):
        raise TypeError(f"model must be a str, got {type(model).__name__} {model!r}")
    if not model.strip():
        raise ValueError("model must be a non-empty model name")
    return model


def _provider_arg(provider: object) -> str | None:
    if provider is None:
        return None
    if not isinstance(provider, str):
        raise TypeError(f"provider must be a str or None, got {type(provider).__name__}")
    if not provider.strip():
        raise ValueError("provider must be a non-empty provider id or None")
    return provider


def _override_key(model: str, provider: str | None) -> tuple[str, str | None]:
    return (model.lower(), None if provider is None else provider.lower())


def set_price(
    model: str,
    *,
    input_per_mtok: float,
    output_per_mtok: float,
    cached_input_per_mtok: float | None = None,
    cache_write_per_mtok: float | None = None,
    provider: str | None = None,
) -> None:
    """Set (or replace) the price of ``model`` in USD per million tokens; it wins over the table.

    Use it for a model the table lacks (a self-hosted model at ``0``, a fine-tune) or to
    correct a price. Names match case-insensitively and exactly, or, when ``model`` holds ``*``,
    ``?`` or ``[``, as an fnmatch pattern: ``set_price("ft:gpt-4o-mini*", ...)`` prices every
    such fine-tune (an exact price wins over a pattern, a longer pattern over a shorter one). A
    provider-prefixed name (``openai/x``) also finds the price set for ``x``. With ``provider``
    the price applies only to calls that name that provider; without it, to every call of ``model``.
    Cache reads and writes without their own rate are billed at the input rate, reasoning tokens
    at the output rate. Results carry ``pricing_version == "user"``.
    """
    key = _override_key(_model_arg(model), _provider_arg(provider))
    r_in = _rate_arg("input_per_mtok", input_per_mtok)
    r_out = _rate_arg("output_per_mtok", output_per_mtok)
    r_cr = (
        r_in
        if cached_input_per_mtok is None
        else _rate_arg("cached_input_per_mtok", cached_input_per_mtok)
    )
    r_cw = (
        r_in
        if cache_write_per_mtok is None
        else _rate_arg("cache_write_per_mtok", cache_write_per_mtok)
    )
    rates = _Rates(r_in, r_out, r_cr, r_cw, r_out, 0.0, USER_PRICING_VERSION)
    global _overrides, _patterns
    with _overrides_lock:
        if _is_pattern(key[0]):
            kept = [p for p in _patterns if (p[0], p[1]) != key]
            _patterns = tuple(sorted([*kept, (*key, rates)], key=lambda p: -len(p[0])))
        else:
            _overrides = {**_overrides, key: rates}


def remove_price(model: str, *, provider: str | None = None) -> None:
    """Remove a price set with :func:`set_price`; ``KeyError`` if there is none."""
    key = _override_key(_model_arg(model), _provider_arg(provider))
    global _overrides, _patterns
    with _overrides_lock:
        if _is_pattern(key[0]):
            if not any((p[0], p[1]) == key for p in _patterns):
                where = "" if provider is None else f" for provider {provider!r}"
                raise KeyError(f"no price was set for pattern {model!r}{where}")
            _patterns = tuple(p for p in _patterns if (p[0], p[1]) != key)
            return
        if key not in _overrides:
            where = "" if provider is None else f" for provider {provider!r}"
            raise KeyError(f"no price was set for model {model!r}{where}")
        _overrides = {k: v for k, v in _overrides.items() if k != key}


def clear_prices() -> None:
    """Remove every price set with :func:`set_price` (the table is untouched)."""
    global _overrides, _patterns
    with _overrides_lock:
        _overrides = {}
        _patterns = ()


# --------------------------------------------------------------------------- pricing a call


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
    if (type(model) is not str or not model
            or (provider is not None and (type(provider) is not str or not provider))):  # fmt: skip
        model, provider = _names(model, provider)
    if type(input_tokens) is not int or input_tokens < 0:
        input_tokens = _count("input_tokens", input_tokens)
    if type(output_tokens) is not int or output_tokens < 0:
        output_tokens = _count("output_tokens", output_tokens)
    if type(cached_tokens) is not int or cached_tokens < 0:
        cached_tokens = _count("cached_tokens", cached_tokens)
    if type(cache_write_tokens) is not int or cache_write_tokens < 0:
        cache_write_tokens = _count("cache_write_tokens", cache_write_tokens)
    if type(reasoning_tokens) is not int or reasoning_tokens < 0:
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
    if isinstance(rates, PriceResult):
        return rates
    cost = rates.cost(
        input_tokens, output_tokens, cached_tokens, cache_write_tokens, reasoning_tokens
    )
    return PriceResult(cost, rates.version, "priced")


def _rates_of(model: str, provider: str | None) -> _Rates | PriceResult:
    """The rates in force for ``model`` at ``provider`` (a user price, else the disk index's or
    the table's answer), or the unpriced result that says which table did not know it."""
    if _overrides or _patterns:
        user = _user_rates(model, provider)
        if user is not None:
            return user
    known = _from_disk(model, provider)
    if known is not None:
        return known
    table = _current_table()
    rates = _table_entry(model, provider, table.generation)
    if type(rates) is _DatedRates:
        rates = rates.now()
    return table.unpriced if rates is None else rates  # type: ignore[return-value]


def _user_rates(model: str, provider: str | None) -> _Rates | None:
    """The price :func:`set_price` gave ``model`` (exact first, then patterns), or None."""
    names = [model.lower()]
    prefixed = split_provider(model) if "/" in model else None
    if prefixed is not None:
        names.append(prefixed[1].lower())
        provider = provider if provider is not None else prefixed[0]
    providers = (None,) if provider is None else (provider.lower(), None)
    overrides, patterns = _overrides, _patterns
    for name in names:
        for wanted in providers:
            rates = overrides.get((name, wanted))
            if rates is not None:
                return rates
    for name in names:
        for pattern, pattern_provider, rates in patterns:
            if pattern_provider in providers and fnmatch.fnmatchcase(name, pattern):
                return rates
    return None


def estimate(
    model: str,
    provider: str | None = None,
    *,
    prompt_tokens: int | None = None,
    prompt_text: str | None = None,
    max_tokens: int | None = None,
) -> float | None:
    """Upper-bound cost in USD of a call before it is made (the budget reservation).

    The prompt counts ``prompt_tokens`` when given (e.g. the provider's own count), else
    the prompt estimate of :mod:`ampmeter.estimates`, else 0; the output counts ``max_tokens``, or
    when the call sets none the model's documented maximum output (:mod:`ampmeter.max_output`),
    else :data:`DEFAULT_ESTIMATE_OUTPUT_TOKENS`. ``None`` if unpriced.
    """
    if (type(model) is not str or not model
            or (provider is not None and (type(provider) is not str or not provider))):  # fmt: skip
        model, provider = _names(model, provider)
    if prompt_tokens is not None:
        n_in = prompt_tokens
        if type(n_in) is not int or n_in < 0:
            n_in = _count("prompt_tokens", prompt_tokens)
    elif prompt_text is not None:
        if not isinstance(prompt_text, str):
            raise TypeError(f"prompt_text must be a str, got {type(prompt_text).__name__}")
        n_in = estimates.prompt_tokens(prompt_text, model)
    else:
        n_in = 0
    if max_tokens is None:
        n_out = max_output_tokens(model) or DEFAULT_ESTIMATE_OUTPUT_TOKENS
    else:
        n_out = max_tokens
        if type(n_out) is not int or n_out < 0:
            n_out = _count("max_tokens", max_tokens)
    rates = _rates_of(model, provider)
    if isinstance(rates, PriceResult):
        return None
    return rates.cost(n_in, n_out, 0, 0, 0)


def _names(model: object, provider: object) -> tuple[str, str | None]:
    """``model`` and ``provider`` checked (a TypeError or ValueError naming the bad one)."""
    return _model_arg(model), _provider_arg(provider)
