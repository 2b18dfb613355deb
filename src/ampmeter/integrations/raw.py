"""Raw responses: ``.with_raw_response`` and ``.with_streaming_response`` of the Stainless SDKs.

LiteLLM and others call through them to read headers. The response is parsed here to read its
usage: the SDKs cache what ``parse()`` returns, so the caller's own ``parse()`` gets the same
object, and a parsed stream is the metered one.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any, Final

from ampmeter.context import Call
from ampmeter.integrations.adapter import Adapter, RequestInfo, Tally
from ampmeter.integrations.lifecycle import finish_call
from ampmeter.integrations.streams import MeteredAsyncStream, MeteredStream, StreamWrapper
from ampmeter.integrations.wire import BodyReader

__all__ = [
    "RAW_RESPONSE_HEADER",
    "RawResponseProxy",
    "after_raw",
    "after_raw_async",
    "is_raw_request",
]


# The header the Stainless SDKs (openai, anthropic) add to a request made through
# ``.with_raw_response`` ("true"; "raw" in newer anthropic SDKs) or ``.with_streaming_response``
# ("stream").
RAW_RESPONSE_HEADER: Final = "X-Stainless-Raw-Response"


def is_raw_request(kwargs: Mapping[str, Any]) -> bool:
    """Whether the SDK call was made through one of its raw-response wrappers."""
    headers = kwargs.get("extra_headers")
    if not headers:  # the usual case: no ABC isinstance check on every call
        return False
    return isinstance(headers, Mapping) and bool(headers.get(RAW_RESPONSE_HEADER))


def _after(
    result: Any, call: Call, adapter: Adapter, info: RequestInfo, hide: bool, stream_type: type
) -> Any:
    """Hand back a metered stream, or record a whole response's usage and end the call."""
    if adapter.is_stream(result):
        return stream_type(result, call, adapter, hide, info.input_tokens)
    tally = Tally()
    adapter.read_response(result, tally)
    finish_call(call, tally, None)
    return result


def after_raw(result: Any, call: Call, adapter: Adapter, info: RequestInfo, hide: bool) -> Any:
    """What a metered call returns, for a raw response whose ``parse()`` is sync (all but the async
    ``.with_streaming_response``)."""
    try:
        parsed = result.parse()
    except Exception:
        # The caller's own parse() will raise the same; the call was sent and answered.
        finish_call(call, Tally(), None)
        return result
    return _settle_parsed(result, parsed, call, adapter, info, hide, MeteredStream)


async def after_raw_async(
    result: Any, call: Call, adapter: Adapter, info: RequestInfo, hide: bool
) -> Any:
    """:func:`after_raw` for an async client's raw response (``parse()`` may be a coroutine)."""
    try:
        parsed = result.parse()
        if inspect.isawaitable(parsed):
            parsed = await parsed
    except Exception:
        finish_call(call, Tally(), None)
        return result
    return _settle_parsed(result, parsed, call, adapter, info, hide, MeteredAsyncStream)


def _settle_parsed(
    result: Any,
    parsed: Any,
    call: Call,
    adapter: Adapter,
    info: RequestInfo,
    hide: bool,
    stream_type: type,
) -> Any:
    if adapter.is_stream(parsed):
        metered = stream_type(parsed, call, adapter, hide, info.input_tokens)
        return RawResponseProxy(result, metered)
    tally = Tally()
    adapter.read_response(parsed, tally)
    finish_call(call, tally, None)
    return result


class RawResponseProxy:
    """A raw response of a streamed request whose ``parse()`` returns the metered stream.

    Everything else (headers, status, the HTTP response) is the SDK's own object; reading the
    body's lines, text or bytes instead of parsing it also reads the usage from the events. A
    proxy dropped without its stream being read ends the call as an abandoned stream does.
    """

    def __init__(self, raw: Any, stream: StreamWrapper) -> None:
        self._raw = raw
        self._metered = stream
        self._is_async = inspect.iscoroutinefunction(raw.parse)

    def parse(self, *, to: Any = None) -> Any:
        """The metered stream (or, with ``to``, the SDK's own parse)."""
        if to is not None:
            return self._raw.parse(to=to)
        if self._is_async:
            return self._awaitable(self._metered)
        return self._metered

    @staticmethod
    async def _awaitable(value: Any) -> Any:
        return value

    def __getattr__(self, name: str) -> Any:
        if name in ("_raw", "_metered", "_is_async"):  # a failed __init__: no recursion
            raise AttributeError(name)
        value = getattr(self._raw, name)
        if name in _BODY_ITERATORS and callable(value):
            # The caller reads the event stream's raw lines instead of parsing it: read the
            # usage from those lines as they pass.
            return _read_while_iterating(value, _SseReader(self._metered), name == "iter_lines")
        return value


# The raw responses' ways of reading a streamed body piece by piece (the async response's are
# async iterators under the same names).
_BODY_ITERATORS: Final = frozenset({"iter_bytes", "iter_text", "iter_lines"})


class _SseReader:
    """Reads server-sent events from a raw body as it passes, into a metered stream's tally."""

    def __init__(self, stream: StreamWrapper) -> None:
        self._stream = stream
        self._body = BodyReader(stream.adapter, stream.tally, sse=True)

    def feed(self, piece: str | bytes, *, whole_line: bool) -> None:
        data = piece.encode() if isinstance(piece, str) else piece
        self._body.feed(data + b"\n" if whole_line else data)

    def end(self) -> None:
        self._body.end()
        self._stream.end(None)


def _read_while_iterating(
    method: Callable[..., Any], reader: _SseReader, whole_line: bool
) -> Callable[..., Any]:
    """``method`` (a body iterator of a raw response) with each piece fed to ``reader``;
    ``whole_line``: the pieces are lines without their line break."""

    def sync_pieces(pieces: Iterator[Any]) -> Iterator[Any]:
        for piece in pieces:
            reader.feed(piece, whole_line=whole_line)
            yield piece
        reader.end()

    async def async_pieces(pieces: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for piece in pieces:
            reader.feed(piece, whole_line=whole_line)
            yield piece
        reader.end()

    @functools.wraps(method)
    def iterate(*args: Any, **kwargs: Any) -> Any:
        pieces = method(*args, **kwargs)
        if hasattr(pieces, "__aiter__"):
            return async_pieces(pieces)
        return sync_pieces(pieces)

    return iterate
