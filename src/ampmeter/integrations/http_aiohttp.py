"""HTTP-layer metering for ``aiohttp`` clients (google-genai's async client sends with it).

``ClientSession.request`` is wrapped: a request in a known wire format (see
:mod:`ampmeter.integrations.http`) is admitted before it is sent, and the response's
``content`` stream is read through as the caller reads it (``read()``, ``text()``, ``json()``,
``readline()``, ``iter_any()``...). Requests that an httpx layer above already meters (LiteLLM's
aiohttp transport) are left alone. A stream that did not ask for its usage is not changed here.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable, Generator
from typing import Any

import orjson
from yarl import URL

from ampmeter.integrations._common import ACTIVE_CALL, Patch, finish_call, undo_all
from ampmeter.integrations.http import Admitted, BodyMeter, admit, response_reader

__all__ = ["instrument_aiohttp", "uninstrument_aiohttp"]

_patches: list[Patch] = []


class _MeteredContent(BodyMeter):
    """An aiohttp ``StreamReader`` whose reads also feed the request's node."""

    def _seen(self, data: bytes) -> bytes:
        self._reader.feed(data)
        if self._reader.complete or self._inner.at_eof():
            self._reader.end()
            self._end(None)
        return data

    async def read(self, n: int = -1) -> bytes:
        return self._seen(await self._inner.read(n))

    async def readany(self) -> bytes:
        return self._seen(await self._inner.readany())

    async def readline(self, **kwargs: Any) -> bytes:
        return self._seen(await self._inner.readline(**kwargs))

    async def readuntil(self, *args: Any, **kwargs: Any) -> bytes:
        return self._seen(await self._inner.readuntil(*args, **kwargs))

    async def readexactly(self, n: int) -> bytes:
        return self._seen(await self._inner.readexactly(n))

    async def readchunk(self) -> tuple[bytes, bool]:
        data, end_of_chunk = await self._inner.readchunk()
        return self._seen(data), end_of_chunk

    async def _pieces(self, read: Callable[[], Any]) -> AsyncIterator[bytes]:
        while True:
            data = await read()
            if not data:
                self._seen(b"")
                return
            yield data

    def iter_any(self) -> AsyncIterator[bytes]:
        return self._pieces(self.readany)

    def iter_chunked(self, n: int) -> AsyncIterator[bytes]:
        return self._pieces(lambda: self.read(n))

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._pieces(self.readline)

    def __getattr__(self, name: str) -> Any:
        if name == "_inner":  # a failed __init__: no recursion
            raise AttributeError(name)
        return getattr(self._inner, name)


async def _send(request: Any, admitted: Admitted) -> Any:
    token = ACTIVE_CALL.set(admitted.call)
    try:
        response = await request
    except BaseException as exc:
        finish_call(admitted.call, None, exc)
        raise
    finally:
        ACTIVE_CALL.reset(token)
    reader = response_reader(admitted, response.status, response.headers.get("Content-Type", ""))
    if reader is not None:
        response.content = _MeteredContent(response.content, reader, admitted)
    return response


class _MeteredRequest:
    """What ``ClientSession.request`` returns: awaitable, and an async context manager."""

    def __init__(self, request: Any, admitted: Admitted) -> None:
        self._coro = _send(request, admitted)
        self._response: Any = None

    def __await__(self) -> Generator[Any, None, Any]:
        return self._coro.__await__()

    async def __aenter__(self) -> Any:
        self._response = await self._coro
        return self._response

    async def __aexit__(self, *exc_info: object) -> None:
        self._response.release()
        await self._response.wait_for_close()


def _wrap_request(original: Callable[..., Any], *, post: bool) -> Callable[..., Any]:
    """``ClientSession.request`` (``post=False``) or ``.post`` (which does not go through it)."""

    @functools.wraps(original)
    def request(session: Any, *args: Any, **kwargs: Any) -> Any:
        if post:
            method, url = "POST", kwargs["url"] if "url" in kwargs else args[0] if args else ""
        else:
            method = kwargs["method"] if "method" in kwargs else args[0] if args else ""
            url = kwargs["url"] if "url" in kwargs else args[1] if len(args) > 1 else ""
        body = kwargs.get("data")
        if kwargs.get("json") is not None:
            body = orjson.dumps(kwargs["json"])
        if not isinstance(body, (bytes, str)) or str(method).upper() != "POST":
            return original(session, *args, **kwargs)
        admitted = admit("POST", URL(str(url)).path, body, "aiohttp", may_ask_usage=False)
        if admitted is None:
            return original(session, *args, **kwargs)
        return _MeteredRequest(original(session, *args, **kwargs), admitted)

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
