"""The provider's response id on an instrumented call's node, and as its idempotency key with
``instrument(response_id_keys=True)`` (a caching gateway).

Every node keeps its response's id (``response_id``). With gateway keys, a response delivered
twice (a gateway's cache, a recorded cassette) is the same response: it counts once, locally and
through a shared ledger, and the second call still returns the SDK's object as usual. The
replay server sends the recorded ids as they are (``verbatim_ids=True``), as a cassette would;
by default it gives each response a fresh id, as a real provider does, and every call counts.
By default an id is never a key (tests/integrations/test_repeated_ids.py).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from ampmeter import ExecutionContext
from ampmeter.integrations import instrument
from ampmeter.integrations.adapter import MAX_RESPONSE_ID
from ampmeter.keys import KEY_COST, KEY_INPUT_TOKENS, KEY_LLM_CALLS
from ampmeter.ledgers import SqliteLedger
from ampmeter.testing import ReplayResponse, ReplayServer, recorded

pytestmark = pytest.mark.usefixtures("instrumented")  # conftest.py

USER: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
CHAT, RESPONSES, MESSAGES = "/v1/chat/completions", "/v1/responses", "/v1/messages"
GEMINI = "/v1beta/models/gemini-2.5-flash:generateContent"
GEMINI_STREAM = "/v1beta/models/gemini-2.0-flash:streamGenerateContent"

Send = Callable[[ReplayServer], str]  # one instrumented request; the response id it returned


def openai_chat(server: ReplayServer) -> str:
    client = openai.OpenAI(base_url=server.openai_base_url, api_key="k", max_retries=0)
    answer = client.chat.completions.create(model="gpt-4o-mini", messages=USER)
    assert answer.choices[0].message.tool_calls  # the SDK's own object, parsed as usual
    return f"openai:{answer.id}"


def openai_chat_stream(server: ReplayServer) -> str:
    client = openai.OpenAI(base_url=server.openai_base_url, api_key="k", max_retries=0)
    chunks = list(client.chat.completions.create(model="gpt-4o-mini", messages=USER, stream=True))
    return f"openai:{chunks[0].id}"


def openai_responses(server: ReplayServer) -> str:
    client = openai.OpenAI(base_url=server.openai_base_url, api_key="k", max_retries=0)
    return f"openai:{client.responses.create(model='o4-mini', input='Weather?').id}"


def responses_stream() -> ReplayResponse:
    """The recorded Responses object, streamed as a provider streams it (created, completed)."""
    done = recorded.load("openai_responses_usage")
    started = {**done, "status": "in_progress", "output": [], "usage": None}
    return ReplayResponse.sse(
        [
            (
                "response.created",
                {"type": "response.created", "sequence_number": 0, "response": started},
            ),
            (
                "response.completed",
                {"type": "response.completed", "sequence_number": 1, "response": done},
            ),
        ]
    )


def openai_responses_stream(server: ReplayServer) -> str:
    client = openai.OpenAI(base_url=server.openai_base_url, api_key="k", max_retries=0)
    events = list(client.responses.create(model="o4-mini", input="Weather?", stream=True))
    assert [e.type for e in events] == ["response.created", "response.completed"]
    return f"openai:{events[0].response.id}"


def async_openai_chat_stream(server: ReplayServer) -> str:
    async def send() -> str:
        client = openai.AsyncOpenAI(base_url=server.openai_base_url, api_key="k", max_retries=0)
        async with client:
            stream = await client.chat.completions.create(
                model="gpt-4o-mini", messages=USER, stream=True
            )
            ids = [chunk.id async for chunk in stream]
        return f"openai:{ids[0]}"

    return asyncio.run(send())


def anthropic_stream(server: ReplayServer) -> str:
    client = anthropic.Anthropic(base_url=server.anthropic_base_url, api_key="k", max_retries=0)
    events = list(
        client.messages.create(
            model="claude-sonnet-4-5", max_tokens=100, messages=USER, stream=True
        )
    )
    start = events[0]
    assert start.type == "message_start"
    return f"anthropic:{start.message.id}"


def async_openai_chat(server: ReplayServer) -> str:
    async def send() -> str:
        client = openai.AsyncOpenAI(base_url=server.openai_base_url, api_key="k", max_retries=0)
        async with client:
            answer = await client.chat.completions.create(model="gpt-4o-mini", messages=USER)
        return f"openai:{answer.id}"

    return asyncio.run(send())


def anthropic_message(server: ReplayServer) -> str:
    client = anthropic.Anthropic(base_url=server.anthropic_base_url, api_key="k", max_retries=0)
    answer = client.messages.create(model="claude-sonnet-4-5", max_tokens=100, messages=USER)
    assert [b.type for b in answer.content].count("tool_use") == 2
    return f"anthropic:{answer.id}"


def async_anthropic_stream(server: ReplayServer) -> str:
    async def send() -> str:
        client = anthropic.AsyncAnthropic(
            base_url=server.anthropic_base_url, api_key="k", max_retries=0
        )
        async with (
            client,
            client.messages.stream(
                model="claude-sonnet-4-5", max_tokens=100, messages=USER
            ) as events,
        ):
            final = await events.get_final_message()
        return f"anthropic:{final.id}"

    return asyncio.run(send())


def gemini_over_http(server: ReplayServer) -> str:
    body = {"contents": [{"role": "user", "parts": [{"text": "Weather?"}]}]}
    answer = httpx.post(server.url + GEMINI, json=body).json()
    return f"google:{answer['responseId']}"


def gemini_stream_over_http(server: ReplayServer) -> str:
    body = {"contents": [{"role": "user", "parts": [{"text": "Weather?"}]}]}
    url = server.url + GEMINI_STREAM + "?alt=sse"
    with httpx.Client() as client, client.stream("POST", url, json=body) as response:
        lines = [line for line in response.iter_lines() if line.startswith("data:")]
    return f"google:{json.loads(lines[0][5:])['responseId']}"


SENDERS: dict[str, tuple[Send, str, Callable[[], ReplayResponse]]] = {
    "openai chat": (openai_chat, CHAT, recorded.openai_chat_tool_calls),
    "openai chat stream": (openai_chat_stream, CHAT, recorded.openai_chat_stream_usage),
    "openai responses": (openai_responses, RESPONSES, recorded.openai_responses_usage),
    "openai responses stream": (openai_responses_stream, RESPONSES, responses_stream),
    "async openai chat": (async_openai_chat, CHAT, recorded.openai_chat_tool_calls),
    "async openai chat stream": (async_openai_chat_stream, CHAT, recorded.openai_chat_stream_usage),
    "anthropic stream": (anthropic_stream, MESSAGES, recorded.anthropic_message_stream),
    "anthropic messages": (anthropic_message, MESSAGES, recorded.anthropic_message_tool_use),
    "async anthropic stream": (async_anthropic_stream, MESSAGES, recorded.anthropic_message_stream),
    "gemini over httpx": (gemini_over_http, GEMINI, recorded.gemini_generate_content),
    "gemini stream over httpx": (
        gemini_stream_over_http,
        GEMINI_STREAM,
        recorded.gemini_stream_generate_content,
    ),
}


def llm_nodes(ctx: ExecutionContext) -> list[dict[str, Any]]:
    return [n for n in ctx.snapshot()["graph"]["nodes"].values() if n["kind"] == "llm"]


@pytest.mark.parametrize("name", list(SENDERS))
def test_a_response_delivered_twice_counts_once_with_gateway_keys(name: str) -> None:
    instrument(response_id_keys=True)  # the fixture puts the default back
    send, path, response = SENDERS[name]
    with ReplayServer(verbatim_ids=True) as server:
        server.script(path, response(), response())
        with ExecutionContext(max_cost_usd=10.0) as ctx:
            key = send(server)
            once = (ctx.stats.get_gauge(KEY_COST), ctx.stats.get_counter(KEY_INPUT_TOKENS))
            assert send(server) == key  # the same id again (the premise), returned normally
            twice = (ctx.stats.get_gauge(KEY_COST), ctx.stats.get_counter(KEY_INPUT_TOKENS))
        assert len(server.requests) == 2
    assert once == twice and once[0] > 0 and once[1] > 0
    assert ctx.stats.get_counter(KEY_LLM_CALLS) == 1
    first, again = llm_nodes(ctx)
    assert first["metadata"]["response_id"] == again["metadata"]["response_id"] == key
    assert first["metadata"]["idempotency_key"].startswith(f"{key} ")  # id, endpoint, usage
    assert first["cost_usd"] > 0
    assert again["metadata"]["idempotency_key"] == first["metadata"]["idempotency_key"]
    assert again["metadata"]["duplicate_of"] == first["node_id"]
    assert again["status"] == "success" and again["cost_usd"] == 0
    assert again["tokens_in"] == again["tokens_out"] == 0
    assert ctx.graph.aggregates()["total_cost_usd"] == Decimal(str(first["cost_usd"]))


@pytest.mark.parametrize("name", ["openai chat stream", "anthropic messages"])
def test_fresh_ids_count_every_response(name: str) -> None:
    """The replay server's default, like a provider: each response has its own id."""
    instrument(response_id_keys=True)
    send, path, response = SENDERS[name]
    with ReplayServer() as server, ExecutionContext() as ctx:
        server.script(path, response(), response())
        keys = {send(server), send(server)}
    assert len(keys) == 2
    assert ctx.stats.get_counter(KEY_LLM_CALLS) == 2
    assert {n["metadata"]["response_id"] for n in llm_nodes(ctx)} == keys
    assert all("duplicate_of" not in n["metadata"] for n in llm_nodes(ctx))


