"""The billing provider: a loopback OpenAI and Anthropic server that bills everything a request
sends (tools, schemas, tool results, framing), driven through the real SDKs."""

from __future__ import annotations

import contextvars
import json
import math
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import anthropic
import openai
import pytest

from ampmeter import ExecutionContext, money
from ampmeter.sinks.memory import MemorySink
from ampmeter.testing import BillingProvider, ReplayServer, agent_requests, recorded
from support.stopping import stop_while_answering

KEY = "test-key"
SYSTEM = "You answer in one word. " * 5
USER = "Name one colour."
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city today.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city's name."}},
            "required": ["city"],
        },
    },
}
SCHEMA = {
    "type": "json_schema",
    "json_schema": {
        "name": "colour",
        "schema": {"type": "object", "properties": {"colour": {"type": "string"}}},
    },
}
PRICES = {"gpt-4o-mini": ("0.15", "0.60"), "claude-haiku-4-5": ("1", "5")}


def compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def expected_tokens(texts: list[str], messages: int, cpt: float, tools: int = 0) -> int:
    """The documented rule, written out: text at ``cpt``, 3 per message, 3 per request."""
    chars = sum(len(text) for text in texts)
    return math.ceil(chars / cpt) + 3 * messages + 3 + tools


@pytest.fixture
def provider() -> Iterator[BillingProvider]:
    with BillingProvider(output_tokens=12, prices=PRICES) as server:
        yield server


def openai_client(server: BillingProvider, retries: int = 0) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.openai_base_url, api_key=KEY, max_retries=retries)


def anthropic_client(server: BillingProvider) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.anthropic_base_url, api_key=KEY, max_retries=0)


