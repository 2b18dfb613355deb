"""The most input tokens a model takes in one request: its context window.

A request that continues state kept by the provider (a stored response, a conversation) is
billed for that state, which its body does not show. When ampmeter did not see the state
grow, its size is unknown, and the only ceiling on it is the model's context window. The
windows come from the same genai-prices table the prices do; a model the table does not know
gets :data:`DEFAULT_CONTEXT_WINDOW`.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Final

from ampmeter.pricing.genai_table import split_provider

__all__ = ["DEFAULT_CONTEXT_WINDOW", "context_window"]

DEFAULT_CONTEXT_WINDOW: Final = 2_097_152
"""The context window taken for a model the price table does not know: 2M tokens, the
largest window of the common hosted models (Gemini 1.5 Pro's)."""


@lru_cache(maxsize=1_024)
def context_window(model: str | None) -> int:
    """``model``'s context window in tokens (a provider prefix such as ``openai/`` is read as
    the price table reads it), else :data:`DEFAULT_CONTEXT_WINDOW`."""
    if not model:
        return DEFAULT_CONTEXT_WINDOW
    import genai_prices

    empty = genai_prices.Usage(input_tokens=0, output_tokens=0)
    names: list[tuple[str, str | None]] = [(model, None)]
    prefixed = split_provider(model)
    if prefixed is not None:
        names.append((prefixed[1], prefixed[0]))
    for name, provider in names:
        try:
            found = genai_prices.calc_price(empty, name, provider_id=provider)
        except LookupError:
            continue
        window = found.model.context_window
        if isinstance(window, int) and window > 0:
            return window
    return DEFAULT_CONTEXT_WINDOW
