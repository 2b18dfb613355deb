"""The Responses WebSocket protocol metered at the ``websockets`` client, whoever opened the
connection (openai-agents' and pydantic-ai's WebSocket modes, the ``openai`` SDK's
``responses.connect()``, or a program's own client): metered here, once.

``ClientConnection.send`` / ``recv`` / ``close`` of the sync and asyncio clients are wrapped,
and those of the legacy asyncio client (``websockets.legacy.client``, which
``websockets.client.connect`` still returns; deprecated since websockets 14, shipped until its
removal, announced for 2030) once a program imports it. Each text or binary frame holding a
``response.create`` event is one ``llm`` node, admitted before the frame is sent (a stop raises
``LimitExceeded`` and the frame never leaves). The server events read back are matched to their
response by the id ``response.created`` announces, and each node ends with the usage of
``response.completed`` / ``incomplete`` / ``failed``; an ``error`` event fails the oldest
response not yet named, free (it was refused), else ends the oldest as cut, charged what was
read (else its estimate). Responses still open when the connection closes end as abandoned
streams do.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Final

from ampmeter.integrations.attach import metered_context
from ampmeter.integrations.http import json_object
from ampmeter.integrations.lifecycle import (
    ACTIVE_REQUEST,
    META_TRANSPORT,
    Admitted,
    begin_call,
)
from ampmeter.integrations.openai import ResponsesAdapter
from ampmeter.integrations.patching import Patch, around, undo_all
from ampmeter.integrations.wire import get

__all__ = [
    "ResponseFailed",
    "instrument_websockets",
    "instrument_websockets_legacy",
    "uninstrument_websockets",
]

_MARK: Final = "response.create"
_ADAPTER: Final = ResponsesAdapter("responses.connect.create")
_ATTRIBUTE: Final = "_ampmeter_pending_responses"  # where a connection's responses live

_patches: list[Patch] = []


class ResponseFailed(Exception):
    """The server reported the response failed (recorded on the node, never raised)."""


@dataclass(slots=True)
class _Pending:
    """One response sent and not yet finished: its request, admitted, and the id the server
    named it by (``response.created``)."""

    admitted: Admitted
    response_id: str | None = None


@dataclass(slots=True)
class _Responses:
    """The responses of one connection, oldest first."""

    pending: list[_Pending] = field(default_factory=list)

    def admit(self, event: dict[str, Any]) -> _Pending | None:
        """Begin the node of a ``response.create`` event (None: not one, or not metered here;
        ``LimitExceeded`` when it would break a limit). Call before sending the frame."""
        if event.get("type") != _MARK or ACTIVE_REQUEST.get() is not None:
            return None
        ctx = metered_context()
        if ctx is None:
            return None
        model = event.get("model")
        model = model if isinstance(model, str) else None
        meta = {META_TRANSPORT: "websockets"}
        response = _Pending(begin_call(ctx, _ADAPTER, event, model, meta))
        self.pending.append(response)  # before sending: the answer may be read on another thread
        return response

    def not_sent(self, response: _Pending, exc: BaseException) -> None:
        """Sending the frame of ``response`` failed."""
        if response in self.pending:
            self.pending.remove(response)
        response.admitted.fail(exc)

    def observe(self, event: Any) -> None:
        """Read one server event into the response it belongs to."""
        queue = self.pending
        if not queue:
            return
        kind = get(event, "type")
        response_id = get(get(event, "response"), "id")
        if kind == "response.created":  # names the oldest response not yet named
            unnamed = next((p for p in queue if p.response_id is None), None)
            if unnamed is not None:
                unnamed.response_id = response_id
            return
        if kind == "error":
            message = get(event, "message") or get(get(event, "error"), "message")
            error = ResponseFailed(str(message or "error event"))
            unnamed = next((p for p in queue if p.response_id is None), None)
            if unnamed is not None:  # the oldest request not yet answered was refused
                queue.remove(unnamed)
                unnamed.admitted.fail(error)
            else:  # the response generating stopped: billed, it ends with what was read
                queue.pop(0).admitted.end(error)
            return
        pending = next((p for p in queue if response_id and p.response_id == response_id), queue[0])
        _ADAPTER.read_event(event, pending.admitted.tally, False)
        if pending.admitted.tally.complete:
            queue.remove(pending)
            failed = ResponseFailed("response.failed") if kind == "response.failed" else None
            pending.admitted.end(failed)

    def abandon_all(self) -> None:
        """The connection closed: every response still open ends as abandoned."""
        while self.pending:
            response = self.pending.pop(0)
            response.admitted.abandon()


def _admit(connection: Any, message: Any) -> _Pending | None:
    mark: Any = _MARK if isinstance(message, str) else _MARK.encode()
    if not isinstance(message, (str, bytes)) or mark not in message:  # most frames: no parse
        return None
    event = json_object(message)
    if event is None:
        return None
    responses: _Responses = vars(connection).setdefault(_ATTRIBUTE, _Responses())
    return responses.admit(event)


def _sending(connection: Any, message: Any, *args: Any, **kwargs: Any) -> Generator[None, Any, Any]:
    pending = _admit(connection, message)
    try:
        return (yield)
    except BaseException as exc:
        if pending is not None:  # admitted: the connection has its responses
            vars(connection)[_ATTRIBUTE].not_sent(pending, exc)
        raise


def _receiving(connection: Any, *args: Any, **kwargs: Any) -> Generator[None, Any, Any]:
    message = yield
    responses = vars(connection).get(_ATTRIBUTE)
    if responses is not None and responses.pending:  # read only while a response is open
        event = json_object(message)
        if event is not None:
            responses.observe(event)
    return message


def _closing(connection: Any, *args: Any, **kwargs: Any) -> Generator[None, Any, Any]:
    try:
        return (yield)
    finally:
        responses = vars(connection).get(_ATTRIBUTE)
        if responses is not None:
            responses.abandon_all()


_HOOKS: Final = {"send": _sending, "recv": _receiving, "close": _closing}


def _patch(*classes: type) -> None:
    for cls in classes:
        if not any(patch.owner is cls for patch in _patches):
            for name, hook in _HOOKS.items():
                _patches.append(Patch.apply(cls, name, around(getattr(cls, name), hook)))


def instrument_websockets(_module: ModuleType) -> None:
    """Meter the sync and asyncio ``websockets`` clients (idempotent)."""
    from websockets.asyncio.client import ClientConnection as AsyncClientConnection
    from websockets.sync.client import ClientConnection

    _patch(ClientConnection, AsyncClientConnection)


def instrument_websockets_legacy(module: ModuleType) -> None:
    """Meter the legacy asyncio client of ``module`` (``websockets.legacy.client``; idempotent).
    Patched on its import only: importing it warns of its deprecation."""
    _patch(module.WebSocketClientProtocol)


def uninstrument_websockets() -> None:
    """Restore the ``websockets`` clients, the legacy one included (idempotent)."""
    undo_all(_patches)
