"""HTTP-layer metering for the standard library's ``http.client`` (``urllib``, and ``requests``
through ``urllib3``), beside httpx, httpx2 and aiohttp.

A ``POST`` in a known wire format (see :mod:`ampmeter.integrations.http`, same adapters) is
admitted in ``HTTPConnection.request`` before a byte is written, so a limit stops it there; a
request an SDK layer already meters is left alone. The response's body is read into the node
as the caller reads it (``read``, ``read1``, ``readinto``, ``readline``, and urllib3's own
chunked reader, which reads the socket below ``http.client``); the node ends at the body's
end, or as abandoned when the response is closed first. ``urllib3`` 2 sends its requests
itself rather than through ``http.client``'s ``request``: its connection is patched the same
way when it is imported. Request bodies are sent as written (a stream that did not ask for its
usage is not changed to ask for it, as it is over httpx: the caller's headers are already
fixed).
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable, Generator, Iterator
from types import ModuleType
from typing import Any, Final
from urllib.parse import urlsplit

from ampmeter.integrations.http import BodyMeter, admit, response_reader
from ampmeter.integrations.lifecycle import Admitted, settings
from ampmeter.integrations.patching import Patch, around, undo_all
from ampmeter.integrations.proxy_mark import METERED_HEADER
from ampmeter.integrations.wire import BodyReader

__all__ = ["instrument_http_client", "instrument_urllib3", "uninstrument_http_client"]

_PENDING: Final = "_ampmeter_admitted"  # on a connection: its request, until its response
_METER: Final = "_ampmeter_body"  # on a response: the meter reading its body
# The parameters both request() methods (http.client's, urllib3's) take by position: the rest
# are keyword-only.
_POSITIONAL: Final = ("method", "url", "body", "headers")

_patches: list[Patch] = []


class _ResponseBody(BodyMeter):
    """An ``http.client`` response's body read into its request's node."""

    def __init__(self, response: Any, reader: BodyReader, admitted: Admitted) -> None:
        super().__init__(response, reader, admitted)
        self.busy = False  # a read is under way (the response's reads call one another)
        encoding = (response.getheader("content-encoding") or "").strip().lower()
        # The caller may decompress what it reads; the reader needs the plain body.
        gzipped = encoding in ("gzip", "deflate")
        self._inflate = zlib.decompressobj(zlib.MAX_WBITS | 32) if gzipped else None
        self._inflating = False  # a first piece was inflated
        self._unreadable = False

    def seen(self, data: bytes, *, decoded: bool = False) -> None:
        """``data`` was read from the body (``decoded``: already decompressed)."""
        if self.admitted.done:
            return
        if data and self._inflate is not None and not decoded:
            data = self._inflated(self._inflate, data)
        if data:
            self.reader.feed(data)
        if not data or self.reader.complete or self.inner.isclosed():
            self.finish()

    def _inflated(self, inflate: Any, data: bytes) -> bytes:
        """``data`` decompressed. ``deflate`` may come raw, without its zlib header (as
        urllib3 reads it); a body that cannot be inflated is read no further (it is charged
        its estimate) and never breaks the caller's read."""
        if self._unreadable:
            return b""
        try:
            data = inflate.decompress(data)
        except zlib.error:
            if self._inflating:
                self._unreadable = True
                return b""
            self._inflate = zlib.decompressobj(-zlib.MAX_WBITS)
            self._inflating = True
            return self._inflated(self._inflate, data)
        self._inflating = True
        return data


def _admit(given: dict[str, Any]) -> Admitted | None:
    method, body = str(given.get("method", "")), given.get("body")
    if method.upper() != "POST" or not isinstance(body, (bytes, bytearray, str)):
        return None
    content = bytes(body) if isinstance(body, bytearray) else body
    path = urlsplit(str(given.get("url", ""))).path
    return admit(path, content, "http.client", may_ask_usage=False)


def _mark(connection: Any, given: dict[str, Any]) -> None:
    """Add the mark for the run's proxy (:mod:`.proxy_mark`) to the request's ``given``
    arguments, when it goes there."""
    body = given["body"]
    # http.client sends a str body encoded as ISO-8859-1.
    data = body.encode("iso-8859-1") if isinstance(body, str) else bytes(body)
    where = f"http://{connection.host}:{connection.port}{urlsplit(str(given['url'])).path}"
    mark = settings.marker.mark_for(where, data)
    if mark is not None:
        given["headers"] = {**(given.get("headers") or {}), METERED_HEADER: mark}


