"""Prices for calls recorded without a cost: the pricing layer a context uses, and the metadata
an LLM call's price leaves on its node."""

from __future__ import annotations

from typing import Any

from ampmeter import money
from ampmeter.node import (
    META_CACHE_WRITE_TOKENS,
    META_CACHED_TOKENS,
    META_COST_STATUS,
    META_PRICING_VERSION,
    META_REASONING_TOKENS,
    META_TOOL_CALLS_MADE,
)

__all__ = ["DEFAULT_PRICING", "Priced", "layer", "price_call", "use_pricing"]


class _DefaultPricing:
    """``ampmeter.pricing``, imported when the first call needs a price (it loads the table)."""

    def price(self, *args: Any, **kwargs: Any) -> Any:
        from ampmeter import pricing

        return pricing.price(*args, **kwargs)

    def estimate(self, *args: Any, **kwargs: Any) -> Any:
        from ampmeter import pricing

        return pricing.estimate(*args, **kwargs)

    def load(self) -> None:
        from ampmeter import pricing

        pricing.load()


DEFAULT_PRICING: Any = _DefaultPricing()
"""The pricing layer contexts use unless told otherwise."""

_layer: list[Any] = [DEFAULT_PRICING]


def layer() -> Any:
    """The pricing layer in force (None: nothing is priced)."""
    return _layer[0]


def use_pricing(pricing: Any) -> None:
    """Price calls recorded without a cost with ``pricing`` (``ampmeter.pricing`` by default;
    None prices nothing: such calls are ``unpriced``). Wiring for tests and embedders."""
    _layer[0] = pricing


class Priced:
    """What an ended LLM (or embedding) call cost, and the metadata its price leaves."""

    __slots__ = ("cost", "metadata", "unpriced")

    def __init__(self, cost: int, metadata: dict[str, Any], unpriced: int) -> None:
        self.cost = cost
        self.metadata = metadata
        self.unpriced = unpriced


def price_call(
    pricing: Any,
    model: str | None,
    provider: str | None,
    cost: int | None,
    recorded: bool,
    tokens_in: int,
    tokens_out: int,
    cached: int,
    cache_writes: int,
    reasoning: int,
    tools: int,
) -> Priced:
    """The price of an ended call in nano-dollars: ``cost`` as given, else the pricing layer's
    (unpriced when the model is unknown, the call recorded nothing, or there is no pricing
    layer). The layer's price may be a Decimal or a float of dollars."""
    version: str | None = None
    if cost is not None:
        status = "given"
    elif not model or not recorded or pricing is None:
        cost, status = 0, "unpriced"
    else:
        result = pricing.price(
            model,
            provider,
            input_tokens=tokens_in,
            output_tokens=tokens_out,
            cached_tokens=cached,
            cache_write_tokens=cache_writes,
            reasoning_tokens=reasoning,
        )
        version = result.pricing_version
        if result.cost_usd is None:
            cost, status = 0, "unpriced"
        else:
            cost, status = money.to_nano(result.cost_usd, "price"), "priced"
    meta: dict[str, Any] = {META_COST_STATUS: status}
    if version:
        meta[META_PRICING_VERSION] = version
    if cached:
        meta[META_CACHED_TOKENS] = cached
    if cache_writes:
        meta[META_CACHE_WRITE_TOKENS] = cache_writes
    if reasoning:
        meta[META_REASONING_TOKENS] = reasoning
    meta[META_TOOL_CALLS_MADE] = tools
    return Priced(cost, meta, int(status == "unpriced"))
