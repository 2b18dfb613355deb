"""DSPy's native engine, metered at its request/response boundary.

DSPy 3's default engine (``LM15Engine`` and ``AsyncLM15Engine``, its vendored ``lm15`` client)
sends over its own stdlib sockets, below every SDK and HTTP library ampmeter patches. Each
request passes ``complete`` (a ``Response``) or ``stream`` (a generator of events), sync or
async, with one ``dspy.lm15.Request``: it is measured (:mod:`.dspy_request`) and admitted before
the engine runs, and its node ends with the usage the response (or the stream's end event)
reports. Budget-pressure hooks that rewrite a request (a downgrade, the budget told to the
model) do not apply here: lm15's requests are immutable. DSPy's LiteLLM engine is metered by
the layers above, once.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from contextlib import aclosing, closing, contextmanager
from types import ModuleType
from typing import Any, Final

from ampmeter.integrations.adapter import Adapter, Tally
from ampmeter.integrations.attach import metered_context
from ampmeter.integrations.dspy_request import (
    USAGE_FAMILIES,
    read_usage,
    request_body,
    wire_of,
)
from ampmeter.integrations.lifecycle import (
    ACTIVE_REQUEST,
    Admitted,
    begin_call,
    settings,
)
from ampmeter.integrations.patching import Patch, around, undo_all
from ampmeter.pricing.request_size import Wire

__all__ = ["instrument_dspy", "uninstrument_dspy"]

# lm15's provider names that ampmeter's pricing knows by another name.
_PROVIDERS: Final = {"openai-chat": "openai", "openai": "openai", "gemini": "google"}
_END: Final = object()  # an engine stream's end
_WRITTEN: Final = frozenset({"text", "thinking", "tool_call"})  # deltas the model wrote

_patches: list[Patch] = []


class _EngineAdapter(Adapter):
    """A DSPy engine request's node and how its responses and stream events are read: its
    provider, operation, wire format and how its provider counts usage."""

    def __init__(self, provider: str, operation: str, wire: Wire, family: str | None) -> None:
        super().__init__(operation)
        self.provider = provider
        self.wire = wire
        self.family = family

    def read_response(self, result: Any, tally: Tally) -> None:
        tally.response_id = getattr(result, "id", None)
        read_usage(getattr(result, "usage", None), self.family, tally)
        message = getattr(result, "message", None)
        kinds = (getattr(part, "type", None) for part in getattr(message, "parts", ()))
        tally.tool_calls = sum(kind == "tool_call" for kind in kinds)
        if settings.capture_content:
            text = getattr(result, "text", None)
            if isinstance(text, str):
                tally.keep_text(text)

    def read_event(self, event: Any, tally: Tally, hide_usage: bool) -> bool:
        kind = getattr(event, "type", None)
        if kind == "start":
            tally.response_id = getattr(event, "id", None)
        elif kind == "delta":
            delta = getattr(event, "delta", None)
            tally.chunks += 1
            kind = getattr(delta, "type", None)
            text = getattr(delta, "text", None)
            if kind == "tool_call":
                if getattr(delta, "name", None):
                    tally.tool_calls += 1  # a call's first delta names it
                text = getattr(delta, "input", None)  # (its arguments: written, not kept)
            elif settings.capture_content and isinstance(text, str):
                tally.keep_text(text)
            # What a cut stream is charged for (:mod:`.unreported`): what the model wrote.
            if kind in _WRITTEN and isinstance(text, str):
                tally.chars += len(text)
        elif kind == "end":
            read_usage(getattr(event, "usage", None), self.family, tally)
            tally.complete = True
        return False


_adapter = functools.cache(_EngineAdapter)  # one per (provider, operation, wire, family)


def _admit(engine: Any, request: Any, stream: bool) -> Admitted | None:
    """Measure and admit ``request`` (``LimitExceeded`` if it does not fit); None when no
    context meters it here, or the engine cannot route it (it then refuses the request
    itself, before sending anything)."""
    ctx = metered_context()
    if ctx is None or ACTIVE_REQUEST.get() is not None:
        return None
    try:
        route = engine.resolve(request.model)
    except Exception:
        return None
    wire = wire_of(route.adapter)
    provider = _PROVIDERS.get(route.provider, route.provider)
    operation = "dspy.stream" if stream else "dspy.complete"
    adapter = _adapter(provider, operation, wire, USAGE_FAMILIES.get(route.adapter))
    body = request_body(wire, route.model, request)
    return begin_call(ctx, adapter, body, route.model)


def _completing(engine: Any, request: Any, *args: Any, **kwargs: Any) -> Generator[None, Any, Any]:
    """Around ``complete``: admitted before the engine runs, ended with the response's usage."""
    admitted = _admit(engine, request, stream=False)
    if admitted is None:
        return (yield)
    with admitted:
        response = yield
    admitted.read_whole(response)
    return response


@contextmanager
def _settled(meter: Admitted) -> Iterator[None]:
    """End a stream's node as its reading ends: with the usage of its end event, as cut when
    closed or exhausted before that event, or with the error that stops the reading."""
    try:
        yield
    except GeneratorExit:
        meter.abandon()
        raise
    except BaseException as exc:
        meter.end(exc)
        raise
    if meter.tally.complete:
        meter.end(None)
    else:
        meter.abandon()


@contextmanager
def _active(admitted: Admitted) -> Iterator[None]:
    """Mark ``admitted`` active only while the engine works: the caller's own calls between
    events are not this request's."""
    token = ACTIVE_REQUEST.set(admitted)
    try:
        yield
    finally:
        ACTIVE_REQUEST.reset(token)


def _wrap_stream(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def stream(engine: Any, request: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
        # A generator, as the engine's own: nothing is admitted or sent until it is read.
        admitted = _admit(engine, request, stream=True)
        events = original(engine, request, *args, **kwargs)
        if admitted is None:
            yield from events
            return
        with _settled(admitted), closing(events):
            while True:
                with _active(admitted):
                    event = next(events, _END)
                if event is _END:
                    break
                admitted.read(event)
                yield event

    return stream


def _wrap_async_stream(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def stream(engine: Any, request: Any, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        admitted = _admit(engine, request, stream=True)
        events = original(engine, request, *args, **kwargs)
        if admitted is None:
            async for event in events:
                yield event
            return
        with _settled(admitted):
            async with aclosing(events):
                while True:
                    with _active(admitted):
                        event = await anext(events, _END)
                    if event is _END:
                        break
                    admitted.read(event)
                    yield event

    return stream


_STREAMS: Final = {"LM15Engine": _wrap_stream, "AsyncLM15Engine": _wrap_async_stream}


def instrument_dspy(module: ModuleType) -> None:
    """Meter the native engines of ``module`` (``dspy.clients.engines.lm15_engine``;
    idempotent)."""
    if _patches:
        return
    for engine_name, wrap_stream in _STREAMS.items():
        engine = getattr(module, engine_name, None)
        if not isinstance(engine, type):
            continue
        complete, stream = engine.__dict__.get("complete"), engine.__dict__.get("stream")
        if callable(complete):
            _patches.append(Patch.apply(engine, "complete", around(complete, _completing)))
        if callable(stream):
            _patches.append(Patch.apply(engine, "stream", wrap_stream(stream)))


def uninstrument_dspy() -> None:
    """Put the engines' methods back (idempotent)."""
    undo_all(_patches)
