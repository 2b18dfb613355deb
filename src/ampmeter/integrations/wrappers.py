"""SDK methods made metered: sync and async resource methods, and deferred stream requests.

* no current context: the original method runs untouched (one contextvar lookup);
* otherwise an ``llm`` node is begun under the current node, the context reserves the call's
  estimate and checks its limits (``LimitExceeded`` is raised before any request is built),
  the SDK call runs, and the node ends with the usage the provider reported (for a stream, when
  it ends: :mod:`ampmeter.integrations.streams`). The caller gets the SDK's own objects.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from ampmeter import redact
from ampmeter.context import Call, ExecutionContext, configured_policies
from ampmeter.integrations.adapter import Adapter, RequestInfo, Tally
from ampmeter.integrations.attach import metered_context
from ampmeter.integrations.lifecycle import (
    ACTIVE_CALL,
    begin_call,
    finish_call,
    relieve_pressure,
)
from ampmeter.integrations.raw import after_raw, after_raw_async, is_raw_request
from ampmeter.integrations.streams import MeterStream, meter_async_stream, meter_stream
from ampmeter.limits import ExceededLimit

__all__ = [
    "metered_awaitable",
    "metered_request",
    "wrap_async",
    "wrap_sync",
]


def _before(
    ctx: ExecutionContext, adapter: Adapter, resource: Any, kwargs: dict[str, Any]
) -> tuple[Call, RequestInfo, bool]:
    """Admit a call (limits checked, node running) before the SDK of ``resource`` sends it.

    The SDK client's credentials are scrubbed from error texts from then on (a provider's error
    body may echo its key). Under budget pressure the context's ``on_budget_pressure`` hook may
    first change the request (``kwargs``, in place) or refuse it (the call is then refused at
    admission)."""
    redact.remember_client(getattr(resource, "_client", None))  # the Stainless resource's client
    refused = notes = None
    if configured_policies(ctx).shapes_requests:
        refused, notes = relieve_pressure(ctx, adapter, kwargs)
    info = adapter.request_info(kwargs)
    hide = adapter.prepare_stream(kwargs) if info.stream else False
    return begin_call(ctx, adapter, info, notes, kwargs, refused), info, hide


def _after(
    result: Any, call: Call, adapter: Adapter, info: RequestInfo, hide: bool, meter: MeterStream
) -> Any:
    """Meter a stream in place, or record a whole response's usage and end the call; either
    way the SDK's own object is handed back."""
    if isinstance(result, adapter.stream_types):
        meter(result, call, adapter, hide, info)
        return result
    tally = Tally()
    adapter.read_response(result, tally)
    finish_call(call, tally, None)
    return result


def wrap_sync(adapter: Adapter, original: Callable[..., Any]) -> Callable[..., Any]:
    """A metered version of a sync SDK method."""

    @functools.wraps(original)
    def metered(resource: Any, *args: Any, **kwargs: Any) -> Any:
        ctx = metered_context()
        if ctx is None or ACTIVE_CALL.get() is not None:  # not in a context, or already metered
            return original(resource, *args, **kwargs)
        call, info, hide = _before(ctx, adapter, resource, kwargs)
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
            return after_raw(result, call, adapter, info, hide)
        return _after(result, call, adapter, info, hide, meter_stream)

    metered.__ampmeter_original__ = original  # type: ignore[attr-defined]
    return metered


def wrap_async(adapter: Adapter, original: Callable[..., Any]) -> Callable[..., Any]:
    """A metered version of an async SDK method."""

    @functools.wraps(original)
    async def metered(resource: Any, *args: Any, **kwargs: Any) -> Any:
        ctx = metered_context()
        if ctx is None or ACTIVE_CALL.get() is not None:
            return await original(resource, *args, **kwargs)
        call, info, hide = _before(ctx, adapter, resource, kwargs)
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
            return await after_raw_async(result, call, adapter, info, hide)
        return _after(result, call, adapter, info, hide, meter_async_stream)

    metered.__ampmeter_original__ = original  # type: ignore[attr-defined]
    return metered


def metered_request(
    adapter: Adapter,
    info: RequestInfo,
    request: Callable[[], Any],
    kwargs: Mapping[str, Any] | None = None,
    refused: ExceededLimit | None = None,
    notes: Mapping[str, Any] | None = None,
) -> Callable[[], Any]:
    """Wrap a stream helper's deferred sync request (called when the helper is entered);
    ``kwargs``, ``refused`` and ``notes`` (``extra``) as for :func:`begin_call`."""

    def run() -> Any:
        ctx = metered_context()
        if ctx is None:
            return request()
        call = begin_call(ctx, adapter, info, notes, kwargs, refused)
        token = ACTIVE_CALL.set(call)
        try:
            raw = request()
        except BaseException as exc:
            finish_call(call, None, exc)
            raise
        finally:
            ACTIVE_CALL.reset(token)
        meter_stream(raw, call, adapter, False, info)
        return raw

    return run


async def metered_awaitable(
    adapter: Adapter,
    info: RequestInfo,
    request: Any,
    kwargs: Mapping[str, Any] | None = None,
    refused: ExceededLimit | None = None,
    notes: Mapping[str, Any] | None = None,
) -> Any:
    """Await a stream helper's deferred async request (a coroutine) as a metered call;
    ``kwargs``, ``refused`` and ``notes`` (``extra``) as for :func:`begin_call`."""
    ctx = metered_context()
    if ctx is None:
        return await request
    try:
        call = begin_call(ctx, adapter, info, notes, kwargs, refused)
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
    meter_async_stream(raw, call, adapter, False, info)
    return raw
