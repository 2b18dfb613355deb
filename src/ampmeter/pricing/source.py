"""Where a context's prices come from, and what an ended call's price leaves on its node.

A context prices the calls recorded without a cost, and estimates what a call reserves, with
its ``pricing`` (``ExecutionContext(pricing=...)``; children inherit it). Anything with the
``price`` and ``estimate`` functions of :mod:`ampmeter.pricing` can serve:

* :data:`TABLE`, the default: the prices of :mod:`ampmeter.pricing` (genai-prices and the
  user's prices), imported when the first call needs a price, so that making a context does
  not load the table. A context checks a call's counts where they enter (``llm_call``,
  ``record``) and counts money in nano-dollars, so TABLE prices its calls without checking
  them again, in integers (:class:`~ampmeter.pricing.plan.TablePlan`);
* :data:`NO_PRICES`: prices nothing. Every call without a cost of its own is ``unpriced``
  (never $0), so under a cost limit it is refused unless it carries an ``estimate_usd``
  (``on_unpriced`` decides); for tests and embedders that bring their own costs;
* the module :mod:`ampmeter.pricing`, or an embedder's own object. Its dollars are read as
  every amount a user gives is (:func:`ampmeter.money.to_nano`: a float as written).

A call is estimated and priced through the plan of its model (:func:`plan_for`:
:mod:`ampmeter.pricing.plan`), found once per call.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Final, Protocol

from ampmeter import money
from ampmeter.node import (
    META_CACHE_WRITE_TOKENS,
    META_CACHED_TOKENS,
    META_COST_STATUS,
    META_PRICING_VERSION,
    META_REASONING_TOKENS,
    META_TOOL_CALLS_MADE,
)

if TYPE_CHECKING:
    from ampmeter.pricing.plan import PricePlan, TablePlan
    from ampmeter.pricing.table import PriceResult

__all__ = [
    "META_COST_CLAMPED",
    "NO_PRICES",
    "TABLE",
    "Pricing",
    "checked",
    "plan_for",
    "price_call",
    "table_plan",
]

META_COST_CLAMPED: Final = "cost_clamped"  # priced past what money counts: the most it counts


class Pricing(Protocol):
    """What a context needs of its prices: :func:`ampmeter.pricing.price` (the cost of an ended
    call; ``cost_usd`` None when unpriced) and :func:`ampmeter.pricing.estimate` (the most a
    call may cost before it is made, in dollars; None when unpriced), with their signatures."""

    def price(self, *args: Any, **kwargs: Any) -> PriceResult: ...

    def estimate(self, *args: Any, **kwargs: Any) -> Decimal | None: ...


class _Table:
    """:mod:`ampmeter.pricing`'s ``price`` and ``estimate``, imported when first called and
    kept on this object from then on (a context prices its calls through :func:`plan_for`)."""

    # Declared for the type checker; each is set on first use by __getattr__.
    price: Callable[..., PriceResult]
    estimate: Callable[..., Decimal | None]

    def __getattr__(self, name: str) -> Any:
        if name not in ("price", "estimate"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        from ampmeter.pricing import table

        function = getattr(table, name)
        setattr(self, name, function)  # later calls find it here, as a plain attribute
        return function

    def load(self) -> None:
        """Load the price table now (a context with a timeout does, so that the first call's
        load never counts against it)."""
        from ampmeter.pricing import table

        table.load()

    def __repr__(self) -> str:
        return "ampmeter.pricing.TABLE"


class _NoPrices:
    """Prices nothing (see the module docstring)."""

    def price(self, model: str, provider: str | None = None, **tokens: int) -> PriceResult:
        from ampmeter.pricing.table import PriceResult

        return PriceResult(None, "", "unpriced")

    def estimate(self, model: str, provider: str | None = None, **sizes: Any) -> Decimal | None:
        return None

    def __repr__(self) -> str:
        return "ampmeter.pricing.NO_PRICES"


TABLE: Pricing = _Table()
"""The price table (:mod:`ampmeter.pricing`), loaded on first need: every context's default."""

NO_PRICES: Pricing = _NoPrices()
"""Prices nothing: calls without a cost of their own are ``unpriced``, never $0."""


def checked(pricing: object) -> Pricing | None:
    """``pricing`` as a context's keyword (None: as the enclosing context)."""
    if pricing is None:
        return None
    for name in ("price", "estimate"):
        if not callable(getattr(pricing, name, None)):
            raise TypeError(
                f"pricing must have price() and estimate() like ampmeter.pricing (or be "
                f"ampmeter.pricing.NO_PRICES), got {type(pricing).__name__} without {name}()"
            )
    return pricing  # type: ignore[return-value]


_PLANS_MAX: Final = 4096
_plans: dict[tuple[str, str | None], TablePlan] = {}


def plan_for(pricing: Pricing, model: str, provider: str | None) -> PricePlan:
    """The price plan of ``model`` at ``provider`` under a context's ``pricing``: for
    :data:`TABLE` compiled once per name and kept (it follows later changes of the table and
    the user's prices itself); ``TypeError``/``ValueError`` for a model or provider that is not
    a name."""
    if pricing is not TABLE:
        from ampmeter.pricing.plan import AskedPlan

        return AskedPlan(pricing, model, provider)
    try:
        plan = _plans.get((model, provider))
    except TypeError:  # not a name at all, which table_plan reports
        plan = None
    return table_plan(model, provider) if plan is None else plan


def table_plan(model: str, provider: str | None) -> TablePlan:
    """:func:`plan_for` of :data:`TABLE`."""
    try:
        plan = _plans.get((model, provider))
    except TypeError:  # not a name at all, which model_arg reports
        plan = None
    if plan is not None:
        return plan
    from ampmeter.pricing.plan import TablePlan
    from ampmeter.pricing.user_prices import model_arg, provider_arg

    plan = TablePlan(model_arg(model), provider_arg(provider))
    if len(_plans) >= _PLANS_MAX:
        _plans.clear()
    _plans[model, provider] = plan
    return plan


def price_call(
    plan: PricePlan | None,
    cost: int | None,
    recorded: bool,
    tokens_in: int,
    tokens_out: int,
    cached: int,
    cache_writes: int,
    reasoning: int,
    tools: int,
    estimated: bool = False,
) -> tuple[int, dict[str, Any], int]:
    """What an ended LLM (or embedding) call cost in nano-dollars, the metadata its price
    leaves, and 1 when it is unpriced (else 0). The cost is ``cost`` as given, else its model's
    ``plan``'s (unpriced without a model, when the model is unknown or when the call recorded
    nothing), with
    ``cost_status`` ``"estimated"`` when the counts were ``estimated`` (the provider reported
    none, so they are ampmeter's). A price beyond what money counts (a provider reporting
    absurd usage: 2**53 tokens of a $10 per million model) is charged as the most it counts,
    :data:`~ampmeter.money.MAX_NANO`, and the node says ``cost_clamped``: the caller still gets
    the response it paid for, and no budget lets another call through."""
    version: str | None = None
    clamped = False
    if cost is not None:
        status = "given"
    elif plan is None or not recorded:
        cost, status = 0, "unpriced"
    else:
        try:
            found, version = plan.price_nano(tokens_in, tokens_out, cached, cache_writes, reasoning)
        except money.TooLargeToCount:
            found, clamped = money.MAX_NANO, True
        if found is None:
            cost, status = 0, "unpriced"
        else:
            cost, status = found, "estimated" if estimated else "priced"
    meta: dict[str, Any] = {META_COST_STATUS: status}
    if clamped:
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
    return cost, meta, int(status == "unpriced")
