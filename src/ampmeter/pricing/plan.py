"""A context's prices compiled for one model: what a call of it reserves, and what it costs.

:func:`~ampmeter.pricing.source.plan_for` gives the price plan of a ``(model, provider)``
under a context's pricing; a call finds it once, and both its reservation
(:meth:`TablePlan.estimate_nano`) and its price when it ends (:meth:`TablePlan.price_nano`) use
it. For the table (:data:`~ampmeter.pricing.TABLE`) the plan is compiled once per
``(model, provider)``: the model's rates (integers: :class:`~ampmeter.pricing.rates.Rates`),
its default output and its output bound. On every use it checks that neither the table (a live
update, a table loaded since the disk index answered) nor the user's prices
(:func:`~ampmeter.pricing.set_price`) changed since it was compiled, and compiles again when
they did: a stale price would undercount. Rates that depend on the time of the request are
read on every use.

Any other pricing (:data:`~ampmeter.pricing.NO_PRICES`, an embedder's object) is asked on every
use (:class:`AskedPlan`), its dollars read as any amount a user gives (a float as written).
"""

from __future__ import annotations

from decimal import Decimal
from typing import TYPE_CHECKING, Final

from ampmeter import money
from ampmeter.pricing import genai_table, user_prices
from ampmeter.pricing.genai_table import DatedRates, Unpriced, table_entry
from ampmeter.pricing.max_output import DEFAULT_OUTPUT_BOUND, max_output_tokens
from ampmeter.pricing.rates import Rates
from ampmeter.pricing.user_prices import user_rates

if TYPE_CHECKING:
    from ampmeter.pricing.source import Pricing

__all__ = ["DEFAULT_ESTIMATE_OUTPUT_TOKENS", "AskedPlan", "PricePlan", "TablePlan"]

DEFAULT_ESTIMATE_OUTPUT_TOKENS: Final = 1024
"""Output tokens an estimate assumes when the call sets no ``max_tokens`` and the model's
maximum output is not in :mod:`ampmeter.pricing.max_output`'s table."""

# What a plan was compiled from and to: (the table's source, the user's price changes, rates
# that depend on the time of the request or None, the rates or None, the pricing version).
_State = tuple[object, int, DatedRates | None, Rates | None, str]


class TablePlan:
    """The table's (or the user's) prices of one model at one provider (see the module docs).
    Whether the model has a price is whether :meth:`estimate_nano` gives one (None: unpriced),
    as of that moment: a price set later prices it from then on."""

    __slots__ = ("_state", "model", "output_bound", "output_default", "provider")

    def __init__(self, model: str, provider: str | None) -> None:
        self.model = model
        self.provider = provider
        known = max_output_tokens(model)
        self.output_default: int = known or DEFAULT_ESTIMATE_OUTPUT_TOKENS
        """Output tokens an estimate takes for a call without ``max_tokens``."""
        self.output_bound: int = known or DEFAULT_OUTPUT_BOUND
        """Output tokens ``estimate="bound"`` reserves for a call without ``max_tokens``."""
        self._state = self._compile()

    def _compile(self) -> _State:
        # Read before resolving: a change made meanwhile is seen, and compiled, on the next use.
        source, changes = genai_table.source(), user_prices.book.changes
        entry: Rates | DatedRates | Unpriced | None = user_rates(self.model, self.provider)
        if entry is None:
            entry = table_entry(self.model, self.provider)
        if isinstance(entry, Unpriced):
            state: _State = (source, changes, None, None, entry.version)
        elif isinstance(entry, DatedRates):
            state = (source, changes, entry, None, entry.version)
        else:
            state = (source, changes, None, entry, entry.version)
        self._state = state  # one assignment: a thread pricing meanwhile reads a whole state
        return state

    def _units(
        self, inp: int, out: int, cache_read: int, cache_write: int, reasoning: int
    ) -> tuple[int | None, int, str]:
        """The exact cost as ``units`` × 10**-``places`` USD (``units`` None when unpriced) by
        the rates in force now, and their pricing version."""
        source, changes, dated, rates, version = self._state
        if source is not genai_table.source() or changes != user_prices.book.changes:
            source, changes, dated, rates, version = self._compile()
        if dated is not None:
            rates = dated.in_force()
        if rates is None:
            return None, 0, version
        units, places = rates.units(inp, out, cache_read, cache_write, reasoning)
        return units, places, version

    def estimate_nano(self, prompt_tokens: int, max_tokens: int | None) -> int | None:
        """The most a call of ``prompt_tokens`` writing up to ``max_tokens`` (None:
        :attr:`output_default`) may cost, in nano-dollars rounded up (None when unpriced),
        for counts already checked."""
        out = self.output_default if max_tokens is None else max_tokens
        units, places, _ = self._units(prompt_tokens, out, 0, 0, 0)
        if units is None:
            return None
        return money.scaled_nano(units, places, "the price estimate", round_up=True)

    def price_nano(
        self, inp: int, out: int, cache_read: int, cache_write: int, reasoning: int
    ) -> tuple[int | None, str]:
        """The cost of an ended call with these (checked) counts in nano-dollars, rounded half
        to even (None when unpriced), and the pricing version."""
        units, places, version = self._units(inp, out, cache_read, cache_write, reasoning)
        if units is None:
            return None, version
        return money.scaled_nano(units, places, "price"), version

    def price_usd(
        self, inp: int, out: int, cache_read: int, cache_write: int, reasoning: int
    ) -> tuple[Decimal | None, str]:
        """:meth:`price_nano` as exact Decimal dollars, not rounded."""
        units, places, version = self._units(inp, out, cache_read, cache_write, reasoning)
        return None if units is None else Decimal(f"{units}E-{places}"), version


class AskedPlan:
    """Another pricing (:data:`~ampmeter.pricing.NO_PRICES`, an embedder's), asked for each
    call in its dollars, read in nano-dollars."""

    __slots__ = ("model", "output_bound", "pricing", "provider")

    def __init__(self, pricing: Pricing, model: str, provider: str | None) -> None:
        self.pricing = pricing
        self.model = model
        self.provider = provider
        self.output_bound: int = max_output_tokens(model) or DEFAULT_OUTPUT_BOUND

    def estimate_nano(self, prompt_tokens: int, max_tokens: int | None) -> int | None:
        found = self.pricing.estimate(
            self.model, self.provider, prompt_tokens=prompt_tokens, max_tokens=max_tokens
        )
        return None if found is None else money.to_nano(found, "the price estimate", round_up=True)

    def price_nano(
        self, inp: int, out: int, cache_read: int, cache_write: int, reasoning: int
    ) -> tuple[int | None, str]:
        result = self.pricing.price(
            self.model,
            self.provider,
            input_tokens=inp,
            output_tokens=out,
            cached_tokens=cache_read,
            cache_write_tokens=cache_write,
            reasoning_tokens=reasoning,
        )
        cost = result.cost_usd
        return None if cost is None else money.to_nano(cost, "price"), result.pricing_version


PricePlan = TablePlan | AskedPlan
"""What a context prices one model with (:func:`ampmeter.pricing.source.plan_for`)."""
