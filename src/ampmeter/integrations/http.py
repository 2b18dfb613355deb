"""HTTP-layer metering: LLM requests sent with ``httpx`` or ``httpx2`` by any client that has
no SDK door (LiteLLM's own handlers, google-genai, mistralai, plain httpx), at ``Client.send`` /
``AsyncClient.send``: the one door every request of a client goes through, whatever transport
is mounted (LiteLLM's aiohttp transport included). aiohttp's own clients: :mod:`.http_aiohttp`.

A ``POST`` is metered when a context is current, no SDK door is already metering the request
(:data:`~ampmeter.integrations.lifecycle.ACTIVE_REQUEST`; the SDKs' own clients send past this
layer), and its path names a known wire format (:data:`ROUTES`). Its JSON body is read before
anything is sent, so limits stop the request before a byte leaves; the response body is read as
it passes to the caller (streams included; a streamed Gemini answer is SSE or a JSON array). A
streamed OpenAI chat or completions request that did not ask for usage gets
``stream_options.include_usage`` and the extra usage event is not passed on.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any, Final

import orjson

from ampmeter.integrations.adapter import Adapter
from ampmeter.integrations.anthropic import MessagesAdapter
from ampmeter.integrations.attach import metered_context
from ampmeter.integrations.bedrock import EVENT_STREAM, ConverseAdapter, EventFrames, InvokeAdapter
from ampmeter.integrations.gemini import EmbedContentAdapter, GenerateContentAdapter
from ampmeter.integrations.lifecycle import (
    ACTIVE_REQUEST,
    META_TRANSPORT,
    Admitted,
    begin_call,
    settings,
)
from ampmeter.integrations.openai import (
    ChatAdapter,
    CompletionsAdapter,
    EmbeddingsAdapter,
    ResponsesAdapter,
)
from ampmeter.integrations.openai_images import ImagesAdapter
from ampmeter.integrations.patching import Patch, undo_all
from ampmeter.integrations.proxy_mark import METERED_HEADER
from ampmeter.integrations.unmetered import UnmeteredAdapter, unmetered_adapter
from ampmeter.integrations.wire import BodyReader

__all__ = [
    "ROUTES",
    "BodyMeter",
    "adapter_for_path",
    "admit",
    "instrument_httpx",
    "json_object",
    "response_reader",
    "uninstrument_httpx",
    "unwrapped_send",
]


# The reader of each wire format, by how a request path ends; checked in order
# ("/chat/completions" before "/completions"). The SDKs' own paths are these keys.
# ("/embeddings" and Gemini's embedding routes make an ``embedding`` node.)
ROUTES: Final[dict[str, Adapter]] = {
    "/chat/completions": ChatAdapter("chat.completions"),
    "/responses": ResponsesAdapter("responses"),
    # A compaction is a model call billed as a response is (SDK method: responses.compact).
    "/responses/compact": ResponsesAdapter("responses", "compact"),
    "/embeddings": EmbeddingsAdapter("embeddings"),
    "/images/generations": ImagesAdapter("images", "generate"),
    "/images/edits": ImagesAdapter("images", "edit"),
    "/completions": CompletionsAdapter("completions"),
    "/messages": MessagesAdapter("messages"),
    ":embedContent": EmbedContentAdapter("embedContent"),
    ":batchEmbedContents": EmbedContentAdapter("batchEmbedContents"),
    ":generateContent": GenerateContentAdapter("generateContent"),
    ":streamGenerateContent": GenerateContentAdapter("streamGenerateContent"),
    "/converse": ConverseAdapter("converse", streams=False),
    "/converse-stream": ConverseAdapter("converse_stream", streams=True),
    "/invoke": InvokeAdapter("invoke_model", streams=False),
    "/invoke-with-response-stream": InvokeAdapter(
        "invoke_model_with_response_stream", streams=True
    ),
}

_patches: list[Patch] = []


def adapter_for_path(path: str) -> Adapter | None:
    """The reader of the wire format a request path names, or None."""
    return next((adapter for suffix, adapter in ROUTES.items() if path.endswith(suffix)), None)


def unwrapped_send(client_class: type) -> Any:
    """The ``send`` that httpx client class ``client_class`` inherits, as it is without this
    module's patch (for an SDK's own client, whose every request the SDK's door meters)."""
    for owner in client_class.__mro__:
        if "send" in owner.__dict__:
            originals = (patch.original for patch in _patches if patch.owner is owner)
            return next(originals, owner.__dict__["send"])
    raise TypeError(f"{client_class.__name__} is no httpx client")


