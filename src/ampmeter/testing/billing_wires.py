"""The billing provider's Chat Completions and Messages routes: what a request bills, the
record of a billed call (:class:`BilledCall`, which every route answers from), and the answers,
whole or streamed, in each provider's shape. A body the provider rejects raises ``ValueError``,
which the provider answers with a 400 (:func:`error_answer`)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final, Literal

from ampmeter.testing.replay import ReplayResponse

__all__ = [
    "WORD",
    "BilledCall",
    "BillingWire",
    "answer_pieces",
    "anthropic_answer",
    "billed_content",
    "billed_parts",
    "chat_answer",
    "compact",
    "error_answer",
    "listed",
    "max_tokens",
]

BillingWire = Literal["chat", "anthropic", "responses"]
WORD: Final = "tok "  # one output token of the fixed answer
_MEDIA_PARTS: Final = frozenset(
    {"image_url", "input_audio", "file", "image", "document", "input_image", "input_file"}
)


@dataclass(frozen=True, slots=True)
class BilledCall:
    """One request the provider answered and billed.

    ``usage_reported`` is False for an OpenAI stream sent without ``include_usage``, and for
    every answer of a provider that ``strip_usage``: billed, but the client was never told.
    ``cost_usd`` is None when the provider has no price for ``model``.
    """

    wire: BillingWire
    model: str
    stream: bool
    input_tokens: int
    output_tokens: int
    usage_reported: bool
    cost_usd: Decimal | None


def billed_parts(wire: BillingWire, body: Mapping[str, Any]) -> tuple[list[str], int, int, bool]:
    """The pieces of billed text, framed messages, media parts, and whether tools are
    defined."""
    texts: list[str] = []
    media = 0
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    framed = len(messages)
    if wire == "anthropic":
        system = body.get("system")
        if system is not None:
            media += billed_content(system, texts)
            framed += 1
    for message in messages:
        if not isinstance(message, dict):
            raise ValueError("every message must be an object")
        media += billed_content(message.get("content"), texts)
        name = message.get("name")
        if isinstance(name, str):
            texts.append(name)
        calls = [*(message.get("tool_calls") or ()), {"function": message.get("function_call")}]
        for call in calls:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                texts.append(str(function.get("name", "")))
                texts.append(str(function.get("arguments", "")))
    tools = [*listed(body, "tools"), *listed(body, "functions")]
    texts.extend(compact(tool) for tool in tools)
    for key in ("response_format", "output_format"):
        if body.get(key) is not None:
            texts.append(compact(body[key]))
    return texts, framed, media, bool(tools)


def billed_content(content: object, texts: list[str]) -> int:
    """Adds the billed text of a message's content to ``texts``; returns its media parts."""
    if content is None:
        return 0
    if isinstance(content, str):
        texts.append(content)
        return 0
    if not isinstance(content, list):
        raise ValueError("message content must be a string or a list of parts")
    media = 0
    for part in content:
        if not isinstance(part, dict):
            raise ValueError("every content part must be an object")
        kind = part.get("type")
        if kind in _MEDIA_PARTS:
            media += 1
        elif kind == "tool_use":
            texts.append(str(part.get("name", "")))
            texts.append(compact(part.get("input", {})))
        elif kind == "tool_result":
            media += billed_content(part.get("content"), texts)
        else:
            for key in ("text", "thinking", "refusal"):
                value = part.get(key)
                if isinstance(value, str):
                    texts.append(value)
    return media


def listed(body: Mapping[str, Any], key: str) -> list[Any]:
    """``body[key]``, a list when given (``ValueError`` for anything else)."""
    value = body.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError(f"{key} must be a list")
    return value


def compact(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def max_tokens(wire: BillingWire, body: Mapping[str, Any]) -> int:
    names = ("max_output_tokens",) if wire == "responses" else ("max_completion_tokens",)
    value = next((body[n] for n in names if n in body), body.get("max_tokens"))
    if value is None:
        if wire == "anthropic":
            raise ValueError("max_tokens: field required")
        return 2**31
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"max_tokens must be an integer >= 1, got {value!r}")
    return value


