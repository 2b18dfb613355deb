"""Raw responses: ``.with_raw_response`` and ``.with_streaming_response`` of the Stainless SDKs.

LiteLLM and others call through them to read headers. The response is parsed here to read its
usage: the SDKs cache what ``parse()`` returns, so the caller's own ``parse()`` gets the same
object, and a parsed stream is the metered one. The raw response handed back is the SDK's own.
"""

from __future__ import annotations

import functools
import inspect
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from typing import Any, Final

from ampmeter.integrations.lifecycle import Admitted
from ampmeter.integrations.streams import meter_stream
from ampmeter.integrations.wire import BodyReader

__all__ = ["RAW_RESPONSE_HEADER", "after_raw", "after_raw_async"]


# The header the Stainless SDKs (openai, anthropic) add to a request made through
# ``.with_raw_response`` ("true"; "raw" in newer anthropic SDKs) or ``.with_streaming_response``
# ("stream").
RAW_RESPONSE_HEADER: Final = "X-Stainless-Raw-Response"


def after_raw(result: Any, admitted: Admitted) -> Any:
    """Read a raw response's usage (``parse()`` sync: all but the async
    ``.with_streaming_response``) and hand the raw response back as it is."""
    try:
        parsed = result.parse()
    except Exception:
        # The caller's own parse() will raise the same; the call was sent and answered.
        admitted.end(None)
        return result
    return _settle_parsed(result, parsed, admitted, is_async=False)


async def after_raw_async(result: Any, admitted: Admitted) -> Any:
    """:func:`after_raw` for an async client's raw response (``parse()`` may be a coroutine)."""
    try:
        parsed = result.parse()
        if inspect.isawaitable(parsed):
            parsed = await parsed
    except Exception:
        admitted.end(None)
        return result
    return _settle_parsed(result, parsed, admitted, is_async=True)


def _settle_parsed(result: Any, parsed: Any, admitted: Admitted, *, is_async: bool) -> Any:
    # The SDK caches what parse() returns: the caller's parse() gets this metered stream. The
    # caller may read its lines, text or bytes instead of parsing it: the raw response's body
    # iterators then read the usage from the events they pass.
    if not admitted.stream:
        admitted.read_whole(parsed)
        return result
    meter_stream(admitted, parsed, is_async=is_async)
    ref = weakref.ref(result)  # the hooks live on the response: no cycle through them
    for name in _BODY_ITERATORS:
        method = getattr(type(result), name, None)
        if method is not None:
            setattr(result, name, _read_while_iterating(ref, method, admitted, name))
    return result


# The raw responses' ways of reading a streamed body piece by piece (the async response's are
# async iterators under the same names).
_BODY_ITERATORS: Final = frozenset({"iter_bytes", "iter_text", "iter_lines"})


_END: Final[Any] = object()  # a body iterator's end


def _read_while_iterating(
    ref: weakref.ref[Any], method: Callable[..., Any], meter: Admitted, name: str
) -> Callable[..., Any]:
    """Body iterator ``method`` of the raw response ``ref`` names, with each piece's
    server-sent events read into ``meter`` (``iter_lines`` gives lines without their line
    break)."""
    body = BodyReader(meter.adapter, meter.tally, sse=True)
    line_break = b"\n" if name == "iter_lines" else b""

    def feed(piece: str | bytes) -> None:
        body.feed((piece.encode() if isinstance(piece, str) else piece) + line_break)

    def end() -> None:
        body.end()
        meter.end(body.unread)

    # The HTTP response closes itself after its last piece: while a piece is being read, the
    # reader (not the close) decides how the call ends.
    @contextmanager
    def reading() -> Iterator[None]:
        meter.reading = True
        try:
            yield
        finally:
            meter.reading = False

    def sync_pieces(pieces: Iterator[Any]) -> Iterator[Any]:
        while True:
            with reading():
                piece = next(pieces, _END)
            if piece is _END:
                break
            feed(piece)
            yield piece
        end()

    async def async_pieces(pieces: AsyncIterator[Any]) -> AsyncIterator[Any]:
        while True:
            with reading():
                piece = await anext(pieces, _END)
            if piece is _END:
                break
            feed(piece)
            yield piece
        end()

    @functools.wraps(method)
    def iterate(*args: Any, **kwargs: Any) -> Any:
        pieces = method(ref(), *args, **kwargs)
        if hasattr(pieces, "__aiter__"):
            return async_pieces(pieces)
        return sync_pieces(pieces)

    return iterate
