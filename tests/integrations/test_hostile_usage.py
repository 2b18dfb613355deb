"""A provider's usage report is checked once, where ampmeter reads it: odd numbers never break
the caller's call and never reach the accounting unchecked.

Hostile usage bodies are replayed through the real ``openai`` SDK (a whole response and a
stream) and through plain ``httpx`` (the JSON body reader): what is not an int (a string, a
bool, a float) reads as absent, negatives count 0, details larger than their totals are cut to
them, and a count beyond what the accounting holds (2**53) counts as 2**53, so that a budget
still stops the calls after it.
"""

from __future__ import annotations

import json
import urllib.request
from decimal import Decimal
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from ampmeter import ExecutionContext, LimitExceeded, Node, money
from ampmeter.analysis import summarize
from ampmeter.keys import KEY_INPUT_TOKENS
from ampmeter.sinks.jsonl import JsonlSink
from ampmeter.sinks.memory import MemorySink
from ampmeter.testing import recorded
from ampmeter.testing.replay import ReplayResponse, ReplayServer
from support.wire import chat_stream

pytestmark = pytest.mark.usefixtures("instrumented")  # conftest.py

CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"
PROMPT = [{"role": "user", "content": "Weather in Paris?"}]
HUGE = 2**60
MOST = 2**53  # the largest count the accounting holds

ESTIMATED = -1  # a count the provider did not give readably: ampmeter's estimate stands for it

# usage reported -> (tokens_in, tokens_out, cached, cache_write, reasoning) of the node
CASES: dict[str, tuple[Any, tuple[int | None, ...]]] = {
    "a string": ({"prompt_tokens": "12", "completion_tokens": 4}, (ESTIMATED, 4, 0, 0, 0)),
    "bools": (
        {"prompt_tokens": True, "completion_tokens": False},
        (ESTIMATED, ESTIMATED, 0, 0, 0),
    ),
    "a float": ({"prompt_tokens": 12.0, "completion_tokens": 3}, (ESTIMATED, 3, 0, 0, 0)),
    "a negative": ({"prompt_tokens": -5, "completion_tokens": 3}, (0, 3, 0, 0, 0)),
    "details larger than totals": (
        {
            "prompt_tokens": 10,
            "completion_tokens": 3,
            "prompt_tokens_details": {"cached_tokens": 8, "cache_write_tokens": 5},
            "completion_tokens_details": {"reasoning_tokens": 9},
        },
        (10, 3, 8, 2, 3),
    ),
    "negative details": (
        {
            "prompt_tokens": 10,
            "completion_tokens": 3,
            "prompt_tokens_details": {"cached_tokens": -4, "cache_write_tokens": 2},
            "completion_tokens_details": {"reasoning_tokens": -1},
        },
        (10, 3, 0, 2, 0),
    ),
    "details that are not objects": (
        {
            "prompt_tokens": 10,
            "completion_tokens": 3,
            "prompt_tokens_details": "lots",
            "completion_tokens_details": [7],
        },
        (10, 3, 0, 0, 0),
    ),
    "usage that is not an object": ("lots", (ESTIMATED, ESTIMATED, 0, 0, 0)),
    "huge details": (
        {
            "prompt_tokens": 10,
            "completion_tokens": 3,
            "prompt_tokens_details": {"cached_tokens": HUGE},
            "completion_tokens_details": {"reasoning_tokens": HUGE},
        },
        (10, 3, 10, 0, 3),
    ),
    "huge totals": (
        {
            "prompt_tokens": HUGE,
            "completion_tokens": HUGE,
            "prompt_tokens_details": {"cached_tokens": HUGE, "cache_write_tokens": 5},
        },
        (MOST, MOST, MOST, 0, 0),
    ),
}


def _usage_of(node: Node) -> tuple[int | None, ...]:
    meta = node.metadata
    return (
        node.tokens_in,
        node.tokens_out,
        meta.get("cached_tokens", 0),
        meta.get("cache_write_tokens", 0),
        meta.get("reasoning_tokens", 0),
    )


