"""The genai-prices table: loaded on first use, resolved once per model, kept on disk.

genai-prices is imported on first use, so importing ampmeter stays fast. Each
``(model, provider)`` is resolved once per table snapshot (a live update of the table starts a
new generation) and the answer is kept in the disk index (:mod:`ampmeter.pricing._cache`), so
later processes price known models without loading the table. A model whose price depends on
the time of the request (start dates, off-peak hours) is re-resolved when a condition flips.
Provider-prefixed names (LiteLLM's ``openai/gpt-4o``) are priced as the model they name at
that provider.
"""

from __future__ import annotations

import contextlib
import math
import re
import sys
import threading
import time as _time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta, timezone
from functools import lru_cache, partial
from typing import TYPE_CHECKING, Final

from ampmeter.pricing import _cache as _price_cache
from ampmeter.pricing.rates import Rates, compile_price, rates_from_json, rates_to_json

if TYPE_CHECKING:
    from genai_prices.types import ModelInfo, PriceCalculation

__all__ = [
    "DEFAULT_CONTEXT_WINDOW",
    "DatedRates",
    "Unpriced",
    "context_window",
    "load",
    "now",
    "split_provider",
    "table_entry",
    "table_model_id",
    "table_version",
    "watch",
]

_UTC: Final = timezone.utc
now = _time.time
"""The clock time-dependent prices are read at (seconds since the epoch); tests replace it."""


@dataclass(frozen=True, slots=True)
class Unpriced:
    """The answer for a model the table (of ``version``) does not price."""

    version: str


# --------------------------------------------------------------------------- the price table


class _Table:
    """The lazily imported genai-prices entry points and the snapshot rates were resolved from."""

    __slots__ = ("calc_price", "generation", "get_snapshot", "snapshot", "version")
    version: str
    snapshot: object

    def __init__(self) -> None:
        import genai_prices
        from genai_prices import data_snapshot

        self.calc_price = genai_prices.calc_price
        self.get_snapshot = data_snapshot.get_snapshot
        self.generation = 0
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
        self.snapshot = snapshot
        self.generation += 1
        _table_entry.cache_clear()


_table: _Table | None = None
_table_lock = threading.Lock()


def _current_table() -> _Table:
    global _table
    table = _table
    if table is None:
        with _table_lock:
            table = _table = _table or _Table()
    snapshot = table.get_snapshot()
    if snapshot is not table.snapshot:
        with _table_lock:
            if snapshot is not table.snapshot:
                table.refresh(snapshot)
    return table


@dataclass(slots=True, eq=False)
class DatedRates:
    """Rates of a model whose table price depends on the request time (start dates, off-peak).

    The rates in force are kept until the next instant any of the model's conditions changes.
    """

    model_info: ModelInfo
    version: str
    state: tuple[float, Rates | None] = (-math.inf, None)  # (valid until, rates)

    def in_force(self) -> Rates | None:
        """The rates in force now (by :data:`now`)."""
        moment = now()
        until, rates = self.state
        if moment < until:
            return rates
        stamp = datetime.fromtimestamp(moment, _UTC)
        rates = compile_price(self.model_info.get_prices(stamp), self.version)
        self.state = (_next_change(self.model_info, stamp), rates)
        return rates


def _next_change(model_info: ModelInfo, stamp: datetime) -> float:
    """The first instant after ``stamp`` at which a price condition of the model may flip."""
    from genai_prices.types import StartDateConstraint, TimeOfDateConstraint

    prices = model_info.prices
    changes = [math.inf]
    for conditional in prices if isinstance(prices, list) else ():
        constraint = conditional.constraint
        if isinstance(constraint, StartDateConstraint):
            changes.append(datetime.combine(constraint.start_date, time(), _UTC).timestamp())
        elif isinstance(constraint, TimeOfDateConstraint):
            for moment in (constraint.start_time, constraint.end_time):
                at = datetime.combine(stamp.date(), _as_utc(moment))
                if at <= stamp:
                    at += timedelta(days=1)
                changes.append(at.timestamp())
        elif constraint is not None:  # a condition this module does not know: re-resolve always
            return stamp.timestamp()
    instant = stamp.timestamp()
    return min((c for c in changes if c > instant), default=math.inf)


def _as_utc(moment: time) -> time:
    # Naive times of day are UTC, as in genai-prices.
    if moment.tzinfo is None:
        return moment.replace(tzinfo=_UTC)
    return datetime.combine(date(1970, 1, 1), moment).astimezone(_UTC).timetz()


@lru_cache(maxsize=4096)
def _table_entry(model: str, provider: str | None, generation: int) -> Rates | DatedRates | None:
    """Resolve ``model`` in the table and keep the answer in the disk index; ``generation``
    keys the cache to one table snapshot (so each answer is resolved and stored once)."""
    table = _current_table()
    calc = _resolve(model, provider)
    if calc is not None and isinstance(calc.model.prices, list):
        # Conditional prices, picked by the request's time: always asked of the table.
        return DatedRates(calc.model, table.version)
    rates = None if calc is None else compile_price(calc.model_price, table.version)
    if table.generation == 1:  # the bundled snapshot's answers (not an auto-updated table's)
        value = table.version if rates is None else rates_to_json(rates)
        _price_cache.store(model, provider, value)
    return rates


