"""Wire shapes the local model cannot produce, replayed to the real SDKs over loopback."""

from __future__ import annotations

import asyncio

import anthropic
import openai
import pytest

import ampmeter.pricing
from ampmeter import ExecutionContext, Limit, LimitExceeded
from ampmeter.keys import KEY_COST, KEY_LLM_CALLS, KEY_RETRIES
from ampmeter.sinks.memory import MemorySink
from ampmeter.testing import recorded
from ampmeter.testing.replay import ReplayServer

CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"
PROMPT = [{"role": "user", "content": "Weather in Paris and Oslo?"}]


pytestmark = pytest.mark.usefixtures("instrumented")  # conftest.py


def oai(replay: ReplayServer, retries: int = 0) -> openai.OpenAI:
    return openai.OpenAI(base_url=replay.openai_base_url, api_key="sk-secret", max_retries=retries)


def anth(replay: ReplayServer, retries: int = 0) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=replay.anthropic_base_url, api_key="sk-ant-secret", max_retries=retries
    )


def only_llm_node(sink: MemorySink) -> ampmeter.Node:
    (node,) = [n for n in sink.nodes if n.kind == "llm"]
    return node


def test_openai_tool_calls_cached_and_reasoning_tokens(replay: ReplayServer) -> None:
    replay.script(CHAT, recorded.openai_chat_tool_calls())
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]) as ctx:
        oai(replay).chat.completions.create(model="gpt-4o-mini", messages=PROMPT, max_tokens=200)
    node = only_llm_node(sink)
    body = recorded.load("openai_chat_tool_calls")["usage"]
    assert node.tokens_in == body["prompt_tokens"]
    assert node.tokens_out == body["completion_tokens"]
    assert node.metadata["cached_tokens"] == body["prompt_tokens_details"]["cached_tokens"]
    assert (
        node.metadata["reasoning_tokens"] == (body["completion_tokens_details"]["reasoning_tokens"])
    )
    assert node.metadata["tool_calls_made"] == 2
    assert node.metadata["cost_status"] == "priced"
    assert node.cost_usd > 0
    assert ctx.stats.get_gauge(KEY_COST) == pytest.approx(node.cost_usd)
    # the key went in the request header, never into the node
    assert "sk-secret" not in repr(node.to_dict())
    assert replay.requests[0].headers.get("authorization") == "Bearer sk-secret"


def test_openai_stream_usage_hidden_when_injected(replay: ReplayServer) -> None:
    replay.script(CHAT, recorded.openai_chat_stream_usage())
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        chunks = list(
            oai(replay).chat.completions.create(model="gpt-4o-mini", messages=PROMPT, stream=True)
        )
    assert all(c.choices for c in chunks)
    assert replay.requests[0].json()["stream_options"] == {"include_usage": True}
    usage = recorded.load("openai_chat_stream_usage")[-1]["usage"]
    node = only_llm_node(sink)
    assert (node.tokens_in, node.tokens_out) == (usage["prompt_tokens"], usage["completion_tokens"])
    assert node.metadata["cached_tokens"] == usage["prompt_tokens_details"]["cached_tokens"]


def test_openai_stream_cut_mid_way_fails_with_usage_seen(replay: ReplayServer) -> None:
    replay.script(CHAT, recorded.openai_chat_stream_usage(cut_after=2))
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]) as ctx:
        stream = oai(replay).chat.completions.create(
            model="gpt-4o-mini", messages=PROMPT, stream=True
        )
        with pytest.raises(openai.APIError):
            for _ in stream:
                pass
    node = only_llm_node(sink)
    assert node.status == "fail"
    assert ctx.graph.aggregates()["total_llm_calls"] == 1


def test_openai_responses_api_usage_and_tool_calls(replay: ReplayServer) -> None:
    replay.script("/v1/responses", recorded.openai_responses_usage())
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        oai(replay).responses.create(model="o4-mini", input="What is AF?", max_output_tokens=50)
    body = recorded.load("openai_responses_usage")
    usage = body["usage"]
    node = only_llm_node(sink)
    assert (node.tokens_in, node.tokens_out) == (usage["input_tokens"], usage["output_tokens"])
    assert node.metadata["cached_tokens"] == usage["input_tokens_details"]["cached_tokens"]
    assert node.metadata["reasoning_tokens"] == usage["output_tokens_details"]["reasoning_tokens"]
    calls = sum(1 for item in body["output"] if item["type"].endswith("_call"))
    assert node.metadata["tool_calls_made"] == calls


def test_openai_429_then_200_counts_a_retry(replay: ReplayServer) -> None:
    replay.script(CHAT, recorded.openai_error(429), recorded.openai_chat_tool_calls())
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]) as ctx:
        oai(replay, retries=2).chat.completions.create(model="gpt-4o-mini", messages=PROMPT)
    node = only_llm_node(sink)
    assert node.status == "success"
    assert node.retries_used == 1
    assert ctx.stats.get_counter(KEY_RETRIES) == 1
    assert len(replay.requests) == 2