@pytest.mark.parametrize("case", list(CASES))
def test_a_hostile_usage_report_is_checked_where_it_is_read(
    replay: ReplayServer, case: str
) -> None:
    usage, expected = CASES[case]
    whole = {"id": "chatcmpl-1", "object": "chat.completion", "choices": [], "usage": usage}
    chunk = {
        "id": "chatcmpl-2",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": "Sunny"}}],
    }
    replay.script(
        CHAT,
        ReplayResponse.json(whole),
        chat_stream(chunk, usage),
        ReplayResponse.json({**whole, "id": "chatcmpl-3"}),
    )
    client = openai.OpenAI(base_url=replay.openai_base_url, api_key="k", max_retries=0)
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]) as ctx:
        answer = client.chat.completions.create(model="gpt-4o-mini", messages=PROMPT)
        chunks = list(
            client.chat.completions.create(model="gpt-4o-mini", messages=PROMPT, stream=True)
        )
        body = {"model": "gpt-4o-mini", "messages": PROMPT}
        response = httpx.post(f"{replay.openai_base_url}/chat/completions", json=body)
        in_stats = ctx.stats.get_counter(KEY_INPUT_TOKENS)
    assert answer.id.startswith("chatcmpl-1") and len(chunks) == 1 and response.status_code == 200
    nodes = [n for n in sink.nodes if n.kind == "llm"]
    assert [n.status for n in nodes] == ["success"] * 3
    estimated = ESTIMATED in expected
    assert [n.metadata["cost_status"] for n in nodes] == [
        "estimated" if estimated else "priced"
    ] * 3
    # An unreadable count is never 0: the input is the request's estimate (the same request
    # each time), the output what was received, else the most the call could write.
    reserved_in = nodes[0].tokens_in if expected[0] == ESTIMATED else expected[0]
    assert reserved_in is not None and (reserved_in > 0 or expected[0] == 0)
    outputs = [n.tokens_out for n in nodes]
    if expected[1] == ESTIMATED:
        # The whole answer had no choices: nothing to count (the model's most); the stream
        # said "Sunny": counted, a token per character (never fewer than were billed).
        assert outputs == [16_384, 5, 16_384]
    for node in nodes:
        got = _usage_of(node)
        assert got[2:] == expected[2:]
        assert got[0] == reserved_in
        assert expected[1] == ESTIMATED or got[1] == expected[1]
    assert in_stats == 3 * reserved_in
    # Only a total outside 0..2**53 is clamped; details cut to their totals are not flagged.
    clamped = case in ("a negative", "huge totals")
    assert [n.metadata.get("usage_clamped", False) for n in nodes] == [clamped] * 3


