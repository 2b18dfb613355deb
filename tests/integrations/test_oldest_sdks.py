"""SDKs and frameworks in environments of their own, metered for real: the oldest declared SDKs
(``openai==1.40.0``, ``anthropic==0.40.0``), openai 2.x, Semantic Kernel, pydantic-ai and
openai-agents.

The environments are made by :mod:`sdk_envs`. The programs make real calls to the session's
llama.cpp server or to loopback replay servers, and print what each node recorded beside what
the server reported.
"""

from __future__ import annotations

import pytest

from ampmeter.local_llm import LocalLLMServer
from ampmeter.testing import recorded
from support.responses_socket import ResponsesSocket
from support.sdk_envs import AMPMETER_DEPS, oldest_env, openai_2_env, run_program, sdk_env

PROGRAM = r"""
import asyncio, json, sys
import anthropic, openai
from pydantic import BaseModel
import ampmeter
from ampmeter.sinks.memory import MemorySink

ampmeter.instrument()
openai_url, anthropic_url, model = sys.argv[1:4]
messages = [{"role": "user", "content": "Name one colour."}]

class Colour(BaseModel):
    name: str

reported = []
sink = MemorySink()
client = openai.OpenAI(base_url=openai_url, api_key="k", max_retries=0)
aclient = openai.AsyncOpenAI(base_url=openai_url, api_key="k", max_retries=0)
claude = anthropic.Anthropic(base_url=anthropic_url, api_key="k", max_retries=0)

async def parse_async():
    return await aclient.beta.chat.completions.parse(
        model=model, messages=messages, max_tokens=150, temperature=0, response_format=Colour)

with ampmeter.ExecutionContext(sinks=[sink]):
    r = client.chat.completions.create(model=model, messages=messages, max_tokens=4)
    reported.append((r.usage.prompt_tokens, r.usage.completion_tokens))
    p = client.beta.chat.completions.parse(
        model=model, messages=messages, max_tokens=150, temperature=0, response_format=Colour)
    reported.append((p.usage.prompt_tokens, p.usage.completion_tokens))
    a = asyncio.run(parse_async())
    reported.append((a.usage.prompt_tokens, a.usage.completion_tokens))
    m = claude.messages.create(model=model, messages=messages, max_tokens=4)
    u = m.usage
    reported.append((u.input_tokens + (u.cache_read_input_tokens or 0), u.output_tokens))
nodes = [n for n in sink.nodes if n.kind == "llm"]
print(json.dumps({
    "versions": [openai.__version__, anthropic.__version__],
    "reported": reported,
    "nodes": [[n.metadata.get("operation_name"), n.tokens_in, n.tokens_out] for n in nodes],
}))
"""


@pytest.mark.slow
def test_oldest_declared_sdks_are_metered_exactly(llm_server: LocalLLMServer) -> None:
    program_args = (llm_server.base_url, llm_server.url, llm_server.model)
    result = run_program(oldest_env(), PROGRAM, *program_args)
    assert result["versions"] == ["1.40.0", "0.40.0"]
    operations = [op for op, _, _ in result["nodes"]]
    assert operations == [
        "chat.completions.create",
        "beta.chat.completions.parse",
        "beta.chat.completions.parse",
        "messages.create",
    ]
    assert [[t_in, t_out] for _, t_in, t_out in result["nodes"]] == result["reported"]


