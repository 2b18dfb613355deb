"""OpenAI SDK instrumentation against the real local llama.cpp server (real SDK, real HTTP)."""

from __future__ import annotations

import gc
import json

import openai
import pytest
from openai._base_client import AsyncAPIClient, SyncAPIClient
from openai.resources.chat.completions import Completions
from openai.resources.responses import Responses

import ampmeter.pricing
from ampmeter import ExecutionContext, Limit, LimitExceeded
from ampmeter.integrations import instrument, is_instrumented, uninstrument
from ampmeter.integrations.lifecycle import META_PROMPT_TEXT, META_RESPONSE_TEXT
from ampmeter.keys import KEY_INPUT_TOKENS, KEY_LLM_CALLS
from ampmeter.local_llm import LocalLLMServer
from ampmeter.sinks.memory import MemorySink

MESSAGES = [{"role": "user", "content": "Name one colour."}]


pytestmark = pytest.mark.usefixtures("instrumented")  # conftest.py


def llm_nodes(sink: MemorySink) -> list[ampmeter.Node]:
    return [n for n in sink.nodes if n.kind == "llm"]


def test_sync_create_records_server_usage(
    openai_client: openai.OpenAI, llm_server: LocalLLMServer
) -> None:
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]) as ctx, ctx.step("plan") as step:
        resp = openai_client.chat.completions.create(
            model=llm_server.model, messages=MESSAGES, max_tokens=6
        )
    (node,) = llm_nodes(sink)
    assert resp.usage is not None
    assert node.tokens_in == resp.usage.prompt_tokens
    assert node.tokens_out == resp.usage.completion_tokens
    assert node.parent_id == step.node_id
    assert node.status == "success"
    assert node.model == llm_server.model
    assert node.metadata["provider"] == "openai"
    assert node.metadata["tool_calls_made"] == 0
    assert node.latency_ms is not None and node.latency_ms >= 0
    # nothing of the conversation, and no key, unless capture_content is asked for
    assert META_PROMPT_TEXT not in node.metadata and META_RESPONSE_TEXT not in node.metadata
    assert "test-key" not in repr(node.to_dict())
    assert ctx.stats.get_counter(KEY_INPUT_TOKENS) == resp.usage.prompt_tokens


async def test_async_create_records_server_usage(
    async_openai_client: openai.AsyncOpenAI, llm_server: LocalLLMServer
) -> None:
    sink = MemorySink()
    async with ExecutionContext(sinks=[sink]):
        resp = await async_openai_client.chat.completions.create(
            model=llm_server.model, messages=MESSAGES, max_tokens=6
        )
    (node,) = llm_nodes(sink)
    assert resp.usage is not None
    assert (node.tokens_in, node.tokens_out) == (
        resp.usage.prompt_tokens,
        resp.usage.completion_tokens,
    )