def test_a_huge_count_counts_as_the_most_the_accounting_holds_so_a_budget_stops_after_it(
    replay: ReplayServer,
) -> None:
    """The call that reported it is not broken (it was sent and answered); the next one is
    stopped before it is sent."""
    usage = {"prompt_tokens": HUGE, "completion_tokens": 2}
    body = {"id": "chatcmpl-1", "object": "chat.completion", "choices": [], "usage": usage}
    replay.script(CHAT, ReplayResponse.json(body), ReplayResponse.json(body))
    client = openai.OpenAI(base_url=replay.openai_base_url, api_key="k", max_retries=0)
    sink = MemorySink()
    with ExecutionContext(sinks=[sink], max_cost_usd=100.0) as ctx:
        client.chat.completions.create(model="gpt-4o-mini", messages=PROMPT)
        with pytest.raises(LimitExceeded):
            client.chat.completions.create(model="gpt-4o-mini", messages=PROMPT)
        assert ctx.stats.get_counter(KEY_INPUT_TOKENS) == MOST
        assert ctx.stats.total_cost() > Decimal(100)
    assert len(replay.requests) == 1
    assert [n.status for n in sink.nodes if n.kind == "llm"] == ["success", "halt"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_price_beyond_what_money_counts_is_charged_as_the_most_and_the_call_returns(
    replay: ReplayServer, tmp_path: Path, stream: bool
) -> None:
    """2**60 tokens of gpt-4o cost more than money counts (2**63 - 1 nano-dollars): the counts
    are clamped to 2**53, their price to the most money counts, the node says both, and the
    caller gets the response; the next call is refused before it is sent, and the log reads."""
    usage = {"prompt_tokens": HUGE, "completion_tokens": HUGE}
    body = {"id": "chatcmpl-1", "object": "chat.completion", "choices": [], "usage": usage}
    chunk = {
        "id": "chatcmpl-2",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": "Sunny"}}],
    }
    replay.script(CHAT, chat_stream(chunk, usage) if stream else ReplayResponse.json(body))
    client = openai.OpenAI(base_url=replay.openai_base_url, api_key="k", max_retries=0)
    log = tmp_path / "events.jsonl"
    sink = MemorySink()
    with ExecutionContext(sinks=[sink, JsonlSink(str(log))], max_cost_usd=100.0) as ctx:
        answer = client.chat.completions.create(model="gpt-4o", messages=PROMPT, stream=stream)
        received = [c.choices[0].delta.content for c in answer if c.choices] if stream else answer
        with pytest.raises(LimitExceeded):
            client.chat.completions.create(model="gpt-4o", messages=PROMPT)
        assert ctx.stats.total_cost() == money.from_nano(money.MAX_NANO)
    assert received == ["Sunny"] if stream else received.id.startswith("chatcmpl-1")
    assert len(replay.requests) == 1
    sent, refused = [n for n in sink.nodes if n.kind == "llm"]
    assert (sent.status, refused.status) == ("success", "halt")
    assert sent.tokens_in == sent.tokens_out == MOST
    assert sent.cost_usd == money.from_nano(money.MAX_NANO)
    assert sent.metadata["cost_status"] == "priced"
    assert sent.metadata["usage_clamped"] is sent.metadata["cost_clamped"] is True
    (run,) = summarize([log]).runs
    assert run.cost_usd == float(money.from_nano(money.MAX_NANO)) and run.llm_calls == 2


def test_an_anthropic_sum_beyond_the_range_counts_as_the_most(replay: ReplayServer) -> None:
    """Anthropic's input is the sum of three counts: a sum past 2**53 is clamped as one is."""
    message = recorded.load("anthropic_message_tool_use")
    usage = {**message["usage"], "input_tokens": MOST, "cache_read_input_tokens": 7}
    replay.script(MESSAGES, ReplayResponse.json({**message, "usage": usage}))
    client = anthropic.Anthropic(base_url=replay.anthropic_base_url, api_key="k", max_retries=0)
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        client.messages.create(model="claude-haiku-4-5", messages=PROMPT, max_tokens=300)
    (node,) = [n for n in sink.nodes if n.kind == "llm"]
    assert node.status == "success"
    assert node.tokens_in == MOST
    assert node.metadata["cached_tokens"] == 7
    assert node.tokens_out == usage["output_tokens"]


@pytest.mark.parametrize(
    ("tool_calls", "counted"),
    [
        (5, 0),
        (True, 0),
        ("abc", 0),
        ({"index": 0}, 0),
        ([{"index": [1]}, {"index": "x"}], 1),  # indexes that are no ints read as 0: one call
        ([{"index": 0}, {"index": 1}], 2),
    ],
)
def test_tool_calls_that_are_not_a_list_count_none_and_never_break_the_call(
    replay: ReplayServer, tool_calls: object, counted: int
) -> None:
    usage = {"prompt_tokens": 10, "completion_tokens": 3}
    message = {"role": "assistant", "tool_calls": tool_calls}
    whole = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message}],
        "usage": usage,
    }
    chunk = {
        "id": "chatcmpl-2",
        "object": "chat.completion.chunk",
        "choices": [{"index": [0], "delta": {"tool_calls": tool_calls}}],
    }
    replay.script(
        CHAT,
        ReplayResponse.json(whole),
        chat_stream(chunk, usage),
    )
    client = openai.OpenAI(base_url=replay.openai_base_url, api_key="k", max_retries=0)
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        client.chat.completions.create(model="gpt-4o-mini", messages=PROMPT)
        list(client.chat.completions.create(model="gpt-4o-mini", messages=PROMPT, stream=True))
    nodes = [n for n in sink.nodes if n.kind == "llm"]
    assert [(n.status, n.tokens_in, n.tokens_out) for n in nodes] == [("success", 10, 3)] * 2
    plain = 2 if isinstance(tool_calls, list) else 0  # a whole message counts its list
    assert [n.metadata.get("tool_calls_made", 0) for n in nodes] == [plain, counted]