def answer_pieces(answer: str | None, tokens: int) -> list[str]:
    """The answer's text as ``tokens`` pieces (one per output token, as streamed)."""
    if answer is None:
        return [WORD] * tokens
    if tokens == 0:
        return []
    size = -(-len(answer) // tokens) or 1
    found = [answer[at : at + size] for at in range(0, len(answer), size)]
    return found + [""] * (tokens - len(found))


def chat_answer(call: BilledCall, number: int, capped: bool, pieces: list[str]) -> ReplayResponse:
    ident = f"chatcmpl-bill{number:06d}"
    usage = {
        "prompt_tokens": call.input_tokens,
        "completion_tokens": call.output_tokens,
        "total_tokens": call.input_tokens + call.output_tokens,
        "prompt_tokens_details": {"cached_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0},
    }
    head = {"id": ident, "created": int(time.time()), "model": call.model}
    finish = "length" if capped else "stop"
    if not call.stream:
        message = {"role": "assistant", "content": "".join(pieces)}
        choice = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
        body = {
            **head,
            "object": "chat.completion",
            "choices": [choice],
            "usage": usage if call.usage_reported else None,
        }
        return ReplayResponse.json(body)
    chunk = {**head, "object": "chat.completion.chunk"}

    def delta(part: dict[str, Any], reason: str | None) -> tuple[None, dict[str, Any]]:
        choice = {"index": 0, "delta": part, "finish_reason": reason, "logprobs": None}
        return None, {**chunk, "choices": [choice]}

    events: list[tuple[str | None, Any]] = [delta({"role": "assistant", "content": ""}, None)]
    events += [delta({"content": piece}, None) for piece in pieces]
    events.append(delta({}, finish))
    if call.usage_reported:
        events.append((None, {**chunk, "choices": [], "usage": usage}))
    events.append((None, "[DONE]"))
    return ReplayResponse.sse(events)


def anthropic_answer(
    call: BilledCall, number: int, capped: bool, pieces: list[str]
) -> ReplayResponse:
    finish = "max_tokens" if capped else "end_turn"
    message: dict[str, Any] = {
        "id": f"msg_bill{number:06d}",
        "type": "message",
        "role": "assistant",
        "model": call.model,
        "stop_sequence": None,
    }
    usage = {
        "input_tokens": call.input_tokens,
        "output_tokens": call.output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }
    if not call.stream:
        text = {"type": "text", "text": "".join(pieces)}
        body = {**message, "content": [text], "stop_reason": finish}
        if call.usage_reported:
            body["usage"] = usage
        return ReplayResponse.json(body)
    start = {**message, "content": [], "stop_reason": None}
    ending: dict[str, Any] = {"delta": {"stop_reason": finish, "stop_sequence": None}}
    if call.usage_reported:  # the input at the start, the output at the end
        start["usage"] = {**usage, "output_tokens": 1}
        ending["usage"] = {"output_tokens": call.output_tokens}
    block = {"index": 0, "content_block": {"type": "text", "text": ""}}
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"message": start}),
        ("content_block_start", block),
    ]
    events += [
        ("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": piece}})
        for piece in pieces
    ]
    events += [
        ("content_block_stop", {"index": 0}),
        ("message_delta", ending),
        ("message_stop", {}),
    ]
    return ReplayResponse.sse([(name, {"type": name, **data}) for name, data in events])


def error_answer(wire: BillingWire, status: int, message: str) -> ReplayResponse:
    """A 400 (a request the provider rejects) or a 404 (a route it does not have)."""
    kind = "not_found_error" if wire == "anthropic" and status == 404 else "invalid_request_error"
    return ReplayResponse.error(wire, status, {"type": kind, "message": message})
