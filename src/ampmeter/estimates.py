"""How many prompt tokens a call may use before it is sent: the one estimate, learned per model.

A prompt of ``n`` characters is estimated at ``n / 4`` tokens until calls of its model have
finished; from then on at the *highest* tokens-per-character ratio seen for that model, so text
that tokenizes densely (code, CJK) stops being under-reserved after a few calls.
"""

from __future__ import annotations

import math
from typing import Final

__all__ = ["CHARS_PER_TOKEN", "learn", "learned_ratio", "prompt_tokens"]

CHARS_PER_TOKEN: Final = 4
"""The starting assumption: four characters per token (English prose on current tokenizers)."""

_DEFAULT_RATIO: Final = 1.0 / CHARS_PER_TOKEN
_MIN_CHARS: Final = 32  # shorter prompts are dominated by per-message overhead: not learned from
_MAX_MODELS: Final = 4_096
_ratios: dict[str, float] = {}  # model -> highest tokens per character seen


def prompt_tokens(text: str, model: str | None = None) -> int:
    """The estimated prompt tokens of ``text`` for ``model`` (rounded up)."""
    ratio = _ratios.get(model, _DEFAULT_RATIO) if model else _DEFAULT_RATIO
    return math.ceil(len(text) * ratio)


def learned_ratio(model: str) -> float:
    """The tokens-per-character ratio used for ``model`` now."""
    return _ratios.get(model, _DEFAULT_RATIO)


def learn(model: str, prompt_chars: int, tokens_in: int) -> None:
    """Learn from a finished call: ``prompt_chars`` characters took ``tokens_in`` tokens."""
    if not model or prompt_chars < _MIN_CHARS or tokens_in <= 0:
        return
    ratio = tokens_in / prompt_chars
    if ratio > _ratios.get(model, _DEFAULT_RATIO) and (
        model in _ratios or len(_ratios) < _MAX_MODELS
    ):
        _ratios[model] = ratio


def forget() -> None:
    """Forget every learned ratio (for tests)."""
    _ratios.clear()
