"""A provider's response id is no idempotency key: a server that repeats ids is still billed
for every request, so every request counts and the cap holds.

Gateways and mock servers answer every request with one id, and Ollama draws its ids from 999
values; the billing provider does both (``id_pool``), and the provider's bill is the truth:
recorded equals billed and billed stays under the cap. ``instrument(response_id_keys=True)``
is for a caching gateway: even then a call counts once only when its id, its endpoint and its
usage are all the same as an earlier call's, and its node says so.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import openai
import pytest

from ampmeter import ExecutionContext, Limit, LimitExceeded
from ampmeter.integrations import instrument
from ampmeter.keys import KEY_LLM_CALLS
from ampmeter.sinks.memory import MemorySink
from ampmeter.testing import BillingProvider, ReplayResponse, ReplayServer

pytestmark = pytest.mark.usefixtures("instrumented")  # conftest.py

PRICES = {"gpt-4o-mini": ("0.15", "0.60")}  # the price table's, so recorded can equal billed
CAP = Decimal("0.0002")  # about 18 calls of "Hi" and 16 tokens out


def _spend_until_stopped(client: openai.OpenAI, ctx: ExecutionContext, most: int) -> int:
    """Calls made before a limit stopped one (``most``: a limit that never stops fails)."""
    for made in range(most):
        try:
            client.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": "Hi"}], max_tokens=16
            )
        except LimitExceeded:
            return made
    raise AssertionError(f"{most} calls and no limit stopped one: {ctx.stats.total_cost()}")


@pytest.mark.parametrize("pool", [1, 4], ids=["one id", "ids from a small set"])
def test_a_repeated_id_is_a_billed_call_and_counts(pool: int) -> None:
    """One id for every answer (a gateway, a mock), or ids drawn from a few values (as
    Ollama's 999, made few so that they repeat at once): the cost cap and a call-count limit
    hold against the provider's bill."""
    sink = MemorySink()
    with BillingProvider(id_pool=pool, prices=PRICES) as server:
        client = openai.OpenAI(base_url=server.openai_base_url, api_key="k", max_retries=0)
        with ExecutionContext(max_cost_usd=CAP, sinks=[sink]) as ctx:
            made = _spend_until_stopped(client, ctx, 60)
        with ExecutionContext(limits=[Limit(KEY_LLM_CALLS, 5)]) as counted:
            assert _spend_until_stopped(client, counted, 60) == 5
        billed = server.calls
    ids = [n.metadata["response_id"] for n in sink.nodes if n.kind == "llm" and n.tokens_in]
    assert len(ids) == made > len(set(ids))  # the premise: ids repeated
    assert len(set(ids)) <= pool
    assert ctx.stats.total_cost() == sum(c.cost_usd or 0 for c in billed[:made]) <= CAP
    assert ctx.stats.get_counter(KEY_LLM_CALLS) == made
    assert len(billed) == made + 5
    assert not any({"duplicate_of", "idempotency_key"} & n.metadata.keys() for n in sink.nodes)


def _chat(server: ReplayServer, content: str) -> Any:
    client = openai.OpenAI(base_url=server.openai_base_url, api_key="k", max_retries=0)
    messages = [{"role": "user", "content": content}]
    return client.chat.completions.create(model="gpt-4o-mini", messages=messages)


def test_gateway_keys_count_a_stored_response_once_and_nothing_else() -> None:
    """With ``response_id_keys=True`` one id comes back three times: the same usage from the
    same endpoint (a cached answer delivered again) counts once and its node says so; other
    usage, or another endpoint with the same usage, is another billed call."""
    instrument(response_id_keys=True)  # the fixture puts the default back
    usage = {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10}
    other = {"prompt_tokens": 30, "completion_tokens": 4, "total_tokens": 34}
    message = {"role": "assistant", "content": "yes"}
    chat = {"id": "same", "object": "chat.completion", "created": 1, "model": "gpt-4o-mini"}
    chat["choices"] = [{"index": 0, "finish_reason": "stop", "message": message}]
    text = {**chat, "object": "text_completion"}
    text["choices"] = [{"index": 0, "finish_reason": "stop", "text": "yes", "logprobs": None}]
    sink = MemorySink()
    with ReplayServer(verbatim_ids=True) as server:
        server.script(
            "/v1/chat/completions",
            ReplayResponse.json({**chat, "usage": usage}),
            ReplayResponse.json({**chat, "usage": usage}),
            ReplayResponse.json({**chat, "usage": other}),
        )
        server.script("/v1/completions", ReplayResponse.json({**text, "usage": usage}))
        client = openai.OpenAI(base_url=server.openai_base_url, api_key="k", max_retries=0)
        with ExecutionContext(sinks=[sink]) as ctx:
            answers = [_chat(server, "Say yes."), _chat(server, "Say yes."), _chat(server, "?")]
            client.completions.create(model="gpt-4o-mini", prompt="Say yes.")
    assert [a.id for a in answers] == ["same"] * 3  # every answer reached the caller
    first, again, more, legacy = [n for n in sink.nodes if n.kind == "llm"]
    assert again.metadata["duplicate_of"] == first.node_id
    assert again.status == "success" and again.tokens_in == 0 and again.cost_usd == 0
    assert again.metadata["idempotency_key"] == first.metadata["idempotency_key"]
    assert "openai:same" in first.metadata["idempotency_key"]
    for node in (first, more, legacy):
        assert "duplicate_of" not in node.metadata and node.cost_usd > 0
    assert ctx.stats.get_counter("amp:input_tokens") == 9 + 30 + 9
    assert ctx.stats.get_counter(KEY_LLM_CALLS) == 3


def test_gateway_keys_never_count_an_answer_without_usage_as_a_replay() -> None:
    """Two answers of one id and no usage (a proxy that strips it, a stream cut before it)
    made the same key, id and endpoint alone, so the second, billed, counted as a replay of
    the first and was charged $0. With no usage to compare, nothing says it is one."""
    instrument(response_id_keys=True)  # the fixture puts the default back
    output = [{"type": "message", "id": "m", "role": "assistant", "status": "completed"}]
    output[0]["content"] = [{"type": "output_text", "text": "yes", "annotations": []}]
    response = {"id": "resp_same", "object": "response", "created_at": 1, "status": "completed"}
    response.update(model="gpt-4o-mini", output=output, usage=None)
    sink = MemorySink()
    with ReplayServer(verbatim_ids=True) as server:
        server.script("/v1/responses", *[ReplayResponse.json(response)] * 2)
        client = openai.OpenAI(base_url=server.openai_base_url, api_key="k", max_retries=0)
        with ExecutionContext(sinks=[sink]) as ctx:
            for question in ("Say yes.", "Say yes again."):
                client.responses.create(model="gpt-4o-mini", input=question)
    nodes = [n for n in sink.nodes if n.kind == "llm"]
    assert [n.metadata["response_id"] for n in nodes] == ["openai:resp_same"] * 2
    assert [n.cost_usd > 0 for n in nodes] == [True, True]
    assert not any({"duplicate_of", "idempotency_key"} & n.metadata.keys() for n in nodes)
    assert all(n.cost_usd > 0 and n.metadata["cost_status"] == "estimated" for n in nodes)
    assert ctx.stats.get_counter(KEY_LLM_CALLS) == 2
