"""Anthropic SDK instrumentation against the real local llama.cpp server's Messages API."""

from __future__ import annotations

from typing import Any

import anthropic
import pytest
from anthropic._base_client import AsyncAPIClient, SyncAPIClient
from anthropic.resources.messages import Messages

import ampmeter.pricing
from ampmeter import ExecutionContext, Limit, LimitExceeded
from ampmeter.integrations import instrument, uninstrument
from ampmeter.keys import KEY_LLM_CALLS
from ampmeter.local_llm import LocalLLMServer
from ampmeter.sinks.memory import MemorySink

MESSAGES: list[Any] = [{"role": "user", "content": "Name one fruit."}]


pytestmark = pytest.mark.usefixtures("instrumented")  # conftest.py


def only_llm_node(sink: MemorySink) -> ampmeter.Node:
    (node,) = [n for n in sink.nodes if n.kind == "llm"]
    return node


def normalised_in(usage: Any) -> int:
    return int(
        usage.input_tokens
        + (usage.cache_read_input_tokens or 0)
        + (usage.cache_creation_input_tokens or 0)
    )


def test_sync_create_normalises_cache_tokens(
    anthropic_client: anthropic.Anthropic, llm_server: LocalLLMServer
) -> None:
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        msg = anthropic_client.messages.create(
            model=llm_server.model, messages=MESSAGES, max_tokens=6
        )
    node = only_llm_node(sink)
    assert node.tokens_in == normalised_in(msg.usage)
    assert node.tokens_out == msg.usage.output_tokens
    assert node.metadata.get("cached_tokens", 0) == (msg.usage.cache_read_input_tokens or 0)
    assert node.metadata["provider"] == "anthropic"
    assert node.name == "messages.create"


async def test_async_create(
    async_anthropic_client: anthropic.AsyncAnthropic, llm_server: LocalLLMServer
) -> None:
    sink = MemorySink()
    async with ExecutionContext(sinks=[sink]):
        msg = await async_anthropic_client.messages.create(
            model=llm_server.model, messages=MESSAGES, max_tokens=6
        )
    node = only_llm_node(sink)
    assert (node.tokens_in, node.tokens_out) == (normalised_in(msg.usage), msg.usage.output_tokens)


def test_create_stream_true(
    anthropic_client: anthropic.Anthropic, llm_server: LocalLLMServer
) -> None:
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        events = list(
            anthropic_client.messages.create(
                model=llm_server.model, messages=MESSAGES, max_tokens=6, stream=True
            )
        )
    start = next(e for e in events if e.type == "message_start")
    delta = [e for e in events if e.type == "message_delta"][-1]
    node = only_llm_node(sink)
    assert node.status == "success"
    assert node.tokens_in == normalised_in(start.message.usage)
    assert node.tokens_out == delta.usage.output_tokens


def test_stream_helper_sync(
    anthropic_client: anthropic.Anthropic, llm_server: LocalLLMServer
) -> None:
    sink = MemorySink()
    with (
        ExecutionContext(sinks=[sink]),
        anthropic_client.messages.stream(
            model=llm_server.model, messages=MESSAGES, max_tokens=6
        ) as stream,
    ):
        final = stream.get_final_message()
    node = only_llm_node(sink)
    assert node.name == "messages.stream"
    assert node.status == "success"
    assert (node.tokens_in, node.tokens_out) == (
        normalised_in(final.usage),
        final.usage.output_tokens,
    )


async def test_stream_helper_async(
    async_anthropic_client: anthropic.AsyncAnthropic, llm_server: LocalLLMServer
) -> None:
    sink = MemorySink()
    async with (
        ExecutionContext(sinks=[sink]),
        async_anthropic_client.messages.stream(
            model=llm_server.model, messages=MESSAGES, max_tokens=6
        ) as stream,
    ):
        final = await stream.get_final_message()
    node = only_llm_node(sink)
    assert (node.tokens_in, node.tokens_out) == (
        normalised_in(final.usage),
        final.usage.output_tokens,
    )


