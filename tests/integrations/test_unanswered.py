"""A request sent and never answered (its read timed out, the server hung up) may have been
billed: its bill unknown, it is charged its estimate, not nothing. One that never left (no
connection) is free.

Against the provider that bills like a real one, which bills a request as it takes it and then
takes its time to answer.
"""

from __future__ import annotations

import httpx
import openai
import pytest

from ampmeter import ExecutionContext
from ampmeter.sinks.memory import MemorySink
from ampmeter.testing import recorded
from ampmeter.testing.billing import BillingProvider
from ampmeter.testing.replay import ReplayResponse, ReplayServer

pytestmark = pytest.mark.usefixtures("instrumented")  # conftest.py

BODY = {
    "model": "gpt-4o-mini",
    "messages": [{"role": "user", "content": "Plan the week, please."}],
    "max_tokens": 30,
}


def test_a_request_that_times_out_after_it_was_sent_is_charged_its_estimate() -> None:
    sink = MemorySink()
    with BillingProvider(delay_s=0.5) as bill, ExecutionContext(sinks=[sink]):
        sdk = openai.OpenAI(base_url=bill.openai_base_url, api_key="k", max_retries=0)
        with pytest.raises(openai.APITimeoutError):
            sdk.chat.completions.create(**BODY, timeout=0.1)
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(bill.openai_base_url + "/chat/completions", json=BODY, timeout=0.1)
        with pytest.raises(openai.APIConnectionError):
            unreachable = openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="k")
            unreachable.with_options(max_retries=0).chat.completions.create(**BODY)
        assert len(bill.calls) == 2
    by_sdk, by_httpx, never_sent = [node for node in sink.nodes if node.kind == "llm"]
    for sent in (by_sdk, by_httpx):
        assert sent.status == "fail" and sent.metadata["cost_status"] == "estimated"
        assert sent.tokens_out == BODY["max_tokens"] and sent.cost_usd > 0
    assert never_sent.cost_usd == 0 and never_sent.tokens_in is None


def test_attempts_the_sdk_retried_after_a_timeout_are_charged_as_well() -> None:
    """The SDK retries a request whose answer timed out, inside the one call ampmeter meters:
    only its last attempt was charged, though the provider billed each. Each attempt retried
    unanswered now adds its estimate, so the count is never below the bill."""
    sink = MemorySink()
    prices = {"gpt-4o-mini": ("0.15", "0.60")}
    with BillingProvider(delay_s=0.5, prices=prices) as bill, ExecutionContext(sinks=[sink]) as ctx:
        sdk = openai.OpenAI(base_url=bill.openai_base_url, api_key="k", max_retries=2)
        with pytest.raises(openai.APITimeoutError):
            sdk.chat.completions.create(**BODY, timeout=0.1)
        assert len(bill.calls) == 3
    (node,) = [n for n in sink.nodes if n.kind == "llm"]
    assert node.retries_used == 2 and node.metadata["cost_status"] == "estimated"
    assert node.tokens_out == 3 * BODY["max_tokens"]
    assert node.tokens_in is not None and node.tokens_in >= bill.billed_input_tokens
    assert ctx.stats.total_cost() >= bill.billed_usd > 0


def test_an_attempt_retried_unanswered_is_charged_beside_the_answer_that_came(
    replay: ReplayServer,
) -> None:
    """The first attempt timed out (sent: the provider may bill it), the retry was answered:
    the call is charged the answer's usage and the first attempt's estimate."""
    answer = recorded.load("openai_chat_tool_calls")
    replay.script(
        "/v1/chat/completions",
        ReplayResponse.json(answer, delay=1.0),
        ReplayResponse.json(answer),
    )
    sink = MemorySink()
    sdk = openai.OpenAI(base_url=replay.openai_base_url, api_key="k", max_retries=1)
    with ExecutionContext(sinks=[sink]):
        sdk.chat.completions.create(**BODY, timeout=0.3)
    assert len(replay.requests) == 2
    (node,) = [n for n in sink.nodes if n.kind == "llm"]
    usage = answer["usage"]
    assert node.status == "success" and node.retries_used == 1
    assert node.tokens_out == usage["completion_tokens"] + BODY["max_tokens"]
    assert node.tokens_in is not None and node.tokens_in > usage["prompt_tokens"]
    assert node.metadata["cost_status"] == "estimated"
