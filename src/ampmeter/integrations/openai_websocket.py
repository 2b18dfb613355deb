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
from collections.abc import Callable
from typing import Any

from ampmeter.integrations.lifecycle import ACTIVE_CALL
from ampmeter.integrations.patching import Patch
from ampmeter.integrations.responses_socket import responses_on

__all__ = ["patch_responses_websocket"]


def _wrap_send(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def send(connection: Any, event: Any) -> Any:
        responses = responses_on(connection)
        assert responses is not None
        pending = responses.admit(event, "websocket")
        if pending is None:
            return original(connection, event)
        token = ACTIVE_CALL.set(pending.call)  # the websockets layer below leaves it alone
        try:
            return original(connection, event)
        except BaseException as exc:
            responses.not_sent(pending, exc)
            raise
        finally:
            ACTIVE_CALL.reset(token)

    return send


def _wrap_async_send(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def send(connection: Any, event: Any) -> Any:
        responses = responses_on(connection)
        assert responses is not None
        pending = responses.admit(event, "websocket")
        if pending is None:
            return await original(connection, event)
        token = ACTIVE_CALL.set(pending.call)
        try:
            return await original(connection, event)
        except BaseException as exc:
            responses.not_sent(pending, exc)
            raise
        finally:
            ACTIVE_CALL.reset(token)

    return send


def _wrap_parse_event(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def parse_event(connection: Any, data: Any) -> Any:
        event = original(connection, data)
        responses = responses_on(connection, create=False)
        if responses is not None:
            responses.observe(event)
        return event

    return parse_event


def _abandon_all(connection: Any) -> None:
    responses = responses_on(connection, create=False)
    if responses is not None:
        responses.abandon_all()


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
