"""The most output tokens a model can write in one call, where its provider documents it.

genai-prices carries prices and context windows, not output limits, so ampmeter ships a small
table (``max_output_tokens.json``) of the documented limits of common models. A call that sets
no ``max_tokens`` reserves its model's limit: a budget must not assume a short answer from a
model that may write a long one. A model the table does not know gets ``None`` (the caller's
default applies). Each model name is resolved once and then answered from a cache.
"""

from __future__ import annotations

from functools import cache, lru_cache
from typing import Final

from ampmeter.pricing.names import longest_prefix

__all__ = ["DEFAULT_OUTPUT_BOUND", "max_output_tokens", "output_bound"]

DEFAULT_OUTPUT_BOUND: Final = 32_768
"""Output tokens :func:`output_bound` takes for a call without ``max_tokens`` to a model this
table does not know (a stated default: gpt-4.1's documented maximum, above what most chat
models allow; models that write more are in the table)."""

_TABLE_FILE: Final = "max_output_tokens.json"
_SEPARATORS: Final = "-@:_"


@lru_cache(maxsize=4_096)
def max_output_tokens(model: str) -> int | None:
    """``model``'s documented maximum output tokens per call, or None if the table lacks it.

    A provider prefix (``openai/gpt-4o``) is ignored; a dated or versioned name
    (``gpt-4o-2024-08-06``) matches its family's longest entry.
    """
    table = _load()
    found = longest_prefix(table, model, _SEPARATORS)
    return None if found is None else table[found]


def output_bound(model: str | None, max_tokens: int | None) -> int:
    """The most output tokens a call may be billed for: its ``max_tokens`` when given, else
    ``model``'s documented maximum output, else :data:`DEFAULT_OUTPUT_BOUND`."""
    if max_tokens is not None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
            raise ValueError(f"max_tokens must be an int >= 0 or None, got {max_tokens!r}")
        return max_tokens
    return (max_output_tokens(model) if model else None) or DEFAULT_OUTPUT_BOUND


@cache
def _load() -> dict[str, int]:
    from importlib import resources

    import orjson

    raw = orjson.loads(resources.files("ampmeter.pricing").joinpath(_TABLE_FILE).read_bytes())
    return {str(name): int(tokens) for name, tokens in raw["models"].items()}