def test_a_redelivered_response_counts_once_in_the_shared_ledger(tmp_path: Path) -> None:
    """A second run that replays the first run's cassette adds nothing to the shared spend,
    nor to its own stats: the ledger says it counted the response already."""
    instrument(response_id_keys=True)
    path = tmp_path / "budget.sqlite3"
    with ReplayServer(verbatim_ids=True) as server, SqliteLedger(path, "team") as ledger:
        server.script(CHAT, recorded.openai_chat_tool_calls(), recorded.openai_chat_tool_calls())
        with ExecutionContext(max_cost_usd=10.0, ledger=ledger) as first:
            key = openai_chat(server)
        spent = ledger.spent()[KEY_COST]
        assert spent == first.stats.get_gauge(KEY_COST) > 0
        with ExecutionContext(max_cost_usd=10.0, ledger=ledger) as replayed:
            assert openai_chat(server) == key
        assert ledger.spent()[KEY_COST] == spent
    assert replayed.stats.get_gauge(KEY_COST) == 0
    assert replayed.stats.get_counter(KEY_LLM_CALLS) == 0
    (node,) = llm_nodes(replayed)
    assert node["metadata"]["duplicate_of"] == "ledger:team" and node["cost_usd"] == 0
    assert Decimal(str(node["metadata"]["first_cost_usd"])) == spent