@pytest.mark.parametrize("cpt", [4.0, 2.5])
def test_openai_bills_messages_tools_schema_and_framing(cpt: float) -> None:
    with BillingProvider(chars_per_token=cpt, output_tokens=5) as server:
        client = openai_client(server)
        messages: Any = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": USER},
        ]
        plain = client.chat.completions.create(model="gpt-4o-mini", messages=messages)
        full = client.chat.completions.create(
            model="gpt-4o-mini", messages=messages, tools=[WEATHER], response_format=SCHEMA
        )
    assert plain.usage is not None and full.usage is not None
    assert plain.usage.prompt_tokens == expected_tokens([SYSTEM, USER], 2, cpt)
    billed = expected_tokens([SYSTEM, USER, compact(WEATHER), compact(SCHEMA)], 2, cpt)
    assert full.usage.prompt_tokens == billed
    assert billed - plain.usage.prompt_tokens >= (len(compact(WEATHER)) // cpt) - 1
    assert [c.input_tokens for c in server.calls] == [plain.usage.prompt_tokens, billed]
    assert server.billed_output_tokens == 10


def test_openai_bills_tool_calls_tool_results_content_parts_and_images(
    provider: BillingProvider,
) -> None:
    arguments = '{"city": "Paris"}'
    result = "Sunny, 24 degrees, light wind from the west."
    messages: Any = [
        {"role": "user", "content": [{"type": "text", "text": USER}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": result},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "And this?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            ],
        },
    ]
    response = openai_client(provider).chat.completions.create(
        model="gpt-4o-mini", messages=messages, tools=[WEATHER]
    )
    assert response.usage is not None
    texts = [USER, "get_weather", arguments, result, "And this?", compact(WEATHER)]
    assert response.usage.prompt_tokens == expected_tokens(texts, 4, 4.0) + 85


def test_openai_output_is_capped_by_max_tokens(provider: BillingProvider) -> None:
    client = openai_client(provider)
    messages: Any = [{"role": "user", "content": USER}]
    capped = client.chat.completions.create(model="gpt-4o-mini", messages=messages, max_tokens=7)
    whole = client.chat.completions.create(
        model="gpt-4o-mini", messages=messages, max_completion_tokens=500
    )
    assert capped.usage is not None and whole.usage is not None
    assert (capped.usage.completion_tokens, capped.choices[0].finish_reason) == (7, "length")
    assert capped.choices[0].message.content == "tok " * 7
    assert (whole.usage.completion_tokens, whole.choices[0].finish_reason) == (12, "stop")


def test_openai_stream_reports_usage_only_when_asked_and_is_billed_either_way(
    provider: BillingProvider,
) -> None:
    client = openai_client(provider)
    messages: Any = [{"role": "user", "content": USER}]
    told = list(
        client.chat.completions.create(
            model="gpt-4o-mini",
            messages=messages,
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    silent = list(
        client.chat.completions.create(model="gpt-4o-mini", messages=messages, stream=True)
    )
    usage = told[-1].usage
    assert usage is not None and told[-1].choices == []
    assert (usage.prompt_tokens, usage.completion_tokens) == (expected_tokens([USER], 1, 4), 4)
    assert "".join(c.choices[0].delta.content or "" for c in told if c.choices) == "tok " * 4
    assert all(chunk.usage is None for chunk in silent)
    first, second = provider.calls
    assert (first.stream, first.usage_reported, first.output_tokens) == (True, True, 4)
    assert (second.stream, second.usage_reported, second.output_tokens) == (True, False, 12)
    assert second.input_tokens == usage.prompt_tokens


def test_anthropic_bills_system_tools_tool_use_and_tool_results(
    provider: BillingProvider,
) -> None:
    tool = {
        "name": "get_weather",
        "description": "The weather in a city today.",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
    result = "Sunny, 24 degrees."
    messages: Any = [
        {"role": "user", "content": USER},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me look."},
                {
                    "type": "tool_use",
                    "id": "tu_1",
                    "name": "get_weather",
                    "input": {"city": "Oslo"},
                },
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "tu_1", "content": result}],
        },
    ]
    message = anthropic_client(provider).messages.create(
        model="claude-haiku-4-5",
        system=[{"type": "text", "text": SYSTEM}],
        messages=messages,
        tools=[tool],  # type: ignore[list-item]
        max_tokens=100,
    )
    texts = [SYSTEM, USER, "Let me look.", "get_weather", compact({"city": "Oslo"}), result]
    texts.append(compact(tool))
    assert message.usage.input_tokens == expected_tokens(texts, 4, 4.0)
    assert message.usage.output_tokens == 12
    assert message.stop_reason == "end_turn"
    assert message.content[0].type == "text" and message.content[0].text == "tok " * 12


def test_anthropic_stream_carries_usage_and_tool_framing() -> None:
    with BillingProvider(tool_framing=346, output_tokens=30) as server:
        tool: Any = {"name": "noop", "input_schema": {"type": "object"}}
        with anthropic_client(server).messages.stream(
            model="claude-haiku-4-5",
            messages=[{"role": "user", "content": USER}],
            tools=[tool],
            max_tokens=9,
        ) as stream:
            text = "".join(stream.text_stream)
            final = stream.get_final_message()
    assert text == "tok " * 9
    assert final.stop_reason == "max_tokens"
    assert final.usage.input_tokens == expected_tokens([USER, compact(tool)], 1, 4.0, 346)
    assert final.usage.output_tokens == 9
    (call,) = server.calls
    assert (call.wire, call.stream, call.usage_reported) == ("anthropic", True, True)


@pytest.mark.usefixtures("instrumented")
def test_metered_calls_equal_what_the_provider_billed(provider: BillingProvider) -> None:
    """Every billed request is one node, with the tokens and the cost the provider billed."""
    sink = MemorySink()
    chat = openai_client(provider)
    claude = anthropic_client(provider)
    messages: Any = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]
    with ExecutionContext(max_cost_usd=1.0, sinks=[sink]) as ctx:
        chat.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=[WEATHER])
        for _ in chat.chat.completions.create(
            model="gpt-4o-mini",
            messages=messages,
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        ):
            pass
        claude.messages.create(
            model="claude-haiku-4-5", system=SYSTEM, messages=messages[1:], max_tokens=50
        )
        with claude.messages.stream(
            model="claude-haiku-4-5", messages=messages[1:], max_tokens=3
        ) as stream:
            stream.get_final_message()

        def worker() -> None:
            chat.chat.completions.create(model="gpt-4o-mini", messages=messages, max_tokens=2)

        threads = [
            threading.Thread(target=contextvars.copy_context().run, args=(worker,))
            for _ in range(16)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        spent = ctx.stats.total_cost()
    nodes = [node for node in sink.nodes if node.kind == "llm"]
    calls = provider.calls
    assert len(nodes) == len(calls) == 20
    assert sorted((n.model, n.tokens_in, n.tokens_out) for n in nodes) == sorted(
        (c.model, c.input_tokens, c.output_tokens) for c in calls
    )
    assert sorted(money.to_nano(n.cost_usd) for n in nodes) == sorted(
        money.to_nano(c.cost_usd) for c in calls
    )
    assert money.to_nano(spent) == money.to_nano(provider.billed_usd)
    assert provider.billed_input_tokens == sum(n.tokens_in or 0 for n in nodes)


def test_billed_dollars_are_exact_and_need_a_price() -> None:
    with BillingProvider(output_tokens=3, prices={"gpt-4o-mini": (0.15, 0.6)}) as server:
        client = openai_client(server)
        messages: Any = [{"role": "user", "content": "x" * 400}]
        for _ in range(3):
            client.chat.completions.create(model="gpt-4o-mini", messages=messages)
        # 400 characters at 4 a token, 3 for the message and 3 for the request: 106 input tokens
        # at $0.15/M and 3 output tokens at $0.60/M, three times, exactly
        assert server.billed_usd == Decimal("0.0000531")
        client.chat.completions.create(model="unknown-model", messages=messages)
        assert server.calls[-1].cost_usd is None
        with pytest.raises(ValueError, match="no price for model 'unknown-model'"):
            _ = server.billed_usd


def post(url: str, body: bytes, method: str = "POST") -> tuple[int, Any]:
    request = urllib.request.Request(url, data=body if method == "POST" else None, method=method)
    request.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_requests_a_provider_rejects_get_a_400_and_are_not_billed(
    provider: BillingProvider,
) -> None:
    chat = provider.openai_base_url + "/chat/completions"
    messages = provider.anthropic_base_url + "/v1/messages"
    ok_messages = [{"role": "user", "content": "hi"}]
    cases = [
        (chat, b"not json"),
        (chat, b"[1, 2]"),
        (chat, json.dumps({"messages": ok_messages}).encode()),
        (chat, json.dumps({"model": "gpt-4o-mini", "messages": "hi"}).encode()),
        (
            chat,
            json.dumps({"model": "gpt-4o-mini", "messages": ok_messages, "max_tokens": 0}).encode(),
        ),
        (chat, json.dumps({"model": "gpt-4o-mini", "messages": [{"content": 5}]}).encode()),
        (messages, json.dumps({"model": "claude-haiku-4-5", "messages": ok_messages}).encode()),
    ]
    for url, body in cases:
        status, answer = post(url, body)
        assert status == 400, body
        assert "error" in answer
    status, answer = post(chat, b"", method="GET")
    assert status == 404 and "no route GET" in answer["error"]["message"]
    assert provider.calls == []
    with pytest.raises(ValueError, match="messages must be a non-empty list"):
        provider.input_tokens("chat", {"model": "m", "messages": []})


def test_scripted_errors_come_first_and_are_not_billed(provider: BillingProvider) -> None:
    provider.script("/v1/chat/completions", recorded.openai_error(429))
    response = openai_client(provider, retries=1).chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": USER}]
    )
    assert response.usage is not None and response.usage.completion_tokens == 12
    assert len(provider.requests) == 2
    assert len(provider.calls) == 1


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ({"chars_per_token": 0}, ValueError),
        ({"chars_per_token": float("nan")}, ValueError),
        ({"chars_per_token": "4"}, TypeError),
        ({"output_tokens": -1}, ValueError),
        ({"message_framing": True}, ValueError),
        ({"delay_s": -0.1}, ValueError),
        ({"prices": {"m": ("x", "1")}}, ValueError),
        ({"answer": 3}, TypeError),
        ({"text_tokens": 3}, TypeError),
        ({"id_pool": 0}, ValueError),
        ({"id_pool": True}, ValueError),
    ],
)
def test_bad_arguments_are_refused(arguments: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        BillingProvider(**arguments)


def test_a_replay_server_fallback_must_be_callable() -> None:
    with pytest.raises(TypeError, match="fallback must be callable"):
        ReplayServer(fallback="answer")  # type: ignore[arg-type]


def test_calls_take_the_provider_time_together() -> None:
    with BillingProvider(delay_s=0.4) as server:
        client = openai_client(server)

        def worker() -> None:
            client.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": USER}]
            )

        threads = [threading.Thread(target=worker) for _ in range(8)]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - started
    assert server.peak_in_flight == 8
    assert 0.4 <= elapsed < 8 * 0.4


