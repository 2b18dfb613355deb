"""How many input tokens a request will be billed for, before it is sent.

A request is *measured* once (:class:`RequestSize`) by the estimator of its wire format (the
``wire_*`` modules), from everything its provider bills as input, which each estimator adds up
part by part in a :class:`Tally`; the measure does not depend on the estimate mode.
:func:`input_tokens` turns a measure into tokens for a model, in the two modes
docs/containment.md explains ("What a request is estimated at"): ``"bound"``, a ceiling no
tokenizer can exceed (no token is shorter than one UTF-8 byte; with the ``ampmeter[tokenizer]``
extra, an OpenAI model's own encoding, each piece of text on its own as the provider renders
it), and ``"learned"`` (the default), the text times a ratio learned per model, never more
than the bound.

What is learned (:func:`learn`): the input tokens the provider billed, less framing and media,
over the characters (or tokenizer tokens) of the *same whole request*, is one observation of
the model's ratio. The ratio starts at :data:`PRIOR_RATIO`, a token a character, so that the
first calls, reserved before any has settled, cannot overshoot a cap. An observation above the
request's bytes per character (something was billed that the body did not show) is cut to it;
one below :data:`MIN_RATIO` (the fixed parts were over-counted) teaches nothing. The ratio moves
by at most :data:`MAX_STEP_UP` up and :data:`MAX_STEP_DOWN` down per call, so one odd call
cannot distort later estimates. Requests under :data:`MIN_LEARN_CHARS` characters (framing
dominates them) teach nothing. Each process learns its own ratios.
"""

from __future__ import annotations

import importlib
import json
import math
import threading
from collections.abc import Callable, Mapping
from typing import Any, Final, Literal, NamedTuple

from ampmeter.pricing import stored_state, tokenizer

__all__ = [
    "CHARS_PER_TOKEN",
    "MAX_STEP_DOWN",
    "MAX_STEP_UP",
    "MEASURES",
    "MIN_LEARN_CHARS",
    "MIN_RATIO",
    "PRIOR_RATIO",
    "EstimateMode",
    "RequestSize",
    "Tally",
    "Wire",
    "forget",
    "input_tokens",
    "json_text",
    "learn",
    "learned_ratio",
    "measure",
    "measure_text",
]

EstimateMode = Literal["learned", "bound"]
Wire = Literal["chat", "completions", "responses", "anthropic", "gemini"]


class RequestSize(NamedTuple):
    """What one request sends that its provider bills as input, measured before it is sent.

    ``chars`` and ``utf8_bytes`` count all billed text (messages in every role, system and
    instructions, tool definitions, calls and results, response schemas); ``framing`` is the
    tokens known without reading the text: the per-message and per-request tokens the provider
    documents, and prompts sent as token ids; ``media`` the tokens of images, audio and files
    by the provider's rules (a stated bound where they are unknown). ``text_tokens`` is the
    text's count by an offline tokenizer of the model's family when one is switched on
    (``ampmeter[tokenizer]``), each piece of text counted on its own, else None. ``stored`` is
    the tokens of state the provider keeps that the request continues (a stored response or
    conversation: billed as input, not in the body; see :mod:`~ampmeter.pricing.stored_state`),
    0 for none, None when its size is unknown. ``parts``: billed parts it may use
    (:mod:`~ampmeter.pricing.parts`): its audio input tokens (a part of ``media``) and the uses
    of billed server tools it allows, reserved at their own rates; None for none. A plain
    immutable value: one is made per request.
    """

    chars: int
    utf8_bytes: int
    framing: int = 0
    media: int = 0
    text_tokens: int | None = None
    stored: int | None = 0
    parts: dict[str, int] | None = None


def json_text(value: object) -> str:
    """``value`` as the compact JSON an SDK sends (non-ASCII kept as UTF-8, as httpx does)."""
    # Imported here, not at the top: the context imports this module, and ``import ampmeter``
    # must load only the accounting core (a request is measured only once an SDK call is made).
    import orjson

    try:
        return orjson.dumps(value).decode()
    except TypeError:  # a key or value orjson does not take, or nesting deeper than it goes
        pass
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    except (RecursionError, ValueError):  # deeper than Python recurses, or circular
        return "".join(_strings(value, scalars=True))