PRESSURE_PROGRAM = r"""
import json, sys
import openai
import ampmeter
from ampmeter.sinks.memory import MemorySink

ampmeter.instrument()
openai_url, model = sys.argv[1:3]
ampmeter.set_price("cheap-model", input_per_mtok=0.1, output_per_mtok=0.1)
seen = []

def cheaper(ctx, request):
    seen.append(request["model"])
    if request["messages"][0]["content"] == "refuse me":
        return None
    return {**request, "model": "cheap-model"}

client = openai.OpenAI(base_url=openai_url, api_key="k", max_retries=0)
sink = MemorySink()
refused = None
with ampmeter.ExecutionContext(max_cost_usd=100.0, on_budget_pressure=cheaper, pressure_at=0.001,
                               sinks=[sink]) as ctx:
    ctx.stats.incr_gauge("amp:cost", 1.0)  # spent before: under pressure from the first call
    with client.beta.chat.completions.stream(
            model=model, messages=[{"role": "user", "content": "Hi."}], max_tokens=3) as stream:
        for _ in stream:
            pass
    try:
        with client.beta.chat.completions.stream(
                model=model, messages=[{"role": "user", "content": "refuse me"}], max_tokens=3):
            pass
    except ampmeter.LimitExceeded as stop:
        refused = str(stop)
nodes = [n for n in sink.nodes if n.kind == "llm"]
print(json.dumps({"seen": seen, "refused": refused,
                  "nodes": [[n.metadata.get("operation_name"), n.model, n.status] for n in nodes]}))
"""


@pytest.mark.slow
def test_the_oldest_beta_stream_helper_gets_budget_pressure(llm_server: LocalLLMServer) -> None:
    result = run_program(oldest_env(), PRESSURE_PROGRAM, llm_server.base_url, llm_server.model)
    assert result["seen"] == [llm_server.model, llm_server.model]
    assert result["nodes"] == [
        ["beta.chat.completions.stream", "cheap-model", "success"],  # the SDK names its helper
        ["beta.chat.completions.stream", llm_server.model, "halt"],
    ]
    assert "on_budget_pressure hook" in result["refused"]


STOP_PROGRAM = r"""
import asyncio, json
import openai
from openai.types.chat import ChatCompletion
import ampmeter
from ampmeter.sinks.memory import MemorySink
from ampmeter.testing.replay import ReplayServer

ampmeter.instrument()
body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 2}
result = {"version": openai.__version__}
with ReplayServer() as server:
    client = openai.OpenAI(base_url=server.openai_base_url, api_key="k", max_retries=2)
    aclient = openai.AsyncOpenAI(base_url=server.openai_base_url, api_key="k", max_retries=2)

    async def post_async():
        return await aclient.post("/chat/completions", body=body, cast_to=ChatCompletion)

    for name, post in (
        ("sync", lambda: client.post("/chat/completions", body=body, cast_to=ChatCompletion)),
        ("async", lambda: asyncio.run(post_async())),
    ):
        sink = MemorySink()
        error = None
        with ampmeter.ExecutionContext(max_steps=0, sinks=[sink]) as ctx:
            try:
                post()
            except Exception as exc:
                error = type(exc).__name__
        result[name] = {
            "error": error,
            "nodes": [n.status for n in sink.nodes if n.kind == "llm"],
            "retries": ctx.stats.get_counter("amp:retries"),
        }
    result["sent"] = len(server.requests)
print(json.dumps(result))
"""


@pytest.mark.slow
@pytest.mark.parametrize("major", [1, 2])
def test_a_stop_below_an_older_sdk_is_not_retried(major: int) -> None:
    """openai 1.x and 2.x catch every exception of their transport and retry it: a stop raised
    at the HTTP layer (the SDK's generic ``client.post()``) still reaches the caller, once."""
    python = oldest_env() if major == 1 else openai_2_env()
    result = run_program(python, STOP_PROGRAM)
    assert result["version"].startswith(f"{major}.")
    for name in ("sync", "async"):
        assert result[name] == {"error": "LimitExceeded", "nodes": ["halt"], "retries": 0}
    assert result["sent"] == 0