def test_agent_shaped_tools_are_billed_in_both_wire_formats(provider: BillingProvider) -> None:
    chat_tools: Any = agent_requests.tool_schemas(20)
    claude_tools: Any = agent_requests.tool_schemas(20, "anthropic")
    assert 12_000 <= len(compact(chat_tools)) <= 14_000
    assert len({tool["function"]["name"] for tool in chat_tools}) == 20
    messages: Any = [{"role": "user", "content": agent_requests.USER_PROMPT}]
    response = openai_client(provider).chat.completions.create(
        model="gpt-4o-mini", messages=messages, tools=chat_tools
    )
    message = anthropic_client(provider).messages.create(
        model="claude-haiku-4-5", messages=messages, tools=claude_tools, max_tokens=5
    )
    assert response.usage is not None
    texts = [agent_requests.USER_PROMPT, *map(compact, chat_tools)]
    assert response.usage.prompt_tokens == expected_tokens(texts, 1, 4.0)
    texts = [agent_requests.USER_PROMPT, *map(compact, claude_tools)]
    assert message.usage.input_tokens == expected_tokens(texts, 1, 4.0)
    with pytest.raises(ValueError, match="count"):
        agent_requests.tool_schemas(-1)
    with pytest.raises(ValueError, match="wire"):
        agent_requests.tool_schemas(1, "gemini")  # type: ignore[arg-type]


