"""DSPy's native engine, metered at its request/response boundary.

DSPy 3's default engine (``LM15Engine`` and ``AsyncLM15Engine``, its vendored ``lm15`` client)
sends requests over its own stdlib sockets, below no SDK and no HTTP library ampmeter patches.
Every request DSPy sends through it passes one of four methods, each taking one
``dspy.lm15.Request``: ``complete`` (a ``Response``) and ``stream`` (a generator of events), sync
and async. Those are wrapped: the request is measured (:mod:`.dspy_request`) and admitted before
the engine runs, so a limit stops it before a byte is sent (DSPy raises the stop inside its own
``LM`` error, the stop in its chain: :func:`ampmeter.find_limit_exceeded`), and the node ends
with the usage the response (or the stream's end event) reports. A stream cut before its end is
charged as any cut stream. DSPy's retries call the engine again: each attempt is its own node.

DSPy's LiteLLM engine is not patched here: LiteLLM's requests are metered by the SDK and HTTP
layers, once. Budget-pressure hooks that rewrite a request (a downgrade, the budget told to the
model) do not apply to these requests: lm15's requests are immutable.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Final

from ampmeter.context import Call, ExecutionContext
from ampmeter.integrations.adapter import Adapter, RequestInfo, Tally
from ampmeter.integrations.attach import metered_context
from ampmeter.integrations.dspy_request import (
    USAGE_FAMILIES,
    count_tool_calls,
    read_usage,
    request_body,
    wire_of,
)
from ampmeter.integrations.lifecycle import (
    ACTIVE_CALL,
    begin_call,
    finish_abandoned,
    finish_call,
    settings,
)
from ampmeter.integrations.patching import Patch, undo_all
from ampmeter.pricing import request_size
from ampmeter.pricing.request_size import Wire

__all__ = ["instrument_dspy", "uninstrument_dspy"]

# lm15's provider names that ampmeter's pricing knows by another name.
_PROVIDERS: Final = {"openai-chat": "openai", "openai": "openai", "gemini": "google"}
_ENGINES: Final = ("LM15Engine", "AsyncLM15Engine")

_patches: list[Patch] = []


class _EngineAdapter(Adapter):
    """A DSPy engine request's node: its provider, operation and wire format."""

    def __init__(self, provider: str, operation: str, wire: Wire) -> None:
        self.provider = provider
        self.operation = operation
        self.wire = wire


_adapters: dict[tuple[str, str, str], _EngineAdapter] = {}


@dataclass(frozen=True, slots=True)
class _Metered:
    """A request admitted: its call, the request's measure and model, how usage is counted."""

    call: Call
    info: RequestInfo
    provider: str
    family: str | None


def _begin(ctx: ExecutionContext, engine: Any, request: Any, stream: bool) -> _Metered | None:
    """Measure and admit ``request`` (``LimitExceeded`` if it does not fit); None when the
    engine cannot route it (it then refuses the request itself, before sending anything)."""
    try:
        route = engine.resolve(request.model)
        config = request.config
    except Exception:
        return None
    wire = wire_of(route.adapter)
    provider = _PROVIDERS.get(route.provider, route.provider)
    operation = "dspy.stream" if stream else "dspy.complete"
    key = (provider, operation, wire)
    adapter = _adapters.get(key)
    if adapter is None:
        adapter = _adapters[key] = _EngineAdapter(provider, operation, wire)
    body = request_body(wire, route.model, request)
    info = RequestInfo(route.model, request_size.measure(wire, body), config.max_tokens, stream)
    call = begin_call(ctx, adapter, info, None, body)
    return _Metered(call, info, provider, USAGE_FAMILIES.get(route.adapter))


def _read_response(response: Any, metered: _Metered) -> Tally:
    tally = Tally()
    tally.note_response_id(metered.provider, getattr(response, "id", None))
    read_usage(getattr(response, "usage", None), metered.family, tally)
    message = getattr(response, "message", None)
    parts = getattr(message, "parts", ())
    tally.tool_calls = count_tool_calls(parts)
    if settings.capture_content:
        text = getattr(response, "text", None)
        if isinstance(text, str):
            tally.keep_text(text)
    return tally


def _read_event(event: Any, tally: Tally, metered: _Metered) -> None:
    kind = getattr(event, "type", None)
    if kind == "start":
        tally.note_response_id(metered.provider, getattr(event, "id", None))
    elif kind == "delta":
        delta = getattr(event, "delta", None)
        tally.chunks += 1
        if getattr(delta, "type", None) == "tool_call" and getattr(delta, "name", None):
            tally.tool_calls += 1  # a call's first delta names it
        text = getattr(delta, "text", None)
        if settings.capture_content and isinstance(text, str):
            tally.keep_text(text)
    elif kind == "end":
        read_usage(getattr(event, "usage", None), metered.family, tally)
        tally.complete = True