SEMANTIC_KERNEL_PROGRAM = r"""
import asyncio, json
from openai import AsyncOpenAI
from semantic_kernel.connectors.ai.open_ai import (
    OpenAIChatCompletion, OpenAIChatPromptExecutionSettings)
from semantic_kernel.contents import ChatHistory
import ampmeter
from ampmeter.sinks.memory import MemorySink
from ampmeter.testing import recorded
from ampmeter.testing.replay import ReplayServer

ampmeter.instrument()

async def main():
    with ReplayServer() as server:
        server.script("/v1/chat/completions", recorded.openai_chat_stream_usage())
        client = AsyncOpenAI(base_url=server.openai_base_url, api_key="k", max_retries=0)
        service = OpenAIChatCompletion(ai_model_id="gpt-4o-mini", async_client=client)
        history = ChatHistory()
        history.add_user_message("Weather in Paris?")
        settings = OpenAIChatPromptExecutionSettings(max_tokens=50)
        sink = MemorySink()
        stopped = None
        async with ampmeter.ExecutionContext(max_steps=1, sinks=[sink]):
            text = []
            async for messages in service.get_streaming_chat_message_contents(history, settings):
                text.extend(str(m) for m in messages)
            try:
                async for _ in service.get_streaming_chat_message_contents(history, settings):
                    pass
            except Exception as exc:
                stopped = ampmeter.find_limit_exceeded(exc) is not None
        print(json.dumps({
            "text": "".join(text),
            "nodes": [[n.status, n.tokens_in, n.tokens_out] for n in sink.nodes if n.kind == "llm"],
            "sent": len(server.requests),
            "stopped": stopped,
        }))

asyncio.run(main())
"""
# Semantic Kernel pins pydantic below 2.14, which genai-prices needs on Python 3.15: it cannot
# join the development group, so it runs in an environment of its own.
SEMANTIC_KERNEL = ("semantic-kernel>=1.30", "openai>=3", *AMPMETER_DEPS)


@pytest.mark.slow
def test_semantic_kernel_streams_through_the_sdks_own_stream() -> None:
    """Semantic Kernel tests ``isinstance(response, AsyncStream)``: an instrumented stream must
    be the SDK's own, and be metered exactly, and a stop must reach it before the request."""
    result = run_program(sdk_env("semantic-kernel", SEMANTIC_KERNEL), SEMANTIC_KERNEL_PROGRAM)
    chunks = recorded.load("openai_chat_stream_usage")
    (usage,) = [c["usage"] for c in chunks if c.get("usage")]
    expected = "".join(
        choice["delta"].get("content") or "" for c in chunks for choice in c["choices"]
    )
    assert result["text"] == expected
    assert result["nodes"] == [
        ["success", usage["prompt_tokens"], usage["completion_tokens"]],
        ["halt", None, None],
    ]
    assert result["sent"] == 1
    assert result["stopped"] is True


PYDANTIC_AI_PROGRAM = r"""
import asyncio, json, sys
from openai import AsyncOpenAI
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIResponsesModel
from pydantic_ai.providers.openai import OpenAIProvider
import ampmeter
from ampmeter.sinks.memory import MemorySink

ampmeter.instrument()
base_url = sys.argv[1]

async def main():
    client = AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0)
    model = OpenAIResponsesModel("o4-mini", provider=OpenAIProvider(openai_client=client))
    agent = Agent(model, model_settings={"openai_transport": "websocket"})
    sink = MemorySink()
    stopped = None
    async with ampmeter.ExecutionContext(max_steps=1, sinks=[sink]):
        result = await agent.run("Look it up.")
        try:
            await agent.run("And again.")
        except Exception as exc:
            stopped = ampmeter.find_limit_exceeded(exc) is not None
    usage = result.usage
    print(json.dumps({
        "nodes": [[n.status, n.tokens_in, n.tokens_out, n.metadata.get("transport")]
                  for n in sink.nodes if n.kind == "llm"],
        "usage": [usage.input_tokens, usage.output_tokens],
        "stopped": stopped,
    }))

asyncio.run(main())
"""
# pydantic-ai installs beside the development group; its WebSocket mode needs the
# openai-realtime extra, kept out of the group with its own environment.
PYDANTIC_AI = ("pydantic-ai-slim[openai,openai-realtime]", *AMPMETER_DEPS)