def test_a_legacy_function_call_is_billed(provider: BillingProvider) -> None:
    message = {"role": "assistant", "content": None}
    called = {**message, "function_call": {"name": "lookup", "arguments": '{"id": 7}'}}
    plain = provider.input_tokens("chat", {"messages": [message]})
    assert plain == 3 + 3
    texts = ["lookup", '{"id": 7}']
    assert provider.input_tokens("chat", {"messages": [called]}) == expected_tokens(texts, 1, 4.0)


def test_a_given_answer_is_sent_and_billed_at_output_tokens() -> None:
    with BillingProvider(answer="[[ ## answer ## ]] 4", output_tokens=5) as provider:
        client = openai.OpenAI(base_url=provider.openai_base_url, api_key=KEY)
        request: Any = {"model": "m", "messages": [{"role": "user", "content": USER}]}
        plain = client.chat.completions.create(**request)
        streamed = client.chat.completions.create(
            **request, stream=True, stream_options={"include_usage": True}
        )
        pieces = [c.choices[0].delta.content for c in streamed if c.choices]
    assert plain.choices[0].message.content == "[[ ## answer ## ]] 4"
    assert "".join(p or "" for p in pieces) == "[[ ## answer ## ]] 4"
    assert plain.usage is not None and plain.usage.completion_tokens == 5
    assert [c.output_tokens for c in provider.calls] == [5, 5]


@pytest.mark.parametrize(("distinct", "expected"), [(None, 4), (1, 1), (2, 2)])
def test_response_ids_repeat_when_drawn_from_few_values(
    distinct: int | None, expected: int
) -> None:
    with BillingProvider(id_pool=distinct) as provider:
        client = openai.OpenAI(base_url=provider.openai_base_url, api_key=KEY)
        ids = {
            client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": USER}]
            ).id
            for _ in range(4)
        }
    assert len(ids) == expected


def test_a_provider_stopped_mid_delay_ends_its_answer_at_once_and_the_call_stays_billed() -> None:
    before = set(threading.enumerate())
    provider = BillingProvider(delay_s=60).start()
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
    request = urllib.request.Request(
        provider.openai_base_url + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    errors = stop_while_answering(
        provider,
        lambda: urllib.request.urlopen(request, timeout=30),
        lambda: bool(provider.calls),
        before,
    )
    assert errors and len(provider.calls) == 1  # sent, so billed, though never answered
