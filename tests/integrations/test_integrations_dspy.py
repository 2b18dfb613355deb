"""DSPy 3's default engine (its own client over stdlib sockets) is metered at its request and
response boundary: one node per request the provider billed, with the provider's usage, and a
limit stops the next request before it is sent, sync, async and streamed."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from ampmeter import ExecutionContext, LimitExceeded, find_limit_exceeded
from ampmeter.integrations.adapter import Tally
from ampmeter.integrations.dspy_request import read_usage
from ampmeter.node import Node
from ampmeter.testing import BillingProvider

dspy = pytest.importorskip("dspy")
from dspy.clients.engines.lm15_engine import (  # noqa: E402
    AsyncLM15Engine,
    LM15Engine,
    RouterConfig,
)
from dspy.lm15 import Config, Message, Request  # noqa: E402

pytestmark = pytest.mark.usefixtures("instrumented")  # conftest.py

MODEL = "gpt-4o-mini"
CLAUDE = "claude-3-5-haiku-latest"
PRICES = {MODEL: ("0.15", "0.60"), CLAUDE: ("0.80", "4.00")}
# What DSPy's ChatAdapter parses, so Predict succeeds on the provider's answer.
ANSWER = "[[ ## answer ## ]]\n4\n\n[[ ## completed ## ]]"


@pytest.fixture
def bill() -> Iterator[BillingProvider]:
    with BillingProvider(prices=PRICES, answer=ANSWER, output_tokens=12) as provider:
        yield provider


def lm(bill: BillingProvider, model: str = f"openai/{MODEL}", **kwargs: Any) -> Any:
    return dspy.LM(
        model, api_base=bill.openai_base_url, api_key="k", max_tokens=40, cache=False, **kwargs
    )


def llm_nodes(ctx: ExecutionContext) -> list[Node]:
    return [n for n in ctx.graph.nodes() if n.kind == "llm"]


def assert_billed_exactly(ctx: ExecutionContext, bill: BillingProvider) -> None:
    """One node per billed request, each with the provider's usage; the cost is the bill."""
    nodes = llm_nodes(ctx)
    assert len(nodes) == len(bill.calls) > 0
    assert sorted((n.tokens_in, n.tokens_out) for n in nodes) == sorted(
        (c.input_tokens, c.output_tokens) for c in bill.calls
    )
    assert ctx.stats.total_cost() == bill.billed_usd


def test_lm_calls_and_predict_are_metered_exactly(bill: BillingProvider) -> None:
    model = lm(bill)
    with ExecutionContext() as ctx, dspy.context(lm=model):
        model("Say hello.")
        answer = dspy.Predict("question -> answer")(question="What is 2 + 2?")
    assert answer.answer == "4"
    assert len(bill.calls) == 2
    assert all(c.stream is False for c in bill.calls)
    assert_billed_exactly(ctx, bill)
    assert {n.metadata["operation_name"] for n in llm_nodes(ctx)} == {"dspy.complete"}
    assert {n.metadata["provider"] for n in llm_nodes(ctx)} == {"openai"}


async def test_acall_is_metered_exactly(bill: BillingProvider) -> None:
    model = lm(bill)
    async with ExecutionContext() as ctx:
        await model.acall("Say hello.")
        with dspy.context(lm=model):
            answer = await dspy.Predict("question -> answer").acall(question="2 + 2?")
    assert answer.answer == "4"
    assert len(bill.calls) == 2
    assert_billed_exactly(ctx, bill)


async def test_streamify_is_metered_exactly(bill: BillingProvider) -> None:
    program = dspy.streamify(dspy.Predict("question -> answer"))
    async with ExecutionContext() as ctx:
        with dspy.context(lm=lm(bill)):
            items = [item async for item in program(question="2 + 2?")]
    assert isinstance(items[-1], dspy.Prediction) and items[-1].answer == "4"
    assert [c.stream for c in bill.calls] == [True]
    assert_billed_exactly(ctx, bill)
    assert llm_nodes(ctx)[0].metadata["operation_name"] == "dspy.stream"


def test_the_anthropic_dialect_counts_its_usage(bill: BillingProvider) -> None:
    with ExecutionContext() as ctx:
        lm(bill, f"anthropic/{CLAUDE}")("Say hello.")
    assert [c.wire for c in bill.calls] == ["anthropic"]
    assert_billed_exactly(ctx, bill)
    assert llm_nodes(ctx)[0].metadata["provider"] == "anthropic"


