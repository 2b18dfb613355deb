"""The Responses WebSocket protocol, metered per response on one connection.

Each ``response.create`` event sent is one ``llm`` node, admitted (limits checked, estimate
reserved) before the frame is sent. The server events read back are matched to their response
by the id ``response.created`` announces, and each node ends with the usage of
``response.completed`` / ``incomplete`` / ``failed``; an ``error`` event fails the oldest
response not yet answered. Responses still open when the connection closes end as abandoned
streams do. Metered at the ``websockets`` client (:mod:`ampmeter.integrations.websocket_client`),
whoever opened the connection: the ``openai`` SDK's ``responses.connect()`` included.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from ampmeter.context import Call
from ampmeter.integrations.adapter import RequestInfo, Tally
from ampmeter.integrations.attach import metered_context
from ampmeter.integrations.lifecycle import (
    ACTIVE_CALL,
    META_TRANSPORT,
    begin_call,
    finish_abandoned,
    finish_call,
)
from ampmeter.integrations.openai import ResponsesAdapter
from ampmeter.integrations.wire import get

__all__ = ["PendingResponse", "ResponseFailed", "ResponsesOnSocket", "responses_on"]

_ADAPTER: Final = ResponsesAdapter("responses.connect.create")
_ATTRIBUTE: Final = "_ampmeter_pending_responses"  # where a connection's responses live


class ResponseFailed(Exception):
    """The server reported the response failed (recorded on the node, never raised)."""


@dataclass(slots=True)
class PendingResponse:
    """One response sent and not yet finished."""

    call: Call
    info: RequestInfo
    tally: Tally = field(default_factory=Tally)
    response_id: str | None = None


class ResponsesOnSocket:
    """The responses of one connection, oldest first."""

    __slots__ = ("pending",)

    def __init__(self) -> None:
        self.pending: list[PendingResponse] = []

    def admit(self, event: Any, transport: str) -> PendingResponse | None:
        """Begin the node of a ``response.create`` event (None: not one, or not metered here;
        ``LimitExceeded`` when it would break a limit). Call before sending the frame."""
        if get(event, "type") != "response.create" or ACTIVE_CALL.get() is not None:
            return None
        ctx = metered_context()
        if ctx is None:
            return None
        body = event if isinstance(event, Mapping) else event.to_dict()
        info = _ADAPTER.request_info(body)
        call = begin_call(ctx, _ADAPTER, info, {META_TRANSPORT: transport}, body)
        response = PendingResponse(call, info)
        self.pending.append(response)  # before sending: the answer may be read on another thread
        return response

    def not_sent(self, response: PendingResponse, exc: BaseException) -> None:
        """Sending the frame of ``response`` failed."""
        if response in self.pending:
            self.pending.remove(response)
        finish_call(response.call, None, exc)

    def observe(self, event: Any) -> None:
        """Read one server event into the response it belongs to."""
        queue = self.pending
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
        if pending.tally.complete:
            queue.remove(pending)
            failed = ResponseFailed("response.failed") if kind == "response.failed" else None
            finish_call(pending.call, pending.tally, failed)

    def abandon_all(self) -> None:
        """The connection closed: every response still open ends as abandoned."""
        while self.pending:
            response = self.pending.pop(0)
            finish_abandoned(response.call, response.tally, response.info)


def responses_on(connection: Any, *, create: bool = True) -> ResponsesOnSocket | None:
    """The responses of ``connection`` (made on first use unless ``create`` is False)."""
    found: ResponsesOnSocket | None = connection.__dict__.get(_ATTRIBUTE)
    if found is None and create:
        found = ResponsesOnSocket()
        setattr(connection, _ATTRIBUTE, found)
    return found
