"""The metering proxy at its hostile edges: callers that leave, upstreams that answer oddly.

Whatever happens between the caller and the provider, a request the proxy forwarded ends
charged at its bill (or, when the bill cannot be read, its estimate), never left in flight
or free, and the caller gets the bytes the provider sent.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from ampmeter.context import ExecutionContext
from ampmeter.proxy import MeteringProxy
from ampmeter.proxy.budget_file import budgets_from
from ampmeter.testing.billing import BillingProvider

PRICES = {"gpt-4o-mini": ("0.15", "0.60")}
PROMPT = [{"role": "user", "content": "Summarise the meeting notes, please. " * 8}]


def proxy_to(upstream: str, **caller: Any) -> MeteringProxy:
    config = budgets_from(
        {"upstreams": {"openai": upstream}, "callers": {"team": {"max_cost_usd": 1.0, **caller}}}
    )
    return MeteringProxy(config)


def settled(ctx: ExecutionContext, calls: int) -> None:
    """Wait (briefly) until ``calls`` calls of ``ctx`` have ended."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        aggregates = ctx.graph.aggregates()
        if aggregates["total_llm_calls"] >= calls and aggregates["in_flight"] == 0:
            return
        time.sleep(0.02)
    pytest.fail(f"the proxy left calls in flight: {ctx.graph.aggregates()}")


def test_a_caller_that_times_out_before_the_answer_is_charged_the_bill() -> None:
    """A client's timeout hangs up while the provider is still working: the provider bills the
    answer all the same, so the proxy reads it to its end and counts it."""
    with (
        BillingProvider(prices=PRICES, output_tokens=40, delay_s=0.4) as bill,
        proxy_to(bill.openai_base_url) as proxy,
    ):
        url = proxy.base_urls()["OPENAI_BASE_URL"] + "/chat/completions"
        for stream in (False, True):
            body = {"model": "gpt-4o-mini", "messages": PROMPT, "stream": stream}
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(url, json=body, timeout=0.1)
        ctx = proxy.context("team")
        settled(ctx, 2)
        assert len(bill.calls) == 2
        assert ctx.stats.total_cost() == bill.billed_usd > 0
