"""Clients that bring their own HTTP: ``urllib`` and ``requests`` over ``http.client``.

Against the replay server: the requests it saw equal the nodes recorded, the tokens equal the
usage it sent, and a limit stops the next request before it is sent.
"""

from __future__ import annotations

import http.client
import json
import urllib.request
import zlib
from typing import Any

import pytest
import requests

from ampmeter import ExecutionContext, LimitExceeded, Node
from ampmeter.integrations.lifecycle import META_TRANSPORT
from ampmeter.sinks.memory import MemorySink
from ampmeter.testing import recorded
from ampmeter.testing.billing import BillingProvider
from ampmeter.testing.replay import ReplayResponse, ReplayServer

pytestmark = pytest.mark.usefixtures("instrumented")  # conftest.py

CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "Weather in Paris and Oslo?"}]
BODY = {"model": "gpt-4o-mini", "messages": MESSAGES, "max_tokens": 50}
STREAM_BODY = {**BODY, "stream": True, "stream_options": {"include_usage": True}}


def llm_nodes(sink: MemorySink) -> list[Node]:
    return [n for n in sink.nodes if n.kind == "llm"]


def chat_usage() -> tuple[int, int]:
    usage = recorded.load("openai_chat_tool_calls")["usage"]
    return usage["prompt_tokens"], usage["completion_tokens"]


def stream_usage() -> tuple[int, int]:
    (usage,) = [c["usage"] for c in recorded.load("openai_chat_stream_usage") if c.get("usage")]
    return usage["prompt_tokens"], usage["completion_tokens"]


def urllib_post(url: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    return urllib.request.urlopen(request, timeout=10)


def test_urllib_is_metered_and_stopped_before_sending(replay: ReplayServer) -> None:
    replay.script(CHAT, recorded.openai_chat_tool_calls(), recorded.openai_chat_tool_calls())
    url = replay.openai_base_url + "/chat/completions"
    sink = MemorySink()
    with ExecutionContext(max_steps=1, sinks=[sink]):
        with urllib_post(url, BODY) as response:
            answer = json.loads(response.read())
        with pytest.raises(LimitExceeded):
            urllib_post(url, BODY)
    assert len(replay.requests) == 1  # the stopped one never left
    success, halted = llm_nodes(sink)
    assert (success.status, halted.status) == ("success", "halt")
    assert (success.tokens_in, success.tokens_out) == chat_usage()
    assert answer["usage"]["prompt_tokens"] == success.tokens_in
    assert success.metadata[META_TRANSPORT] == "http.client"


def test_urllib_stream_read_line_by_line(replay: ReplayServer) -> None:
    replay.script(CHAT, recorded.openai_chat_stream_usage())
    sink = MemorySink()
    with (
        ExecutionContext(sinks=[sink]),
        urllib_post(replay.openai_base_url + "/chat/completions", STREAM_BODY) as response,
    ):
        lines = list(response)
    assert any(b'"usage":{' in line for line in lines)
    (node,) = llm_nodes(sink)
    assert (node.status, node.tokens_in, node.tokens_out) == ("success", *stream_usage())


def test_requests_is_metered_once_per_request(replay: ReplayServer) -> None:
    replay.script(CHAT, *(recorded.openai_chat_tool_calls() for _ in range(2)))
    url = replay.openai_base_url + "/chat/completions"
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]) as ctx, requests.Session() as session:
        answers = [session.post(url, json=BODY, timeout=10).json() for _ in range(2)]
    nodes = llm_nodes(sink)
    assert len(nodes) == len(replay.requests) == 2
    assert [(n.tokens_in, n.tokens_out) for n in nodes] == [chat_usage()] * 2
    assert ctx.stats.total_input_tokens() == sum(a["usage"]["prompt_tokens"] for a in answers)


def test_requests_stream_and_a_stop_before_the_next(replay: ReplayServer) -> None:
    replay.script(CHAT, recorded.openai_chat_stream_usage(), recorded.openai_chat_stream_usage())
    url = replay.openai_base_url + "/chat/completions"
    sink = MemorySink()
    with ExecutionContext(max_steps=1, sinks=[sink]):
        with requests.post(url, json=STREAM_BODY, stream=True, timeout=10) as response:
            events = [line for line in response.iter_lines() if line]
        with pytest.raises(LimitExceeded):
            requests.post(url, json=STREAM_BODY, stream=True, timeout=10)
    assert len(replay.requests) == 1
    assert events[-1] == b"data: [DONE]"
    success, halted = llm_nodes(sink)
    assert (success.status, success.tokens_in, success.tokens_out) == ("success", *stream_usage())
    assert halted.status == "halt"


