"""Prices, input estimates and output maxima: what a call costs and what it may cost.

- :mod:`ampmeter.pricing.table`: prices from genai-prices and the user's own prices.
- :mod:`ampmeter.pricing.request_size`: how many input tokens a request will be billed for, measured
  from everything it sends, in the ``"learned"`` or ``"bound"`` mode.
- :mod:`ampmeter.pricing.max_output`: the most output tokens a model can write in one call.
"""

from __future__ import annotations

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
