"""Prices, input estimates and output maxima: what a call costs and what it may cost.

- :mod:`ampmeter.pricing.table`: the exact cost of a call, in Decimal dollars, from
  genai-prices (:mod:`~ampmeter.pricing.genai_table`) or the user's own prices
  (:mod:`~ampmeter.pricing.user_prices`).
- :mod:`ampmeter.pricing.tool_prices`: what a call of a priced tool costs.
- :mod:`ampmeter.pricing.request_size`: how many input tokens a request will be billed for,
  measured by one estimator per wire format from everything it sends, in the ``"learned"`` or
  ``"bound"`` mode.
- :mod:`ampmeter.pricing.max_output`: the most output tokens a model can write in one call.
- :mod:`ampmeter.pricing.source`: where a context's prices come from (``pricing=``):
  :data:`TABLE` (the default) or :data:`NO_PRICES` (nothing priced: calls are ``unpriced``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ampmeter._lazy import lazy_names
from ampmeter.pricing.source import NO_PRICES, TABLE, Pricing

if TYPE_CHECKING:
    from ampmeter.pricing.max_output import output_bound
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
    from ampmeter.pricing.tool_prices import (
        clear_tool_prices,
        remove_tool_price,
        set_tool_price,
        tool_price,
    )

__all__ = [
    "CHARS_PER_TOKEN",
    "DEFAULT_ESTIMATE_OUTPUT_TOKENS",
    "NO_PRICES",
    "TABLE",
    "USER_PRICING_VERSION",
    "PriceResult",
    "Pricing",
    "PricingStatus",
    "clear_prices",
    "clear_tool_prices",
    "estimate",
    "load",
    "output_bound",
    "price",
    "remove_price",
    "remove_tool_price",
    "set_price",
    "set_tool_price",
    "table_version",
    "tool_price",
]


# The price table pulls in genai-prices and the disk index: it loads on first use, so that
# ``import ampmeter`` (which needs only request_size) stays the accounting core alone.
__getattr__ = lazy_names(
    __name__,
    {
        **dict.fromkeys(__all__, "ampmeter.pricing.table"),  # those imported above never get here
        **dict.fromkeys(
            ("clear_tool_prices", "remove_tool_price", "set_tool_price", "tool_price"),
            "ampmeter.pricing.tool_prices",
        ),
        "output_bound": "ampmeter.pricing.max_output",
    },
)