def _strings(value: object, *, scalars: bool) -> list[str]:
    """Every string inside ``value`` (keys too, and other scalars as text when ``scalars``),
    walked without recursion so that no nesting depth can stop a measure."""
    found: list[str] = []
    stack = [value]
    seen: set[int] = set()
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            found.append(item)
        elif isinstance(item, (dict, list, tuple)):
            if id(item) in seen:
                continue
            seen.add(id(item))
            if isinstance(item, dict):
                if scalars:
                    stack.extend(str(key) for key in item)
                stack.extend(item.values())
            else:
                stack.extend(item)
        elif scalars and item is not None:
            found.append(str(item))
    return found


class Tally(list[str]):
    """The billed text, framing and media tokens of one request, added up part by part.

    The tally is the list of the strings sent (an estimator that has a string in hand appends
    it; :meth:`text` takes a value that may not be one); ``framing`` and ``media`` are their
    tokens, 0 (the class's value) until a part adds some. A tally is made per request measured.
    """

    framing: int = 0
    media: int = 0
    parts: dict[str, int] | None = None  # billed parts the request may use (see RequestSize)

    def add_part(self, name: str, count: int) -> None:
        """Count ``count`` more of the billed part ``name`` the request may use."""
        if self.parts is None:
            self.parts = {}
        self.parts[name] = self.parts.get(name, 0) + count

    def text(self, value: object) -> None:
        """Add ``value`` if it is text (anything else sends no text here)."""
        if isinstance(value, str) and value:
            self.append(value)

    def json(self, value: object) -> None:
        """Add ``value`` as the JSON text it is sent as (a string is sent as it is)."""
        if isinstance(value, str):
            self.text(value)
        elif value is not None:
            self.append(json_text(value))

    def any_text(self, value: object) -> None:
        """Add every string inside ``value`` (a content structure whose keys are not billed)."""
        self.extend(text for text in _strings(value, scalars=False) if text)

    def size(self, counter: Callable[[str], int] | None = None) -> RequestSize:
        """The measure of what was added; ``counter`` (text -> tokens) counts the text exactly,
        each piece on its own: a provider renders each message's content on its own, and two
        pieces counted together may share a token that the rendering does not."""
        text = "".join(self)
        tokens = None if counter is None else sum(map(counter, self))
        chars = len(text)
        # (ASCII text, the usual, is known to be so without reading it: a byte a character.)
        utf8_bytes = chars if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
        return RequestSize(chars, utf8_bytes, self.framing, self.media, tokens, 0, self.parts)


CHARS_PER_TOKEN: Final = 4
"""Four characters per token: English prose on current tokenizers (where a learned ratio
usually comes down to)."""
PRIOR_RATIO: Final = 1.0
"""The tokens per character a model's ``"learned"`` estimate starts at, until a call teaches it:
one a character, above what any but the densest text is billed (the bound still caps it)."""
MIN_RATIO: Final = 0.1
"""The fewest tokens per character an observation may show (ten characters a token)."""
MAX_STEP_UP: Final = 1.4
"""The most one call can multiply a model's learned ratio by."""
MAX_STEP_DOWN: Final = 1.25
"""The most one call can divide a model's learned ratio by."""
MIN_LEARN_CHARS: Final = 32

_MAX_MODELS: Final = 4_096
# wire -> (module, function); each estimator is imported when its wire is first measured, so
# importing ampmeter does not pay for the formats a program never sends.
_ESTIMATORS: Final = {
    "chat": ("ampmeter.pricing.wire_chat", "measure_chat"),
    "completions": ("ampmeter.pricing.wire_chat", "measure_completions"),
    "responses": ("ampmeter.pricing.wire_responses", "measure_responses"),
    "anthropic": ("ampmeter.pricing.wire_anthropic", "measure_anthropic"),
    "gemini": ("ampmeter.pricing.wire_gemini", "measure_gemini"),
}
_Measure = Callable[[Mapping[str, Any], Callable[[str], int] | None], RequestSize]


class _Measures(dict[str, _Measure]):
    """:data:`MEASURES`: each wire format's estimator, imported when first asked for."""

    def __missing__(self, wire: str) -> _Measure:
        where = _ESTIMATORS.get(wire)
        if where is None:
            known = ", ".join(sorted(_ESTIMATORS))
            raise ValueError(f"unknown wire format {wire!r}; known: {known}")
        module, name = where
        estimator: _Measure = getattr(importlib.import_module(module), name)
        self[wire] = estimator
        return estimator


