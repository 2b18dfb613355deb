"""Prices, input estimates and output maxima: what a call costs and what it may cost.

- :mod:`ampmeter.pricing.table`: prices from genai-prices and the user's own prices.
- :mod:`ampmeter.pricing.request_size`: how many input tokens a request will be billed for, measured
  from everything it sends, in the ``"learned"`` or ``"bound"`` mode.
- :mod:`ampmeter.pricing.max_output`: the most output tokens a model can write in one call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ampmeter.pricing.table import (
        CHARS_PER_TOKEN,
        DEFAULT_ESTIMATE_OUTPUT_TOKENS,
        USER_PRICING_VERSION,
        PriceResult,
        PricingStatus,
        clear_prices,
        estimate,
        load,
        price,
        remove_price,
        set_price,
        table_version,
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
    "table_version",
]


def __getattr__(name: str) -> Any:
    # The price table pulls in genai-prices and the disk index: it loads on first use, so that
    # ``import ampmeter`` (which needs only request_size) stays the accounting core alone.
    if name in __all__:
        from ampmeter.pricing import table

        return getattr(table, name)
    raise AttributeError(f"module 'ampmeter.pricing' has no attribute {name!r}")
