"""The billing provider's OpenAI Responses route (``POST /v1/responses``).

Billed as the chat route is (text at the provider's characters per token, framing per item and
per request, tool definitions and ``text.format`` as their compact JSON), and, as OpenAI does,
for the stored conversation the request continues: a ``previous_response_id`` is billed the
input and output of that response, a ``conversation`` the input and output of its latest
response and the items added to it since. The provider keeps both
(:class:`StoredConversations`); a ``previous_response_id`` it does not know is a 400, a
conversation id it never saw starts empty. Conversations are made and grown as OpenAI's are
(``POST /v1/conversations`` with optional ``items``, ``POST /v1/conversations/<id>/items``:
:func:`conversations_answer`).
"""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from ampmeter.testing.billing_wires import (
    WORD,
    BilledCall,
    billed_content,
    compact,
    error_answer,
    listed,
)
from ampmeter.testing.replay import RecordedRequest, ReplayResponse

__all__ = [
    "StoredConversations",
    "conversations_answer",
    "responses_answer",
    "responses_parts",
    "stored_ids",
]

# The fresh suffix the replay server gives every id it sends (see ReplayServer): a response
# is continued by the id the client got, and kept here by the id the provider made.
_FRESH_SUFFIX = re.compile(r"-[0-9a-f]{12}$")


class StoredConversations:
    """The tokens each stored response and each conversation holds (thread-safe)."""

    def __init__(self) -> None:
        self._sizes: dict[str, int] = {}
        self._lock = threading.Lock()
        self._numbers = itertools.count(1)

    def add_items(self, conversation: str | None, tokens: int) -> str:
        """Make a conversation (``conversation`` None) or add items to one, ``tokens`` of
        them; its id."""
        with self._lock:
            if conversation is None:
                conversation = f"conv_bill{next(self._numbers):06d}"
            key = f"conversation:{conversation}"
            self._sizes[key] = self._sizes.get(key, 0) + tokens
        return conversation

    def billed_for(self, body: Mapping[str, Any]) -> int:
        """The stored tokens ``body`` continues; ``ValueError`` (a 400) for an unknown response."""
        previous, conversation = stored_ids(body)
        total = 0
        with self._lock:
            if previous is not None:
                size = self._sizes.get(f"response:{_FRESH_SUFFIX.sub('', previous)}")
                if size is None:
                    raise ValueError(f"Previous response with id '{previous}' not found.")
                total += size
            if conversation is not None:
                total += self._sizes.get(f"conversation:{conversation}", 0)
        return total

    def keep(self, body: Mapping[str, Any], response_id: str, tokens: int) -> None:
        """A response ``response_id`` to ``body`` left ``tokens`` of stored conversation."""
        _, conversation = stored_ids(body)
        with self._lock:
            if body.get("store") is not False:
                self._sizes[f"response:{response_id}"] = tokens
            if conversation is not None:
                self._sizes[f"conversation:{conversation}"] = tokens


def stored_ids(body: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """The ``previous_response_id`` and the conversation id a request names (``ValueError``
    for one that is not a string id)."""
    previous = body.get("previous_response_id")
    conversation = body.get("conversation")
    if isinstance(conversation, Mapping):
        conversation = conversation.get("id")
    for name, value in (("previous_response_id", previous), ("conversation", conversation)):
        if value is not None and (not isinstance(value, str) or not value):
            raise ValueError(f"{name} must be a non-empty string id, got {value!r}")
    if previous is not None and conversation is not None:
        raise ValueError("previous_response_id and conversation cannot both be given")
    return previous, conversation


def responses_parts(body: Mapping[str, Any]) -> tuple[list[str], int, int, bool]:
    """The billed texts, framed items, media parts and whether tools are defined, of a
    Responses ``body``; ``ValueError`` for a body the
    provider rejects."""
    texts: list[str] = []
    framed = media = 0
    instructions = body.get("instructions")
    if isinstance(instructions, str):
        texts.append(instructions)
        framed += 1
    given = body.get("input")
    items = [given] if isinstance(given, str) else given
    if not isinstance(items, list) or not items:
        raise ValueError("input must be a non-empty string or list of items")
    for item in items:
        framed += 1
        if isinstance(item, str):
            texts.append(item)
            continue
        if not isinstance(item, Mapping):
            raise ValueError("every input item must be a string or an object")
        texts.extend(
            item[key] for key in ("name", "arguments", "output") if isinstance(item.get(key), str)
        )
        if isinstance(item.get("content"), (str, list)):
            media += billed_content(item["content"], texts)
    tools = listed(body, "tools")
    texts.extend(compact(tool) for tool in tools)
    text = body.get("text")
    if isinstance(text, Mapping) and text.get("format") is not None:
        texts.append(compact(text["format"]))
    return texts, framed, media, bool(tools)


def responses_answer(
    call: BilledCall, response_id: str, body: Mapping[str, Any], capped: bool
) -> ReplayResponse:
    """The answer: a whole response, or (``call.stream``) its server-sent events."""
    _, conversation = stored_ids(body)
    usage = {
        "input_tokens": call.input_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": call.output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": call.input_tokens + call.output_tokens,
    }
    message = {
        "type": "message",
        "id": f"msg_{response_id}",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": WORD * call.output_tokens, "annotations": []}],
    }
    response: dict[str, Any] = {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": "incomplete" if capped else "completed",
        "model": call.model,
        "output": [message],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "previous_response_id": body.get("previous_response_id"),
        "usage": usage if call.usage_reported else None,
    }
    if capped:
        response["incomplete_details"] = {"reason": "max_output_tokens"}
    if conversation is not None:
        response["conversation"] = {"id": conversation}
    if not call.stream:
        return ReplayResponse.json(response)
    started = {**response, "status": "in_progress", "output": [], "usage": None}
    delta = {"item_id": message["id"], "output_index": 0, "content_index": 0, "delta": WORD}
    end = "response.incomplete" if capped else "response.completed"
    events: list[tuple[str, dict[str, Any]]] = [
        ("response.created", {"response": started}),
        *[("response.output_text.delta", {**delta, "logprobs": []})] * call.output_tokens,
        (end, {"response": response}),
    ]
    return ReplayResponse.sse(
        (name, {"type": name, **data, "sequence_number": number})
        for number, (name, data) in enumerate(events)
    )


def conversations_answer(
    request: RecordedRequest,
    stored: StoredConversations,
    tokens_of: Callable[[list[Any]], int],
) -> ReplayResponse:
    """Make a conversation or add items to one (``tokens_of``: the tokens of items as this
    provider bills them when they are continued)."""
    parts = request.path.strip("/").split("/")  # v1, conversations[, <id>, items]
    body = request.json() if request.body else {}
    items = body.get("items") if isinstance(body, dict) else None
    if items is not None and not isinstance(items, list):
        return error_answer("chat", 400, "items must be a list")
    if parts == ["v1", "conversations"]:
        conversation = stored.add_items(None, tokens_of(items) if items else 0)
        made = {"id": conversation, "object": "conversation", "created_at": int(time.time())}
        return ReplayResponse.json({**made, "metadata": {}})
    if len(parts) == 4 and parts[3] == "items" and items:
        stored.add_items(parts[2], tokens_of(items))
        listed = [{"id": f"item_{n}", **item} for n, item in enumerate(items)]
        return ReplayResponse.json(
            {"object": "list", "data": listed, "first_id": "item_0", "has_more": False}
        )
    return error_answer(
        "chat", 400, f"billing provider: no route POST {request.path} with these items"
    )