MEASURES: Final[Mapping[str, _Measure]] = _Measures()
"""``MEASURES[wire](body, counter)`` is :func:`measure` in one lookup, for a caller that holds
a JSON body and its model's counter (:data:`~ampmeter.pricing.tokenizer.COUNTERS`)."""

# (model, basis) -> learned ratio; basis "chars" (tokens per character) or "tokens" (billed
# tokens per tokenizer token).
_ratios: dict[tuple[str, str], float] = {}
_lock = threading.Lock()


def measure_text(text: str) -> RequestSize:
    """The measure of plain text sent as it is (no framing)."""
    return RequestSize(len(text), len(text.encode("utf-8", "surrogatepass")))


def measure(wire: Wire, body: Mapping[str, Any]) -> RequestSize:
    """The measure of a request ``body`` (the JSON object sent) in the wire format ``wire``.

    ``body["model"]`` selects model-specific rules (image tokens, tool prompts) and the
    tokenizer where one is installed. Its parts are read as SDK arguments and JSON give them
    (dicts, lists, strings). ``ValueError`` for an unknown wire format, ``TypeError`` for a
    body that is not a mapping.
    """
    estimator = MEASURES[wire]
    if not isinstance(body, dict):  # SDK keyword arguments and JSON bodies are dicts
        if not isinstance(body, Mapping):
            raise TypeError(f"a request body must be a mapping, got {type(body).__name__}")
        body = dict(body)
    model = body.get("model")
    return estimator(body, tokenizer.COUNTERS[model] if isinstance(model, str) else None)


def input_tokens(size: RequestSize, model: str | None, mode: EstimateMode = "learned") -> int:
    """The input tokens to reserve for a request of ``size`` sent to ``model`` (stored state
    of unknown size: :func:`~ampmeter.pricing.stored_state.unknown_state_tokens`)."""
    chars, utf8_bytes, framing, media, text_tokens, stored, _ = size
    if stored is None:
        stored = stored_state.unknown_state_tokens(model, mode)
    fixed = framing + media + stored
    if mode == "bound":
        # A token of the model's own encoding, counted piece by piece, is its ceiling.
        return (utf8_bytes if text_tokens is None else min(text_tokens, utf8_bytes)) + fixed
    if mode != "learned":
        raise ValueError(f"estimate mode must be 'learned' or 'bound', got {mode!r}")
    if text_tokens is not None:
        text = text_tokens * _ratios.get((model or "", "tokens"), 1.0)
    else:
        text = chars * _ratios.get((model or "", "chars"), PRIOR_RATIO)
    return min(math.ceil(text), utf8_bytes) + fixed


def learned_ratio(model: str) -> float:
    """The tokens-per-character ratio used for ``model`` now (:data:`PRIOR_RATIO` until a
    call taught it)."""
    return _ratios.get((model, "chars"), PRIOR_RATIO)


def learn(model: str, size: RequestSize, prompt_tokens: int) -> None:
    """Learn from a finished call: a request of ``size`` was billed ``prompt_tokens`` input
    tokens (cached ones included). See the module docs for the rule."""
    if not model or size.chars < MIN_LEARN_CHARS or prompt_tokens <= 0 or size.stored is None:
        return  # (billed for state of unknown size: the text's share of the bill is unknown)
    billed_text = prompt_tokens - size.framing - size.media - size.stored
    if size.text_tokens is not None and size.text_tokens > 0:
        key, per_unit, start = (model, "tokens"), size.text_tokens, 1.0
        # A tokenizer token is at least one byte: no more billed tokens than bytes.
        ceiling = size.utf8_bytes / size.text_tokens
    else:
        key, per_unit, start = (model, "chars"), size.chars, PRIOR_RATIO
        ceiling = size.utf8_bytes / size.chars
    observed = billed_text / per_unit
    if observed < MIN_RATIO * (size.chars / per_unit):
        return
    observed = min(observed, ceiling)
    with _lock:
        current = _ratios.get(key, start)
        if key not in _ratios and len(_ratios) >= _MAX_MODELS:
            return
        step = min(max(observed / current, 1.0 / MAX_STEP_DOWN), MAX_STEP_UP)
        _ratios[key] = current * step


def forget() -> None:
    """Forget every learned ratio (for tests)."""
    with _lock:
        _ratios.clear()
