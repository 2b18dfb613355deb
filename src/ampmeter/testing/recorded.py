"""Recorded provider responses, in the wire formats the OpenAI, Anthropic and Gemini APIs
document.

The bodies live as JSON files in ``wire/`` beside this module (:data:`WIRE_NAMES`); :func:`load`
returns a fresh copy of one, and the other functions wrap them as
:class:`~ampmeter.testing.replay.ReplayResponse` objects ready to script on a
:class:`~ampmeter.testing.replay.ReplayServer` (each says what its body holds).

The ``*_error_echoing`` responders answer with an error whose message quotes the request's API
key and prompt, as provider bodies quote a wrong key ("Incorrect API key provided: ...") or the
offending input: the worst case for what reaches a log.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any, Final

from ampmeter import _validate
from ampmeter.testing.replay import RecordedRequest, ReplayResponse, Responder

__all__ = [
    "WIRE_NAMES",
    "anthropic_error",
    "anthropic_error_echoing",
    "anthropic_message_stream",
    "anthropic_message_tool_use",
    "anthropic_stream_error_echoing",
    "gemini_generate_content",
    "gemini_stream_generate_content",
    "load",
    "openai_chat_stream_usage",
    "openai_chat_tool_calls",
    "openai_embeddings",
    "openai_error",
    "openai_error_echoing",
    "openai_responses_usage",
    "openai_stream_error_echoing",
]

_WIRE = resources.files("ampmeter.testing").joinpath("wire")
WIRE_NAMES: Final = tuple(sorted(f.name[:-5] for f in _WIRE.iterdir() if f.name.endswith(".json")))
"""The names of the recorded bodies."""


# What each provider's answers carry, and the rate-limit headers it sends with a 429.
_HEADERS: Final = {
    "openai": {"x-request-id": "req_replay", "openai-processing-ms": "1"},
    "anthropic": {"request-id": "req_replay"},
}
_RATE_LIMITED: Final = {
    "openai": {
        "x-ratelimit-limit-requests": "3",
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "20s",
    },
    "anthropic": {
        "anthropic-ratelimit-requests-limit": "50",
        "anthropic-ratelimit-requests-remaining": "0",
        "anthropic-ratelimit-requests-reset": "2025-01-01T00:00:20Z",
    },
}


def load(name: str) -> Any:
    """Return a fresh copy of the recorded body ``name`` (one of :data:`WIRE_NAMES`).

    Raises:
        KeyError: ``name`` is not a recorded body.
    """
    if name not in WIRE_NAMES:
        raise KeyError(f"no recorded body named {name!r}; known: {', '.join(WIRE_NAMES)}")
    return json.loads(_WIRE.joinpath(f"{name}.json").read_text("utf-8"))


def openai_chat_tool_calls() -> ReplayResponse:
    """A ``chat.completion`` with tool calls and detailed usage."""
    return ReplayResponse.json(load("openai_chat_tool_calls"), headers=_HEADERS["openai"])


def openai_chat_stream_usage(*, cut_after: int | None = None) -> ReplayResponse:
    """A chat completion stream whose last chunk carries the usage, ended by ``[DONE]``.

    ``cut_after`` drops the connection after that many events (the usage chunk is the
    second-to-last event, ``[DONE]`` the last).
    """
    events: list[tuple[str | None, Any]] = [
        (None, chunk) for chunk in load("openai_chat_stream_usage")
    ]
    events.append((None, "[DONE]"))
    return ReplayResponse.sse(events, headers=_HEADERS["openai"], cut_after=cut_after)


def openai_responses_usage() -> ReplayResponse:
    """A Responses API ``response`` object with cached and reasoning token details."""
    return ReplayResponse.json(load("openai_responses_usage"), headers=_HEADERS["openai"])


def openai_embeddings() -> ReplayResponse:
    """An ``embeddings`` list of two vectors with its usage."""
    return ReplayResponse.json(load("openai_embeddings"), headers=_HEADERS["openai"])


def gemini_generate_content() -> ReplayResponse:
    """A Gemini ``generateContent`` response with function calls, cached and thought tokens."""
    return ReplayResponse.json(load("gemini_generate_content"))


def gemini_stream_generate_content(*, sse: bool = True) -> ReplayResponse:
    """A Gemini ``streamGenerateContent`` answer: server-sent events (``alt=sse``, what the
    SDKs ask for) or, with ``sse=False``, the chunks as one JSON array."""
    chunks = load("gemini_stream_generate_content")
    if sse:
        return ReplayResponse.sse([(None, chunk) for chunk in chunks])
    return ReplayResponse.json(chunks)


def anthropic_message_tool_use() -> ReplayResponse:
    """A Messages API ``message`` with tool_use blocks and prompt-cache usage."""
    return ReplayResponse.json(load("anthropic_message_tool_use"), headers=_HEADERS["anthropic"])


def anthropic_message_stream(*, cut_after: int | None = None) -> ReplayResponse:
    """A Messages API event stream (``message_start`` ... ``message_stop``)."""
    events = [(item["event"], item["data"]) for item in load("anthropic_message_stream")]
    return ReplayResponse.sse(events, headers=_HEADERS["anthropic"], cut_after=cut_after)


def openai_error(status: int, *, retry_after: float | None = 0.001) -> ReplayResponse:
    """An OpenAI error response (429 rate limit or 500 server error).

    ``retry_after`` (seconds) sets ``retry-after`` and ``retry-after-ms``; the SDK honours any
    positive value, so the small default makes its retry nearly immediate. ``None`` omits them.
    """
    return _recorded_error("openai", status, retry_after)


def anthropic_error(status: int, *, retry_after: float | None = 0.001) -> ReplayResponse:
    """An Anthropic error response (429 rate limit, 500 api error, 529 overloaded).

    ``retry_after`` works as in :func:`openai_error`.
    """
    return _recorded_error("anthropic", status, retry_after)


def _recorded_error(provider: str, status: int, retry_after: float | None) -> ReplayResponse:
    prefix = f"{provider}_error_"
    name = f"{prefix}{status}"
    if name not in WIRE_NAMES:
        known = ", ".join(n.removeprefix(prefix) for n in WIRE_NAMES if n.startswith(prefix))
        raise ValueError(f"no recorded {provider} error for status {status!r}; known: {known}")
    headers = dict(_HEADERS[provider])
    if retry_after is not None:
        _validate.amount(retry_after, "retry_after")
        headers.update(
            {"retry-after": f"{retry_after:g}", "retry-after-ms": f"{retry_after * 1000:g}"}
        )
    if status == 429:
        headers.update(_RATE_LIMITED[provider])
    body = load(name)
    if provider == "anthropic":
        headers["request-id"] = str(body["request_id"])
    return ReplayResponse.json(body, status=status, headers=headers)


# (error type, code) of the echoing errors, per provider and status, as the providers name them
_ECHO_TYPES: Final[dict[str, dict[int, tuple[str, str | None]]]] = {
    "openai": {
        400: ("invalid_request_error", "invalid_prompt"),
        401: ("invalid_request_error", "invalid_api_key"),
        429: ("requests", "rate_limit_exceeded"),
        500: ("server_error", None),
    },
    "anthropic": {
        400: ("invalid_request_error", None),
        401: ("authentication_error", None),
        429: ("rate_limit_error", None),
        500: ("api_error", None),
        529: ("overloaded_error", None),
    },
}


def _echo_message(request: RecordedRequest) -> str:
    """A provider-style message quoting the request's credentials and its first message."""
    headers = request.headers
    key = headers.get("x-api-key") or headers.get("authorization", "").removeprefix("Bearer ")
    try:
        messages = request.json().get("messages") or [{}]
        prompt = messages[0].get("content")
    except (ValueError, AttributeError, IndexError):
        prompt = None
    return (
        f"Incorrect API key provided: {key}. Authorization: Bearer {key}. "
        f"The request could not be served: {prompt!s}"
    )


