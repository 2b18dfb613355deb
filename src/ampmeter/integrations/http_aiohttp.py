"""HTTP-layer metering for ``aiohttp`` clients (google-genai's async client sends with it).

``ClientSession.request`` is wrapped: a request in a known wire format (see
:mod:`ampmeter.integrations.http`) is admitted before it is sent, and the response's
``content`` stream is read through as the caller reads it (``read()``, ``text()``, ``json()``,
``readline()``, ``iter_any()``...). Requests that an httpx layer above already meters (LiteLLM's
aiohttp transport) are left alone. As over httpx, a streamed OpenAI chat or completions request
that did not ask for its usage gets ``stream_options.include_usage``, and the extra usage event is
taken out of what the caller reads.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
from multidict import CIMultiDict
from yarl import URL

from ampmeter.integrations.http import BodyMeter, admit, response_reader
from ampmeter.integrations.lifecycle import Admitted, settings
from ampmeter.integrations.patching import Patch, undo_all
from ampmeter.integrations.proxy_mark import METERED_HEADER

__all__ = ["instrument_aiohttp", "uninstrument_aiohttp"]

_patches: list[Patch] = []


class _MeteredContent(BodyMeter):
    """An aiohttp ``StreamReader`` whose reads also feed the request's node, with the usage
    event ampmeter asked for taken out.

    What the caller may see comes from the reader (whole events at a time when an event is
    hidden), so it is buffered here and each read method hands it out with its own semantics
    (a line for ``readline``).
    """

    def __init__(self, inner: Any, reader: Any, admitted: Admitted) -> None:
        super().__init__(inner, reader, admitted)
        self._buffer = bytearray()
        self._eof = False

    async def _fill(self) -> bool:
        """Read more of the body into the buffer; False at its end."""
        if self._eof:
            return False
        with self.ending_on_error():  # a body the provider cut is charged now, not when collected
            data = await self.inner.readany()
        if data:
            self._buffer += self.take(data)
            if not self.inner.at_eof():
                return True
        self._eof = True
        self._buffer += self.finish()
        return bool(data)

    def _take(self, size: int) -> bytes:
        out = bytes(self._buffer[:size])
        del self._buffer[:size]
        return out

    async def read(self, n: int = -1) -> bytes:
        while (n < 0 or not self._buffer) and await self._fill():
            pass
        return self._take(len(self._buffer) if n < 0 else n)

    async def readany(self) -> bytes:
        while not self._buffer and await self._fill():
            pass
        return self._take(len(self._buffer))

    async def readuntil(self, separator: bytes = b"\n") -> bytes:
        while (found := self._buffer.find(separator)) < 0 and await self._fill():
            pass
        return self._take(len(self._buffer) if found < 0 else found + len(separator))

    async def readline(self, **kwargs: Any) -> bytes:
        return await self.readuntil(b"\n")

    async def readexactly(self, n: int) -> bytes:
        while len(self._buffer) < n and await self._fill():
            pass
        if len(self._buffer) < n:
            raise asyncio.IncompleteReadError(self._take(len(self._buffer)), n)
        return self._take(n)

    async def readchunk(self) -> tuple[bytes, bool]:
        # (b"", False) is aiohttp's end of the body; no piece here ends an HTTP chunk.
        return await self.readany(), False

    def at_eof(self) -> bool:
        return self._eof and not self._buffer

    async def _pieces(self, read: Callable[[], Any]) -> AsyncIterator[bytes]:
        while data := await read():
            yield data

    def iter_any(self) -> AsyncIterator[bytes]:
        return self._pieces(self.readany)

    async def iter_chunks(self) -> AsyncIterator[tuple[bytes, bool]]:
        while data := await self.readany():
            yield data, False

    def iter_chunked(self, n: int) -> AsyncIterator[bytes]:
        return self._pieces(lambda: self.read(n))

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._pieces(self.readline)

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # a failed __init__: no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)


async def _send(request: Any, admitted: Admitted) -> Any:
    with admitted:
        try:
            response = await request
        except asyncio.TimeoutError as exc:
            import aiohttp

            # The session's timeout while the answer was awaited (not while connecting, which
            # aiohttp 3.10+ tells apart): sent, so charged its estimate (sent_unanswered in
            # lifecycle knows aiohttp's other errors).
            if not isinstance(exc, getattr(aiohttp, "ConnectionTimeoutError", ())):
                admitted.end(exc)
            raise
    reader = response_reader(admitted, response.status, response.headers.get("Content-Type", ""))
    if reader is not None:
        response.content = _MeteredContent(response.content, reader, admitted)
    return response


def _wrap_request(original: Callable[..., Any], *, post: bool) -> Callable[..., Any]:
    """``ClientSession.request`` (``post=False``) or ``.post`` (which does not go through it)."""

    positional = ("url",) if post else ("method", "url")

    @functools.wraps(original)
    def request(session: Any, *args: Any, **kwargs: Any) -> Any:
        given = {**dict(zip(positional, args, strict=False)), **kwargs}
        method, url = "POST" if post else given.get("method", ""), given.get("url", "")
        body = kwargs.get("data")
        if kwargs.get("json") is not None:
            body = orjson.dumps(kwargs["json"])
        if not isinstance(body, (bytes, str)) or str(method).upper() != "POST":
            return original(session, *args, **kwargs)
        admitted = admit(URL(str(url)).path, body, "aiohttp", may_ask_usage=True)
        if admitted is None:
            return original(session, *args, **kwargs)
        marker = settings.marker
        if admitted.hide or marker.proxy_url is not None:
            # The body that asks for the usage, or the exact bytes the proxy's mark is of.
            raw = body.encode() if isinstance(body, str) else body
            kwargs["data"] = data = orjson.dumps(admitted.body) if admitted.hide else raw
            headers = kwargs["headers"] = CIMultiDict(kwargs.get("headers") or ())
            headers.popall("Content-Length", None)  # the body changed length
            if kwargs.pop("json", None) is not None:  # the content type aiohttp sets for json=
                headers.setdefault("Content-Type", "application/json")
            mark = marker.mark_for(str(url), data)
            if mark is not None:
                headers.add(METERED_HEADER, mark)
        sent = original(session, *args, **kwargs)
        return type(sent)(_send(sent, admitted))  # aiohttp's own awaitable context manager

    return request


def instrument_aiohttp(module: Any) -> None:
    """Meter the requests of ``aiohttp.ClientSession`` (``module`` is aiohttp; idempotent)."""
    if _patches:
        return
    session = module.ClientSession
    for name in ("request", "post"):
        wrapped = _wrap_request(session.__dict__[name], post=name == "post")
        _patches.append(Patch.apply(session, name, wrapped))


def uninstrument_aiohttp() -> None:
    """Restore ``ClientSession.request`` (idempotent)."""
    undo_all(_patches)
