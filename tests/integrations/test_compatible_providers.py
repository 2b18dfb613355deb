"""The ``openai`` SDK pointed at another provider's OpenAI-compatible API is priced at that
provider's price.

The SDK names its calls ``openai`` (its wire format). DeepSeek, Mistral and xAI models are not
OpenAI's, so they were unpriced: refused under any cost cap, and counted as $0 where the
context allows unpriced calls, while the provider billed them.
"""

from __future__ import annotations

from decimal import Decimal

import genai_prices
import openai
import pytest

import ampmeter
from ampmeter import ExecutionContext
from ampmeter.sinks.memory import MemorySink
from ampmeter.testing import recorded
from ampmeter.testing.replay import ReplayResponse, ReplayServer

pytestmark = pytest.mark.usefixtures("instrumented")  # conftest.py


def table_cost(model: str, usage: dict[str, int]) -> Decimal:
    """The table's price of ``usage`` (cached tokens part of the input, as OpenAI counts)."""
    counted = genai_prices.Usage(
        input_tokens=usage["prompt_tokens"],
        cache_read_tokens=usage["cached_tokens"],
        output_tokens=usage["completion_tokens"],
    )
    return genai_prices.calc_price(counted, model).total_price


@pytest.mark.parametrize("model", ["deepseek-chat", "mistral-large-latest", "grok-3"])
def test_another_providers_model_through_the_openai_sdk_is_priced_and_capped(
    replay: ReplayServer, model: str
) -> None:
    body = recorded.load("openai_chat_tool_calls")
    reported = body["usage"]
    usage = {
        "prompt_tokens": reported["prompt_tokens"],
        "cached_tokens": reported["prompt_tokens_details"]["cached_tokens"],
        "completion_tokens": reported["completion_tokens"],
    }
    replay.script("/v1/chat/completions", ReplayResponse.json(body))
    client = openai.OpenAI(base_url=replay.openai_base_url, api_key="k", max_retries=0)
    sink = MemorySink()
    with ExecutionContext(sinks=[sink], max_cost_usd=1) as ctx:  # (refused when unpriced)
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}])
    (node,) = [node for node in sink.nodes if node.kind == "llm"]
    assert node.metadata["cost_status"] == "priced"
    assert node.cost_usd == ctx.stats.total_cost() == table_cost(model, usage) > 0


def test_the_price_function_falls_back_to_the_provider_that_lists_the_model() -> None:
    at_openai = ampmeter.price("deepseek-chat", input_tokens=1000, output_tokens=100)
    assert at_openai.cost_usd is not None
    assert (
        ampmeter.price("deepseek-chat", input_tokens=1000, output_tokens=100, provider="openai")
        == at_openai
    )
    # A model no provider lists stays unpriced (a local model is never guessed a price).
    local = ampmeter.price("llama3.1:8b", input_tokens=1000, output_tokens=100, provider="openai")
    assert local.cost_usd is None
