"""Where a context's prices come from, and what an ended call's price leaves on its node.

A context prices the calls recorded without a cost, and estimates what a call reserves, with
its ``pricing`` (``ExecutionContext(pricing=...)``; children inherit it): :data:`TABLE` (the
default), :data:`NO_PRICES`, the module :mod:`ampmeter.pricing`, or an embedder's own object
with its ``price`` and ``estimate`` functions, whose dollars are read as every amount a user
gives is (:func:`ampmeter.money.to_nano`: a float as written). A context checks a call's counts
where they enter (``llm_call``, ``record``) and counts money in nano-dollars, so TABLE prices its
calls without checking them again, in integers, through the plan of the call's model
(:func:`~ampmeter.pricing.plan.plan_for`), found once per call.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ampmeter.pricing.table import PriceResult

__all__ = ["NO_PRICES", "TABLE", "Pricing", "checked"]


class Pricing(Protocol):
    """What a context needs of its prices: :func:`ampmeter.pricing.price` (the cost of an ended
    call; ``cost_usd`` None when unpriced) and :func:`ampmeter.pricing.estimate` (the most a
    call may cost before it is made, in dollars; None when unpriced), with their signatures:
    ``price`` is given ``parts=`` when a call reports billed parts
    (:mod:`ampmeter.pricing.parts`), and must charge them."""

    def price(self, *args: Any, **kwargs: Any) -> PriceResult: ...

    def estimate(self, *args: Any, **kwargs: Any) -> Decimal | None: ...


class _Table:
    """:mod:`ampmeter.pricing`'s ``price`` and ``estimate``, imported when first called and
    kept on this object from then on (a context prices its calls through its price plans)."""

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
"""The price table (:mod:`ampmeter.pricing`), every context's default: loaded when the first
call needs a price, so that making a context does not load it."""

NO_PRICES: Pricing = _NoPrices()
"""Prices nothing, for tests and embedders that bring their own costs: calls without a cost of
their own are ``unpriced`` (never $0), so under a cost limit one is refused unless it carries an
``estimate_usd`` (``on_unpriced`` decides)."""


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
