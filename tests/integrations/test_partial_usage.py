"""A response whose usage report was cut short is charged at least what was received.

Anthropic's ``message_start`` reports the input and the output so far (1 token); the output
written comes in ``message_delta``, last. A stream that ends before it (an ``error`` event
mid-stream, a cut connection, a caller that closes it) was billed for every token it sent:
the output counted from what was received, never the 1 token of its first event.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import openai
import pytest

from ampmeter import ExecutionContext
from ampmeter.sinks.memory import MemorySink
from ampmeter.testing import recorded
from ampmeter.testing.replay import ReplayResponse, ReplayServer

pytestmark = pytest.mark.usefixtures("instrumented")  # conftest.py

MESSAGES = "/v1/messages"
PROMPT = [{"role": "user", "content": "Write a long story about the sea."}]
TEXT = "The sea was calm that morning, and the boats went out early. " * 3


def _anthropic_events(*, error: bool) -> list[tuple[str | None, Any]]:
    """The recorded stream's start, then three long text deltas, then (``error``) Anthropic's
    ``overloaded_error`` event, where ``message_delta`` would have come."""
    start, block = recorded.load("anthropic_message_stream")[:2]
    events: list[tuple[str | None, Any]] = [
        (start["event"], start["data"]),
        (block["event"], block["data"]),
    ]
    delta = {
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "text_delta", "text": TEXT},
    }
    events += [("content_block_delta", delta)] * 3
    if error:
        overloaded = {"type": "overloaded_error", "message": "Overloaded"}
        events.append(("error", {"type": "error", "error": overloaded}))
    return events


def _read_all(stream: Any) -> None:
    for _ in stream:
        pass


def _read_one_then_close(stream: Any) -> None:
    for event in stream:
        if event.type == "content_block_delta":
            break
    stream.close()


@pytest.mark.parametrize(
    ("ending", "read", "received"),
    [
        ("an error event", _read_all, 3),
        ("a stream that stops", _read_all, 3),
        ("a caller that closes it", _read_one_then_close, 1),
    ],
)
def test_an_anthropic_stream_cut_before_its_final_usage_is_charged_what_it_received(
    replay: ReplayServer, ending: str, read: Callable[[Any], None], received: int
) -> None:
    """It was charged the 1 output token of ``message_start`` as if it were the final count
    (``success`` when the stream just stopped), whatever the deltas had brought."""
    replay.script(MESSAGES, ReplayResponse.sse(_anthropic_events(error=ending == "an error event")))
    client = anthropic.Anthropic(base_url=replay.anthropic_base_url, api_key="k", max_retries=0)
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        stream = client.messages.create(
            model="claude-haiku-4-5", messages=PROMPT, max_tokens=4096, stream=True
        )
        if ending == "an error event":
            with pytest.raises(anthropic.APIStatusError):
                read(stream)
        else:
            read(stream)
    (node,) = [n for n in sink.nodes if n.kind == "llm"]
    start = recorded.load("anthropic_message_stream")[0]["data"]["message"]["usage"]
    assert node.tokens_in == start["input_tokens"] + start["cache_read_input_tokens"]
    # A token per character received (the rule of a cut stream), never the 1 reported first.
    assert node.tokens_out == received * len(TEXT)
    assert node.metadata["cost_status"] == "estimated"
    if ending != "a stream that stops":
        assert node.status == "fail"


def _anthropic_message(client: Any) -> Any:
    return client.messages.create(model="claude-haiku-4-5", messages=PROMPT, max_tokens=4096)


def _openai_response(client: Any) -> Any:
    return client.responses.create(model="o4-mini", input="Look it up.", max_output_tokens=4096)


def _openai_chat(client: Any) -> Any:
    # Through plain httpx: the SDK's own model would make "96" and 96.0 ints before ampmeter
    # reads them (a raw client or the proxy hands ampmeter the body as it came).
    body = {"model": "gpt-4o-mini", "messages": PROMPT, "max_tokens": 4096}
    return httpx.post(f"{client.base_url}chat/completions", json=body)


WHOLE = {
    "anthropic": (MESSAGES, "anthropic_message_tool_use", "output_tokens", _anthropic_message),
    "responses": ("/v1/responses", "openai_responses_usage", "output_tokens", _openai_response),
    "chat": ("/v1/chat/completions", "openai_chat_tool_calls", "completion_tokens", _openai_chat),
}
WHOLE_INPUT = {"anthropic": 3484, "responses": 3120, "chat": 2210}


@pytest.mark.parametrize("provider", list(WHOLE))
@pytest.mark.parametrize("count", ["96", 96.0, True], ids=["a string", "a float", "a bool"])
def test_a_whole_answer_whose_output_count_is_no_int_is_charged_the_output_it_received(
    replay: ReplayServer, provider: str, count: object
) -> None:
    """Its input was read, its output count (no int) read as absent: charged 0 output tokens,
    ``priced``, for an answer that held text and tool calls. Now counted from them."""
    path, name, field, send = WHOLE[provider]
    body = recorded.load(name)
    body["usage"][field] = count
    replay.script(path, ReplayResponse.json(body))
    make = anthropic.Anthropic if provider == "anthropic" else openai.OpenAI
    base = replay.anthropic_base_url if provider == "anthropic" else replay.openai_base_url
    client = make(base_url=base, api_key="k", max_retries=0)
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        send(client)
    (node,) = [n for n in sink.nodes if n.kind == "llm"]
    assert node.status == "success"
    assert node.tokens_in == WHOLE_INPUT[provider]
    # A token per character of the text and the tools' names and arguments written.
    assert node.tokens_out is not None and node.tokens_out > 40
    assert node.metadata["cost_status"] == "estimated"


@pytest.mark.parametrize(
    "given",
    [[7] * 3000, [[7] * 1000, [8] * 2000]],
    ids=["token ids", "lists of token ids"],
)
def test_embeddings_sent_as_token_ids_are_reserved_and_charged_their_tokens(
    replay: ReplayServer, given: list[Any]
) -> None:
    """Inputs sent as token ids (LangChain's ``OpenAIEmbeddings`` sends them so) were measured
    as no text: reserved 0 tokens, so no cap could stop them, and charged 0 when the answer
    came without usage (a proxy's cut). They are 3000 tokens, counted exactly."""
    body = recorded.load("openai_embeddings")
    del body["usage"]
    replay.script("/v1/embeddings", ReplayResponse.json(body))
    client = openai.OpenAI(base_url=replay.openai_base_url, api_key="k", max_retries=0)
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        client.embeddings.create(model="text-embedding-3-small", input=given)
    (node,) = [n for n in sink.nodes if n.kind == "embedding"]
    assert (node.tokens_in, node.tokens_out) == (3000, 0)
    assert node.cost_nano > 0 and node.metadata["cost_status"] == "estimated"


def _responses_events(*, reasoning: bool) -> list[tuple[str | None, Any]]:
    """A Responses stream cut after its text began (no ``response.completed``): a reasoning
    item first (its tokens billed as output, never streamed) when ``reasoning``."""
    started = {"id": "resp_cut", "object": "response", "status": "in_progress", "output": []}
    events: list[dict[str, Any]] = [{"type": "response.created", "response": started}]
    if reasoning:
        item = {"id": "rs_1", "type": "reasoning", "summary": []}
        events += [
            {"type": "response.output_item.added", "output_index": 0, "item": item},
            {"type": "response.output_item.done", "output_index": 0, "item": item},
        ]
    message = {"id": "msg_1", "type": "message", "role": "assistant", "content": []}
    events += [
        {"type": "response.output_item.added", "output_index": 1, "item": message},
        {"type": "response.output_text.delta", "item_id": "msg_1", "delta": "Looking"},
    ]
    return [(event["type"], event) for event in events]


@pytest.mark.parametrize("reasoning", [True, False], ids=["reasoning", "no reasoning"])
def test_a_cut_responses_stream_that_reasoned_is_charged_its_most_output(
    replay: ReplayServer, reasoning: bool
) -> None:
    """A reasoning model's stream cut after its text began was charged a token per character
    of that text (7), though the reasoning before it (billed as output, never sent) may be
    thousands of tokens: what was received says nothing of it. Its output is now the most the
    call could write, its reservation; a stream without reasoning still counts its text."""
    replay.script("/v1/responses", ReplayResponse.sse(_responses_events(reasoning=reasoning)))
    client = openai.OpenAI(base_url=replay.openai_base_url, api_key="k", max_retries=0)
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        stream = client.responses.create(
            model="o4-mini", input="Look it up.", max_output_tokens=4096, stream=True
        )
        assert [event.type for event in stream][-1] == "response.output_text.delta"
    (node,) = [n for n in sink.nodes if n.kind == "llm"]
    assert node.tokens_out == (4096 if reasoning else len("Looking"))
    assert node.metadata["cost_status"] == "estimated"


def test_a_cut_anthropic_stream_that_thought_is_charged_its_most_output(
    replay: ReplayServer,
) -> None:
    """Claude 4 streams a summary of its thinking and bills all of it: a stream cut after a
    thinking delta was charged a token per character of the summary."""
    start = recorded.load("anthropic_message_stream")[0]
    thinking = {"type": "thinking", "thinking": "", "signature": ""}
    delta = {"type": "thinking_delta", "thinking": "The user asks about the sea."}
    events: list[tuple[str | None, Any]] = [
        (start["event"], start["data"]),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": thinking},
        ),
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
    ]
    replay.script(MESSAGES, ReplayResponse.sse(events))
    client = anthropic.Anthropic(base_url=replay.anthropic_base_url, api_key="k", max_retries=0)
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        _read_all(
            client.messages.create(
                model="claude-haiku-4-5", messages=PROMPT, max_tokens=4096, stream=True
            )
        )
    (node,) = [n for n in sink.nodes if n.kind == "llm"]
    assert (node.tokens_out, node.metadata["cost_status"]) == (4096, "estimated")


def test_a_gemini_stream_that_ends_before_its_last_chunk_is_charged_what_it_received(
    replay: ReplayServer,
) -> None:
    """Gemini's chunks before the last report the prompt alone (``promptTokenCount``), the
    output only in the last: a stream that ended before it (google-genai, read at the HTTP
    layer) was charged its input and 0 output tokens. (Thinking off: a thinking model's is
    charged its unseen thoughts, test_gemini_thinking.py.)"""
    from google import genai
    from google.genai import types

    chunks = [
        {
            "candidates": [{"content": {"parts": [{"text": TEXT}], "role": "model"}, "index": 0}],
            "usageMetadata": {"promptTokenCount": 12, "totalTokenCount": 12},
            "responseId": "gemini-cut",
        }
    ] * 2
    path = "/v1beta/models/gemini-2.5-flash:streamGenerateContent"
    replay.script(path, ReplayResponse.sse([(None, chunk) for chunk in chunks]))
    options = types.HttpOptions(base_url=replay.url, api_version="v1beta")
    client = genai.Client(api_key="k", http_options=options)
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        stream = client.models.generate_content_stream(
            model="gemini-2.5-flash",
            contents="Write a long story about the sea.",
            config=types.GenerateContentConfig(
                max_output_tokens=4096, thinking_config=types.ThinkingConfig(thinking_budget=0)
            ),
        )
        assert len(list(stream)) == 2
    (node,) = [n for n in sink.nodes if n.kind == "llm"]
    assert (node.tokens_in, node.tokens_out) == (12, 2 * len(TEXT))
    assert node.metadata["cost_status"] == "estimated"


def _chat_chunks(delta: dict[str, Any]) -> list[tuple[str | None, Any]]:
    """A Chat Completions stream that ends after one content chunk, before its usage chunk."""
    chunk = {
        "id": "chatcmpl-cut",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
    }
    return [(None, chunk)]


@pytest.mark.parametrize(
    ("model", "effort", "unseen"),
    [
        ("o3", None, True),
        ("gpt-5-mini", None, True),
        ("gpt-5.1", "none", False),  # asked not to reason
        ("gpt-4o-mini", None, False),
        ("gpt-4o-mini", "low", True),  # (a compatible server's model, asked to reason)
        ("gemini-2.5-flash", None, True),  # through Gemini's OpenAI-compatible API
        ("gpt-5-chat-latest", None, False),
    ],
)
def test_a_cut_chat_stream_of_a_reasoning_model_is_charged_its_most_output(
    replay: ReplayServer, model: str, effort: str | None, unseen: bool
) -> None:
    """A reasoning model's Chat Completions stream sends none of its reasoning, and says how
    much there was only in its usage chunk: one cut before it was charged the 7 characters of
    text it sent. Its output is now the most the call could write."""
    replay.script("/v1/chat/completions", ReplayResponse.sse(_chat_chunks({"content": "Looking"})))
    client = openai.OpenAI(base_url=replay.openai_base_url, api_key="k", max_retries=0)
    sink = MemorySink()
    extra = {} if effort is None else {"reasoning_effort": effort}
    with ExecutionContext(sinks=[sink]):
        _read_all(
            client.chat.completions.create(
                model=model, messages=PROMPT, max_completion_tokens=4096, stream=True, **extra
            )
        )
    (node,) = [n for n in sink.nodes if n.kind == "llm"]
    assert node.tokens_out == (4096 if unseen else len("Looking"))
    assert node.metadata["cost_status"] == "estimated"


def test_reasoning_a_compatible_server_streams_counts_as_output_of_a_cut_stream(
    replay: ReplayServer,
) -> None:
    """DeepSeek and vLLM stream reasoning as ``reasoning_content`` (OpenRouter as
    ``reasoning``): billed output, which a stream cut before its usage chunk counted as 0."""
    thought = "First, list the rivers of Europe by length. " * 4
    for field in ("reasoning_content", "reasoning"):
        replay.script("/v1/chat/completions", ReplayResponse.sse(_chat_chunks({field: thought})))
    client = openai.OpenAI(base_url=replay.openai_base_url, api_key="k", max_retries=0)
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        for _ in range(2):
            _read_all(
                client.chat.completions.create(
                    model="qwen3-32b", messages=PROMPT, max_tokens=4096, stream=True
                )
            )
    for node in [n for n in sink.nodes if n.kind == "llm"]:
        assert node.tokens_out == len(thought)  # a token per character, at most
