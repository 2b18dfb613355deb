"""The Responses WebSocket protocol metered at the ``websockets`` client, whoever opened the
connection (openai-agents' and pydantic-ai's WebSocket modes, or a program's own client).

``ClientConnection.send`` / ``recv`` / ``close`` of the sync and asyncio clients are wrapped,
and those of the legacy asyncio client (``websockets.legacy.client``, which
``websockets.client.connect`` still returns; deprecated since websockets 14, shipped until its
removal, announced for 2030) once a program imports it:
a text or binary frame holding a ``response.create`` event is admitted before it is sent (a
stop raises ``LimitExceeded`` and the frame never leaves), and frames read back are matched to
their responses (:mod:`ampmeter.integrations.responses_socket`) while any is open. The
``openai`` SDK's ``responses.connect()`` sends through these clients: it is metered here, once.
"""

from __future__ import annotations

from collections.abc import Generator
from types import ModuleType
from typing import Any, Final

import orjson

from ampmeter.integrations.patching import Patch, around, undo_all
from ampmeter.integrations.responses_socket import PendingResponse, responses_on

__all__ = ["instrument_websockets", "instrument_websockets_legacy", "uninstrument_websockets"]

_MARK: Final = "response.create"
_TRANSPORT: Final = "websockets"

_patches: list[Patch] = []
_legacy_patches: list[Patch] = []


def _event(message: Any) -> Any:
    """The JSON event a frame carries, or None."""
    if not isinstance(message, (str, bytes, bytearray, memoryview)):
        return None
    try:
        event = orjson.loads(message)
    except orjson.JSONDecodeError:
        return None
    return event if isinstance(event, dict) else None


def _admit(connection: Any, message: Any) -> PendingResponse | None:
    if not isinstance(message, (str, bytes)):
        return None
    mark: Any = _MARK if isinstance(message, str) else _MARK.encode()
    if mark not in message:  # most frames: no parse
        return None
    event = _event(message)
    if event is None:
        return None
    responses = responses_on(connection)
    assert responses is not None
    return responses.admit(event, _TRANSPORT)


def _observe(connection: Any, message: Any) -> None:
    responses = responses_on(connection, create=False)
    if responses is not None and responses.pending:
        event = _event(message)
        if event is not None:
            responses.observe(event)


def _sending(connection: Any, message: Any, *args: Any, **kwargs: Any) -> Generator[None, Any, Any]:
    pending = _admit(connection, message)
    if pending is None:
        return (yield)
    try:
        return (yield)
    except BaseException as exc:
        responses = responses_on(connection, create=False)
        if responses is not None:
            responses.not_sent(pending, exc)
        raise


def _receiving(connection: Any, *args: Any, **kwargs: Any) -> Generator[None, Any, Any]:
    message = yield
    _observe(connection, message)
    return message


def _closing(connection: Any, *args: Any, **kwargs: Any) -> Generator[None, Any, Any]:
    try:
        return (yield)
    finally:
        responses = responses_on(connection, create=False)
        if responses is not None:
            responses.abandon_all()


_HOOKS: Final = {"send": _sending, "recv": _receiving, "close": _closing}


def _patch(cls: type, patches: list[Patch]) -> None:
    for name, hook in _HOOKS.items():
        patches.append(Patch.apply(cls, name, around(getattr(cls, name), hook)))


def instrument_websockets(_module: ModuleType) -> None:
    """Meter the sync and asyncio ``websockets`` clients (idempotent)."""
    if _patches:
        return
    from websockets.asyncio.client import ClientConnection as AsyncClientConnection
    from websockets.sync.client import ClientConnection

    _patch(ClientConnection, _patches)
    _patch(AsyncClientConnection, _patches)


def instrument_websockets_legacy(module: ModuleType) -> None:
    """Meter the legacy asyncio client of ``module`` (``websockets.legacy.client``; idempotent).
    Patched on its import only: importing it warns of its deprecation."""
    if _legacy_patches:
        return
    _patch(module.WebSocketClientProtocol, _legacy_patches)


def uninstrument_websockets() -> None:
    """Restore the ``websockets`` clients, the legacy one included (idempotent)."""
    undo_all(_patches)
    undo_all(_legacy_patches)
