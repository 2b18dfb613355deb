"""A Gemini thinking model's stream cut before its last chunk is charged its unseen thoughts.

Gemini reports ``thoughtsTokenCount`` (billed as output) only in a stream's last chunk; the
chunks before carry the visible text and the count of it so far. A stream cut before the last
(the caller stops reading, the connection drops) was billed for the thinking all the same: it is
charged the most the call could write, as an OpenAI reasoning stream cut short is. A model that
does not think (``thinkingBudget`` 0, Gemini 2.0) is charged what it received, as before.
google-genai and raw httpx, read at the HTTP layer, against the replay server.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from ampmeter import ExecutionContext
from ampmeter.integrations.gemini import thinks
from ampmeter.node import Node
from ampmeter.sinks.memory import MemorySink
from ampmeter.testing.replay import ReplayResponse, ReplayServer

pytestmark = pytest.mark.usefixtures("instrumented")  # conftest.py

TEXT = "The sea was calm that morning, and the boats went out early. "
MAX_OUT = 4096


def _chunk(text: str, written: int, *, thought: bool = False) -> dict[str, Any]:
    part: dict[str, Any] = {"text": text, "thought": True} if thought else {"text": text}
    return {
        "candidates": [{"content": {"parts": [part], "role": "model"}, "index": 0}],
        "usageMetadata": {
            "promptTokenCount": 12,
            "candidatesTokenCount": written,
            "totalTokenCount": 12 + written,
        },
        "responseId": "gemini-thinking-cut",
    }


def _stream(chunks: list[dict[str, Any]], *, cut: bool) -> ReplayResponse:
    """Visible chunks; the last one (with ``thoughtsTokenCount``) never comes when ``cut``."""
    last = _chunk("", 30)
    last["candidates"][0]["finishReason"] = "STOP"
    last["usageMetadata"].update(thoughtsTokenCount=900, totalTokenCount=942)
    events = [(None, chunk) for chunk in [*chunks, last]]
    return ReplayResponse.sse(events, cut_after=len(chunks) if cut else None)


def _gemini(replay: ReplayServer) -> Any:
    from google import genai
    from google.genai import types

    options = types.HttpOptions(base_url=replay.url, api_version="v1beta")
    return genai.Client(api_key="k", http_options=options)


def _read_cut(client: Any, model: str, config: Any) -> Node:
    """Read a stream the server cuts after its visible chunks; the call's node."""
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        stream = client.models.generate_content_stream(
            model=model, contents="Write a long story about the sea.", config=config
        )
        with pytest.raises(Exception) as cut:  # its HTTP library's own error: checked below
            for _ in stream:
                pass
    assert type(cut.value).__name__ == "RemoteProtocolError"  # the body was cut short
    (node,) = [n for n in sink.nodes if n.kind == "llm"]
    return node


def test_a_thinking_stream_cut_before_its_last_chunk_is_charged_the_most_it_could_write(
    replay: ReplayServer,
) -> None:
    from google.genai import types

    path = "/v1beta/models/gemini-2.5-flash:streamGenerateContent"
    replay.script(path, _stream([_chunk(TEXT, 13), _chunk(TEXT, 26)], cut=True))
    client = _gemini(replay)
    node = _read_cut(
        client, "gemini-2.5-flash", types.GenerateContentConfig(max_output_tokens=MAX_OUT)
    )
    # Its 26 visible tokens were reported; its thoughts (up to all it could write) were not.
    assert (node.tokens_in, node.tokens_out) == (12, MAX_OUT)
    assert node.metadata["cost_status"] == "estimated" and node.metadata["usage_estimated"]


def test_thought_summaries_streamed_do_not_make_the_thinking_seen(replay: ReplayServer) -> None:
    """``includeThoughts`` streams thought summaries, not every thought token billed."""
    from google.genai import types

    path = "/v1beta/models/gemini-2.5-pro:streamGenerateContent"
    chunks = [_chunk("Thinking about the sea.", 0, thought=True), _chunk(TEXT, 13)]
    replay.script(path, _stream(chunks, cut=True))
    config = types.GenerateContentConfig(
        max_output_tokens=MAX_OUT,
        thinking_config=types.ThinkingConfig(include_thoughts=True, thinking_budget=1024),
    )
    node = _read_cut(_gemini(replay), "gemini-2.5-pro", config)
    assert node.tokens_out == MAX_OUT


def test_a_stream_without_thinking_cut_short_is_charged_what_it_received(
    replay: ReplayServer,
) -> None:
    """``thinkingBudget`` 0 turns thinking off: the visible output reported is the output."""
    from google.genai import types

    path = "/v1beta/models/gemini-2.5-flash:streamGenerateContent"
    replay.script(path, _stream([_chunk(TEXT, 13), _chunk(TEXT, 26)], cut=True))
    config = types.GenerateContentConfig(
        max_output_tokens=MAX_OUT, thinking_config=types.ThinkingConfig(thinking_budget=0)
    )
    node = _read_cut(_gemini(replay), "gemini-2.5-flash", config)
    assert (node.tokens_in, node.tokens_out) == (12, 26)


def test_a_thinking_stream_read_to_its_end_is_charged_its_report(replay: ReplayServer) -> None:
    path = "/v1beta/models/gemini-2.5-flash:streamGenerateContent"
    replay.script(path, _stream([_chunk(TEXT, 13)], cut=False))
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]), httpx.Client() as client:
        body = {"contents": [{"parts": [{"text": "Write."}]}]}
        with client.stream("POST", replay.url + path + "?alt=sse", json=body) as response:
            for _ in response.iter_bytes():
                pass
    (node,) = [n for n in sink.nodes if n.kind == "llm"]
    assert (node.tokens_out, node.metadata["reasoning_tokens"]) == (930, 900)
    assert node.metadata["cost_status"] == "priced"