def json_object(content: Any) -> dict[str, Any] | None:
    """The JSON object ``content`` (text, bytes or a buffer) holds; None for anything else."""
    try:
        body = orjson.loads(content)
    except orjson.JSONDecodeError:
        return None
    return body if isinstance(body, dict) else None


def admit(
    path: str, content: bytes | str, transport: str, *, may_ask_usage: bool
) -> Admitted | None:
    """Begin the node of a ``POST`` in a known wire format (None: not one to meter here).

    Raises ``LimitExceeded`` when it would break a limit: nothing has been sent. With
    ``may_ask_usage`` a stream that did not ask for its usage is changed to ask for it
    (``Admitted.hide``; the caller sends ``Admitted.body`` instead of its own).
    """
    if ACTIVE_REQUEST.get() is not None:
        return None
    adapter = adapter_for_path(path) or unmetered_adapter(path)
    ctx = None if adapter is None else metered_context()
    body = None if ctx is None else json_object(content)
    if ctx is None or adapter is None or body is None:
        return None
    if isinstance(adapter, UnmeteredAdapter):  # one node, not metered (see .unmetered)
        return adapter.begin(ctx, body, {META_TRANSPORT: transport})
    model = adapter.model_for(path, body)  # (Gemini and Bedrock name it in the path)
    if model is None:
        return None  # no model: not an LLM request (e.g. POST /v1/threads/{id}/messages)
    meta = {META_TRANSPORT: transport}
    return begin_call(ctx, adapter, body, model, meta, ask_usage=body if may_ask_usage else None)


def response_reader(admitted: Admitted, status: int, content_type: str) -> BodyReader | None:
    """How to read a response's body (None: an error status, and the node ended failed; a
    redirect is no answer of the provider's either)."""
    if status >= 300:
        admitted.fail(_ProviderError(f"the provider answered HTTP {status}"))
        return None
    sse = content_type.startswith("text/event-stream")
    frames = EventFrames() if content_type.startswith(EVENT_STREAM) else None
    return BodyReader(admitted.adapter, admitted.tally, sse=sse, hide=admitted.hide, frames=frames)


class _ProviderError(Exception):
    """The provider answered with an error status (recorded on the node, never raised)."""


class BodyMeter:
    """A response body being read into its request's node: ends the node at the body's end
    (or its last event), or as abandoned when closed or dropped before."""

    def __init__(self, inner: Any, reader: BodyReader, admitted: Admitted) -> None:
        self.admitted = admitted
        self.inner = inner
        self.reader = reader

    def take(self, piece: bytes) -> bytes:
        """Read ``piece`` of the body; return what the caller gets of it."""
        out = self.reader.feed(piece)
        if self.reader.complete:
            self.admitted.end(self.reader.unread)  # the caller may stop at the last event
        return out

    def finish(self) -> bytes:
        """The body is complete: end the node; return the bytes still owed to the caller."""
        tail = self.reader.end()
        self.admitted.end(self.reader.unread)
        return tail

    @contextmanager
    def ending_on_error(self) -> Iterator[None]:
        """End the node with the error that stops the reading (a reader closing the body
        early is no error: :meth:`abandon` counts it)."""
        try:
            yield
        except BaseException as exc:
            if not isinstance(exc, GeneratorExit):
                self.admitted.end(exc)
            raise

    def __del__(self) -> None:
        # A response dropped unread is still counted, with the usage seen so far. Nothing can be
        # reported from a finalizer, and at interpreter exit module globals (contextlib too) may
        # already be gone: hence a bare try.
        try:  # noqa: SIM105
            self.admitted.abandon()
        except Exception:
            pass


class _SyncBody(BodyMeter):
    def __iter__(self) -> Iterator[bytes]:
        with self.ending_on_error():
            for piece in self.inner:
                if out := self.take(piece):
                    yield out
            if tail := self.finish():
                yield tail

    def close(self) -> None:
        try:
            self.inner.close()
        finally:
            self.admitted.abandon()


