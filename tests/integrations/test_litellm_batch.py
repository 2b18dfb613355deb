"""LiteLLM's ``batch_completion`` (its requests sent from a thread pool) and the Router's async
batches are metered exactly against a provider that bills: one node per billed request, with
the provider's usage, plain and streamed, and a limit stops a request before it is sent."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import litellm
import pytest

from ampmeter import ExecutionContext, LimitExceeded, find_limit_exceeded
from ampmeter.node import Node
from ampmeter.testing import BillingProvider

pytestmark = pytest.mark.usefixtures("instrumented", "litellm_streams_collected")  # conftest.py

litellm.suppress_debug_info = True

MODEL = "gpt-4o-mini"
CLAUDE = "claude-3-5-haiku-latest"
PRICES = {MODEL: ("0.15", "0.60"), CLAUDE: ("0.80", "4.00")}
BATCH = [[{"role": "user", "content": f"Name colour number {n}."}] for n in range(3)]


@pytest.fixture
def bill() -> Iterator[BillingProvider]:
    with BillingProvider(prices=PRICES, output_tokens=6) as provider:
        yield provider


def llm_nodes(ctx: ExecutionContext) -> list[Node]:
    return [n for n in ctx.graph.nodes() if n.kind == "llm"]


def assert_billed_exactly(ctx: ExecutionContext, bill: BillingProvider) -> None:
    nodes = llm_nodes(ctx)
    assert [n.status for n in nodes] == ["success"] * len(bill.calls)
    assert sorted((n.tokens_in, n.tokens_out) for n in nodes) == sorted(
        (c.input_tokens, c.output_tokens) for c in bill.calls
    )
    assert ctx.stats.total_cost() == bill.billed_usd


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_batch_completion_is_metered_exactly(bill: BillingProvider, stream: bool) -> None:
    with ExecutionContext() as ctx:
        answers = litellm.batch_completion(
            model=f"openai/{MODEL}",
            api_base=bill.openai_base_url,
            api_key="k",
            messages=BATCH,
            max_tokens=6,
            stream=stream,
        )
        for answer in answers:
            assert not isinstance(answer, Exception), answer
            if stream:
                list(answer)
    assert len(bill.calls) == len(BATCH)
    assert_billed_exactly(ctx, bill)


def test_an_anthropic_stream_read_to_its_end_is_metered(bill: BillingProvider) -> None:
    """LiteLLM stops reading an Anthropic stream at the delta that gives its stop reason, and
    never closes it: the node ends there, with the final usage, not when the body is
    dropped (after the context, which then charged nothing)."""
    with ExecutionContext() as ctx:
        chunks = list(
            litellm.completion(
                model=f"anthropic/{CLAUDE}",
                api_base=bill.openai_base_url.removesuffix("/v1"),
                api_key="k",
                messages=BATCH[0],
                max_tokens=6,
                stream=True,
            )
        )
        assert chunks
    assert [c.wire for c in bill.calls] == ["anthropic"]
    assert_billed_exactly(ctx, bill)


def test_a_limit_stops_batch_requests_before_they_are_sent(bill: BillingProvider) -> None:
    with ExecutionContext(max_steps=2) as ctx:
        answers = litellm.batch_completion(
            model=f"openai/{MODEL}",
            api_base=bill.openai_base_url,
            api_key="k",
            messages=BATCH,
            max_tokens=6,
        )
    stops = [a for a in answers if isinstance(a, Exception)]
    assert len(stops) == 1 and isinstance(find_limit_exceeded(stops[0]), LimitExceeded)
    assert len(bill.calls) == 2  # the third request was never sent
    assert sorted(n.status for n in llm_nodes(ctx)) == ["halt", "success", "success"]
    assert ctx.stats.total_cost() == bill.billed_usd


def test_the_routers_async_batches_are_metered_exactly(bill: BillingProvider) -> None:
    params: dict[str, Any] = {
        "model": f"openai/{MODEL}",
        "api_base": bill.openai_base_url,
        "api_key": "k",
    }
    router = litellm.Router(model_list=[{"model_name": "m", "litellm_params": params}])

    async def run() -> ExecutionContext:
        async with ExecutionContext() as ctx:
            await router.abatch_completion_one_model_multiple_requests(
                model="m", messages=BATCH, max_tokens=6
            )
        return ctx

    ctx = asyncio.run(run())
    assert len(bill.calls) == len(BATCH)
    assert_billed_exactly(ctx, bill)