def test_raw_httpx_caller_that_stops_reading_a_thinking_stream_is_charged_unseen_output(
    replay: ReplayServer,
) -> None:
    path = "/v1beta/models/gemini-3-flash-preview:streamGenerateContent"
    replay.script(path, _stream([_chunk(TEXT, 13)] * 3, cut=False))
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]), httpx.Client() as client:
        body = {
            "contents": [{"parts": [{"text": "Write."}]}],
            "generationConfig": {
                "maxOutputTokens": 2000,
                "thinkingConfig": {"thinkingLevel": "low"},
            },
        }
        with client.stream("POST", replay.url + path + "?alt=sse", json=body) as response:
            next(response.iter_bytes())  # one chunk read, then closed
    (node,) = [n for n in sink.nodes if n.kind == "llm"]
    assert node.tokens_out == 2000 and node.metadata["cost_status"] == "estimated"


@pytest.mark.parametrize(
    ("model", "config", "expected"),
    [
        ("gemini-2.5-flash", None, True),
        ("models/gemini-2.5-pro", {"thinkingConfig": {"thinkingBudget": 128}}, True),
        ("gemini-2.5-flash", {"thinkingConfig": {"thinkingBudget": 0}}, False),
        ("gemini-2.5-flash", {"thinking_config": {"thinking_budget": 0}}, False),
        ("gemini-2.5-flash", {"thinkingConfig": {"thinkingBudget": -1}}, True),
        ("gemini-2.5-flash-lite", None, False),
        ("gemini-2.5-flash-lite", {"thinkingConfig": {"thinkingBudget": 512}}, True),
        ("gemini-2.0-flash", None, False),
        ("gemini-2.0-flash-thinking-exp", None, True),
        ("gemini-1.5-pro", None, False),
        ("gemma-3-27b-it", None, False),
        ("gemini-3-pro-preview", {"thinkingConfig": {"thinkingLevel": "low"}}, True),
        ("gemini-flash-latest", None, True),  # an alias: may think, so charged as if
        (None, {"thinkingConfig": {"thinkingBudget": True}}, True),  # no budget: a bool
    ],
)
def test_which_requests_think(model: str | None, config: Any, expected: bool) -> None:
    body: dict[str, Any] = {"contents": []}
    if config is not None:
        body["generationConfig"] = config
    assert thinks(body, model) is expected


def test_a_thinking_stream_that_ends_before_its_last_chunk_is_charged_unseen_output(
    replay: ReplayServer,
) -> None:
    """The body ends cleanly, but without the chunk that says why generation stopped and
    reports the thoughts (a proxy's truncation): as cut."""
    path = "/v1beta/models/gemini-2.5-flash:streamGenerateContent"
    replay.script(path, ReplayResponse.sse([(None, _chunk(TEXT, 13))]))
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]), httpx.Client() as client:
        body = {"contents": [{"parts": [{"text": "Write."}]}]}
        body["generationConfig"] = {"maxOutputTokens": MAX_OUT}
        with client.stream("POST", replay.url + path + "?alt=sse", json=body) as response:
            for _ in response.iter_bytes():
                pass
    (node,) = [n for n in sink.nodes if n.kind == "llm"]
    assert (node.tokens_in, node.tokens_out) == (12, MAX_OUT)
    assert node.metadata["usage_estimated"] and node.metadata["cost_status"] == "estimated"


def test_a_thinking_answer_without_usage_is_charged_unseen_output(replay: ReplayServer) -> None:
    """A whole answer without ``usageMetadata``: its text is not all it wrote."""
    from google.genai import types

    answer = _chunk(TEXT, 13)
    del answer["usageMetadata"]
    answer["candidates"][0]["finishReason"] = "STOP"
    replay.script("/v1beta/models/gemini-2.5-pro:generateContent", ReplayResponse.json(answer))
    client = _gemini(replay)
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        client.models.generate_content(
            model="gemini-2.5-pro",
            contents="Write.",
            config=types.GenerateContentConfig(max_output_tokens=300),
        )
    (node,) = [n for n in sink.nodes if n.kind == "llm"]
    assert node.tokens_out == 300 and node.metadata["cost_status"] == "estimated"


@pytest.mark.parametrize("stream", [False, True])
def test_a_blocked_prompt_reports_all_its_usage(replay: ReplayServer, stream: bool) -> None:
    """A prompt blocked before any generation: its usage (the prompt alone) is all of it,
    charged as reported, never as unseen output."""
    blocked = {
        "promptFeedback": {"blockReason": "SAFETY"},
        "usageMetadata": {"promptTokenCount": 12, "totalTokenCount": 12},
    }
    operation = "streamGenerateContent" if stream else "generateContent"
    path = f"/v1beta/models/gemini-2.5-flash:{operation}"
    answer = ReplayResponse.sse([(None, blocked)]) if stream else ReplayResponse.json(blocked)
    replay.script(path, answer)
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]), httpx.Client() as client:
        body = {"contents": [{"parts": [{"text": "Write."}]}]}
        body["generationConfig"] = {"maxOutputTokens": MAX_OUT}
        with client.stream("POST", replay.url + path, json=body) as response:
            response.read()
    (node,) = [n for n in sink.nodes if n.kind == "llm"]
    assert (node.tokens_in, node.tokens_out) == (12, 0)
    assert node.metadata["cost_status"] == "priced"
