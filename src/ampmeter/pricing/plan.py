"""A model's price plan: what a call of it reserves, and what it costs when it ends.

A call finds its plan once (:func:`plan_for`) and both its reservation (:meth:`PricePlan.reserve`)
and its price (:meth:`PricePlan.price`) are worked out by it. Under :data:`TABLE` a plan is
compiled once per ``(model, provider)`` and kept: the model's rates as integers (nano-dollars
per token of each class, and its fee per call: :class:`~ampmeter.pricing.rates.Rates`), its
pricing version, its default output and its output bound. :func:`plan_for` compiles it again
when the user's prices (:func:`~ampmeter.pricing.set_price`) or the table (a live update, a
table loaded since the disk index answered) changed since: a stale price would undercount. A
call is priced by the plan it was made with; a price set meanwhile applies from the next call.
Rates that depend on the time of the request are read on every use.

Any other pricing (:data:`NO_PRICES`, an embedder's object) is asked on every use, its dollars
read as any amount a user gives (a float as written). A call that names no model has a plan
too, that prices nothing.

Two estimate modes (a context's ``estimate=``): ``"learned"`` takes the input from the request's
measure corrected per model by finished calls, and the output from ``max_tokens``, else the
model's default output (priced, not held as tokens); ``"bound"`` reserves a ceiling no tokenizer
can pass: the input's bound from its measure, and the output at ``max_tokens``, else the
model's documented maximum output, else :data:`~ampmeter.pricing.max_output.DEFAULT_OUTPUT_BOUND`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Final

from ampmeter import _validate, money
from ampmeter._validate import Counts
from ampmeter.node import (
    META_CACHE_WRITE_TOKENS,
    META_CACHED_TOKENS,
    META_COST_STATUS,
    META_PRICING_VERSION,
    META_REASONING_TOKENS,
    META_TOOL_CALLS_MADE,
)
from ampmeter.pricing import request_size, user_prices
from ampmeter.pricing.max_output import DEFAULT_OUTPUT_BOUND, max_output_tokens
from ampmeter.pricing.parts import part_units
from ampmeter.pricing.rates import Rates
from ampmeter.pricing.request_size import EstimateMode, RequestSize
from ampmeter.pricing.source import TABLE, Pricing

if TYPE_CHECKING:
    from ampmeter.pricing.genai_table import DatedRates, Unpriced

__all__ = [
    "DEFAULT_ESTIMATE_OUTPUT_TOKENS",
    "ESTIMATE_MODES",
    "MAX_MODELS",
    "META_COST_CLAMPED",
    "PricePlan",
    "forget_inputs",
    "largest_input",
    "plan_for",
]

DEFAULT_ESTIMATE_OUTPUT_TOKENS: Final = 1024
"""Output tokens an estimate assumes when the call sets no ``max_tokens`` and the model's
maximum output is not in :mod:`ampmeter.pricing.max_output`'s table."""
ESTIMATE_MODES: Final = ("learned", "bound")
META_COST_CLAMPED: Final = "cost_clamped"  # priced past what money counts: the most it counts


# The most input tokens a request to each model was billed in this process (as the provider
# counted), for the first MAX_MODELS models: what stored state of unknown size is estimated at
# in "learned" mode (see stored_state.unknown_state_tokens). Noted where a call is priced.
MAX_MODELS: Final = 4_096
_largest: dict[str, int] = {}
_largest_lock = threading.Lock()