def test_an_async_clients_retry_is_counted_on_its_call(replay: ReplayServer) -> None:
    """The async client's retry sleep is counted where the sync one's is, in the request's own
    context, and is still awaited (the SDK retries after it)."""
    replay.script(CHAT, recorded.openai_error(500), recorded.openai_chat_tool_calls())
    client = openai.AsyncOpenAI(base_url=replay.openai_base_url, api_key="k", max_retries=2)
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]) as ctx:
        create = client.chat.completions.create(model="gpt-4o-mini", messages=PROMPT)
        asyncio.run(create)
    node = only_llm_node(sink)
    assert node.status == "success" and node.retries_used == 1
    assert ctx.stats.get_counter(KEY_RETRIES) == 1 and len(replay.requests) == 2


def test_openai_500_marks_fail_with_sdk_error_class(replay: ReplayServer) -> None:
    replay.script(CHAT, recorded.openai_error(500))
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]), pytest.raises(openai.InternalServerError):
        oai(replay).chat.completions.create(model="gpt-4o-mini", messages=PROMPT)
    node = only_llm_node(sink)
    assert node.status == "fail"
    assert node.error_class == "InternalServerError"
    assert node.tokens_in is None


def test_openai_limit_exceeded_sends_no_request(replay: ReplayServer) -> None:
    replay.script(CHAT, recorded.openai_chat_tool_calls())
    sink = MemorySink()
    with ExecutionContext(sinks=[sink], max_cost_usd=0.000001) as ctx, pytest.raises(LimitExceeded):
        oai(replay).chat.completions.create(model="gpt-4o-mini", messages=PROMPT, max_tokens=4000)
    assert replay.requests == []
    assert only_llm_node(sink).status == "halt"
    assert ctx.stats.get_counter(KEY_LLM_CALLS) == 0


def test_anthropic_tool_use_and_cache_normalisation(replay: ReplayServer) -> None:
    replay.script(MESSAGES, recorded.anthropic_message_tool_use())
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        anth(replay).messages.create(model="claude-haiku-4-5", messages=PROMPT, max_tokens=300)
    usage = recorded.load("anthropic_message_tool_use")["usage"]
    node = only_llm_node(sink)
    assert node.tokens_in == (
        usage["input_tokens"]
        + usage["cache_read_input_tokens"]
        + usage["cache_creation_input_tokens"]
    )
    assert node.tokens_out == usage["output_tokens"]
    assert node.metadata["cached_tokens"] == usage["cache_read_input_tokens"]
    assert node.metadata["cache_write_tokens"] == usage["cache_creation_input_tokens"]
    assert node.metadata["tool_calls_made"] == 2
    assert "sk-ant-secret" not in repr(node.to_dict())


def test_anthropic_stream_helper_replayed(replay: ReplayServer) -> None:
    replay.script(MESSAGES, recorded.anthropic_message_stream())
    sink = MemorySink()
    with (
        ExecutionContext(sinks=[sink]),
        anth(replay).messages.stream(
            model="claude-haiku-4-5", messages=PROMPT, max_tokens=50
        ) as stream,
    ):
        text = stream.get_final_text()
    assert text
    events = recorded.load("anthropic_message_stream")
    start = events[0]["data"]["message"]["usage"]
    final_out = [e for e in events if e["event"] == "message_delta"][-1]["data"]["usage"]
    node = only_llm_node(sink)
    assert node.tokens_in == (
        start["input_tokens"]
        + start["cache_read_input_tokens"]
        + start["cache_creation_input_tokens"]
    )
    assert node.tokens_out == final_out["output_tokens"]


def test_anthropic_stream_closed_half_way_keeps_usage_seen(replay: ReplayServer) -> None:
    replay.script(MESSAGES, recorded.anthropic_message_stream())
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]) as ctx:
        stream = anth(replay).messages.create(
            model="claude-haiku-4-5", messages=PROMPT, max_tokens=50, stream=True
        )
        it = iter(stream)
        assert next(it).type == "message_start"
        stream.close()
    start = recorded.load("anthropic_message_stream")[0]["data"]["message"]["usage"]
    node = only_llm_node(sink)
    assert node.status == "fail"
    assert node.error_class == "StreamAbandoned"
    assert node.tokens_in == start["input_tokens"] + start["cache_read_input_tokens"]
    assert ctx.graph.aggregates()["total_llm_calls"] == 1


def test_anthropic_529_then_200_retry_and_500_fail(replay: ReplayServer) -> None:
    replay.script(
        MESSAGES,
        recorded.anthropic_error(529),
        recorded.anthropic_message_tool_use(),
        recorded.anthropic_error(500),
    )
    sink = MemorySink()
    client = anth(replay, retries=1)
    with ExecutionContext(sinks=[sink], limits=[Limit(KEY_LLM_CALLS, 10)]):
        client.messages.create(model="claude-haiku-4-5", messages=PROMPT, max_tokens=10)
        with pytest.raises(anthropic.InternalServerError):
            anth(replay, retries=0).messages.create(
                model="claude-haiku-4-5", messages=PROMPT, max_tokens=10
            )
    first, second = [n for n in sink.nodes if n.kind == "llm"]
    assert (first.status, first.retries_used) == ("success", 1)
    assert second.status == "fail" and second.error_class == "InternalServerError"
