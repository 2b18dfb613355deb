"""What every wire format's estimator shares: the measure itself and the tally that builds it.

A :class:`Tally` collects the billed text of one request (as the strings sent: message text,
tool definitions and schemas as their JSON), the framing tokens the provider adds, and the
tokens of media; :meth:`Tally.size` turns it into a :class:`RequestSize`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import NamedTuple

__all__ = ["RequestSize", "Tally", "json_text"]


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
    0 for none, None when its size is unknown. A plain immutable value: one is made per request.
    """

    chars: int
    utf8_bytes: int
    framing: int = 0
    media: int = 0
    text_tokens: int | None = None
    stored: int | None = 0


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
        return RequestSize(chars, utf8_bytes, self.framing, self.media, tokens)