def _wrap_complete(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def complete(engine: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        ctx = metered_context()
        metered = None
        if ctx is not None and ACTIVE_CALL.get() is None:
            metered = _begin(ctx, engine, request, stream=False)
        if metered is None:
            return original(engine, request, *args, **kwargs)
        token = ACTIVE_CALL.set(metered.call)
        try:
            response = original(engine, request, *args, **kwargs)
        except BaseException as exc:
            finish_call(metered.call, None, exc)
            raise
        finally:
            ACTIVE_CALL.reset(token)
        finish_call(metered.call, _read_response(response, metered), None)
        return response

    return complete


def _wrap_async_complete(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def complete(engine: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        ctx = metered_context()
        metered = None
        if ctx is not None and ACTIVE_CALL.get() is None:
            metered = _begin(ctx, engine, request, stream=False)
        if metered is None:
            return await original(engine, request, *args, **kwargs)
        token = ACTIVE_CALL.set(metered.call)
        try:
            response = await original(engine, request, *args, **kwargs)
        except BaseException as exc:
            finish_call(metered.call, None, exc)
            raise
        finally:
            ACTIVE_CALL.reset(token)
        finish_call(metered.call, _read_response(response, metered), None)
        return response

    return complete


class _StreamEnd:
    """How a metered stream's node ends: once, at its end event, error or cut."""

    __slots__ = ("done", "metered", "tally")

    def __init__(self, metered: _Metered) -> None:
        self.metered = metered
        self.tally = Tally()
        self.done = False

    def read(self, event: Any) -> None:
        _read_event(event, self.tally, self.metered)
        if self.tally.complete:
            self.finish(None)  # the caller may stop reading at the end event

    def finish(self, exc: BaseException | None) -> None:
        if not self.done:
            self.done = True
            finish_call(self.metered.call, self.tally, exc)

    def cut(self) -> None:
        if not self.done:
            self.done = True
            finish_abandoned(self.metered.call, self.tally, self.metered.info)


def _wrap_stream(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def stream(engine: Any, request: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
        # A generator, as the engine's own: nothing is admitted or sent until it is read.
        ctx = metered_context()
        metered = None
        if ctx is not None and ACTIVE_CALL.get() is None:
            metered = _begin(ctx, engine, request, stream=True)
        events = original(engine, request, *args, **kwargs)
        if metered is None:
            yield from events
            return
        end = _StreamEnd(metered)
        try:
            while True:
                # Marked active only while the engine works: the caller's own calls between
                # events are not this request's.
                token = ACTIVE_CALL.set(metered.call)
                try:
                    event = next(events)
                except StopIteration:
                    break
                finally:
                    ACTIVE_CALL.reset(token)
                end.read(event)
                yield event
        except GeneratorExit:
            events.close()
            end.cut()
            raise
        except BaseException as exc:
            end.finish(exc)
            raise
        if end.tally.complete:
            end.finish(None)
        else:
            end.cut()

    return stream


def _wrap_async_stream(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def stream(engine: Any, request: Any, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        ctx = metered_context()
        metered = None
        if ctx is not None and ACTIVE_CALL.get() is None:
            metered = _begin(ctx, engine, request, stream=True)
        events = original(engine, request, *args, **kwargs)
        if metered is None:
            async for event in events:
                yield event
            return
        end = _StreamEnd(metered)
        try:
            while True:
                token = ACTIVE_CALL.set(metered.call)
                try:
                    event = await events.__anext__()
                except StopAsyncIteration:
                    break
                finally:
                    ACTIVE_CALL.reset(token)
                end.read(event)
                yield event
        except GeneratorExit:
            await events.aclose()
            end.cut()
            raise
        except BaseException as exc:
            end.finish(exc)
            raise
        if end.tally.complete:
            end.finish(None)
        else:
            end.cut()

    return stream


_WRAPPERS: Final = {
    "LM15Engine": (("complete", _wrap_complete), ("stream", _wrap_stream)),
    "AsyncLM15Engine": (("complete", _wrap_async_complete), ("stream", _wrap_async_stream)),
}


def instrument_dspy(module: ModuleType) -> None:
    """Meter the native engines of ``module`` (``dspy.clients.engines.lm15_engine``;
    idempotent)."""
    if _patches:
        return
    for engine_name in _ENGINES:
        engine = getattr(module, engine_name, None)
        if not isinstance(engine, type):
            continue
        for method, wrap in _WRAPPERS[engine_name]:
            original = engine.__dict__.get(method)
            if callable(original):
                _patches.append(Patch.apply(engine, method, wrap(original)))


def uninstrument_dspy() -> None:
    """Put the engines' methods back (idempotent)."""
    undo_all(_patches)
