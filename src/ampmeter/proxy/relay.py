"""One request through the proxy: identify the caller, admit, forward, pass the body, settle.

A request is metered exactly as an SDK request sent through an instrumented HTTP client: the
same wire-format readers estimate it (:func:`ampmeter.integrations.http.adapter_for_path`), the
caller's context admits it (reserving the estimate on the caller's ledger scope) or refuses it
before a byte goes upstream, and the upstream's body is read as it passes, event by event, into
the node's usage. The caller's own API key goes upstream untouched; the proxy key that names
the caller does not.

Admission and settlement may wait (for other calls' reservations, for a ledger round trip):
they run on the relay's worker threads, so the event loop keeps passing other streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final

import aiohttp
import orjson
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from ampmeter.context import ExecutionContext
from ampmeter.errors import BudgetBusy, LimitExceeded
from ampmeter.integrations.http import adapter_for_path, json_object, response_reader
from ampmeter.integrations.lifecycle import META_TRANSPORT, Admitted, begin_call, sent_unanswered
from ampmeter.integrations.proxy_mark import METERED_HEADER, metered_mark

__all__ = ["KEY_HEADER", "Relay", "refusal"]

KEY_HEADER: Final = "x-ampmeter-key"
"""The header that names the caller (or put the key in the path: ``/k/<key>/openai``)."""

# Hop-by-hop headers (RFC 9110 7.6.1) and those the proxy sets itself are not forwarded.
_NOT_FORWARDED: Final = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "content-encoding",  # the upstream's body is passed on decoded
        "accept-encoding",  # so the upstream is asked only for what the proxy can decode
        KEY_HEADER,
        METERED_HEADER,
    }
)


class Relay:
    """Forwards requests of known callers to their upstreams, metered in each caller's context.

    ``contexts`` maps each caller's proxy key (None: the caller that needs no key) to its open
    context; ``upstreams`` maps a route (``openai``, ``anthropic``) to its base URL.
    ``allow_unestimated``: forward a POST whose cost cannot be estimated (an unknown route or
    body) unmetered, instead of refusing it. ``trusted_key``: a request marked with it (see
    :mod:`ampmeter.integrations.proxy_mark`) was metered by the process that sent it, and
    passes unmetered (``ampmeter run --proxy``: its Python processes meter their own calls).
    """

    def __init__(
        self,
        contexts: Mapping[str | None, ExecutionContext],
        upstreams: Mapping[str, str],
        *,
        allow_unestimated: bool = False,
        trusted_key: bytes | None = None,
        workers: int = 128,
    ) -> None:
        self._contexts = dict(contexts)
        self._upstreams = dict(upstreams)
        self._allow_unestimated = allow_unestimated
        self._trusted_key = trusted_key
        self._workers = ThreadPoolExecutor(workers, thread_name_prefix="ampmeter-proxy")
        self._session: aiohttp.ClientSession | None = None

    async def open(self) -> None:
        """Open the pooled upstream client (on the server's loop)."""
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
            auto_decompress=True,
            connector=aiohttp.TCPConnector(limit=0),  # the callers' concurrency is the limit
        )

    async def close(self) -> None:
        """Close the upstream client and the worker threads."""
        if self._session is not None:
            await self._session.close()
        self._workers.shutdown(wait=True)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """The aiohttp handler of every proxied route."""
        route = request.match_info["route"]
        key = request.match_info.get("key") or request.headers.get(KEY_HEADER)
        ctx = self._contexts.get(key)
        if ctx is None:
            return refusal(route, 401, "no caller has that proxy key", "authentication_error")
        base = self._upstreams.get(route)
        if base is None:
            return refusal(route, 404, f"no upstream is configured for {route!r}", "not_found")
        path = "/" + request.match_info["tail"]
        # Dot segments (sent encoded, even twice) resolve upstream: none may reach beside the
        # base URL the user configured (a gateway's other tenant, another Azure deployment,
        # billed at another price).
        if not f"{URL(base + path).path}/".startswith(f"{URL(base).path.rstrip('/')}/"):
            message = f"the path {path!r} leaves the upstream's base URL"
            return refusal(route, 400, message, "invalid_request_error")
        url = base + path + (f"?{request.query_string}" if request.query_string else "")
        content = await request.read()
        if request.method != "POST" or self._metered_by_sender(request, content):
            # Listing models and the like (nothing is billed), or a request its sender metered.
            return await self._forward(request, url, content, None)
        adapter = adapter_for_path(path)
        body = json_object(content)
        model = None if adapter is None or body is None else adapter.model_for(path, body)
        if adapter is None or body is None or not isinstance(model, str):
            if self._allow_unestimated:
                return await self._forward(request, url, content, None)
            return refusal(
                route,
                400,
                f"the proxy cannot estimate what POST {path} costs, so it does not forward it "
                "(start the proxy with --allow-unestimated to forward such requests unmetered)",
                "invalid_request_error",
            )
        stream = body.get("stream")
        if stream is not None and not isinstance(stream, bool):
            # Read as no stream, it would not be asked for its usage; an upstream that takes it
            # for one would stream without it.
            message = "'stream' must be true, false or null"
            return refusal(route, 400, message, "invalid_request_error")
        meta = {META_TRANSPORT: "proxy"}
        try:
            admitted: Admitted = await self._on_worker(
                lambda: begin_call(ctx, adapter, body, model, meta, ask_usage=body)
            )
        except BudgetBusy as busy:
            return refusal(route, 429, str(busy), "rate_limit_error", retry_after=1)
        except LimitExceeded as stop:
            return refusal(route, 402, str(stop), "insufficient_quota")
        sent = orjson.dumps(body) if admitted.hide else content
        try:
            return await self._forward(request, url, sent, admitted)
        except BaseException as exc:
            # Cancelled (the proxy stopping) before its answer was read: sent, so it is charged
            # at its reservation (an interrupt in flight), never dropped with the task.
            await self._on_worker(admitted.fail, exc, shield=True)
            raise

    def _metered_by_sender(self, request: web.Request, content: bytes) -> bool:
        mark = request.headers.get(METERED_HEADER)
        if mark is None or self._trusted_key is None:
            return False
        return hmac.compare_digest(mark, metered_mark(self._trusted_key, content))

    async def _forward(
        self, request: web.Request, url: str, content: bytes, admitted: Admitted | None
    ) -> web.StreamResponse:
        assert self._session is not None, "the relay is not open"
        headers = CIMultiDict(
            (k, v) for k, v in request.headers.items() if k.lower() not in _NOT_FORWARDED
        )
        try:
            # A redirect goes back to the caller as it came: followed here, it would take the
            # caller's request and key headers to whatever host it names.
            upstream = await self._session.request(
                request.method, url, headers=headers, data=content or None, allow_redirects=False
            )
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            if admitted is not None:  # (charged its estimate if it may have been billed)
                await self._on_worker(admitted.fail, exc)
            sent = sent_unanswered(exc)
            told = "took the request and gave no answer" if sent else "could not be reached"
            route = request.match_info["route"]
            return refusal(route, 502, f"the upstream {told}: {exc}", "api_error")
        async with upstream:
            reader = None
            if admitted is not None:
                content_type = upstream.headers.get("content-type", "")
                reader = response_reader(admitted, upstream.status, content_type)
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for name, value in upstream.headers.items():
                if name.lower() not in _NOT_FORWARDED:
                    response.headers.add(name, value)
            passing = _Passing(response)
            await passing.start(request)
            error: BaseException | None = None
            try:
                async for piece in upstream.content.iter_any():
                    await passing.write(reader.feed(piece) if reader is not None else piece)
                    if reader is None and passing.gone:
                        break  # nothing to count: stop reading what nobody will see
                if reader is not None:
                    await passing.write(reader.end())
            except asyncio.CancelledError:
                # The proxy is stopping mid-body: what was sent is charged (usage seen so far,
                # or the reservation's estimate), as for an SDK stream closed early.
                if admitted is not None:
                    await self._on_worker(admitted.abandon, shield=True)
                raise
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                error = exc
            # Settled before the body's end reaches the caller: once a client has its answer,
            # the call counts (a program that exits at once leaves nothing open).
            if reader is not None and admitted is not None:
                await self._on_worker(admitted.end, error or reader.unread)
            await passing.end(request, cut=error is not None)
            return response

    async def _on_worker(self, function: Any, *args: Any, shield: bool = False) -> Any:
        """``function(*args)`` (admission and settlement may wait for a ledger) on a worker
        thread."""
        job = asyncio.get_running_loop().run_in_executor(self._workers, function, *args)
        return await (asyncio.shield(job) if shield else job)


