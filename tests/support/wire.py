"""Chat completion bodies for the replay server, in the OpenAI wire format."""

from __future__ import annotations

from typing import Any

from ampmeter.testing.replay import ReplayResponse


def chat_completion(model: str, tokens_in: int, tokens_out: int) -> ReplayResponse:
    """A one-choice ``chat.completion`` from ``model`` that used these tokens."""
    return ReplayResponse.json(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1700000000,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": "done"},
                }
            ],
            "usage": {
                "prompt_tokens": tokens_in,
                "completion_tokens": tokens_out,
                "total_tokens": tokens_in + tokens_out,
            },
        }
    )


def chat_stream(chunk: dict[str, Any], usage: dict[str, Any]) -> ReplayResponse:
    """A ``chat.completion.chunk`` stream: ``chunk``, then a chunk of the same id carrying
    ``usage`` and no choices (as ``stream_options.include_usage`` asks), then ``[DONE]``."""
    return ReplayResponse.sse(
        [(None, chunk), (None, {**chunk, "choices": [], "usage": usage}), (None, "[DONE]")]
    )
