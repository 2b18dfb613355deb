"""Patching: attributes replaced on a library's classes, and put back exactly."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from ampmeter.integrations.adapter import Adapter
from ampmeter.integrations.lifecycle import IN_SDK_REQUEST, StopSignal, count_retry
from ampmeter.integrations.wrappers import wrap_async, wrap_sync

__all__ = ["Patch", "patch_base_clients", "patch_method", "patch_retry_sleep", "undo_all"]


@dataclass(slots=True)
class Patch:
    """One attribute replaced on a class (or a module), and how to put it back exactly."""

    owner: type | ModuleType
    name: str
    had_own: bool
    original: Any

    @classmethod
    def apply(cls, owner: type | ModuleType, name: str, replacement: Any) -> Patch:
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


def patch_base_clients(base_client: Any) -> list[Patch]:
    """Count the retries of an SDK's sync and async base clients (its ``_base_client`` module)
    and let a stop raised below their ``request`` pass their retry loop."""
    patches = []
    clients = ((base_client.SyncAPIClient, False), (base_client.AsyncAPIClient, True))
    for client_cls, is_async in clients:
        patch = patch_retry_sleep(client_cls, is_async=is_async)
        if patch is not None:
            patches.append(patch)
        original = client_cls.__dict__.get("request")
        if original is not None:
            door = _async_request_door(original) if is_async else _request_door(original)
            patches.append(Patch.apply(client_cls, "request", door))
    return patches


def _request_door(original: Callable[..., Any]) -> Callable[..., Any]:
    """The SDK's generic ``request``, out of which a :class:`StopSignal` leaves as its stop."""

    @functools.wraps(original)
    def request(client: Any, *args: Any, **kwargs: Any) -> Any:
        token = IN_SDK_REQUEST.set(True)
        try:
            return original(client, *args, **kwargs)
        except StopSignal as signal:
            raise signal.stop from None
        finally:
            IN_SDK_REQUEST.reset(token)

    return request


def _async_request_door(original: Callable[..., Any]) -> Callable[..., Any]:
    """:func:`_request_door` of an async client."""

    @functools.wraps(original)
    async def request(client: Any, *args: Any, **kwargs: Any) -> Any:
        token = IN_SDK_REQUEST.set(True)
        try:
            return await original(client, *args, **kwargs)
        except StopSignal as signal:
            raise signal.stop from None
        finally:
            IN_SDK_REQUEST.reset(token)

    return request


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
