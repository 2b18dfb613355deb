"""How many input tokens a request will be billed for, before it is sent.

A request is *measured* once (:class:`RequestSize`), from everything its provider bills as
input; the measure does not depend on the estimate mode. :func:`input_tokens` then turns a
measure into tokens for a model:

- ``"learned"`` (the default): characters over a ratio learned per model from finished calls,
  on the same whole-request basis (:func:`learn`), plus framing and media tokens.
- ``"bound"``: a ceiling no tokenizer can exceed: the UTF-8 bytes of all text (no token is
  shorter than one byte), plus framing and the media bound.

``measure(wire, body)`` knows the wire formats ampmeter meters; :func:`measure_text` measures
plain text (a caller's ``prompt_text``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

__all__ = [
    "CHARS_PER_TOKEN",
    "EstimateMode",
    "RequestSize",
    "Wire",
    "forget",
    "input_tokens",
    "learn",
    "learned_ratio",
    "measure",
    "measure_text",
    "prompt_tokens",
]

EstimateMode = Literal["learned", "bound"]
Wire = Literal["chat", "completions", "responses", "anthropic", "gemini"]

CHARS_PER_TOKEN: Final = 4
"""The starting assumption: four characters per token (English prose on current tokenizers)."""

_DEFAULT_RATIO: Final = 1.0 / CHARS_PER_TOKEN
_MIN_CHARS: Final = 32  # shorter requests are dominated by framing: not learned from
_MAX_MODELS: Final = 4_096
_ratios: dict[str, float] = {}  # model -> tokens per character learned


@dataclass(frozen=True, slots=True)
class RequestSize:
    """What one request sends that its provider bills as input, measured before it is sent.

    ``chars`` and ``utf8_bytes`` count all billed text (messages in every role, system and
    instructions, tool definitions and results, response schemas); ``framing`` is the
    per-message and per-request tokens the provider documents; ``media`` the tokens of
    images, audio and files by the provider's rules (a stated bound where they are unknown).
    """

    chars: int
    utf8_bytes: int
    framing: int = 0
    media: int = 0


def measure_text(text: str) -> RequestSize:
    """The measure of plain text sent as it is (no framing)."""
    return RequestSize(len(text), len(text.encode("utf-8", "surrogatepass")))


def measure(wire: Wire, body: Mapping[str, Any]) -> RequestSize:
    """The measure of a request ``body`` in the wire format ``wire``."""
    parts: list[str] = []
    _collect_text(body.get("messages") or body.get("input") or body.get("prompt"), parts)
    text = "".join(parts)
    return measure_text(text)


def _collect_text(value: object, into: list[str]) -> None:
    if isinstance(value, str):
        into.append(value)
    elif isinstance(value, Mapping):
        for item in value.values():
            _collect_text(item, into)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _collect_text(item, into)


def input_tokens(size: RequestSize, model: str | None, mode: EstimateMode = "learned") -> int:
    """The input tokens to reserve for a request of ``size`` sent to ``model``."""
    if mode == "bound":
        return size.utf8_bytes + size.framing + size.media
    ratio = _ratios.get(model, _DEFAULT_RATIO) if model else _DEFAULT_RATIO
    return math.ceil(size.chars * ratio) + size.framing + size.media


def prompt_tokens(text: str, model: str | None = None) -> int:
    """The estimated input tokens of plain ``text`` for ``model`` (``"learned"`` mode)."""
    return input_tokens(measure_text(text), model)


def learned_ratio(model: str) -> float:
    """The tokens-per-character ratio used for ``model`` now."""
    return _ratios.get(model, _DEFAULT_RATIO)


def learn(model: str, size: RequestSize, prompt_tokens: int) -> None:
    """Learn from a finished call: a request of ``size`` was billed ``prompt_tokens``."""
    if not model or size.chars < _MIN_CHARS or prompt_tokens <= 0:
        return
    ratio = max(prompt_tokens - size.framing - size.media, 0) / size.chars
    if ratio > _ratios.get(model, _DEFAULT_RATIO) and (
        model in _ratios or len(_ratios) < _MAX_MODELS
    ):
        _ratios[model] = ratio


def forget() -> None:
    """Forget every learned ratio (for tests)."""
    _ratios.clear()