class _Passing:
    """The body on its way to the caller. A caller that hangs up mid-body, or before the
    upstream answered (a client's timeout), is let go, and the upstream's body is still read to
    its end: the provider bills the whole answer (it cannot know the caller left), and its
    usage, which comes last, is then counted exactly instead of estimated."""

    def __init__(self, response: web.StreamResponse) -> None:
        self._response = response
        self.gone = False

    async def start(self, request: web.Request) -> None:
        try:
            await self._response.prepare(request)
        except (ConnectionResetError, aiohttp.ClientConnectionError):
            self.gone = True

    async def write(self, data: bytes) -> None:
        if data and not self.gone:
            try:
                await self._response.write(data)
            except (ConnectionResetError, aiohttp.ClientConnectionError):
                self.gone = True

    async def end(self, request: web.Request, *, cut: bool) -> None:
        """End the body; ``cut``: the upstream broke its body off, and the caller's is broken
        off too (its end never sent), so that no client takes a cut answer for a whole one."""
        if self.gone:
            return
        if cut and request.transport is not None:
            request.transport.close()  # (what was written is still delivered first)
            return
        with contextlib.suppress(ConnectionResetError, aiohttp.ClientConnectionError):
            await self._response.write_eof()


def refusal(
    route: str, status: int, message: str, kind: str, *, retry_after: int | None = None
) -> web.Response:
    """An error in the provider's own shape, so any SDK raises it as that provider's API error.

    ``x-should-retry: false`` tells the official SDKs not to retry it (a budget stop would be
    refused again); a busy budget (429) gives ``retry-after`` instead.
    """
    if route == "anthropic":
        kind = {"insufficient_quota": "billing_error", "not_found": "not_found_error"}.get(
            kind, kind
        )
        body: dict[str, Any] = {"type": "error", "error": {"type": kind, "message": message}}
    else:
        body = {"error": {"message": message, "type": kind, "param": None, "code": "ampmeter"}}
    headers = {"content-type": "application/json"}
    if retry_after is None:
        headers["x-should-retry"] = "false"
    else:
        headers["retry-after"] = str(retry_after)
    return web.Response(status=status, body=orjson.dumps(body), headers=headers)