def test_by_default_a_response_delivered_twice_counts_twice() -> None:
    """An id is no key unless asked: a delivery the provider may have billed counts."""
    with ReplayServer(verbatim_ids=True) as server, ExecutionContext() as ctx:
        server.script(CHAT, recorded.openai_chat_tool_calls(), recorded.openai_chat_tool_calls())
        key = openai_chat(server)
        assert openai_chat(server) == key
    assert ctx.stats.get_counter(KEY_LLM_CALLS) == 2
    nodes = llm_nodes(ctx)
    assert [n["metadata"]["response_id"] for n in nodes] == [key, key]
    assert all("idempotency_key" not in n["metadata"] for n in nodes)
    with pytest.raises(TypeError, match="response_id_keys"):
        instrument(response_id_keys="no")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "bad_id", ["x" * (MAX_RESPONSE_ID + 1), "chatcmpl-1\nforged", ""], ids=["long", "nl", "empty"]
)
def test_an_id_no_provider_would_send_is_not_a_key(bad_id: str) -> None:
    """A hostile or broken server's id (too long, control characters, empty) is never a key,
    nor kept on the node: each delivery counts."""
    instrument(response_id_keys=True)
    body = {**recorded.load("openai_chat_tool_calls"), "id": bad_id}
    with ReplayServer(verbatim_ids=True) as server, ExecutionContext() as ctx:
        server.script(CHAT, ReplayResponse.json(body), ReplayResponse.json(body))
        openai_chat(server)
        openai_chat(server)
    assert ctx.stats.get_counter(KEY_LLM_CALLS) == 2
    assert all("idempotency_key" not in n["metadata"] for n in llm_nodes(ctx))
    assert all("response_id" not in n["metadata"] for n in llm_nodes(ctx))
