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

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any, Final

import orjson

from ampmeter.integrations.patching import Patch, undo_all
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


def _not_sent(connection: Any, pending: PendingResponse, exc: BaseException) -> None:
    responses = responses_on(connection, create=False)
    if responses is not None:
        responses.not_sent(pending, exc)


def _abandon_all(connection: Any) -> None:
    responses = responses_on(connection, create=False)
    if responses is not None:
        responses.abandon_all()


def _sync_wrappers(cls: type) -> dict[str, Callable[..., Any]]:
    send, recv, close = cls.send, cls.recv, cls.close  # type: ignore[attr-defined]

    @functools.wraps(send)
    def metered_send(connection: Any, message: Any, *args: Any, **kwargs: Any) -> Any:
        pending = _admit(connection, message)
        if pending is None:
            return send(connection, message, *args, **kwargs)
        try:
            return send(connection, message, *args, **kwargs)
        except BaseException as exc:
            _not_sent(connection, pending, exc)
            raise

    @functools.wraps(recv)
    def metered_recv(connection: Any, *args: Any, **kwargs: Any) -> Any:
        message = recv(connection, *args, **kwargs)
        _observe(connection, message)
        return message

    @functools.wraps(close)
    def metered_close(connection: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return close(connection, *args, **kwargs)
        finally:
            _abandon_all(connection)

    return {"send": metered_send, "recv": metered_recv, "close": metered_close}


def _async_wrappers(cls: type) -> dict[str, Callable[..., Any]]:
    send, recv, close = cls.send, cls.recv, cls.close  # type: ignore[attr-defined]

    @functools.wraps(send)
    async def metered_send(connection: Any, message: Any, *args: Any, **kwargs: Any) -> Any:
        pending = _admit(connection, message)
        if pending is None:
            return await send(connection, message, *args, **kwargs)
        try:
            return await send(connection, message, *args, **kwargs)
        except BaseException as exc:
            _not_sent(connection, pending, exc)
            raise

    @functools.wraps(recv)
    async def metered_recv(connection: Any, *args: Any, **kwargs: Any) -> Any:
        message = await recv(connection, *args, **kwargs)
        _observe(connection, message)
        return message

    @functools.wraps(close)
    async def metered_close(connection: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await close(connection, *args, **kwargs)
        finally:
            _abandon_all(connection)

    return {"send": metered_send, "recv": metered_recv, "close": metered_close}


def instrument_websockets(_module: ModuleType) -> None:
    """Meter the sync and asyncio ``websockets`` clients (idempotent)."""
    if _patches:
        return
    from websockets.asyncio.client import ClientConnection as AsyncClientConnection
    from websockets.sync.client import ClientConnection

    for cls, wrappers in (
        (ClientConnection, _sync_wrappers(ClientConnection)),
        (AsyncClientConnection, _async_wrappers(AsyncClientConnection)),
    ):
        for name, wrapper in wrappers.items():
            _patches.append(Patch.apply(cls, name, wrapper))


def instrument_websockets_legacy(module: ModuleType) -> None:
    """Meter the legacy asyncio client of ``module`` (``websockets.legacy.client``; idempotent).
    Patched on its import only: importing it warns of its deprecation."""
    if _legacy_patches:
        return
    cls = module.WebSocketClientProtocol
    for name, wrapper in _async_wrappers(cls).items():
        _legacy_patches.append(Patch.apply(cls, name, wrapper))


def uninstrument_websockets() -> None:
    """Restore the ``websockets`` clients, the legacy one included (idempotent)."""
    undo_all(_patches)
    undo_all(_legacy_patches)
