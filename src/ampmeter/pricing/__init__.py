"""Prices, input estimates and output maxima: what a call costs and what it may cost.

- :mod:`ampmeter.pricing.table`: prices from genai-prices and the user's own prices.
- :mod:`ampmeter.pricing.request_size`: how many input tokens a request will be billed for, measured
  from everything it sends, in the ``"learned"`` or ``"bound"`` mode.
- :mod:`ampmeter.pricing.max_output`: the most output tokens a model can write in one call.
- :mod:`ampmeter.pricing.tools`: what a tool call costs.
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
from ampmeter.pricing.tools import clear_tool_prices, set_tool_price, tool_price

__all__ = [
    "CHARS_PER_TOKEN",
    "DEFAULT_ESTIMATE_OUTPUT_TOKENS",
    "USER_PRICING_VERSION",
    "PriceResult",
    "PricingStatus",
    "clear_prices",
    "clear_tool_prices",
    "estimate",
    "load",
    "price",
    "remove_price",
    "set_price",
    "set_tool_price",
    "table_version",
    "tool_price",
]