def test_stream_with_caller_usage_option_matches_usage_chunk(
    openai_client: openai.OpenAI, llm_server: LocalLLMServer
) -> None:
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        stream = openai_client.chat.completions.create(
            model=llm_server.model,
            messages=MESSAGES,
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
    usage = [c.usage for c in chunks if c.usage is not None]
    assert len(usage) == 1  # the caller asked for it, so the caller sees it
    (node,) = llm_nodes(sink)
    assert (node.tokens_in, node.tokens_out) == (usage[0].prompt_tokens, usage[0].completion_tokens)
    assert node.status == "success"


def test_stream_without_usage_option_gets_exact_usage_and_hides_the_extra_chunk(
    openai_client: openai.OpenAI, llm_server: LocalLLMServer
) -> None:
    plain = openai_client.chat.completions.create(
        model=llm_server.model, messages=MESSAGES, max_tokens=6
    )
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        chunks = list(
            openai_client.chat.completions.create(
                model=llm_server.model, messages=MESSAGES, max_tokens=6, stream=True
            )
        )
    assert chunks and all(c.choices for c in chunks)  # no usage-only chunk leaks to the caller
    (node,) = llm_nodes(sink)
    assert plain.usage is not None
    assert node.tokens_in == plain.usage.prompt_tokens
    assert node.tokens_out is not None and 1 <= node.tokens_out <= 6


async def test_async_stream_records_usage(
    async_openai_client: openai.AsyncOpenAI, llm_server: LocalLLMServer
) -> None:
    sink = MemorySink()
    async with ExecutionContext(sinks=[sink]):
        stream = await async_openai_client.chat.completions.create(
            model=llm_server.model,
            messages=MESSAGES,
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [c async for c in stream]
    (usage,) = [c.usage for c in chunks if c.usage is not None]
    (node,) = llm_nodes(sink)
    assert (node.tokens_in, node.tokens_out) == (usage.prompt_tokens, usage.completion_tokens)


def test_stream_helper_is_metered(openai_client: openai.OpenAI, llm_server: LocalLLMServer) -> None:
    plain = openai_client.chat.completions.create(
        model=llm_server.model, messages=MESSAGES, max_tokens=6
    )
    sink = MemorySink()
    with (
        ExecutionContext(sinks=[sink]),
        openai_client.chat.completions.stream(
            model=llm_server.model, messages=MESSAGES, max_tokens=6
        ) as stream,
    ):
        for _ in stream:
            pass
    (node,) = llm_nodes(sink)
    assert node.status == "success"
    assert plain.usage is not None and node.tokens_in == plain.usage.prompt_tokens


def test_stream_abandoned_half_way_fails_and_is_counted(
    openai_client: openai.OpenAI, llm_server: LocalLLMServer
) -> None:
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]) as ctx:
        stream = openai_client.chat.completions.create(
            model=llm_server.model,
            messages=[{"role": "user", "content": "Count to fifty."}],
            max_tokens=40,
            stream=True,
        )
        first = next(iter(stream))
        assert first.choices
        stream.close()
    (node,) = llm_nodes(sink)
    assert node.status == "fail"
    assert node.error_class == "StreamAbandoned"
    assert node.tokens_in is not None and node.tokens_in > 0  # the prompt is still billed
    assert ctx.graph.aggregates()["total_llm_calls"] == 1
    assert ctx.stats.get_counter(KEY_LLM_CALLS) == 1


def test_responses_api_records_usage(
    openai_client: openai.OpenAI, llm_server: LocalLLMServer
) -> None:
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        resp = openai_client.responses.create(
            model=llm_server.model, input="Name one colour.", max_output_tokens=6
        )
    (node,) = llm_nodes(sink)
    assert resp.usage is not None
    assert (node.tokens_in, node.tokens_out) == (resp.usage.input_tokens, resp.usage.output_tokens)
    assert node.name == "responses.create"


def test_limit_stops_call_before_it_is_sent(
    openai_client: openai.OpenAI, llm_server: LocalLLMServer
) -> None:
    sink = MemorySink()
    long_prompt = [{"role": "user", "content": "word " * 200}]  # ~250 tokens by chars/4
    limits = [Limit(KEY_INPUT_TOKENS, 100)]
    with ExecutionContext(sinks=[sink], limits=limits) as ctx, pytest.raises(LimitExceeded):
        openai_client.chat.completions.create(
            model=llm_server.model, messages=long_prompt, max_tokens=4
        )
    (node,) = llm_nodes(sink)
    assert node.status == "halt"
    assert node.tokens_in is None  # never sent, nothing used
    assert ctx.stats.get_counter(KEY_INPUT_TOKENS) == 0


def test_no_context_means_untouched_calls(
    openai_client: openai.OpenAI, llm_server: LocalLLMServer
) -> None:
    resp = openai_client.chat.completions.create(
        model=llm_server.model, messages=MESSAGES, max_tokens=4
    )
    assert resp.usage is not None and resp.usage.completion_tokens >= 1
    stream = openai_client.chat.completions.create(
        model=llm_server.model, messages=MESSAGES, max_tokens=4, stream=True
    )
    assert type(stream) is openai.Stream  # not wrapped, no stream_options added


