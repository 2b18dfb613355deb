"""Wire utilities: reading fields of SDK objects and JSON bodies alike, and reading a provider's
response body as it passes (server-sent events or one JSON document).

:class:`BodyReader` is fed the body's bytes piece by piece, hands each decoded event (or, at the
end, the JSON document) to an :class:`~ampmeter.integrations.adapter.Adapter`, and gives back
the bytes the caller may see: all of them, or, when ampmeter asked the provider for a usage
event the caller did not ask for, every event but that one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

import orjson

if TYPE_CHECKING:
    from ampmeter.integrations.adapter import Adapter, Tally

__all__ = [
    "READERS",
    "BodyReader",
    "FieldReader",
    "counts",
    "first_int",
    "get",
    "ints",
    "text_of",
]


class BodyReader:
    """One response body read into ``tally`` through ``adapter``.

    ``sse``: the body is a ``text/event-stream``; ``frames``: a binary stream of events, whose
    ``feed(piece)`` yields the events a piece completes (Bedrock's); otherwise a JSON document
    (an array of chunks for Gemini's non-SSE stream). ``hide``: drop the events the adapter says
    to hide (then the bytes are passed on whole events at a time).

    An event or document the adapter cannot take (a provider's ``"choices": 5``) is passed on
    unread and the reading goes on; the first such error is kept in ``unread``, for the call to
    end failed with it (charged what was read) while the caller still gets the bytes it paid for.
    """

    __slots__ = (
        "_data",
        "_event",
        "_parts",
        "_pending",
        "adapter",
        "complete",
        "frames",
        "hide",
        "sse",
        "tally",
        "unread",
    )

    def __init__(
        self, adapter: Adapter, tally: Tally, *, sse: bool, hide: bool = False, frames: Any = None
    ) -> None:
        self.adapter = adapter
        self.frames = frames
        self.tally = tally
        self.sse = sse
        self.hide = hide
        self._pending = b""  # an incomplete line (SSE) carried to the next piece
        self._data: list[bytes] = []  # the data lines of the event being read
        self._event: list[bytes] = []  # the raw lines of that event (only when hiding)
        self._parts: list[bytes] = []  # a JSON body's pieces
        self.complete = False  # the stream's last event was read (more bytes may follow)
        self.unread: Exception | None = None

    def feed(self, piece: bytes) -> bytes:
        """Read ``piece``; return what the caller gets of it."""
        if self.frames is not None:
            for event in self.frames.feed(piece):
                self._read_event(event, False)
            self.complete = self.tally.complete
            return piece
        if not self.sse:
            self._parts.append(piece)
            return piece
        *lines, self._pending = (self._pending + piece).split(b"\n")
        if not self.hide:
            for line in lines:
                self._line(line)
            return piece
        out: list[bytes] = []
        for line in lines:
            self._event.append(line + b"\n")
            hidden = self._line(line)
            if hidden is not None:
                if not hidden:
                    out.extend(self._event)
                self._event.clear()
        return b"".join(out)

    def _line(self, line: bytes) -> bool | None:
        """Read one line; at an event's end return whether it was hidden (else None)."""
        if line.endswith(b"\r"):
            line = line[:-1]
        if line:
            if line.startswith(b"data:"):
                data = line[5:]
                self._data.append(data[1:] if data.startswith(b" ") else data)
            return None
        data = b"\n".join(self._data)
        self._data.clear()
        if not data:
            return False
        if data == b"[DONE]":
            self.complete = True
            return False
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError:
            return False
        hidden = self._read_event(event, self.hide)
        if self.tally.complete:
            self.complete = True
        return hidden

    def _read_event(self, event: Any, hide: bool) -> bool:
        try:
            return self.adapter.read_event(event, self.tally, hide)
        except Exception as exc:
            self.unread = self.unread or exc
            return False

    def end(self) -> bytes:
        """The body is complete: read what is left; return the bytes still owed to the caller."""
        if self.frames is not None:
            return b""
        if not self.sse:
            self._read_json(b"".join(self._parts))
            self._parts.clear()
            return b""
        tail = self._pending
        self._pending = b""
        if tail:
            self._event.append(tail)
            self._line(tail)
        hidden = self._line(b"") if self._data else False  # an event the body did not close
        out = b"".join(self._event) if self.hide and not hidden else b""
        self._event.clear()
        return out

    def _read_json(self, body: bytes) -> None:
        if not body.strip():
            return
        try:
            document: Any = orjson.loads(body)
        except orjson.JSONDecodeError:
            return
        if isinstance(document, list):  # a stream sent as one JSON array of chunks
            for chunk in document:
                self._read_event(chunk, False)
            return
        try:
            self.adapter.read_response(document, self.tally)
        except Exception as exc:
            self.unread = self.unread or exc


def text_of(content: Any) -> str:
    """The text of a message's content: a string or a list of text parts (others skipped)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    if isinstance(content, (list, tuple)):
        for part in content:
            if isinstance(part, str):
                parts.append(part)
                continue
            text = part.get("text") if isinstance(part, Mapping) else getattr(part, "text", None)
            if isinstance(text, str):
                parts.append(text)
            elif isinstance(part, Mapping) and "content" in part:
                parts.append(text_of(part["content"]))
    return "\n".join(p for p in parts if p)


def first_int(*values: object) -> int | None:
    """The first of ``values`` that is a real int, or None (bools and SDK ``omit``/``NOT_GIVEN``
    sentinels are not): a request's output cap, under whichever of its names it was given."""
    for value in values:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


_COUNT_TYPES: Final = frozenset({int, type(None)})


def ints(*values: Any) -> tuple[int | None, ...]:
    """Each of ``values`` (counts read from a response) if it is a real int, else None (as
    :func:`first_int` tells them). The usual report (plain ints and None) is checked in C."""
    if _COUNT_TYPES.issuperset(map(type, values)):
        return values
    return tuple(map(first_int, values))  # each value on its own


FieldReader = Callable[[Any, str, None], Any]
"""Reads one field of a response object, called as ``read(obj, name, None)`` (None if absent)."""

_READERS_MAX: Final = 1_024


def _mapping_get(obj: Mapping[str, Any], name: str, default: None) -> Any:
    return obj.get(name, default)


class _Readers(dict[type, FieldReader]):
    """:data:`READERS`: the reader of each type met, chosen the first time it is met."""

    def __missing__(self, kind: type) -> FieldReader:
        found: FieldReader = getattr
        if issubclass(kind, dict):
            found = dict.get
        elif issubclass(kind, Mapping):  # a request's messages may be any mapping
            found = _mapping_get
        if len(self) < _READERS_MAX:
            self[kind] = found
        return found


READERS: Final[dict[type, FieldReader]] = _Readers()
"""How to read several fields of ``obj``, one object of a provider's response or a request:
``READERS[type(obj)]`` is ``dict.get`` for a JSON object, ``getattr`` for an SDK's model (None
and other values read as absent).

Chosen once per object, not once per field as :func:`get` does. Not once per response:
pydantic keeps a field that an older SDK does not declare (newer usage details) as a plain
dict inside the model, and a JSON body may hold anything where an object is expected. The
answer depends only on the object's type, so it is looked up in a table filled once per type
(a lookup in C, where choosing it in a function cost a Python call per object read).
"""


def counts(obj: object, names: tuple[str, ...]) -> tuple[int | None, ...]:
    """The token counts ``names`` of ``obj`` (a usage object, its details, or None), read with
    the reader of ``obj``: each a real int, or None where it is absent or anything else (a
    bool, an SDK's ``omit`` sentinel, a hostile body's string), as :func:`ints` tells them."""
    read = READERS[type(obj)]
    return ints(*[read(obj, name, None) for name in names])


def get(obj: Any, name: str) -> Any:
    """Attribute or mapping key ``name`` of ``obj`` (None when absent): one field of anything,
    a request's messages (any mapping) included."""
    return READERS[type(obj)](obj, name, None)