def test_a_response_closed_half_way_is_abandoned(replay: ReplayServer) -> None:
    replay.script(CHAT, recorded.openai_chat_stream_usage())
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        response = urllib_post(replay.openai_base_url + "/chat/completions", STREAM_BODY)
        response.readline()
        response.close()
    (node,) = llm_nodes(sink)
    assert node.status == "fail" and node.error_class == "StreamAbandoned"
    assert node.tokens_in is not None and node.tokens_in > 0


def test_a_stream_the_provider_cuts_is_charged_when_the_read_fails(replay: ReplayServer) -> None:
    """The read's error ends the call (charged the input's estimate and the output received)
    even while the caller keeps the response: its context's totals and log include it."""
    replay.script(CHAT, recorded.openai_chat_stream_usage(cut_after=2))
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]) as ctx:
        response = urllib_post(replay.openai_base_url + "/chat/completions", STREAM_BODY)
        with pytest.raises(http.client.IncompleteRead):
            response.read()
        assert ctx.stats.total_cost() > 0
    (node,) = llm_nodes(sink)
    assert node.status == "fail" and node.error_class == "IncompleteRead"
    assert node.tokens_in is not None and node.tokens_in > 0
    response.close()


def test_a_request_whose_answer_times_out_is_charged_its_estimate() -> None:
    """Sent, then the read timed out (or the server hung up): the provider bills it all the
    same, so the call is charged its estimate (its bill unknown), not nothing."""
    sink = MemorySink()
    with BillingProvider(delay_s=0.5) as bill, ExecutionContext(sinks=[sink]) as ctx:
        request = urllib.request.Request(
            bill.openai_base_url + "/chat/completions",
            data=json.dumps(BODY).encode(),
            headers={"Content-Type": "application/json"},
        )
        with pytest.raises(TimeoutError):
            urllib.request.urlopen(request, timeout=0.1)
        assert len(bill.calls) == 1
    (node,) = llm_nodes(sink)
    assert node.status == "fail" and node.error_class == "TimeoutError"
    assert node.tokens_out == BODY["max_tokens"] and ctx.stats.total_cost() == node.cost_usd > 0


def test_a_raw_deflate_body_reaches_the_caller_and_is_counted(replay: ReplayServer) -> None:
    """``deflate`` sent raw, without its zlib header (servers do; urllib3 reads it): the
    reader's inflater raised into the caller's read, which broke, and the call was charged an
    estimate instead of the usage the body holds."""
    answer = recorded.load("openai_chat_tool_calls")
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    body = packer.compress(json.dumps(answer).encode()) + packer.flush()
    headers = (("content-type", "application/json"), ("content-encoding", "deflate"))
    replay.script(CHAT, ReplayResponse(chunks=(body,), headers=headers))
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        got = requests.post(replay.openai_base_url + "/chat/completions", json=BODY, timeout=10)
    assert got.json() == answer
    (node,) = llm_nodes(sink)
    assert (node.status, node.tokens_in, node.tokens_out) == ("success", *chat_usage())


def test_a_body_that_cannot_be_inflated_reaches_the_caller_and_is_charged(
    replay: ReplayServer,
) -> None:
    """urllib hands the caller the body as sent; one labelled gzip that is not must not break
    the caller's read because ampmeter could not inflate it: charged its estimate instead."""
    headers = (("content-type", "application/json"), ("content-encoding", "gzip"))
    replay.script(CHAT, ReplayResponse(chunks=(b"not gzip at all",), headers=headers))
    sink = MemorySink()
    with (
        ExecutionContext(sinks=[sink]),
        urllib_post(replay.openai_base_url + "/chat/completions", BODY) as response,
    ):
        assert response.read() == b"not gzip at all"
    (node,) = llm_nodes(sink)
    assert node.cost_usd > 0 and node.metadata["cost_status"] == "estimated"


def test_outside_a_context_and_other_paths_are_left_alone(replay: ReplayServer) -> None:
    replay.script(CHAT, recorded.openai_chat_tool_calls())
    replay.script("/v1/other", recorded.openai_chat_tool_calls())
    with urllib_post(replay.openai_base_url + "/chat/completions", BODY) as response:
        assert json.loads(response.read())["usage"]
    sink = MemorySink()
    with ExecutionContext(max_steps=0, sinks=[sink]):
        requests.post(replay.openai_base_url + "/other", json=BODY, timeout=10)
    assert len(replay.requests) == 2
    assert llm_nodes(sink) == []