class _AsyncBody(BodyMeter):
    async def __aiter__(self) -> AsyncIterator[bytes]:
        with self.ending_on_error():
            async for piece in self.inner:
                if out := self.take(piece):
                    yield out
            if tail := self.finish():
                yield tail

    async def aclose(self) -> None:
        try:
            await self.inner.aclose()
        finally:
            self.admitted.abandon()


def _settle(admitted: Admitted, response: Any, streamed: bool, body_type: type) -> Any:
    reader = response_reader(
        admitted, response.status_code, response.headers.get("content-type", "")
    )
    if reader is not None and not streamed:  # the body was read whole by send()
        reader.feed(response.content)
        reader.end()
        admitted.end(reader.unread)
    elif reader is not None:
        response.stream = body_type(response.stream, reader, admitted)
    return response


def _send_metered(module: ModuleType, request: Any, stream: bool) -> tuple[Admitted | None, Any]:
    """Admit an httpx request about to be sent (None: not one to meter here), and the request
    to send: rebuilt when changed to ask for a stream's usage, marked for the run's proxy when
    this process meters it (one the SDKs' door already meters, ACTIVE_REQUEST, is only marked)."""
    active = ACTIVE_REQUEST.get()
    try:
        content = request.content  # raises when the body is a stream not read yet
    except Exception:
        return None, request  # unmarked: the proxy meters it too (twice, never not at all)
    admitted = None
    if active is None and request.method == "POST":
        # Ask for the usage of a stream the caller reads piece by piece (a body read whole
        # would have to be rewritten to hide the extra event: it is left as it is).
        path, transport = request.url.path, module.__name__
        admitted = admit(path, content, transport, may_ask_usage=stream)
        if admitted is not None and admitted.hide:
            headers = request.headers.copy()
            headers.pop("content-length", None)
            content = orjson.dumps(admitted.body)
            request = module.Request(
                request.method,
                request.url,
                headers=headers,
                content=content,
                extensions=request.extensions,
            )
    if settings.marker.proxy_url is not None and (active is not None or admitted is not None):
        mark = settings.marker.mark_for(str(request.url), content)
        if mark is not None:
            request.headers[METERED_HEADER] = mark
    return admitted, request


def _wrap_send(module: ModuleType, original: Callable[..., Any], body_type: type) -> Any:
    @functools.wraps(original)
    def send(client: Any, request: Any, *, stream: bool = False, **kwargs: Any) -> Any:
        admitted, request = _send_metered(module, request, stream)
        if admitted is None:
            return original(client, request, stream=stream, **kwargs)
        with admitted:
            response = original(client, request, stream=stream, **kwargs)
        return _settle(admitted, response, stream, body_type)

    return send


def _wrap_async_send(module: ModuleType, original: Callable[..., Any], body_type: type) -> Any:
    @functools.wraps(original)
    async def send(client: Any, request: Any, *, stream: bool = False, **kwargs: Any) -> Any:
        admitted, request = _send_metered(module, request, stream)
        if admitted is None:
            return await original(client, request, stream=stream, **kwargs)
        with admitted:
            response = await original(client, request, stream=stream, **kwargs)
        return _settle(admitted, response, stream, body_type)

    return send


def instrument_httpx(module: ModuleType) -> None:
    """Meter the requests of ``module`` (``httpx`` or ``httpx2``) clients (idempotent)."""
    if any(patch.owner is module.Client for patch in _patches):
        return
    for client, wrap, body in (
        (module.Client, _wrap_send, (_SyncBody, module.SyncByteStream)),
        (module.AsyncClient, _wrap_async_send, (_AsyncBody, module.AsyncByteStream)),
    ):
        metered_body = type(f"Metered{body[0].__name__}", body, {})
        _patches.append(Patch.apply(client, "send", wrap(module, client.send, metered_body)))


def uninstrument_httpx() -> None:
    """Restore ``Client.send`` and ``AsyncClient.send`` of every patched module (idempotent)."""
    undo_all(_patches)


def is_instrumented() -> bool:
    """Whether an HTTP client library is currently patched."""
    return bool(_patches)
