"""The Responses API's WebSocket mode (``client.responses.connect()``), metered per response.

One connection carries many responses. Each ``response.create`` event sent on it is one ``llm``
node: it is admitted (limits checked, estimate reserved) before the event is sent, so a stop
raises ``LimitExceeded`` and nothing leaves. The server events read back (``recv()``, iterating
the connection: both parse through ``parse_event``) are matched to their response by the id
that ``response.created`` announces, and the node ends with the usage of
``response.completed`` / ``incomplete`` / ``failed``. Responses still open when the connection
closes end as abandoned streams do. Raw reads (``recv_bytes()`` without ``parse_event``) are
not seen, so their usage is not read.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from ampmeter.context import Call
from ampmeter.integrations.adapter import Tally
from ampmeter.integrations.attach import metered_context
from ampmeter.integrations.lifecycle import (
    META_TRANSPORT,
    begin_call,
    finish_abandoned,
    finish_call,
)
from ampmeter.integrations.openai import ResponsesAdapter
from ampmeter.integrations.patching import Patch
from ampmeter.integrations.wire import get

__all__ = ["patch_responses_websocket"]

_ADAPTER: Final = ResponsesAdapter("responses.connect.create", ())
_PENDING: Final = "_ampmeter_pending_responses"  # the attribute a connection's queue lives in


class ResponseFailed(Exception):
    """The server reported the response failed (recorded on the node, never raised)."""


@dataclass(slots=True)
class _Pending:
    call: Call
    input_tokens: int
    tally: Tally = field(default_factory=Tally)
    response_id: str | None = None


def _queue(connection: Any) -> list[_Pending]:
    queue: list[_Pending] | None = connection.__dict__.get(_PENDING)
    if queue is None:
        queue = []
        setattr(connection, _PENDING, queue)
    return queue


def _admit(event: Any) -> _Pending | None:
    if get(event, "type") != "response.create":
        return None
    ctx = metered_context()
    if ctx is None:
        return None
    body = event if isinstance(event, Mapping) else event.to_dict()
    info = _ADAPTER.request_info(body)
    call = begin_call(ctx, _ADAPTER, info, {META_TRANSPORT: "websocket"}, body)
    return _Pending(call, info.input_tokens)


def _observe(queue: list[_Pending], event: Any) -> None:
    """Read one server event into the response it belongs to."""
    if not queue:
        return
    kind = get(event, "type")
    response_id = get(get(event, "response"), "id")
    if kind == "response.created":
        for pending in queue:
            if pending.response_id is None:
                pending.response_id = response_id
                return
        return
    if kind == "error":  # the oldest request not yet answered was refused
        pending = next((p for p in queue if p.response_id is None), queue[0])
        queue.remove(pending)
        message = get(get(event, "error"), "message")
        finish_call(pending.call, None, ResponseFailed(str(message or "error event")))
        return
    pending = next((p for p in queue if response_id and p.response_id == response_id), queue[0])
    _ADAPTER.read_event(event, pending.tally, False)
    if _ADAPTER.ends_stream(event):
        queue.remove(pending)
        failed = ResponseFailed("response.failed") if kind == "response.failed" else None
        finish_call(pending.call, pending.tally, failed)


def _abandon_all(connection: Any) -> None:
    queue = connection.__dict__.get(_PENDING)
    while queue:
        pending = queue.pop(0)
        finish_abandoned(pending.call, pending.tally, pending.input_tokens)


def _wrap_send(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def send(connection: Any, event: Any) -> Any:
        pending = _admit(event)
        if pending is None:
            return original(connection, event)
        queue = _queue(connection)
        queue.append(pending)  # before sending: the answer may be read on another thread
        try:
            return original(connection, event)
        except BaseException as exc:
            queue.remove(pending)
            finish_call(pending.call, None, exc)
            raise

    return send


def _wrap_async_send(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def send(connection: Any, event: Any) -> Any:
        pending = _admit(event)
        if pending is None:
            return await original(connection, event)
        queue = _queue(connection)
        queue.append(pending)
        try:
            return await original(connection, event)
        except BaseException as exc:
            queue.remove(pending)
            finish_call(pending.call, None, exc)
            raise

    return send


def _wrap_parse_event(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def parse_event(connection: Any, data: Any) -> Any:
        event = original(connection, data)
        queue = connection.__dict__.get(_PENDING)
        if queue:
            _observe(queue, event)
        return event

    return parse_event


def _wrap_close(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def close(connection: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return original(connection, *args, **kwargs)
        finally:
            _abandon_all(connection)

    return close


def _wrap_async_close(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def close(connection: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await original(connection, *args, **kwargs)
        finally:
            _abandon_all(connection)

    return close


def patch_responses_websocket() -> list[Patch]:
    """Meter the Responses WebSocket connections of the installed SDK (none if it has none)."""
    try:
        from openai.resources.responses.responses import (
            AsyncResponsesConnection,
            ResponsesConnection,
        )
    except ImportError:  # an SDK from before the WebSocket mode
        return []
    patches = []
    for owner, is_async in ((ResponsesConnection, False), (AsyncResponsesConnection, True)):
        send = owner.__dict__["send"]
        metered_send = _wrap_async_send(send) if is_async else _wrap_send(send)
        patches.append(Patch.apply(owner, "send", metered_send))
        parse = owner.__dict__["parse_event"]
        patches.append(Patch.apply(owner, "parse_event", _wrap_parse_event(parse)))
        close = owner.close
        wrapped = _wrap_async_close(close) if is_async else _wrap_close(close)
        patches.append(Patch.apply(owner, "close", wrapped))
    return patches
