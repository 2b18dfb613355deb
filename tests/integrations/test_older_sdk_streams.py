"""An instrumented stream stays the SDK's own object on the older SDK majors too: openai 1.x and
2.x (``openai.Stream`` / ``openai.AsyncStream``) and anthropic 0.40 (``messages.create(stream=
True)`` and the ``messages.stream()`` helper), sync and async, each in an environment of its own
(:mod:`sdk_envs`) against a loopback replay server whose recorded usage is the truth.
"""

from __future__ import annotations

from typing import Any

import pytest

from ampmeter.testing import recorded
from support.sdk_envs import oldest_env, openai_2_env, run_program

OPENAI_PROGRAM = r"""
import asyncio, json
import httpx, openai
import ampmeter
from ampmeter.sinks.memory import MemorySink
from ampmeter.testing import recorded
from ampmeter.testing.replay import ReplayServer

ampmeter.instrument()
ARGS = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "stream": True}
USAGE = {"stream_options": {"include_usage": True}}


def shape(stream, cls):
    return {"class": [type(stream) is cls, isinstance(stream, cls)],
            "response": [type(stream.response) is httpx.Response, stream.response.status_code]}


def without_id(chunks):
    # The replay server gives each response a fresh id, as a provider does.
    return [{k: v for k, v in c.model_dump().items() if k != "id"} for c in chunks]


def usage_of(chunks):
    return [[c.usage.prompt_tokens, c.usage.completion_tokens] for c in chunks if c.usage]


async def run_async(client):
    stream = await client.chat.completions.create(**ARGS, **USAGE)
    seen = shape(stream, openai.AsyncStream)
    async with stream as entered:
        seen["entered"] = entered is stream
        seen["usage"] = usage_of([c async for c in stream])
    try:
        await client.chat.completions.create(**ARGS, **USAGE)
    except ampmeter.LimitExceeded:
        seen["stopped"] = True
    return seen


with ReplayServer() as server:
    server.script("/v1/chat/completions", *(recorded.openai_chat_stream_usage() for _ in range(3)))
    client = openai.OpenAI(base_url=server.openai_base_url, api_key="k", max_retries=2)
    bare = without_id(client.chat.completions.create(**ARGS, **USAGE))
    sink = MemorySink()
    with ampmeter.ExecutionContext(max_steps=2, sinks=[sink]):
        stream = client.chat.completions.create(**ARGS, **USAGE)
        sync = shape(stream, openai.Stream)
        with stream as entered:
            sync["entered"] = entered is stream
            chunks = list(stream)
        sync["same_chunks"] = without_id(chunks) == bare
        sync["usage"] = usage_of(chunks)
        aclient = openai.AsyncOpenAI(base_url=server.openai_base_url, api_key="k", max_retries=2)
        asynchronous = asyncio.run(run_async(aclient))
    print(json.dumps({
        "version": openai.__version__,
        "sync": sync,
        "async": asynchronous,
        "nodes": [[n.status, n.tokens_in, n.tokens_out] for n in sink.nodes if n.kind == "llm"],
        "sent": len(server.requests),
    }))
"""


def chat_usage() -> list[int]:
    (usage,) = [c["usage"] for c in recorded.load("openai_chat_stream_usage") if c.get("usage")]
    return [usage["prompt_tokens"], usage["completion_tokens"]]


@pytest.mark.slow
@pytest.mark.parametrize("major", [1, 2])
def test_openai_streams_are_the_sdks_own_on_older_majors(major: int) -> None:
    result = run_program(oldest_env() if major == 1 else openai_2_env(), OPENAI_PROGRAM)
    assert result["version"].startswith(f"{major}.")
    usage = chat_usage()
    shape: dict[str, Any] = {"class": [True, True], "response": [True, 200], "entered": True}
    assert result["sync"] == {**shape, "same_chunks": True, "usage": [usage]}
    assert result["async"] == {**shape, "usage": [usage], "stopped": True}
    # one request per stream, the third stopped before it was sent
    assert result["nodes"] == [["success", *usage], ["success", *usage], ["halt", None, None]]
    assert result["sent"] == 3  # the bare stream outside the context, and the two metered