def _wrap_request(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def request(connection: Any, *args: Any, **kwargs: Any) -> Any:
        given = {**dict(zip(_POSITIONAL, args, strict=False)), **kwargs}
        admitted = _admit(given)
        if admitted is None:
            return original(connection, *args, **kwargs)
        if settings.marker.proxy_url is not None:
            _mark(connection, given)
        with admitted:
            result = original(connection, **given)
        connection.__dict__[_PENDING] = admitted
        return result

    return request


def _getting_response(connection: Any, *args: Any, **kwargs: Any) -> Generator[None, Any, Any]:
    """Around ``getresponse``: the response of an admitted request is read into its node."""
    admitted = connection.__dict__.pop(_PENDING, None)
    if admitted is None:
        return (yield)
    with admitted:
        try:
            response = yield
        except OSError as exc:  # sent, never answered (a read timed out, the server hung up):
            admitted.end(exc)  # the provider may have billed it, so it is charged its estimate
            raise
    content_type = response.getheader("content-type") or ""
    reader = response_reader(admitted, response.status, content_type)
    if reader is not None:
        response.__dict__[_METER] = _ResponseBody(response, reader, admitted)
    return response


def _wrap_read(original: Callable[..., Any], *, into: bool = False) -> Callable[..., Any]:
    """``read``/``read1``/``readline`` of a response (``into``: ``readinto``): what they read is
    read into its node."""

    @functools.wraps(original)
    def read(response: Any, *args: Any, **kwargs: Any) -> Any:
        meter = response.__dict__.get(_METER)
        if meter is None or meter.busy:
            return original(response, *args, **kwargs)
        meter.busy = True  # a chunked readline reads through read(): one piece, seen once
        try:
            with meter.ending_on_error():  # a body the provider cut is charged now
                result = original(response, *args, **kwargs)
        finally:
            meter.busy = False
        meter.seen(bytes(memoryview(args[0])[:result]) if into else result)
        return result

    return read


def _closing(response: Any) -> Generator[None, Any, Any]:
    try:
        return (yield)
    finally:
        meter = response.__dict__.get(_METER)
        if meter is not None:  # abandoned unless its body was read to the end
            meter.admitted.abandon()


def _wrap_read_chunked(original: Callable[..., Any]) -> Callable[..., Any]:
    """urllib3's chunked reader reads the socket below ``http.client``'s response (``_fp``)."""

    @functools.wraps(original)
    def read_chunked(response: Any, *args: Any, **kwargs: Any) -> Iterator[bytes]:
        meter = getattr(getattr(response, "_fp", None), "__dict__", {}).get(_METER)
        if meter is None:
            yield from original(response, *args, **kwargs)
            return
        decode = kwargs.get("decode_content", args[1] if len(args) > 1 else None)
        decoded = response.decode_content if decode is None else bool(decode)
        for chunk in original(response, *args, **kwargs):
            meter.seen(chunk, decoded=decoded)
            yield chunk
        meter.seen(b"")

    return read_chunked


def instrument_http_client(module: ModuleType) -> None:
    """Meter requests sent with ``module`` (``http.client``) connections (idempotent)."""
    if any(patch.owner is module.HTTPConnection for patch in _patches):
        return
    connection, response = module.HTTPConnection, module.HTTPResponse
    _patches.append(Patch.apply(connection, "request", _wrap_request(connection.request)))
    getresponse = around(connection.getresponse, _getting_response)
    _patches.append(Patch.apply(connection, "getresponse", getresponse))
    for name in ("read", "read1", "readline"):
        _patches.append(Patch.apply(response, name, _wrap_read(getattr(response, name))))
    _patches.append(Patch.apply(response, "readinto", _wrap_read(response.readinto, into=True)))
    _patches.append(Patch.apply(response, "close", around(response.close, _closing)))


def instrument_urllib3(module: ModuleType) -> None:
    """Meter ``urllib3`` 2's own request sending and chunked reading (``module`` is
    ``urllib3``; its connections are ``http.client`` ones, patched beside; idempotent)."""
    from urllib3 import connection, response

    owner = connection.HTTPConnection
    if "request" not in owner.__dict__ or any(patch.owner is owner for patch in _patches):
        return  # urllib3 1 sends through http.client's request
    _patches.append(Patch.apply(owner, "request", _wrap_request(owner.__dict__["request"])))
    reader = response.HTTPResponse
    if "read_chunked" in reader.__dict__:
        wrapped = _wrap_read_chunked(reader.__dict__["read_chunked"])
        _patches.append(Patch.apply(reader, "read_chunked", wrapped))


def uninstrument_http_client() -> None:
    """Restore every patched ``http.client`` and ``urllib3`` attribute (idempotent)."""
    undo_all(_patches)