def test_capture_content_opt_in(openai_client: openai.OpenAI, llm_server: LocalLLMServer) -> None:
    instrument(capture_content=True)
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        resp = openai_client.chat.completions.create(
            model=llm_server.model, messages=MESSAGES, max_tokens=6
        )
    (node,) = llm_nodes(sink)
    assert node.metadata[META_PROMPT_TEXT] == "Name one colour."
    assert node.metadata[META_RESPONSE_TEXT] == resp.choices[0].message.content


def test_uninstrument_restores_exactly_and_instrument_is_idempotent() -> None:
    """The SDK is metered at its clients' one door (``request``); its resource methods are
    left as they are."""
    uninstrument()
    doors = (SyncAPIClient, AsyncAPIClient)
    originals = [client.__dict__["request"] for client in doors]
    methods = (Completions.__dict__["create"], Responses.__dict__["create"])
    instrument()
    patched = [client.__dict__["request"] for client in doors]
    assert all(p is not o for p, o in zip(patched, originals, strict=True))
    instrument()
    assert [client.__dict__["request"] for client in doors] == patched  # not wrapped twice
    assert (Completions.__dict__["create"], Responses.__dict__["create"]) == methods
    assert is_instrumented()
    uninstrument()
    uninstrument()
    assert [client.__dict__["request"] for client in doors] == originals
    assert not is_instrumented()
    instrument()


def test_capture_content_must_be_bool() -> None:
    with pytest.raises(TypeError, match="capture_content"):
        instrument(capture_content="yes")  # type: ignore[arg-type]


# -- raw responses (what LiteLLM and header-reading callers use) ---------------------------------


def test_with_raw_response_records_usage_and_parse_gives_the_same_object(
    openai_client: openai.OpenAI, llm_server: LocalLLMServer
) -> None:
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]) as ctx:
        raw = openai_client.chat.completions.with_raw_response.create(
            model=llm_server.model, messages=MESSAGES, max_tokens=6
        )
        (node,) = llm_nodes(sink)  # ended as soon as the response came back
    assert raw.headers.get("content-type", "").startswith("application/json")
    resp = raw.parse()
    assert resp is raw.parse()
    assert resp.usage is not None
    assert (node.tokens_in, node.tokens_out) == (
        resp.usage.prompt_tokens,
        resp.usage.completion_tokens,
    )
    assert node.status == "success"
    assert ctx.stats.get_counter(KEY_INPUT_TOKENS) == resp.usage.prompt_tokens


def test_with_raw_response_stream_parses_to_a_metered_stream(
    openai_client: openai.OpenAI, llm_server: LocalLLMServer
) -> None:
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        raw = openai_client.chat.completions.with_raw_response.create(
            model=llm_server.model,
            messages=MESSAGES,
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        )
        assert raw.status_code == 200
        chunks = list(raw.parse())
    (usage,) = [c.usage for c in chunks if c.usage is not None]
    (node,) = llm_nodes(sink)
    assert node.status == "success"
    assert (node.tokens_in, node.tokens_out) == (usage.prompt_tokens, usage.completion_tokens)


async def test_async_with_raw_response_records_usage(
    async_openai_client: openai.AsyncOpenAI, llm_server: LocalLLMServer
) -> None:
    sink = MemorySink()
    async with ExecutionContext(sinks=[sink]):
        raw = await async_openai_client.chat.completions.with_raw_response.create(
            model=llm_server.model, messages=MESSAGES, max_tokens=6
        )
    resp = raw.parse()
    (node,) = llm_nodes(sink)
    assert resp.usage is not None and node.tokens_in == resp.usage.prompt_tokens
    assert node.tokens_out == resp.usage.completion_tokens