class PricePlan:
    """How one context's pricing prices one model at one provider (see the module docs).
    Whether the model has a price is whether :meth:`reserve` says it is priced."""

    __slots__ = (
        "asked",
        "dated",
        "model",
        "output_bound",
        "output_default",
        "provider",
        "rates",
        "version",
    )

    def __init__(
        self,
        model: str | None,
        provider: str | None,
        *,
        asked: Pricing | None = None,
        rates: Rates | None = None,
        dated: DatedRates | None = None,
        version: str = "",
    ) -> None:
        self.model = model
        self.provider = provider
        self.asked = asked
        """Another pricing, asked on every use (None: the table's or the user's prices)."""
        self.rates = rates
        """The model's rates (None: unpriced, or they depend on the time: ``dated``)."""
        self.dated = dated
        self.version = version
        """The pricing version of the rates, or of the table that does not price the model."""
        known = max_output_tokens(model) if model else None
        self.output_default: int = known or DEFAULT_ESTIMATE_OUTPUT_TOKENS
        """Output tokens an estimate prices for a call without ``max_tokens``."""
        self.output_bound: int = known or DEFAULT_OUTPUT_BOUND
        """Output tokens ``estimate="bound"`` reserves for a call without ``max_tokens``."""

    def reserve(
        self,
        *,
        max_tokens: int | None,
        prompt_tokens: int | None,
        prompt_text: str | None = None,
        request: RequestSize | None = None,
        estimate_usd: float | Decimal | None = None,
        mode: EstimateMode = "learned",
    ) -> tuple[int, int, int, bool, RequestSize | None]:
        """What a call reserves (see the module docs): its input and output tokens, its cost in
        nano-dollars rounded up (``estimate_usd`` when given), whether its model has a price,
        and the measure of its request to learn from (None when there is none, or it is too
        short to teach anything). The input is the caller's ``prompt_tokens``, else the
        estimate from the request's measure or the prompt text. An embedding request sets
        ``max_tokens`` 0: it writes nothing."""
        out_tokens = max_tokens
        if max_tokens is not None and not (
            type(max_tokens) is int and 0 <= max_tokens <= _validate.MAX_COUNT
        ):
            out_tokens = _validate.count(max_tokens, "max_tokens")  # (names what is wrong)
        size: RequestSize | None = None
        wanted: dict[str, int] | None = None  # billed parts the request may use
        if prompt_tokens is not None:
            in_tokens = _validate.count(prompt_tokens, "prompt_tokens")
        elif request is None and prompt_text is None:
            in_tokens = 0
        else:
            if request is None:
                size = request_size.measure_text(_validate.text(prompt_text, "prompt_text"))
            elif isinstance(request, RequestSize):
                size = request
            else:
                raise TypeError(f"request must be a RequestSize, got {type(request).__name__}")
            in_tokens = request_size.input_tokens(size, self.model, mode)
            wanted = size.parts
            if size.chars < request_size.MIN_LEARN_CHARS:
                size = None  # known now: the call's end need not offer it to learn
        if out_tokens is None and mode == "bound":
            out_tokens = self.output_bound
        if estimate_usd is not None:
            cost = _validate.nano(estimate_usd, "estimate_usd", round_up=True)
            return in_tokens, out_tokens or 0, cost, True, size
        # Without max_tokens the default output is priced: a budget must not treat a call of
        # unknown length as free.
        priced_out = self.output_default if out_tokens is None else out_tokens
        found: int | None = None
        if self.asked is not None:
            dollars = self.asked.estimate(
                self.model, self.provider, prompt_tokens=in_tokens, max_tokens=out_tokens
            )
            if dollars is not None:
                found = money.to_nano(dollars, "the price estimate", round_up=True)
        else:
            rates = self.rates if self.dated is None else self.dated.in_force()
            if rates is not None:
                if rates.bands is not None:
                    rates = rates.band(in_tokens)
                r_in, r_out, _, _, _, fee = rates.scaled
                units = in_tokens * r_in + priced_out * r_out + fee
                if wanted and rates.scaled_parts is not None:
                    # Measured audio at its rate, a server tool's uses the request allows.
                    units += part_units(wanted, rates.scaled, rates.scaled_parts)
                found = -(-units // rates.divisor)  # rounded up
                if found > money.MAX_NANO:
                    shown = Decimal(units) / rates.divisor / money.NANO_PER_USD
                    raise money.TooLargeToCount(
                        f"the price estimate is too large to count: {shown!r}"
                    )
        # A call that names no model has no price to miss; an empty name has no price.
        priced = found is not None or self.model is None
        return in_tokens, out_tokens or 0, found or 0, priced, size

    def price(
        self,
        counts: Counts,
        cost: int | None,
        meta: dict[str, Any],
        *,
        recorded: bool,
        estimated: bool,
        parts: dict[str, int] | None = None,
    ) -> tuple[int, int]:
        """What an ended call with these checked ``counts`` cost in nano-dollars, and 1 when it
        is unpriced (else 0); what its price says about it goes into its metadata ``meta``. The
        cost is ``cost`` as given, else the plan's, rounded half to even (unpriced when the model
        has no price or the call recorded nothing), with ``cost_status`` ``"estimated"`` when
        the counts were ``estimated`` (the provider reported none, so they are ampmeter's). A
        price beyond what money counts (a provider reporting absurd usage: 2**53 tokens of a $10
        per million model) is charged as the most it counts, :data:`~ampmeter.money.MAX_NANO`,
        and the node says ``cost_clamped``: the caller still gets the response it paid for, and
        no budget lets another call through. Input the provider counted beyond any before it
        for the model is noted (:func:`largest_input`). ``parts``: the call's checked billed
        parts (:mod:`ampmeter.pricing.parts`), each priced at its own rate and shown in
        ``meta`` under its name."""
        version: str | None = None
        found: int | None = None
        tokens_in, _, cached, cache_writes, reasoning, tools = counts
        # A new largest input (as the provider counted: an estimate would only confirm itself).
        model = self.model
        if model and not estimated and tokens_in > _largest.get(model, 0):
            _note_input(model, tokens_in)
        if cost is None and recorded:
            if self.asked is not None:
                found, version = self._asked_price(counts, parts)
            else:
                version = self.version
                exact = self._units(counts, parts)
                if exact is not None:
                    units, rates = exact
                    divisor = rates.divisor
                    found, rest = divmod(units, divisor)
                    if rest * 2 > divisor or (rest * 2 == divisor and found % 2):
                        found += 1  # half to even
        unpriced = 0
        if cost is not None:
            status = "given"
        elif found is None:
            cost, status, unpriced = 0, "unpriced", 1
        else:
            cost, status = found, "estimated" if estimated else "priced"
        meta[META_COST_STATUS] = status
        if cost > money.MAX_NANO:
            cost = money.MAX_NANO
            meta[META_COST_CLAMPED] = True
        if version:
            meta[META_PRICING_VERSION] = version
        if cached:
            meta[META_CACHED_TOKENS] = cached
        if cache_writes:
            meta[META_CACHE_WRITE_TOKENS] = cache_writes
        if reasoning:
            meta[META_REASONING_TOKENS] = reasoning
        meta[META_TOOL_CALLS_MADE] = tools
        if parts:
            meta.update(parts)
        return cost, unpriced

    def price_usd(
        self, counts: Counts, parts: dict[str, int] | None = None
    ) -> tuple[Decimal | None, str]:
        """The exact cost in dollars (not rounded; None when unpriced) of a call with these
        checked ``counts`` (and billed ``parts``) by the table's rates, and their pricing
        version."""
        exact = self._units(counts, parts)
        if exact is None:
            return None, self.version
        units, rates = exact
        # Written to the finest place of the rates: units of 10**-(places + 6) dollars (rates
        # with fewer than three decimals give whole nano-dollars, multiples of such a unit).
        finer = 3 - rates.places
        if finer > 0:
            units //= 10**finer
        return Decimal(f"{units}E-{rates.places + 6}"), self.version

    def _units(self, counts: Counts, parts: dict[str, int] | None) -> tuple[int, Rates] | None:
        """The exact cost of ``counts`` and ``parts`` as ``units`` × 10**-``places``
        nano-dollars by the rates in force now (None when unpriced), and those rates (the band
        of a tiered price)."""
        rates = self.rates if self.dated is None else self.dated.in_force()
        if rates is None:
            return None
        inp, out, cache_read, cache_write, reasoning, _ = counts
        if rates.bands is not None:
            rates = rates.band(inp)
        r_in, r_out, r_read, r_write, r_reasoning, fee = rates.scaled
        units = (
            (inp - cache_read - cache_write) * r_in
            + cache_read * r_read
            + cache_write * r_write
            + (out - reasoning) * r_out
            + reasoning * r_reasoning
            + fee
        )
        if parts and rates.scaled_parts is not None:
            units += part_units(parts, rates.scaled, rates.scaled_parts)
        return units, rates

    def _asked_price(self, counts: Counts, parts: dict[str, int] | None) -> tuple[int | None, str]:
        """The cost of ``counts`` (and billed ``parts``, given only when there are some) by
        another pricing in nano-dollars, rounded half to even but not bounded, and its pricing
        version."""
        assert self.asked is not None
        inp, out, cache_read, cache_write, reasoning, _ = counts
        result = self.asked.price(
            self.model,
            self.provider,
            input_tokens=inp,
            output_tokens=out,
            cached_tokens=cache_read,
            cache_write_tokens=cache_write,
            reasoning_tokens=reasoning,
            **({"parts": parts} if parts else {}),
        )
        cost = result.cost_usd
        if cost is None:
            return None, result.pricing_version
        nano = round(money.usd(cost, "price").scaleb(9))  # (a Decimal's round: half to even)
        return nano, result.pricing_version


def _note_input(model: str, tokens: int) -> None:
    """A request to ``model`` was billed ``tokens`` input tokens, more than any before it."""
    with _largest_lock:
        known = _largest.get(model)
        if known is None and len(_largest) >= MAX_MODELS:
            return
        if known is None or tokens > known:
            _largest[model] = tokens


def largest_input(model: str | None) -> int | None:
    """The most input tokens a request to ``model`` was billed in this process, or None."""
    return _largest.get(model or "")


def forget_inputs() -> None:
    """Forget the largest inputs (for tests)."""
    with _largest_lock:
        _largest.clear()


_NO_MODEL: Final = PricePlan(None, None)
_EMPTY_MODEL: Final = PricePlan("", None)
_PLANS_MAX: Final = 4096
# Each kept plan with what it was compiled from: a function telling what the table's answers
# come from now, what it told then, and the user's price changes then (see genai_table.watch).
_plans: dict[tuple[str, str | None], tuple[PricePlan, Callable[[], object], object, int]] = {}


def plan_for(pricing: Pricing, model: str | None, provider: str | None) -> PricePlan:
    """The price plan of ``model`` at ``provider`` under a context's ``pricing``: for
    :data:`TABLE` compiled once and kept while the table and the user's prices stay as they
    were (a compare of what it was compiled from); ``TypeError``/``ValueError`` for a model or
    provider that is not a name. A call without a model (None or ``""``) prices nothing."""
    if model is None or model == "":
        return _NO_MODEL if model is None else _EMPTY_MODEL
    if pricing is not TABLE:
        return PricePlan(model, provider, asked=pricing)
    try:
        kept = _plans.get((model, provider))
    except TypeError:  # not a name at all, which the compile reports
        kept = None
    if kept is not None:
        plan, told, source, changes = kept
        if told() is source and changes == user_prices.book.changes:
            return plan
    return _compile(model, provider)


def _compile(model: str, provider: str | None) -> PricePlan:
    """The table's (or the user's) plan of ``model`` at ``provider``, kept for later calls."""
    from ampmeter.pricing.genai_table import DatedRates, table_entry, watch

    model = user_prices.model_arg(model)
    provider = user_prices.provider_arg(provider)
    # Read before resolving: a change made meanwhile is seen, and compiled, on the next call.
    told, source = watch()
    changes = user_prices.book.changes
    entry: Rates | DatedRates | Unpriced | None = user_prices.user_rates(model, provider)
    if entry is None:
        entry = table_entry(model, provider)
    rates = entry if isinstance(entry, Rates) else None
    dated = entry if isinstance(entry, DatedRates) else None
    plan = PricePlan(model, provider, rates=rates, dated=dated, version=entry.version)
    if len(_plans) >= _PLANS_MAX:
        _plans.clear()
    _plans[model, provider] = (plan, told, source, changes)
    return plan