ANTHROPIC_PROGRAM = r"""
import asyncio, json
import anthropic, httpx
import ampmeter
from ampmeter.sinks.memory import MemorySink
from ampmeter.testing import recorded
from ampmeter.testing.replay import ReplayServer

ampmeter.instrument()
ARGS = {"model": "claude-haiku-4-5", "max_tokens": 50,
        "messages": [{"role": "user", "content": "Weather in Paris?"}]}


def shape(stream, cls):
    return {"class": [type(stream) is cls, isinstance(stream, cls)],
            "response": [type(stream.response) is httpx.Response, stream.response.status_code]}


def ends(kinds):
    return [kinds[0], kinds[-1]]


async def run_async(client):
    stream = await client.messages.create(**ARGS, stream=True)
    seen = shape(stream, anthropic.AsyncStream)
    seen["events"] = ends([event.type async for event in stream])
    async with client.messages.stream(**ARGS) as helper:
        seen["helper"] = type(helper) is anthropic.AsyncMessageStream
        final = await helper.get_final_message()
    seen["final"] = [final.usage.input_tokens, final.usage.output_tokens]
    try:
        async with client.messages.stream(**ARGS):
            pass
    except ampmeter.LimitExceeded:
        seen["stopped"] = True
    return seen


with ReplayServer() as server:
    server.script("/v1/messages", *(recorded.anthropic_message_stream() for _ in range(4)))
    client = anthropic.Anthropic(base_url=server.anthropic_base_url, api_key="k", max_retries=2)
    sink = MemorySink()
    with ampmeter.ExecutionContext(max_steps=4, sinks=[sink]):
        stream = client.messages.create(**ARGS, stream=True)
        sync = shape(stream, anthropic.Stream)
        sync["events"] = ends([event.type for event in stream])
        with client.messages.stream(**ARGS) as helper:
            sync["helper"] = type(helper) is anthropic.MessageStream
            final = helper.get_final_message()
        sync["final"] = [final.usage.input_tokens, final.usage.output_tokens]
        aclient = anthropic.AsyncAnthropic(
            base_url=server.anthropic_base_url, api_key="k", max_retries=2)
        asynchronous = asyncio.run(run_async(aclient))
    print(json.dumps({
        "version": anthropic.__version__,
        "sync": sync,
        "async": asynchronous,
        "nodes": [[n.metadata["operation_name"], n.status, n.tokens_in, n.tokens_out]
                  for n in sink.nodes if n.kind == "llm"],
        "sent": len(server.requests),
    }))
"""


@pytest.mark.slow
def test_anthropic_0_40_streams_and_stream_helper_are_metered_exactly() -> None:
    """anthropic 0.40's ``messages.stream()`` drops the stream its request returned and reads
    the response through one of its own: the metering follows it (else the call ended as an
    abandoned stream, with the estimate and no output)."""
    result = run_program(oldest_env(), ANTHROPIC_PROGRAM)
    assert result["version"] == "0.40.0"
    events = recorded.load("anthropic_message_stream")
    start = events[0]["data"]["message"]["usage"]
    output = [e["data"]["usage"] for e in events if e["event"] == "message_delta"][-1]
    tokens_in = sum(
        start[key]
        for key in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    )
    reported = [start["input_tokens"], output["output_tokens"]]
    shape: dict[str, Any] = {"class": [True, True], "response": [True, 200]}
    sides = {"events": ["message_start", "message_stop"], "helper": True, "final": reported}
    assert result["sync"] == {**shape, **sides}
    assert result["async"] == {**shape, **sides, "stopped": True}
    metered = [tokens_in, output["output_tokens"]]
    assert result["nodes"] == [
        ["messages.create", "success", *metered],
        ["messages.stream", "success", *metered],
        ["messages.create", "success", *metered],
        ["messages.stream", "success", *metered],
        ["messages.stream", "halt", None, None],
    ]
    assert result["sent"] == 4  # the fifth was stopped before it was sent