def openai_error_echoing(status: int) -> Responder:
    """An OpenAI error (400, 401, 429, 500) whose message quotes the request's key and prompt."""
    return _error_echoing("openai", status)


def anthropic_error_echoing(status: int) -> Responder:
    """An Anthropic error (400, 401, 429, 500, 529) quoting the request's key and prompt."""
    return _error_echoing("anthropic", status)


def _error_echoing(provider: str, status: int) -> Responder:
    kinds = _ECHO_TYPES[provider]
    if status not in kinds:
        known = ", ".join(str(code) for code in kinds)
        raise ValueError(f"no echoing {provider} error for status {status!r}; known: {known}")
    kind, code = kinds[status]

    def answer(request: RecordedRequest) -> ReplayResponse:
        error = {"type": kind, "message": _echo_message(request), "code": code}
        return ReplayResponse.error(provider, status, error, _HEADERS[provider])

    return answer


def openai_stream_error_echoing() -> Responder:
    """A chat completion stream cut by an ``error`` event (quoting key and prompt) after two
    content chunks."""

    def answer(request: RecordedRequest) -> ReplayResponse:
        chunks = load("openai_chat_stream_usage")[:2]
        error = {"message": _echo_message(request), "type": "server_error", "code": None}
        events: list[tuple[str | None, Any]] = [(None, chunk) for chunk in chunks]
        events.append((None, {"error": error}))
        return ReplayResponse.sse(events, headers=_HEADERS["openai"])

    return answer


def anthropic_stream_error_echoing() -> Responder:
    """A Messages event stream cut by an ``error`` event (quoting key and prompt) after its
    first content delta."""

    def answer(request: RecordedRequest) -> ReplayResponse:
        recorded = load("anthropic_message_stream")[:4]
        events: list[tuple[str | None, Any]] = [(e["event"], e["data"]) for e in recorded]
        error = {"type": "overloaded_error", "message": _echo_message(request)}
        events.append(("error", {"type": "error", "error": error}))
        return ReplayResponse.sse(events, headers=_HEADERS["anthropic"])

    return answer