def _resolve(model: str, provider: str | None) -> PriceCalculation | None:
    """The table's entry for ``model``: matched as genai-prices matches names (any case, dated
    snapshots and aliases), then as ``provider/model`` when the name has a provider prefix, then
    at whichever provider lists it, and a Bedrock model id at ``aws``.

    The last step is for the provider an SDK names, which is its wire format's: the ``openai``
    SDK pointed at DeepSeek's, Mistral's or xAI's API sends ``deepseek-chat`` as an ``openai``
    call, and OpenAI does not list it. Unpriced, it would be refused under a cost cap or counted
    as $0 where unpriced calls are allowed, while its provider bills it at the table's price."""
    table = _current_table()
    from genai_prices import Usage

    usage = Usage(input_tokens=0, output_tokens=0)
    try:
        return table.calc_price(usage, model, provider_id=provider)
    except LookupError:
        prefixed = split_provider(model)
    if prefixed is not None:
        with contextlib.suppress(LookupError):
            return table.calc_price(usage, prefixed[1], provider_id=prefixed[0])
    if provider is not None:
        with contextlib.suppress(LookupError):
            return table.calc_price(usage, model)
    if _BEDROCK_ID.match(model) and provider != "aws":  # (an SDK's Bedrock client's calls)
        with contextlib.suppress(LookupError):
            return table.calc_price(usage, model, provider_id="aws")
    return None


# A Bedrock model id: ``vendor.model``, or ``region.vendor.model`` for cross-region inference
# (``anthropic.claude-3-5-haiku-20241022-v1:0``, ``us.anthropic.claude-sonnet-4-…``).
_BEDROCK_ID: Final = re.compile(r"[a-z-]+(?:\.[a-z-]+)?\.[a-z]")


def table_model_id(model: str, provider: str | None) -> str | None:
    """The id of the table's model that ``model`` is priced as (``gpt-4o`` for ``GPT-4o``,
    ``gpt-4o-2024-08-06`` and ``openai/gpt-4o``), or None when the table does not price it."""
    calc = _resolve(model, provider)
    return None if calc is None else str(calc.model.id)


DEFAULT_CONTEXT_WINDOW: Final = 2_097_152
"""The context window taken for a model the price table does not know: 2M tokens, the
largest window of the common hosted models (Gemini 1.5 Pro's)."""


@lru_cache(maxsize=1_024)
def context_window(model: str | None) -> int:
    """The most input tokens ``model`` takes in one request, as the price table gives it (the
    ceiling on provider-kept state of unknown size), else :data:`DEFAULT_CONTEXT_WINDOW`."""
    calc = _resolve(model, None) if model else None
    window = None if calc is None else calc.model.context_window
    return window if isinstance(window, int) and window > 0 else DEFAULT_CONTEXT_WINDOW


# --------------------------------------------------------------------------- the disk index


def _from_disk(model: str, provider: str | None) -> Rates | Unpriced | None:
    """Rates from the on-disk index while the table is not loaded in this process (a loaded
    table, maybe auto-updated, is always asked instead); None when the index has no answer."""
    if _table is not None or "genai_prices" in sys.modules:
        return None
    found = _price_cache.lookup(model, provider)
    if found is _price_cache.MISS:
        return None
    if isinstance(found, str):  # unpriced, with the table version that said so
        # A provider-prefixed name's may be from before those were resolved: ask again.
        return None if "/" in model else Unpriced(found)
    try:
        return rates_from_json(found)
    except (TypeError, ValueError, KeyError, ArithmeticError):  # e.g. an older float index
        return None


def watch() -> tuple[Callable[[], object], object]:
    """What the table's answers come from now, and a function that tells it again, cheap
    enough to ask on every call (no ampmeter code runs): genai-prices' snapshot once the table
    is loaded (a live update replaces it); before that the disk index answers, and the
    function tells genai-prices' module, None until something imports it (nothing can replace
    the bundled table before then). An answer from :func:`table_entry` holds while the function
    tells the same."""
    if _table is None and "genai_prices" not in sys.modules:
        return _GENAI_PRICES_IMPORTED, None
    table = _current_table()
    return table.get_snapshot, table.get_snapshot()


_GENAI_PRICES_IMPORTED: Final = partial(sys.modules.get, "genai_prices")


def table_entry(model: str, provider: str | None) -> Rates | DatedRates | Unpriced:
    """The table's rates for ``model`` at ``provider`` (the disk index's answer while the
    table is not loaded in this process), rates that depend on the time of the request, or
    :class:`Unpriced` naming the table's version."""
    known = _from_disk(model, provider)
    if known is not None:
        return known
    table = _current_table()
    rates = _table_entry(model, provider, table.generation)
    return Unpriced(table.version) if rates is None else rates


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
    provider = _PROVIDER_ALIASES.get(prefix.lower(), prefix.lower())
    if not slash or not rest or provider not in _known_providers():
        return None
    return provider, rest


@lru_cache(maxsize=1)
def _known_providers() -> frozenset[str]:
    from genai_prices import data_snapshot

    return frozenset(p.id for p in data_snapshot.get_snapshot().providers)
