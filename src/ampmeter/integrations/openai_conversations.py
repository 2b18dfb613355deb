"""OpenAI conversations as stored state: what ampmeter knows of their size.

A Responses request in a ``conversation`` is billed for everything the conversation holds
(:mod:`ampmeter.pricing.stored_state`). ampmeter learns that size from the responses it reads;
items put in a conversation otherwise (``conversations.create(items=...)``,
``conversations.items.create``) are not billed then but are billed as input by every later
response in it, and their tokens are not known. So a conversation made empty is known to
hold nothing, and one given items outside a response becomes of unknown size (reserved as
such) until a response in it is read. These calls are not metered themselves: they are
not billed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ampmeter.integrations.patching import Patch
from ampmeter.pricing import stored_state

__all__ = ["patch_conversations"]


def patch_conversations() -> list[Patch]:
    """Patch the ``openai`` SDK's conversation and item creation (none before the
    Conversations API)."""
    try:
        from openai.resources.conversations import conversations, items
    except ImportError:
        return []
    targets: list[tuple[type, Callable[..., Any], bool]] = [
        (conversations.Conversations, _made, False),
        (conversations.AsyncConversations, _made, True),
        (items.Items, _grown, False),
        (items.AsyncItems, _grown, True),
    ]
    patches = []
    for owner, wrap, is_async in targets:
        patches.append(Patch.apply(owner, "create", wrap(owner.__dict__["create"], is_async)))
    return patches


def _remember_made(conversation: Any, kwargs: dict[str, Any]) -> None:
    if not kwargs.get("items"):  # (an SDK's omit sentinel is false too)
        stored_state.remember(None, conversation, 0)


def _made(original: Callable[..., Any], is_async: bool) -> Callable[..., Any]:
    if is_async:

        @functools.wraps(original)
        async def made_async(resource: Any, *args: Any, **kwargs: Any) -> Any:
            conversation = await original(resource, *args, **kwargs)
            _remember_made(conversation, kwargs)
            return conversation

        return made_async

    @functools.wraps(original)
    def made(resource: Any, *args: Any, **kwargs: Any) -> Any:
        conversation = original(resource, *args, **kwargs)
        _remember_made(conversation, kwargs)
        return conversation

    return made


def _conversation_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The conversation ``items.create`` adds to (its first argument, or by name)."""
    return args[0] if args else kwargs.get("conversation_id")


def _grown(original: Callable[..., Any], is_async: bool) -> Callable[..., Any]:
    # Forgotten before the request: a request that fails may still have added the items.
    if is_async:

        @functools.wraps(original)
        async def grown_async(
            resource: Any, conversation_id: Any, *args: Any, **kwargs: Any
        ) -> Any:
            stored_state.forget_conversation(conversation_id)
            return await original(resource, conversation_id, *args, **kwargs)

        return grown_async

    @functools.wraps(original)
    def grown(resource: Any, *args: Any, **kwargs: Any) -> Any:
        stored_state.forget_conversation(_conversation_of(args, kwargs))
        return original(resource, *args, **kwargs)

    return grown