async def test_async_stream_helper_stopped_by_limit_sends_nothing(
    async_anthropic_client: anthropic.AsyncAnthropic, llm_server: LocalLLMServer
) -> None:
    sink = MemorySink()
    async with ExecutionContext(sinks=[sink], limits=[Limit(KEY_LLM_CALLS, 0)]) as ctx:
        with pytest.raises(LimitExceeded):
            async with async_anthropic_client.messages.stream(
                model=llm_server.model, messages=MESSAGES, max_tokens=6
            ):
                pass
    assert only_llm_node(sink).status == "halt"
    assert ctx.stats.get_counter(KEY_LLM_CALLS) == 0


def test_uninstrument_restores_the_clients_door_exactly() -> None:
    """The SDK is metered at its clients' one door (``request``); ``messages`` is left as it
    is."""
    uninstrument()
    doors = (SyncAPIClient, AsyncAPIClient)
    originals = [client.__dict__["request"] for client in doors]
    methods = {name: Messages.__dict__[name] for name in ("create", "stream")}
    instrument()
    assert all(
        client.__dict__["request"] is not o for client, o in zip(doors, originals, strict=True)
    )
    assert {name: Messages.__dict__[name] for name in ("create", "stream")} == methods
    uninstrument()
    assert [client.__dict__["request"] for client in doors] == originals


def test_beta_messages_create_and_stream_helper_are_metered(
    anthropic_client: anthropic.Anthropic, llm_server: LocalLLMServer
) -> None:
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]) as ctx:
        msg = anthropic_client.beta.messages.create(
            model=llm_server.model, messages=MESSAGES, max_tokens=6
        )
        with anthropic_client.beta.messages.stream(
            model=llm_server.model, messages=MESSAGES, max_tokens=6
        ) as stream:
            final = stream.get_final_message()
    created, streamed = [n for n in sink.nodes if n.kind == "llm"]
    assert created.name == "beta.messages.create" and streamed.name == "beta.messages.stream"
    assert (created.tokens_in, created.tokens_out) == (
        normalised_in(msg.usage),
        msg.usage.output_tokens,
    )
    assert (streamed.tokens_in, streamed.tokens_out) == (
        normalised_in(final.usage),
        final.usage.output_tokens,
    )
    assert ctx.stats.get_counter(KEY_LLM_CALLS) == 2


async def test_async_beta_messages_stopped_by_a_limit_sends_nothing(
    async_anthropic_client: anthropic.AsyncAnthropic, llm_server: LocalLLMServer
) -> None:
    sink = MemorySink()
    async with ExecutionContext(sinks=[sink], limits=[Limit(KEY_LLM_CALLS, 0)]) as ctx:
        with pytest.raises(LimitExceeded):
            await async_anthropic_client.beta.messages.create(
                model=llm_server.model, messages=MESSAGES, max_tokens=6
            )
    assert only_llm_node(sink).status == "halt"
    assert ctx.stats.get_counter(KEY_LLM_CALLS) == 0


def test_with_raw_response_records_usage(
    anthropic_client: anthropic.Anthropic, llm_server: LocalLLMServer
) -> None:
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        raw = anthropic_client.messages.with_raw_response.create(
            model=llm_server.model, messages=MESSAGES, max_tokens=6
        )
    msg = raw.parse()
    node = only_llm_node(sink)
    assert (node.tokens_in, node.tokens_out) == (normalised_in(msg.usage), msg.usage.output_tokens)


def test_with_raw_response_of_a_stream_parses_to_a_metered_stream(
    anthropic_client: anthropic.Anthropic, llm_server: LocalLLMServer
) -> None:
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        raw = anthropic_client.messages.with_raw_response.create(
            model=llm_server.model, messages=MESSAGES, max_tokens=6, stream=True
        )
        events = list(raw.parse())
    delta = [e for e in events if e.type == "message_delta"][-1]
    node = only_llm_node(sink)
    assert node.status == "success" and node.tokens_out == delta.usage.output_tokens