@pytest.mark.parametrize("usage", [True, False], ids=["with usage", "without usage"])
def test_a_body_the_reader_cannot_take_is_charged_and_the_caller_gets_its_response(
    replay: ReplayServer, usage: bool
) -> None:
    """``"choices": 5`` made the reader raise: the caller got ampmeter's TypeError instead of
    the response it paid for, and the call, sent and billed, was never ended (charged nothing).
    Now the call ends failed with the reader's error, charged the usage read before it (or, with
    none, the estimate of a response without usage)."""
    body: dict[str, Any] = {"id": "chatcmpl-1", "object": "chat.completion", "choices": 5}
    if usage:
        body["usage"] = {"prompt_tokens": 1000, "completion_tokens": 10}
    replay.script(CHAT, ReplayResponse.json(body))
    client = openai.OpenAI(base_url=replay.openai_base_url, api_key="k", max_retries=0)
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]) as ctx:
        response = client.chat.completions.create(model="gpt-4o-mini", messages=PROMPT)
    assert response.id.startswith("chatcmpl-1")  # (the replay makes each id fresh)
    (node,) = [n for n in sink.nodes if n.kind == "llm"]
    assert (node.status, node.error_class) == ("fail", "TypeError")
    assert node.cost_nano > 0 and ctx.stats.get_counter(KEY_INPUT_TOKENS) == node.tokens_in
    if usage:
        assert (node.tokens_in, node.tokens_out) == (1000, 10)
        assert node.metadata["cost_status"] == "priced"
    else:
        assert node.tokens_in and node.metadata["cost_status"] == "estimated"


def _assert_failed_and_charged_its_bill(sink: MemorySink) -> None:
    """The one call ended failed with the reader's error, charged the usage reported after it."""
    (node,) = [n for n in sink.nodes if n.kind == "llm"]
    assert (node.status, node.error_class, node.tokens_in, node.tokens_out) == (
        "fail",
        "TypeError",
        1000,
        10,
    )
    assert node.metadata["cost_status"] == "priced"


def test_a_stream_event_the_reader_cannot_take_is_passed_on_and_the_usage_after_it_counted(
    replay: ReplayServer,
) -> None:
    """The event's reader raised into the caller's loop, and the call was charged an estimate:
    the usage event after it was never read. Now the event reaches the caller, the usage is read
    as reported, and the call ends failed with the reader's error."""
    chunk = {"id": "chatcmpl-2", "object": "chat.completion.chunk", "choices": 5}
    replay.script(CHAT, chat_stream(chunk, {"prompt_tokens": 1000, "completion_tokens": 10}))
    client = openai.OpenAI(base_url=replay.openai_base_url, api_key="k", max_retries=0)
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        events = list(
            client.chat.completions.create(model="gpt-4o-mini", messages=PROMPT, stream=True)
        )
    assert len(events) == 1  # (the usage event ampmeter asked for is hidden)
    _assert_failed_and_charged_its_bill(sink)


def _read_with_httpx(url: str, body: dict[str, Any]) -> bytes:
    with httpx.Client() as client, client.stream("POST", url, json=body) as response:
        return b"".join(response.iter_bytes())


def _read_with_urllib(url: str, body: dict[str, Any]) -> bytes:
    data = json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request) as response:
        return bytes(response.read())


def _read_with_openai_raw(url: str, body: dict[str, Any]) -> bytes:
    client = openai.OpenAI(base_url=url.removesuffix("/chat/completions"), api_key="k")
    with client.chat.completions.with_streaming_response.create(**body) as response:
        if not body["stream"]:
            return response.read()
        return b"".join(line.encode() + b"\n\n" for line in response.iter_lines() if line)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole body"])
@pytest.mark.parametrize(
    "read",
    [_read_with_httpx, _read_with_urllib, _read_with_openai_raw],
    ids=["httpx", "urllib", "openai raw"],
)
def test_a_raw_body_the_reader_cannot_take_reaches_the_caller_and_its_usage_is_counted(
    replay: ReplayServer, read: Any, stream: bool
) -> None:
    """At the HTTP layer the reader's error broke the caller's read of the body it paid for
    (and a stream's usage event after the bad one was never read: the call was charged its
    estimate). Now the caller gets every byte, the usage is read as reported, and the call ends
    failed with the reader's error."""
    usage = {"prompt_tokens": 1000, "completion_tokens": 10}
    chunk = {"id": "chatcmpl-2", "object": "chat.completion.chunk", "choices": 5}
    whole = {"id": "chatcmpl-1", "object": "chat.completion", "choices": 5, "usage": usage}
    replay.script(CHAT, chat_stream(chunk, usage) if stream else ReplayResponse.json(whole))
    body = {"model": "gpt-4o-mini", "messages": PROMPT, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]) as ctx:
        got = read(replay.openai_base_url + "/chat/completions", body)
    assert b'"choices":5' in got.replace(b" ", b"") and b'"completion_tokens":10' in got
    assert got.endswith(b"data: [DONE]\n\n") if stream else json.loads(got)["choices"] == 5
    _assert_failed_and_charged_its_bill(sink)
    assert ctx.stats.get_counter(KEY_INPUT_TOKENS) == 1000
