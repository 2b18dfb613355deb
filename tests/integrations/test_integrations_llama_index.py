"""LlamaIndex's lazy streams are metered against the context they were created in.

``stream_chat()`` returns a generator that sends its request when first read: in another thread,
in another context, or after the creating context closed. Real LlamaIndex (its LiteLLM LLM,
sending with LiteLLM's ``hosted_vllm/`` handler) against the real llama.cpp server, and the
replay server where the test counts the requests that reached it.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from typing import Any

import pytest
from llama_index.core.llms import ChatMessage
from llama_index.llms.litellm import LiteLLM

from ampmeter import ExecutionContext, LimitExceeded, StreamOutlivedContext, find_limit_exceeded
from ampmeter.keys import KEY_INPUT_TOKENS, KEY_LLM_CALLS
from ampmeter.local_llm import LocalLLMServer
from ampmeter.sinks.memory import MemorySink
from ampmeter.testing import recorded
from ampmeter.testing.replay import ReplayServer

MESSAGES = [ChatMessage(role="user", content="Name one colour.")]


pytestmark = pytest.mark.usefixtures("instrumented")  # conftest.py


def llm_for(base_url: str, model: str) -> LiteLLM:
    return LiteLLM(
        model="hosted_vllm/" + model,
        api_base=base_url,
        api_key="k",
        temperature=0.0,
        max_tokens=5,
        max_retries=0,
    )


def server_usage(server: LocalLLMServer) -> tuple[int, int]:
    """The usage the server reports for the same request, asked for outside any context."""
    import litellm

    plain = litellm.completion(
        model="hosted_vllm/" + server.model,
        api_base=server.base_url,
        api_key="k",
        messages=[{"role": "user", "content": "Name one colour."}],
        temperature=0.0,
        max_tokens=5,
    )
    return plain.usage.prompt_tokens, plain.usage.completion_tokens


def read_in_a_thread(stream: Any) -> list[Any]:
    """Read ``stream`` to its end on a new thread (which has no current context)."""
    out: list[Any] = []
    errors: list[BaseException] = []

    def read() -> None:
        try:
            out.extend(stream)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=read)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return out


def test_a_stream_read_on_another_thread_is_metered_in_its_creating_context(
    llm_server: LocalLLMServer,
) -> None:
    llm = llm_for(llm_server.base_url, llm_server.model)
    tokens = server_usage(llm_server)
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]) as ctx:
        stream = llm.stream_chat(MESSAGES)
        assert sink.nodes == []  # a lazy stream: nothing sent yet
        with ExecutionContext() as elsewhere:  # a stream read inside another context...
            chunks = read_in_a_thread(stream)  # ...and on a thread with no context at all
        assert elsewhere.stats.get_counter(KEY_LLM_CALLS) == 0
        assert chunks and chunks[-1].message.content
        (node,) = [n for n in sink.nodes if n.kind == "llm"]
        assert (node.tokens_in, node.tokens_out) == tokens
        assert node.status == "success"
        assert ctx.stats.get_counter(KEY_LLM_CALLS) == 1
        assert ctx.stats.get_counter(KEY_INPUT_TOKENS) == tokens[0]


def test_the_creating_contexts_limits_stop_a_stream_read_elsewhere(
    llm_server: LocalLLMServer,
) -> None:
    llm = llm_for(llm_server.base_url, llm_server.model)
    with ExecutionContext(max_steps=0) as ctx:
        stream = llm.stream_chat(MESSAGES)
        with pytest.raises(Exception) as raised:
            read_in_a_thread(stream)
    assert isinstance(find_limit_exceeded(raised.value), LimitExceeded)
    assert ctx.stats.get_counter(KEY_LLM_CALLS) == 0


def test_a_stream_read_after_its_context_closed_is_not_sent() -> None:
    with ReplayServer() as replay:
        replay.script("/v1/chat/completions", recorded.openai_chat_stream_usage())
        llm = llm_for(replay.openai_base_url, "gpt-4o-mini")
        with ExecutionContext(max_cost_usd=1.0):
            stream = llm.stream_chat(MESSAGES)
        with pytest.raises(Exception) as raised:  # LiteLLM re-raises it as a client error
            list(stream)
        assert replay.requests == []
    stop = find_limit_exceeded(raised.value)
    assert isinstance(stop, StreamOutlivedContext)
    assert "after that context closed" in str(stop)


async def test_an_async_stream_read_in_another_task_is_metered_in_its_creating_context(
    llm_server: LocalLLMServer,
) -> None:
    llm = llm_for(llm_server.base_url, llm_server.model)
    tokens = server_usage(llm_server)
    sink = MemorySink()

    async def read(stream: Any) -> list[Any]:
        return [chunk async for chunk in stream]

    async with ExecutionContext(sinks=[sink]) as ctx:
        stream = await llm.astream_chat(MESSAGES)
        # a task started from an empty context: no current ampmeter context there
        task = asyncio.get_running_loop().create_task(read(stream), context=contextvars.Context())
        chunks = await task
    assert chunks
    (node,) = [n for n in sink.nodes if n.kind == "llm"]
    assert (node.tokens_in, node.tokens_out) == tokens
    assert ctx.stats.get_counter(KEY_INPUT_TOKENS) == tokens[0]
