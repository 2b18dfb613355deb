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
from ampmeter.testing.billing import BillingProvider

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