@pytest.mark.slow
def test_pydantic_ai_websocket_mode_is_metered_at_the_websockets_client() -> None:
    """pydantic-ai's ``openai_transport='websocket'`` sends its frames with the SDK
    connection's ``send_raw``, past the SDK-level patch: the ``websockets`` client meters them."""
    with ResponsesSocket() as server:
        python = sdk_env("pydantic-ai", PYDANTIC_AI)
        result = run_program(python, PYDANTIC_AI_PROGRAM, server.base_url)
        sent = len(server.creates)
    usage = recorded.load("openai_responses_usage")["usage"]
    assert result["usage"] == [usage["input_tokens"], usage["output_tokens"]]
    assert result["nodes"] == [
        ["success", usage["input_tokens"], usage["output_tokens"], "websockets"],
        ["halt", None, None, "websockets"],
    ]
    assert sent == 1  # the stopped run sent nothing
    assert result["stopped"] is True


OPENAI_AGENTS_PROGRAM = r"""
import asyncio, json, sys
from openai import AsyncOpenAI
from agents import Agent, ModelSettings, Runner, function_tool, set_tracing_disabled
from agents.models.openai_provider import OpenAIProvider
from agents.retry import ModelRetrySettings, retry_policies
from agents.run import RunConfig
import ampmeter
from ampmeter.sinks.memory import MemorySink

ampmeter.instrument()
set_tracing_disabled(True)  # its traces would go to the provider over HTTP
base_url = sys.argv[1]
looked_up = []

@function_tool
def lookup(term: str) -> str:
    'Look a term up in the glossary.'
    looked_up.append(term)
    return "calls made per task"

async def main():
    client = AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0)
    provider = OpenAIProvider(openai_client=client, use_responses_websocket=True)
    # the runner's own retries, on everything they may retry: a stop must not be one of them
    retry = ModelRetrySettings(max_retries=3, policy=retry_policies.any(
        retry_policies.network_error(), retry_policies.provider_suggested()))
    agent = Agent(name="glossary", instructions="Be brief.", model="o4-mini", tools=[lookup],
                  model_settings=ModelSettings(retry=retry))
    sink = MemorySink()
    stopped = None
    async with ampmeter.ExecutionContext(max_steps=1, sinks=[sink]) as ctx:
        try:  # a tool call, then a second turn with its result: stopped before it is sent
            await Runner.run(agent, "Look it up.", run_config=RunConfig(model_provider=provider))
        except Exception as exc:
            stopped = ampmeter.find_limit_exceeded(exc) is not None
    await provider.aclose()
    print(json.dumps({
        "looked_up": looked_up,
        "nodes": [[n.status, n.tokens_in, n.tokens_out, n.metadata.get("transport")]
                  for n in sink.nodes if n.kind == "llm"],
        "tokens": [ctx.stats.get_counter("amp:input_tokens"),
                   ctx.stats.get_counter("amp:output_tokens")],
        "stopped": stopped,
    }))

asyncio.run(main())
"""
# openai-agents wants websockets < 17 (the development group has 17): an environment of its own.
OPENAI_AGENTS = ("openai-agents>=0.24", *AMPMETER_DEPS)


@pytest.mark.slow
def test_openai_agents_websocket_mode_is_metered_and_stopped_before_the_frame() -> None:
    """openai-agents' ``use_responses_websocket=True`` opens its own ``websockets`` connection
    and sends raw ``response.create`` frames: each is a node, and the turn after the tool call
    is stopped before its frame leaves, with no retry by the runner."""
    with ResponsesSocket() as server:
        python = sdk_env("openai-agents", OPENAI_AGENTS)
        result = run_program(python, OPENAI_AGENTS_PROGRAM, server.base_url)
        sent = len(server.creates)
    usage = recorded.load("openai_responses_usage")["usage"]
    assert result["looked_up"] == ["amplification factor"]  # the tool the first response asked
    assert sent == 1  # the second turn never left
    assert result["nodes"] == [
        ["success", usage["input_tokens"], usage["output_tokens"], "websockets"],
        ["halt", None, None, "websockets"],
    ]
    assert result["tokens"] == [usage["input_tokens"], usage["output_tokens"]]
    assert result["stopped"] is True