def test_with_streaming_response_records_usage(
    openai_client: openai.OpenAI, llm_server: LocalLLMServer
) -> None:
    sink = MemorySink()
    with (
        ExecutionContext(sinks=[sink]),
        openai_client.chat.completions.with_streaming_response.create(
            model=llm_server.model, messages=MESSAGES, max_tokens=6
        ) as response,
    ):
        resp = response.parse()
    (node,) = llm_nodes(sink)
    assert resp.usage is not None
    assert (node.tokens_in, node.tokens_out) == (
        resp.usage.prompt_tokens,
        resp.usage.completion_tokens,
    )


async def test_async_with_streaming_response_of_a_stream_is_metered(
    async_openai_client: openai.AsyncOpenAI, llm_server: LocalLLMServer
) -> None:
    sink = MemorySink()
    streaming = async_openai_client.chat.completions.with_streaming_response
    async with (
        ExecutionContext(sinks=[sink]),
        streaming.create(
            model=llm_server.model,
            messages=MESSAGES,
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        ) as response,
    ):
        stream = await response.parse()
        chunks = [c async for c in stream]
    (usage,) = [c.usage for c in chunks if c.usage is not None]
    (node,) = llm_nodes(sink)
    assert node.status == "success"
    assert (node.tokens_in, node.tokens_out) == (usage.prompt_tokens, usage.completion_tokens)


def test_a_raw_stream_never_parsed_is_counted_as_abandoned(
    openai_client: openai.OpenAI, llm_server: LocalLLMServer
) -> None:
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]) as ctx:
        raw = openai_client.chat.completions.with_raw_response.create(
            model=llm_server.model, messages=MESSAGES, max_tokens=6, stream=True
        )
        raw.http_response.close()
        del raw
        gc.collect()
    (node,) = llm_nodes(sink)
    assert node.status == "fail" and node.error_class == "StreamAbandoned"
    assert node.tokens_in is not None and node.tokens_in > 0  # the prompt estimate still counts
    assert ctx.stats.get_counter(KEY_LLM_CALLS) == 1


def test_streaming_response_read_as_raw_lines_still_records_usage(
    openai_client: openai.OpenAI, llm_server: LocalLLMServer
) -> None:
    """The SDK's documented way to read a raw stream: its lines, never parsed by the caller."""
    sink = MemorySink()
    streaming = openai_client.chat.completions.with_streaming_response
    with (
        ExecutionContext(sinks=[sink]),
        streaming.create(
            model=llm_server.model,
            messages=MESSAGES,
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        ) as response,
    ):
        lines = list(response.iter_lines())
    events = [
        json.loads(line[5:])
        for line in lines
        if line.startswith("data:") and line[5:].strip() != "[DONE]"
    ]
    (usage,) = [e["usage"] for e in events if e.get("usage")]
    (node,) = llm_nodes(sink)
    assert node.status == "success"
    assert (node.tokens_in, node.tokens_out) == (usage["prompt_tokens"], usage["completion_tokens"])


async def test_async_streaming_response_read_as_raw_bytes_still_records_usage(
    async_openai_client: openai.AsyncOpenAI, llm_server: LocalLLMServer
) -> None:
    sink = MemorySink()
    streaming = async_openai_client.chat.completions.with_streaming_response
    async with (
        ExecutionContext(sinks=[sink]),
        streaming.create(
            model=llm_server.model,
            messages=MESSAGES,
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        ) as response,
    ):
        body = b"".join([piece async for piece in response.iter_bytes(chunk_size=7)])
    (usage,) = [
        json.loads(line[5:])["usage"]
        for line in body.decode().splitlines()
        if line.startswith("data:") and '"usage":{' in line
    ]
    (node,) = llm_nodes(sink)
    assert node.status == "success"
    assert (node.tokens_in, node.tokens_out) == (usage["prompt_tokens"], usage["completion_tokens"])