@pytest.mark.parametrize("way", ["sync", "async", "stream"])
def test_a_limit_stops_the_next_request_before_it_is_sent(bill: BillingProvider, way: str) -> None:
    model = lm(bill, num_retries=2)

    async def ask(question: str) -> Any:
        with dspy.context(lm=model):
            if way == "async":
                return await dspy.Predict("question -> answer").acall(question=question)
            program = dspy.streamify(dspy.Predict("question -> answer"))
            return [item async for item in program(question=question)]

    def run(question: str) -> Any:
        if way == "sync":
            with dspy.context(lm=model):
                return dspy.Predict("question -> answer")(question=question)
        return asyncio.run(ask(question))

    with ExecutionContext(max_steps=1) as ctx:
        run("2 + 2?")
        with pytest.raises(dspy.LMError) as caught:  # DSPy's own error, the stop as its cause
            run("3 + 3?")
    assert isinstance(find_limit_exceeded(caught.value), LimitExceeded)
    assert len(bill.calls) == 1  # neither the stopped request nor a retry of it was sent
    assert [n.status for n in llm_nodes(ctx)] == ["success", "halt"]
    assert ctx.stats.total_cost() == bill.billed_usd


def test_dspys_litellm_engine_stays_metered_once(bill: BillingProvider) -> None:
    with ExecutionContext() as ctx:
        lm(bill, engine="litellm")("Say hello.")
    assert_billed_exactly(ctx, bill)
    assert llm_nodes(ctx)[0].metadata["operation_name"] != "dspy.complete"


@pytest.mark.parametrize(
    ("family", "expected"),
    [
        ("anthropic", (100 + 30 + 20, 50)),  # Anthropic's input leaves out its cache
        ("gemini", (100, 50 + 7)),  # Gemini's output leaves out reasoning
        (None, (100, 50)),  # OpenAI's counts already hold both
    ],
)
def test_usage_is_read_in_the_subset_convention(
    family: str | None, expected: tuple[int, int]
) -> None:
    usage = dspy.lm15.Usage(
        input_tokens=100,
        output_tokens=50,
        cache_read_tokens=30,
        cache_write_tokens=20,
        reasoning_tokens=7,
    )
    tally = Tally()
    read_usage(usage, family, tally)
    assert (tally.tokens_in, tally.tokens_out) == expected
    assert (tally.cached, tally.cache_write, tally.reasoning) == (30, 20, 7)


def chat_engine_request(bill: BillingProvider) -> tuple[Any, Any]:
    """The engine's configuration for the billing provider and a chat request of 40 tokens."""
    config = RouterConfig(
        api_keys={"openai-chat": "k"}, base_urls={"openai-chat": bill.openai_base_url}
    )
    request = Request(
        model=f"openai-chat:{MODEL}",
        messages=(Message.user("Say hello."),),
        config=Config(max_tokens=40),
    )
    return config, request


@pytest.mark.parametrize("way", ["sync", "async"])
def test_an_engine_stream_closed_early_is_charged_as_cut(bill: BillingProvider, way: str) -> None:
    config, request = chat_engine_request(bill)

    async def read_one_then_close() -> str:
        events = AsyncLM15Engine(config).stream(request)
        first = await anext(events)
        await events.aclose()
        return str(first.type)

    with ExecutionContext() as ctx:
        if way == "async":
            first = asyncio.run(read_one_then_close())
        else:
            events = LM15Engine(config).stream(request)
            first = next(events).type
            events.close()
    assert first == "start" and len(bill.calls) == 1
    (node,) = llm_nodes(ctx)
    assert (node.status, node.error_class) == ("fail", "StreamAbandoned")
    assert node.tokens_in and node.tokens_out == 40  # charged up to its max_tokens


def test_an_anthropic_engine_stream_is_charged_its_input(bill: BillingProvider) -> None:
    """lm15 drops ``message_start`` (the input's count) and ends the stream with the usage of
    ``message_delta``, which reports only the output: the input read as 0, so a streamed
    Claude request was charged its output alone. The input is now its estimate."""
    config = RouterConfig(
        api_keys={"anthropic": "k"}, base_urls={"anthropic": bill.openai_base_url}
    )
    request = Request(
        model=f"anthropic:{CLAUDE}",
        messages=(Message.user("Say hello. " * 50),),
        config=Config(max_tokens=40),
    )
    with ExecutionContext() as ctx:
        events = list(LM15Engine(config).stream(request))
    assert events[-1].type == "end" and [c.wire for c in bill.calls] == ["anthropic"]
    (node,) = llm_nodes(ctx)
    (billed,) = bill.calls
    assert node.status == "success" and node.tokens_out == billed.output_tokens
    assert node.tokens_in is not None and node.tokens_in >= billed.input_tokens > 0
    assert node.metadata["cost_status"] == "estimated"


def test_an_engine_stream_cut_after_its_text_is_charged_a_token_a_character(
    bill: BillingProvider,
) -> None:
    """A cut stream's output is counted from what was received, a token per character (at
    most ``max_tokens``), as every other stream's is: the engine's deltas were counted one
    token each, whatever text they held (an Anthropic delta holds several tokens)."""
    config, request = chat_engine_request(bill)
    received = []
    with ExecutionContext() as ctx:
        events = LM15Engine(config).stream(request)
        for event in events:
            if event.type == "delta":
                received.append(event.delta.text)
                if len(received) == 3:
                    break
        events.close()
    (node,) = llm_nodes(ctx)
    assert (node.status, node.error_class) == ("fail", "StreamAbandoned")
    assert node.tokens_out == len("".join(received)) > 3
