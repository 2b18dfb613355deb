"""Stops reach the caller: through a framework that wraps them (smolagents), and past an SDK's
retry loop (its generic ``client.post()``, and LiteLLM on top of it)."""

from __future__ import annotations

import asyncio

import openai
import pytest
from openai.types.chat import ChatCompletion

from ampmeter import ExecutionContext, LimitExceeded, find_limit_exceeded
from ampmeter.keys import KEY_RETRIES
from ampmeter.local_llm import LocalLLMServer
from ampmeter.sinks.memory import MemorySink
from ampmeter.testing import recorded
from ampmeter.testing.replay import ReplayResponse, ReplayServer

pytestmark = pytest.mark.usefixtures("instrumented")  # conftest.py


def test_smolagents_wraps_the_stop_in_agent_generation_error(llm_server: LocalLLMServer) -> None:
    from smolagents import OpenAIServerModel, ToolCallingAgent
    from smolagents.utils import AgentGenerationError

    model = OpenAIServerModel(model_id=llm_server.model, api_base=llm_server.base_url, api_key="k")
    agent = ToolCallingAgent(tools=[], model=model, max_steps=3, verbosity_level=0)
    sink = MemorySink()
    with ExecutionContext(max_steps=0, sinks=[sink]), pytest.raises(AgentGenerationError) as err:
        agent.run("Name one colour.")
    stop = find_limit_exceeded(err.value)
    assert isinstance(stop, LimitExceeded)
    assert err.value.__cause__ is stop  # smolagents keeps it as the cause
    (node,) = [n for n in sink.nodes if n.kind == "llm"]
    assert node.status == "halt" and stop.node_id == node.node_id


# -- a stop raised below the SDK passes its retry loop --------------------------------------------

COMPLETION = {
    "id": "c1",
    "object": "chat.completion",
    "created": 1,
    "model": "gpt-4o-mini",
    "choices": [
        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "y"}}
    ],
    "usage": {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10},
}
PROMPT = [{"role": "user", "content": "Say yes."}]
CHAT = "/v1/chat/completions"


def test_a_stop_in_the_sdks_generic_post_is_not_retried(replay: ReplayServer) -> None:
    """``client.post()`` skips the resource patches: the HTTP layer stops it, below the SDK's
    retry loop, and the caller still gets the stop itself, once."""
    replay.script("/v1/chat/completions", ReplayResponse.json(COMPLETION))
    client = openai.OpenAI(base_url=replay.openai_base_url, api_key="k", max_retries=3)
    body = {"model": "gpt-4o-mini", "messages": PROMPT, "max_tokens": 2}
    sink = MemorySink()
    with ExecutionContext(max_steps=1, sinks=[sink]) as ctx:
        done = client.post("/chat/completions", body=body, cast_to=ChatCompletion)
        with pytest.raises(LimitExceeded):
            client.post("/chat/completions", body=body, cast_to=ChatCompletion)
    assert done.usage is not None
    assert len(replay.requests) == 1  # the stopped request never left
    assert [n.status for n in sink.nodes if n.kind == "llm"] == ["success", "halt"]
    assert ctx.stats.get_counter(KEY_RETRIES) == 0
    assert ctx.stats.total_input_tokens() == done.usage.prompt_tokens


async def test_an_async_stop_in_the_sdks_generic_post_is_not_retried(replay: ReplayServer) -> None:
    client = openai.AsyncOpenAI(base_url=replay.openai_base_url, api_key="k", max_retries=3)
    body = {"model": "gpt-4o-mini", "messages": PROMPT, "max_tokens": 2}
    sink = MemorySink()
    async with ExecutionContext(max_steps=0, sinks=[sink]):
        with pytest.raises(LimitExceeded):
            await client.post("/chat/completions", body=body, cast_to=ChatCompletion)
    assert replay.requests == []
    assert [n.status for n in sink.nodes if n.kind == "llm"] == ["halt"]


def test_litellm_gets_a_stop_it_does_not_retry(replay: ReplayServer) -> None:
    """LiteLLM's OpenAI provider with SDK retries: one halted node, no request, and a client
    error (status 400) with the stop in its chain, not a retryable connection error (its Router
    does not retry a 400)."""
    import litellm

    sink = MemorySink()
    with ExecutionContext(max_steps=0, sinks=[sink]), pytest.raises(Exception) as caught:
        litellm.completion(
            model="openai/gpt-4o-mini",
            api_base=replay.openai_base_url,
            api_key="k",
            messages=PROMPT,
            max_tokens=2,
            max_retries=3,
        )
    assert replay.requests == []
    assert getattr(caught.value, "status_code", None) == 400
    assert isinstance(find_limit_exceeded(caught.value), LimitExceeded)
    assert [n.status for n in sink.nodes if n.kind == "llm"] == ["halt"]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_litellms_own_num_retries_do_not_retry_a_stop(replay: ReplayServer, mode: str) -> None:
    """``num_retries`` retries every error LiteLLM maps (the async path every error at all):
    a stop is given back at once, as without ``num_retries``."""
    import litellm

    request = {
        "model": "openai/gpt-4o-mini",
        "api_base": replay.openai_base_url,
        "api_key": "k",
        "messages": PROMPT,
        "max_tokens": 2,
        "num_retries": 3,
    }
    sink = MemorySink()
    with ExecutionContext(max_steps=0, sinks=[sink]) as ctx, pytest.raises(Exception) as caught:
        if mode == "sync":
            litellm.completion(**request)
        else:
            asyncio.run(litellm.acompletion(**request))
    assert replay.requests == []
    assert [n.status for n in sink.nodes if n.kind == "llm"] == ["halt"]
    assert ctx.stats.get_counter(KEY_RETRIES) == 0
    assert isinstance(caught.value, litellm.BadRequestError)  # what LiteLLM raises without retries
    assert isinstance(find_limit_exceeded(caught.value), LimitExceeded)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_litellms_own_num_retries_still_retry_a_server_error(
    replay: ReplayServer, mode: str
) -> None:
    """``num_retries=1`` is also the SDK's ``max_retries``: two 500s end the first attempt (one
    node, one SDK retry), then LiteLLM's own retry sends a third request (a second node)."""
    import litellm

    server_error = recorded.openai_error(500)
    replay.script(CHAT, server_error, server_error, ReplayResponse.json(COMPLETION))
    request = {
        "model": "openai/gpt-4o-mini",
        "api_base": replay.openai_base_url,
        "api_key": "k",
        "messages": PROMPT,
        "max_tokens": 2,
        "num_retries": 1,
    }
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]) as ctx:
        if mode == "sync":
            done = litellm.completion(**request)
        else:
            done = asyncio.run(litellm.acompletion(**request))
    assert len(replay.requests) == 3
    assert [n.status for n in sink.nodes if n.kind == "llm"] == ["fail", "success"]
    assert ctx.stats.get_counter(KEY_RETRIES) == 2  # the SDK's retry, and the failed attempt
    assert ctx.stats.total_input_tokens() == done.usage.prompt_tokens
