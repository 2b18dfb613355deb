"""What the OpenAI and Anthropic integrations share: admission, settlement, streams, patches.

A provider module describes its wire format with an :class:`Adapter` (what the request asks
for, how to read usage from a response or a stream event); this module turns an SDK method into
a metered one:

* no current context: the original method runs untouched (one contextvar lookup);
* otherwise an ``llm`` node is begun under the current node, the context reserves the call's
  estimate and checks its limits (``LimitExceeded`` is raised before any request is built),
  the SDK call runs, and the node ends with the usage the provider reported;
* streams come back wrapped: the node ends when the stream is exhausted or closed; a stream
  abandoned half-way ends ``fail`` with the usage seen so far;
* raw responses (``.with_raw_response`` / ``.with_streaming_response``, which LiteLLM and others
  use to read headers) are parsed to read their usage: the SDKs cache what ``parse()`` returns,
  so the caller's own ``parse()`` gets the same object, and a parsed stream is the metered one.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import os
import sys
import threading
import warnings
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from ampmeter import redact
from ampmeter.context import (
    Call,
    ExecutionContext,
    any_open_context,
    current_context,
    open_contexts,
)
from ampmeter.errors import LimitExceeded, StreamAbandoned, StreamOutlivedContext, note_stop
from ampmeter.graph import META_PROVIDER
from ampmeter.integrations._wire import BodyReader
from ampmeter.limits import ExceededLimit
from ampmeter.policies import in_final_call
from ampmeter.propagation import HANDOFF_ENV, attach_from_env

__all__ = [
    "META_OPERATION",
    "META_PROMPT_TEXT",
    "META_RESPONSE_TEXT",
    "META_TRANSPORT",
    "META_USAGE_ESTIMATED",
    "Adapter",
    "MeteredAsyncStream",
    "MeteredStream",
    "Patch",
    "RequestInfo",
    "StreamAbandoned",
    "Tally",
    "active_call",
    "count_retry",
    "metered_context",
    "remember_client_key",
    "remember_stream_origin",
    "settings",
]

META_OPERATION: Final = "operation_name"  # the SDK method, e.g. "chat.completions.create"
META_PROMPT_TEXT: Final = "prompt_text"  # only with instrument(capture_content=True)
META_RESPONSE_TEXT: Final = "response_text"  # only with instrument(capture_content=True)
META_USAGE_ESTIMATED: Final = "usage_estimated"  # a cut stream's usage, partly estimated
META_TRANSPORT: Final = "transport"  # how a request metered below the SDKs went: httpx, ...
META_MODEL: Final = "model"  # the model of a non-LLM node (an embedding), which has no model field


@dataclass(slots=True)
class Settings:
    """Process-wide integration settings (set by ``instrument()``)."""

    capture_content: bool = False
    default_context: ExecutionContext | None = None


settings = Settings()

# The call whose request is running in this thread or task: the SDK's retry path (which knows
# nothing about ampmeter) counts its retries on it, and the HTTP layer leaves alone a request
# that an SDK patch already meters.
ACTIVE_CALL: contextvars.ContextVar[Call | None] = contextvars.ContextVar(
    "ampmeter_active_sdk_call", default=None
)


def active_call() -> Call | None:
    """The metered call whose SDK request is in progress here, or None."""
    return ACTIVE_CALL.get()


def count_retry() -> None:
    """Count one SDK retry on the active call (called from the SDK's retry sleep)."""
    call = ACTIVE_CALL.get()
    if call is not None:
        call.retry()


def remember_client_key(resource: Any) -> None:
    """Have :mod:`ampmeter.redact` scrub the credentials of the SDK client behind ``resource``.

    A provider's error body may echo the key; it is read from the client on every call (it may
    change: openai's can come from a refreshing provider) and held only by the redaction
    module, which ignores one it already knows.
    """
    client = getattr(resource, "_client", None)  # the Stainless SDKs' resource -> client link
    redact.remember_secret(getattr(client, "api_key", None))
    redact.remember_secret(getattr(client, "auth_token", None))


def metered_context() -> ExecutionContext | None:
    """The context SDK calls attach to here: the one a lazy stream being read was created in,
    else the current one, else the process default, else the one a hand-off token in
    ``AMPMETER_HANDOFF`` gives this process."""
    if _stream_origins:
        origin = _origin_of_running_stream()
        if origin is not None:
            return origin
    ctx = current_context()
    if ctx is None:
        ctx = settings.default_context
        if ctx is None:
            if HANDOFF_ENV in os.environ:
                return attach_from_env()
            if not _warned_unmetered and any_open_context():
                _warn_unmetered()
    return ctx


_warned_unmetered = False

# Lazy streams: generators that send their request only when first read (LlamaIndex's
# ``stream_chat()``), by the id of the generator's frame, with the context they were made in.
# A request is made from inside that frame, wherever and whenever the generator is read.
_stream_origins: dict[int, tuple[weakref.ref[Any], ExecutionContext]] = {}


def remember_stream_origin(stream: Any, ctx: ExecutionContext) -> None:
    """Meter the requests that generator ``stream`` sends against ``ctx`` (its creator's
    context), wherever it is read; forgotten when the generator is."""
    frame = getattr(stream, "gi_frame", None) or getattr(stream, "ag_frame", None)
    if frame is None:
        return
    key = id(frame)

    def forget(ref: weakref.ref[Any]) -> None:
        if _stream_origins.get(key, (None,))[0] is ref:
            del _stream_origins[key]

    _stream_origins[key] = (weakref.ref(stream, forget), ctx)


def _origin_of_running_stream() -> ExecutionContext | None:
    """The creating context of a remembered generator running further up this stack."""
    frame = sys._getframe(2)
    while frame is not None:
        found = _stream_origins.get(id(frame))
        if found is not None:
            stream = found[0]()
            if stream is not None and frame in (getattr(stream, "gi_frame", None),
                                                getattr(stream, "ag_frame", None)):  # fmt: skip
                ctx = found[1]
                if ctx not in open_contexts():
                    stop = StreamOutlivedContext(
                        f"a stream created in context {ctx.name!r} was read after that context "
                        "closed: its request was not sent. Read the stream inside the context."
                    )
                    note_stop(stop)  # frameworks re-raise it as their own error
                    raise stop
                return ctx
        frame = frame.f_back  # type: ignore[assignment]
    return None


def _warn_unmetered() -> None:
    global _warned_unmetered
    _warned_unmetered = True
    names = ", ".join(sorted({repr(ctx.name) for ctx in open_contexts()}))
    warnings.warn(
        f"ampmeter: an SDK call on thread {threading.current_thread().name!r} is not metered: "
        f"no context is current here, while {names} is open in another thread (threads of a "
        "pool do not inherit it). Call ampmeter.set_default_context(ctx) so calls on any "
        "thread attach to it, or submit the work with contextvars.copy_context().run. "
        "(This warning is shown once.)",
        RuntimeWarning,
        stacklevel=4,
    )


class RequestInfo:
    """What a request asks for, as far as the reservation is concerned (read, never changed)."""

    __slots__ = ("max_tokens", "model", "prompt_text", "stream")

    def __init__(
        self, model: str | None, prompt_text: str, max_tokens: int | None, stream: bool
    ) -> None:
        self.model = model
        self.prompt_text = prompt_text
        self.max_tokens = max_tokens
        self.stream = stream

    @property
    def prompt_tokens(self) -> int:
        """The fast prompt estimate: characters / 4, rounded up."""
        return -(-len(self.prompt_text) // 4)


@dataclass(slots=True)
class Tally:
    """Usage seen so far in one response (or stream), in the subset convention.

    ``tokens_in`` includes cache reads and writes; ``tokens_out`` includes reasoning tokens.
    ``text`` (captured content) and ``tool_keys`` are made only when something goes in them.
    """

    tokens_in: int | None = None
    tokens_out: int | None = None
    cached: int = 0
    cache_write: int = 0
    reasoning: int = 0
    tool_calls: int = 0
    chunks: int = 0  # events that carried generated content (a cut stream's output estimate)
    text: list[str] | None = None
    tool_keys: set[tuple[int, int]] | None = None  # (choice, tool) indexes of streamed tool calls

    def keep_text(self, text: str) -> None:
        """Keep a piece of the response's text (with ``instrument(capture_content=True)``)."""
        if self.text is None:
            self.text = [text]
        else:
            self.text.append(text)

    def record_on(self, call: Call) -> None:
        """Report this usage on ``call`` (nothing when the provider reported none)."""
        t_in, t_out = self.tokens_in, self.tokens_out
        if t_in is None and t_out is None:
            if self.tool_calls:
                call.tool_calls_made = self.tool_calls
            return
        t_in = t_in if t_in is not None and t_in > 0 else 0
        t_out = t_out if t_out is not None and t_out > 0 else 0
        cached, writes, reasoning = self.cached, self.cache_write, self.reasoning
        if cached < 0 or writes < 0 or reasoning < 0 or cached + writes > t_in or reasoning > t_out:
            # A provider that reports details larger than the totals must not break the
            # caller's call: clamp them to the subset convention.
            cached = min(max(cached, 0), t_in)
            writes = min(max(writes, 0), t_in - cached)
            reasoning = min(max(reasoning, 0), t_out)
        tools = self.tool_calls if self.tool_calls > 0 else 0
        call.record(t_in, t_out, None, cached, reasoning, tools, cache_write_tokens=writes)


class Adapter:
    """One SDK operation's wire format. Provider modules subclass it."""

    provider: str = ""
    operation: str = ""
    kind: str = "llm"  # the node kind: "llm", or "embedding" for an embeddings endpoint

    def request_info(self, kwargs: Mapping[str, Any]) -> RequestInfo:
        """Model, prompt text, output cap and streaming flag of a request."""
        raise NotImplementedError

    def prepare_stream(self, kwargs: dict[str, Any]) -> bool:
        """Adjust a streaming request in place; True if the usage event must be hidden."""
        return False

    def is_stream(self, result: object) -> bool:
        """Whether ``result`` is the SDK's stream object."""
        raise NotImplementedError

    def read_response(self, result: Any, tally: Tally) -> None:
        """Read usage (and, if captured, text) from a complete response."""
        raise NotImplementedError

    def read_event(self, event: Any, tally: Tally, hide_usage: bool) -> bool:
        """Read one stream event; True if the caller must not see it."""
        raise NotImplementedError

    def ends_stream(self, event: Any) -> bool:
        """Whether ``event`` is the last one of a stream (callers often stop reading there)."""
        return False


def begin_call(
    ctx: ExecutionContext,
    adapter: Adapter,
    info: RequestInfo,
    extra: Mapping[str, Any] | None = None,
    request: Mapping[str, Any] | None = None,
    refused: ExceededLimit | None = None,
) -> Call:
    """Begin and admit the node of one request (``LimitExceeded`` if it does not fit).

    ``request`` (the SDK call's keyword arguments) lets the context's policies see what is
    sent (the loop guard); ``refused`` is a budget-pressure hook's refusal to report.
    """
    meta: dict[str, Any] = {META_OPERATION: adapter.operation}
    if extra:
        meta.update(extra)
    if settings.capture_content:
        meta[META_PROMPT_TEXT] = info.prompt_text
    kind = adapter.kind
    if kind == "llm":
        call = ctx.llm_call(
            adapter.operation,
            model=info.model,
            max_tokens=info.max_tokens,
            prompt_text=info.prompt_text,
            provider=adapter.provider,
            metadata=meta,
            final=in_final_call(),
        )
    elif kind == "embedding":
        call = ctx.embedding_call(
            adapter.operation,
            model=info.model,
            prompt_text=info.prompt_text,
            provider=adapter.provider,
            metadata=meta,
        )
    else:
        meta[META_MODEL] = info.model
        meta[META_PROVIDER] = adapter.provider
        call = ctx.step(adapter.operation, kind=kind, metadata=meta)
    if request is not None and ctx.policies is not None:
        ctx.policies.mark_request(call, request, refused)
    try:
        call.start()
    except LimitExceeded as stop:
        note_stop(stop)  # frameworks may re-raise it as their own error: see find_limit_exceeded
        raise
    return call


def finish_call(call: Call, tally: Tally | None, exc: BaseException | None) -> None:
    """End a request's node with the usage read from its response (None: nothing was read)."""
    if tally is not None:
        tally.record_on(call)
        if tally.text:
            text = "".join(tally.text)
            call.context.graph.update_metadata(call.node_id, {META_RESPONSE_TEXT: text})
    call.finish(exc)


def finish_abandoned(call: Call, tally: Tally, prompt_tokens: int) -> None:
    """End the node of a stream closed before its last event.

    The provider bills a cut stream but its usage report (OpenAI's comes last) may not have
    arrived: count the prompt estimate and one token per content event, and say so on the node.
    """
    if tally.tokens_in is None or (tally.tokens_out or 0) < tally.chunks:
        if tally.tokens_in is None:
            tally.tokens_in = prompt_tokens
        tally.tokens_out = max(tally.tokens_out or 0, tally.chunks)
        call.context.graph.update_metadata(call.node_id, {META_USAGE_ESTIMATED: True})
    cut = StreamAbandoned("the stream was closed before its last event was read")
    finish_call(call, tally, cut)


def relieve_pressure(ctx: ExecutionContext, kwargs: dict[str, Any]) -> ExceededLimit | None:
    """Under budget pressure, let the context's ``on_budget_pressure`` hook change the request
    (``kwargs``, in place) or refuse it: the refusal, to report when the call is admitted."""
    policies = ctx.policies
    if policies is None or policies.pressure is None:
        return None
    return policies.relieve_pressure(ctx, kwargs)


def _before(
    ctx: ExecutionContext, adapter: Adapter, kwargs: dict[str, Any]
) -> tuple[Call, RequestInfo, bool]:
    """Admit a call (limits checked, node running) before the SDK sends it.

    Under budget pressure the context's ``on_budget_pressure`` hook may first change the
    request (``kwargs``, in place) or refuse it (the call is then refused at admission)."""
    refused = relieve_pressure(ctx, kwargs)
    info = adapter.request_info(kwargs)
    hide = adapter.prepare_stream(kwargs) if info.stream else False
    return begin_call(ctx, adapter, info, None, kwargs, refused), info, hide


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
        return stream_type(result, call, adapter, hide, info.prompt_tokens)
    tally = Tally()
    adapter.read_response(result, tally)
    finish_call(call, tally, None)
    return result


def _after_raw(result: Any, call: Call, adapter: Adapter, info: RequestInfo, hide: bool) -> Any:
    """:func:`_after` for a raw response whose ``parse()`` is sync (all but the async
    ``.with_streaming_response``)."""
    try:
        parsed = result.parse()
    except Exception:
        # The caller's own parse() will raise the same; the call was sent and answered.
        finish_call(call, Tally(), None)
        return result
    return _settle_parsed(result, parsed, call, adapter, info, hide, MeteredStream)


async def _after_raw_async(
    result: Any, call: Call, adapter: Adapter, info: RequestInfo, hide: bool
) -> Any:
    """:func:`_after_raw` for an async client's raw response (``parse()`` may be a coroutine)."""
    try:
        parsed = result.parse()
        if inspect.isawaitable(parsed):
            parsed = await parsed
    except Exception:
        finish_call(call, Tally(), None)
        return result
    return _settle_parsed(result, parsed, call, adapter, info, hide, MeteredAsyncStream)


def _settle_parsed(
    result: Any, parsed: Any, call: Call, adapter: Adapter, info: RequestInfo, hide: bool,
    stream_type: type,
) -> Any:  # fmt: skip
    if adapter.is_stream(parsed):
        metered = stream_type(parsed, call, adapter, hide, info.prompt_tokens)
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

    def __init__(self, raw: Any, stream: _StreamBase) -> None:
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

    def __init__(self, stream: _StreamBase) -> None:
        self._stream = stream
        self._body = BodyReader(stream._adapter, stream._tally, sse=True)

    def feed(self, piece: str | bytes, *, whole_line: bool) -> None:
        data = piece.encode() if isinstance(piece, str) else piece
        self._body.feed(data + b"\n" if whole_line else data)

    def end(self) -> None:
        self._body.end()
        self._stream._end(None)


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


def wrap_sync(adapter: Adapter, original: Callable[..., Any]) -> Callable[..., Any]:
    """A metered version of a sync SDK method."""

    @functools.wraps(original)
    def metered(resource: Any, *args: Any, **kwargs: Any) -> Any:
        ctx = metered_context()
        if ctx is None or ACTIVE_CALL.get() is not None:  # not in a context, or already metered
            return original(resource, *args, **kwargs)
        remember_client_key(resource)
        call, info, hide = _before(ctx, adapter, kwargs)
        raw = is_raw_request(kwargs)
        token = ACTIVE_CALL.set(call)
        try:
            result = original(resource, *args, **kwargs)
        except BaseException as exc:
            finish_call(call, None, exc)
            raise
        finally:
            ACTIVE_CALL.reset(token)
        if raw and hasattr(result, "parse"):
            return _after_raw(result, call, adapter, info, hide)
        return _after(result, call, adapter, info, hide, MeteredStream)

    metered.__ampmeter_original__ = original  # type: ignore[attr-defined]
    return metered


def wrap_async(adapter: Adapter, original: Callable[..., Any]) -> Callable[..., Any]:
    """A metered version of an async SDK method."""

    @functools.wraps(original)
    async def metered(resource: Any, *args: Any, **kwargs: Any) -> Any:
        ctx = metered_context()
        if ctx is None or ACTIVE_CALL.get() is not None:
            return await original(resource, *args, **kwargs)
        remember_client_key(resource)
        call, info, hide = _before(ctx, adapter, kwargs)
        raw = is_raw_request(kwargs)
        token = ACTIVE_CALL.set(call)
        try:
            result = await original(resource, *args, **kwargs)
        except BaseException as exc:
            finish_call(call, None, exc)
            raise
        finally:
            ACTIVE_CALL.reset(token)
        if raw and hasattr(result, "parse"):
            return await _after_raw_async(result, call, adapter, info, hide)
        return _after(result, call, adapter, info, hide, MeteredAsyncStream)

    metered.__ampmeter_original__ = original  # type: ignore[attr-defined]
    return metered


def metered_request(
    adapter: Adapter,
    info: RequestInfo,
    request: Callable[[], Any],
    kwargs: Mapping[str, Any] | None = None,
    refused: ExceededLimit | None = None,
) -> Callable[[], Any]:
    """Wrap a stream helper's deferred sync request (called when the helper is entered);
    ``kwargs`` and ``refused`` as for :func:`begin_call`."""

    def run() -> Any:
        ctx = metered_context()
        if ctx is None:
            return request()
        call = begin_call(ctx, adapter, info, None, kwargs, refused)
        token = ACTIVE_CALL.set(call)
        try:
            raw = request()
        except BaseException as exc:
            finish_call(call, None, exc)
            raise
        finally:
            ACTIVE_CALL.reset(token)
        return MeteredStream(raw, call, adapter, False, info.prompt_tokens)

    return run


async def metered_awaitable(
    adapter: Adapter,
    info: RequestInfo,
    request: Any,
    kwargs: Mapping[str, Any] | None = None,
    refused: ExceededLimit | None = None,
) -> Any:
    """Await a stream helper's deferred async request (a coroutine) as a metered call;
    ``kwargs`` and ``refused`` as for :func:`begin_call`."""
    ctx = metered_context()
    if ctx is None:
        return await request
    try:
        call = begin_call(ctx, adapter, info, None, kwargs, refused)
    except BaseException:
        close = getattr(request, "close", None)
        if close is not None:
            close()  # never sent: do not leave a never-awaited coroutine behind
        raise
    token = ACTIVE_CALL.set(call)
    try:
        raw = await request
    except BaseException as exc:
        finish_call(call, None, exc)
        raise
    finally:
        ACTIVE_CALL.reset(token)
    return MeteredAsyncStream(raw, call, adapter, False, info.prompt_tokens)


_OWN_ATTRS: Final = frozenset(
    {"_stream", "_prompt_tokens", "_call", "_adapter", "_hide", "_tally", "_done"}
)


class _StreamBase:
    """Bookkeeping shared by the sync and async stream wrappers."""

    def __init__(
        self, stream: Any, call: Call, adapter: Adapter, hide_usage: bool, prompt_tokens: int
    ) -> None:
        self._stream = stream
        self._prompt_tokens = prompt_tokens
        self._call = call
        self._adapter = adapter
        self._hide = hide_usage
        self._tally = Tally()
        self._done = False

    def _end(self, exc: BaseException | None) -> None:
        if self._done:
            return
        self._done = True
        finish_call(self._call, self._tally, exc)

    def _abandon(self) -> None:
        if not self._done:
            self._done = True
            finish_abandoned(self._call, self._tally, self._prompt_tokens)

    def __getattr__(self, name: str) -> Any:
        if name in _OWN_ATTRS:  # not set yet (a failed __init__): no recursion
            raise AttributeError(name)
        return getattr(self._stream, name)

    def __del__(self) -> None:
        # A stream dropped half-way is still counted (with the usage seen so far). Nothing can be
        # reported from a finalizer, and at interpreter exit module globals may be gone already.
        try:  # noqa: SIM105
            self._abandon()
        except Exception:
            pass

    @property
    def response(self) -> Any:
        """The HTTP response, wrapped so that closing it ends the call."""
        return _ResponseProxy(self._stream.response, self)


class _ResponseProxy:
    """An SDK HTTP response whose ``close()``/``aclose()`` also end the metered call.

    The SDKs' stream helpers close the response directly rather than the stream.
    """

    def __init__(self, response: Any, owner: _StreamBase) -> None:
        self._response = response
        self._owner = owner

    def close(self) -> None:
        try:
            self._response.close()
        finally:
            self._owner._abandon()

    async def aclose(self) -> None:
        try:
            await self._response.aclose()
        finally:
            self._owner._abandon()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._response, name)


class MeteredStream(_StreamBase):
    """A sync SDK stream that reports its usage to its call when it ends."""

    _iterator: Iterator[Any] | None = None

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        if self._iterator is None:
            self._iterator = iter(self._stream)
        adapter, tally, hide = self._adapter, self._tally, self._hide
        while True:
            try:
                event = next(self._iterator)
            except StopIteration:
                self._end(None)
                raise
            except BaseException as exc:
                self._end(exc)
                raise
            if not adapter.read_event(event, tally, hide):
                return event

    def close(self) -> None:
        """Close the stream; if it was not read to the end the call ends ``fail``."""
        try:
            self._stream.close()
        finally:
            self._abandon()

    def __enter__(self) -> MeteredStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class MeteredAsyncStream(_StreamBase):
    """An async SDK stream that reports its usage to its call when it ends."""

    _iterator: AsyncIterator[Any] | None = None

    def __aiter__(self) -> AsyncIterator[Any]:
        return self

    async def __anext__(self) -> Any:
        if self._iterator is None:
            self._iterator = self._stream.__aiter__()
        adapter, tally, hide = self._adapter, self._tally, self._hide
        while True:
            try:
                event = await self._iterator.__anext__()
            except StopAsyncIteration:
                self._end(None)
                raise
            except BaseException as exc:
                self._end(exc)
                raise
            if not adapter.read_event(event, tally, hide):
                return event

    async def close(self) -> None:
        """Close the stream; if it was not read to the end the call ends ``fail``."""
        try:
            await self._stream.close()
        finally:
            self._abandon()

    async def __aenter__(self) -> MeteredAsyncStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


@dataclass(slots=True)
class Patch:
    """One attribute replaced on a class, and how to put it back exactly."""

    owner: type
    name: str
    had_own: bool
    original: Any

    @classmethod
    def apply(cls, owner: type, name: str, replacement: Any) -> Patch:
        """Replace ``owner.name`` with ``replacement`` and remember the original."""
        had_own = name in owner.__dict__
        original = owner.__dict__.get(name)
        setattr(owner, name, replacement)
        return cls(owner, name, had_own, original)

    def undo(self) -> None:
        """Restore the original attribute (or remove the override if it was inherited)."""
        if self.had_own:
            setattr(self.owner, self.name, self.original)
        else:
            delattr(self.owner, self.name)


def patch_retry_sleep(owner: type, *, is_async: bool) -> Patch | None:
    """Count retries by hooking the SDK client's ``_sleep_for_retry`` (None if it has none)."""
    original = getattr(owner, "_sleep_for_retry", None)
    if original is None:
        return None
    if is_async:

        @functools.wraps(original)
        async def sleep_async(self: Any, *args: Any, **kwargs: Any) -> Any:
            count_retry()
            return await original(self, *args, **kwargs)

        return Patch.apply(owner, "_sleep_for_retry", sleep_async)

    @functools.wraps(original)
    def sleep(self: Any, *args: Any, **kwargs: Any) -> Any:
        count_retry()
        return original(self, *args, **kwargs)

    return Patch.apply(owner, "_sleep_for_retry", sleep)


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


def int_or_none(value: object) -> int | None:
    """``value`` if it is a real int (SDK ``omit``/``NOT_GIVEN`` sentinels become None)."""
    if type(value) is int or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    return None


# Whether a type is a Mapping, remembered: ``get`` runs several times per stream event, and an
# ABC isinstance check would cost more than the lookup itself.
_IS_MAPPING: dict[type, bool] = {dict: True, type(None): False}


def get(obj: Any, name: str) -> Any:
    """Attribute or mapping key ``name`` of ``obj`` (None when absent)."""
    mapping = _IS_MAPPING.get(type(obj))
    if mapping is None:
        mapping = _IS_MAPPING[type(obj)] = isinstance(obj, Mapping)
    return obj.get(name) if mapping else getattr(obj, name, None)


def get_int(obj: Any, name: str) -> int | None:
    """:func:`get` of a count: ``int_or_none(get(obj, name))``, with no second call for the
    usual plain int."""
    value = get(obj, name)
    return value if type(value) is int else int_or_none(value)


def patch_client_retries(base_client: Any) -> list[Patch]:
    """Count the retries of an SDK's sync and async base clients (its ``_base_client`` module)."""
    patches = []
    for client_cls, is_async in ((base_client.SyncAPIClient, False),
                                 (base_client.AsyncAPIClient, True)):  # fmt: skip
        patch = patch_retry_sleep(client_cls, is_async=is_async)
        if patch is not None:
            patches.append(patch)
    return patches


def undo_all(patches: list[Patch]) -> None:
    """Restore every patch, last applied first, and empty the list (idempotent)."""
    while patches:
        patches.pop().undo()


def patch_method(owner: type, name: str, adapter: Adapter, *, is_async: bool) -> Patch | None:
    """Meter ``owner.name`` (an SDK resource method); None when this SDK version lacks it."""
    original = owner.__dict__.get(name)
    if original is None:
        return None
    wrapper = wrap_async(adapter, original) if is_async else wrap_sync(adapter, original)
    return Patch.apply(owner, name, wrapper)
