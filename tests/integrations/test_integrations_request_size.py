"""Every metered layer reserves the input of the whole request, measured in its wire format.

The estimate an integration hands the context is ``request_size.measure(wire, body)`` of the
body that goes on the wire (tools, system and schemas included), so a per-call input cap set
one token under that estimate refuses the request before the server sees it, and a cap equal
to it lets it through.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from ampmeter import ExecutionContext, Limit, LimitExceeded
from ampmeter.keys import KEY_OUTPUT_TOKENS
from ampmeter.pricing import request_size
from ampmeter.pricing.request_size import Wire
from ampmeter.sinks.memory import MemorySink
from ampmeter.testing import recorded
from ampmeter.testing.replay import ReplayServer

pytestmark = pytest.mark.usefixtures("instrumented")  # conftest.py

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": f"lookup_{n}",
            "description": "Look a city's weather up in the archive, by day and hour. " * 4,
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
    for n in range(5)
]
MESSAGES = [
    {"role": "system", "content": "You answer weather questions briefly."},
    {"role": "user", "content": "Weather in Paris and Oslo?"},
]
ANTHROPIC_TOOLS = [
    {
        "name": f"lookup_{n}",
        "description": "Look a city's weather up. " * 6,
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
    for n in range(5)
]


@pytest.fixture(autouse=True)
def fresh_ratios() -> Iterator[None]:
    request_size.forget()
    yield
    request_size.forget()


def expected_tokens(wire: Wire, body: dict[str, Any]) -> int:
    return request_size.input_tokens(request_size.measure(wire, body), body["model"])


def check_cap(
    replay: ReplayServer, path: str, estimate: int, send: Callable[[], object]
) -> MemorySink:
    """Under a cap one token short of ``estimate`` nothing is sent; at ``estimate`` it is."""
    with ExecutionContext(max_input_tokens_per_call=estimate - 1), pytest.raises(LimitExceeded):
        send()
    assert [r for r in replay.requests if r.path == path] == []
    sink = MemorySink()
    with ExecutionContext(max_input_tokens_per_call=estimate, sinks=[sink]):
        send()
    assert len([r for r in replay.requests if r.path == path]) == 1
    assert [n.status for n in sink.nodes if n.kind == "llm"] == ["success"]
    return sink


def test_openai_sdk_reserves_the_whole_chat_request(replay: ReplayServer) -> None:
    replay.script("/v1/chat/completions", recorded.openai_chat_tool_calls())
    body = {"model": "gpt-4o-mini", "messages": MESSAGES, "tools": TOOLS, "max_tokens": 50}
    client = openai.OpenAI(base_url=replay.openai_base_url, api_key="k", max_retries=0)
    check_cap(
        replay,
        "/v1/chat/completions",
        expected_tokens("chat", body),
        lambda: client.chat.completions.create(**body),
    )
    assert replay.requests[-1].json() == body  # the measured body is the one sent


def test_openai_responses_and_extra_body_are_measured_as_sent(replay: ReplayServer) -> None:
    replay.script("/v1/responses", recorded.openai_responses_usage())
    extra = {"instructions": "Answer in one word, then explain the reasoning in detail."}
    body = {"model": "gpt-4o-mini", "input": "Weather in Paris?", "max_output_tokens": 40}
    client = openai.OpenAI(base_url=replay.openai_base_url, api_key="k", max_retries=0)
    check_cap(
        replay,
        "/v1/responses",
        expected_tokens("responses", {**body, **extra}),
        lambda: client.responses.create(**body, extra_body=extra),
    )
    assert replay.requests[-1].json() == {**body, **extra}


def test_anthropic_sdk_reserves_the_whole_messages_request(replay: ReplayServer) -> None:
    replay.script("/v1/messages", recorded.anthropic_message_tool_use())
    body = {
        "model": "claude-sonnet-4-5",
        "system": "You answer weather questions briefly.",
        "messages": MESSAGES[1:],
        "tools": ANTHROPIC_TOOLS,
        "max_tokens": 50,
    }
    client = anthropic.Anthropic(base_url=replay.anthropic_base_url, api_key="k", max_retries=0)
    check_cap(
        replay,
        "/v1/messages",
        expected_tokens("anthropic", body),
        lambda: client.messages.create(**body),
    )


def test_the_http_layer_reserves_the_whole_body(replay: ReplayServer) -> None:
    replay.script("/v1/chat/completions", recorded.openai_chat_tool_calls())
    body = {"model": "gpt-4o-mini", "messages": MESSAGES, "tools": TOOLS, "max_tokens": 50}
    url = f"{replay.openai_base_url}/chat/completions"
    with httpx.Client() as client:
        check_cap(
            replay,
            "/v1/chat/completions",
            expected_tokens("chat", body),
            lambda: client.post(url, json=body).raise_for_status(),
        )


def test_a_stream_closed_early_counts_the_measured_input(replay: ReplayServer) -> None:
    replay.script("/v1/chat/completions", recorded.openai_chat_stream_usage())
    body = {"model": "gpt-4o-mini", "messages": MESSAGES, "tools": TOOLS, "stream": True}
    client = openai.OpenAI(base_url=replay.openai_base_url, api_key="k", max_retries=0)
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        stream = client.chat.completions.create(**body)
        next(iter(stream))
        stream.close()  # before the usage chunk: the input is the estimate
    (node,) = [n for n in sink.nodes if n.kind == "llm"]
    assert node.status == "fail"
    assert node.metadata["usage_estimated"] is True
    assert node.tokens_in == expected_tokens("chat", body)


@pytest.mark.parametrize("helper", [False, True])
def test_the_output_cap_is_read_under_either_name(replay: ReplayServer, helper: bool) -> None:
    """``max_tokens`` is the cap when ``max_completion_tokens`` is not an int: the SDK's stream
    helper sends both, the one not given as the SDK's NOT_GIVEN sentinel."""
    replay.script("/v1/chat/completions", recorded.openai_chat_stream_usage())
    client = openai.OpenAI(base_url=replay.openai_base_url, api_key="k", max_retries=0)
    cap = [Limit(KEY_OUTPUT_TOKENS, 499)]
    with ExecutionContext(limits=cap), pytest.raises(LimitExceeded, match="output_tokens"):
        if helper:
            with client.chat.completions.stream(
                model="gpt-4o-mini", messages=MESSAGES, max_tokens=500
            ) as stream:
                list(stream)
        else:
            client.chat.completions.create(
                model="gpt-4o-mini", messages=MESSAGES, max_tokens=500, max_completion_tokens=True
            )
    assert replay.requests == []
