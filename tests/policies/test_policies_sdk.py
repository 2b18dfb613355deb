"""Containment policies on instrumented SDK calls: the real openai SDK through
``ampmeter.instrument()``, against the local llama.cpp server and the replay server."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import anthropic
import openai
import pytest

import ampmeter
from ampmeter import ExecutionContext, LimitExceeded, MemorySink
from ampmeter.keys import KEY_COST, KEY_INPUT_TOKENS, KEY_LLM_CALLS
from ampmeter.local_llm import LocalLLMServer
from ampmeter.policies import KEY_BUDGET_PRESSURE, KEY_REPEATS_FOR
from ampmeter.testing import recorded
from ampmeter.testing.replay import ReplayServer
from support.wire import chat_completion

# A fine-tune whose base the price table has no fine-tuning price for (it knows OpenAI's
# published rates for some bases, e.g. ft:gpt-4o-mini at the "openai" provider).
FINE_TUNE = "ft:gpt-4.1-nano-2025-04-14:org::id"
MESSAGES = [{"role": "user", "content": "Name one colour."}]


pytestmark = pytest.mark.usefixtures("instrumented")  # conftest.py


@pytest.fixture(autouse=True)
def no_prices_left_behind() -> Iterator[None]:
    yield
    ampmeter.clear_prices()


def three_big_calls(ctx: ExecutionContext, replay: ReplayServer) -> int:
    """Make three chat calls of the issue's size; return how many were made."""
    big = (chat_completion(FINE_TUNE, 100_000, 100_000) for _ in range(3))
    replay.script("/v1/chat/completions", *big)
    client = openai.OpenAI(base_url=replay.openai_base_url, api_key="sk-x", max_retries=0)
    made = 0
    with ctx:
        for _ in range(3):
            try:
                client.chat.completions.create(model=FINE_TUNE, messages=MESSAGES)
            except LimitExceeded:
                break
            made += 1
    return made


def test_the_measured_hole_is_closed() -> None:
    # Issue 16: max_cost_usd=0.01 let three 100k + 100k-token calls through on a fine-tune the
    # price table does not know, silently.
    with ReplayServer() as replay:
        assert three_big_calls(ExecutionContext(max_cost_usd=0.01), replay) == 0
        assert replay.requests == []  # refused before the request was sent
    with ReplayServer() as replay:  # the hole, now only when asked for
        ctx = ExecutionContext(max_cost_usd=0.01, on_unpriced="allow")
        assert three_big_calls(ctx, replay) == 3
        assert ctx.stats.get_counter("amp:unpriced_llm_calls") == 3
    ampmeter.set_price("ft:gpt-4.1-nano*", input_per_mtok=0.3, output_per_mtok=1.2)
    with ReplayServer() as replay:  # priced in one line: the first call spends the budget
        ctx = ExecutionContext(max_cost_usd=0.01)
        assert three_big_calls(ctx, replay) == 1
        assert len(replay.requests) == 1
        assert ctx.stats.get_gauge(KEY_COST) == Decimal("0.03") + Decimal("0.12")


def test_a_provider_prefixed_model_is_priced_through_the_sdk() -> None:
    with ReplayServer() as replay:
        replay.script("/v1/chat/completions", chat_completion("openai/gpt-4o", 100_000, 100_000))
        client = openai.OpenAI(base_url=replay.openai_base_url, api_key="sk-x", max_retries=0)
        with ExecutionContext(max_cost_usd=10) as ctx:
            client.chat.completions.create(model="openai/gpt-4o", messages=MESSAGES)
    expected = ampmeter.price("gpt-4o", "openai", input_tokens=100_000, output_tokens=100_000)
    assert ctx.stats.get_gauge(KEY_COST) == expected.cost_usd


def test_the_loop_guard_stops_the_same_request(
    openai_client: openai.OpenAI, llm_server: LocalLLMServer
) -> None:
    sink = MemorySink()
    with ExecutionContext(max_repeats=2, sinks=[sink]) as ctx:
        for _ in range(2):
            openai_client.chat.completions.create(
                model=llm_server.model, messages=MESSAGES, max_tokens=2
            )
        other = [{"role": "user", "content": "Name one animal."}]
        openai_client.chat.completions.create(model=llm_server.model, messages=other, max_tokens=2)
        with pytest.raises(LimitExceeded, match="loop detected") as info:
            openai_client.chat.completions.create(
                model=llm_server.model, messages=MESSAGES, max_tokens=2
            )
    assert info.value.exceeded is not None
    assert info.value.exceeded.key.startswith(KEY_REPEATS_FOR)
    assert ctx.stats.get_counter(KEY_LLM_CALLS) == 3
    statuses = [n.status for n in sink.nodes if n.kind == "llm"]
    assert statuses == ["success", "success", "success", "halt"]


def test_the_input_cap_refuses_before_sending_and_records_the_actual_input(
    openai_client: openai.OpenAI, llm_server: LocalLLMServer
) -> None:
    with ExecutionContext(max_input_tokens_per_call=40) as ctx:
        long = [{"role": "user", "content": "colour " * 40}]  # 280 chars: 70 tokens estimated
        with pytest.raises(LimitExceeded, match="max_input_tokens_per_call"):
            openai_client.chat.completions.create(model=llm_server.model, messages=long)
        resp = openai_client.chat.completions.create(
            model=llm_server.model, messages=MESSAGES, max_tokens=2
        )
    assert resp.usage is not None
    assert ctx.stats.get_counter(KEY_INPUT_TOKENS) == resp.usage.prompt_tokens
    assert ctx.stats.get_counter(KEY_LLM_CALLS) == 1


def test_final_call_may_spend_the_reserve(
    openai_client: openai.OpenAI, llm_server: LocalLLMServer
) -> None:
    # 0.01 USD a token: the request below is estimated at 4 prompt + 5 output tokens = 0.09
    ampmeter.set_price(llm_server.model, input_per_mtok=10_000, output_per_mtok=10_000)
    with ExecutionContext(max_cost_usd=1.0, final_reserve_usd=0.95) as ctx:
        with pytest.raises(LimitExceeded, match="final-answer reserve"):
            openai_client.chat.completions.create(
                model=llm_server.model, messages=MESSAGES, max_tokens=5
            )
        with ampmeter.final_call():
            resp = openai_client.chat.completions.create(
                model=llm_server.model, messages=MESSAGES, max_tokens=5
            )
    assert resp.usage is not None
    spent = (resp.usage.prompt_tokens + resp.usage.completion_tokens) * Decimal("0.01")
    assert ctx.stats.get_gauge(KEY_COST) == spent


def test_budget_pressure_swaps_the_model_and_can_refuse(
    openai_client: openai.OpenAI, llm_server: LocalLLMServer
) -> None:
    # 0.02 USD a token for the local model: one call spends more than half of the budget.
    ampmeter.set_price(llm_server.model, input_per_mtok=20_000, output_per_mtok=20_000)
    ampmeter.set_price("cheap-model", input_per_mtok=0.1, output_per_mtok=0.1)
    seen: list[dict[str, Any]] = []

    def cheaper(ctx: ExecutionContext, request: dict[str, Any]) -> dict[str, Any] | None:
        seen.append(request)
        if request["messages"][0]["content"] == "refuse me":
            return None
        return {**request, "model": "cheap-model"}

    sink = MemorySink()
    with ExecutionContext(
        max_cost_usd=1.2, on_budget_pressure=cheaper, pressure_at=0.5, sinks=[sink]
    ) as ctx:
        first = openai_client.chat.completions.create(
            model=llm_server.model, messages=MESSAGES, max_tokens=3
        )
        assert seen == []  # under pressure_at: the hook is not asked
        assert ctx.stats.get_gauge(KEY_COST) >= 0.6
        second = openai_client.chat.completions.create(
            model=llm_server.model, messages=MESSAGES, max_tokens=3
        )
        with pytest.raises(LimitExceeded, match=r"on_budget_pressure hook .*cheaper") as info:
            openai_client.chat.completions.create(
                model=llm_server.model, messages=[{"role": "user", "content": "refuse me"}]
            )
    assert seen[0]["model"] == llm_server.model
    # llama.cpp answers any model name under its own alias: what it was sent is checked with
    # the replay server below; here the node and its price follow the swapped request.
    assert first.model == second.model == llm_server.model
    nodes = [n for n in sink.nodes if n.kind == "llm"]
    assert [n.model for n in nodes] == [llm_server.model, "cheap-model", llm_server.model]
    assert nodes[2].status == "halt"
    assert info.value.exceeded is not None and info.value.exceeded.key == KEY_BUDGET_PRESSURE
    assert second.usage is not None
    cheap = (second.usage.prompt_tokens + second.usage.completion_tokens) * Decimal("0.1") / 10**6
    assert nodes[1].cost_usd == cheap


def test_a_hook_returning_something_else_is_an_error(
    openai_client: openai.OpenAI, llm_server: LocalLLMServer
) -> None:
    ampmeter.set_price(llm_server.model, input_per_mtok=0, output_per_mtok=0)
    with ExecutionContext(
        max_cost_usd=1.0, on_budget_pressure=lambda c, r: "cheap", pressure_at=0.0001
    ) as ctx:
        ctx.stats.incr_gauge(KEY_COST, 0.5)
        with pytest.raises(TypeError, match="on_budget_pressure must return"):
            openai_client.chat.completions.create(model=llm_server.model, messages=MESSAGES)


def test_the_swapped_request_is_what_goes_on_the_wire() -> None:
    ampmeter.set_price("big-model", input_per_mtok=10, output_per_mtok=10)  # 2 USD a call
    ampmeter.set_price("cheap-model", input_per_mtok=0.1, output_per_mtok=0.1)

    def cheaper(ctx: ExecutionContext, request: dict[str, Any]) -> dict[str, Any]:
        return {**request, "model": "cheap-model", "max_tokens": 7}

    with ReplayServer() as replay:
        replay.script(
            "/v1/chat/completions",
            chat_completion("big-model", 100_000, 100_000),
            chat_completion("cheap-model", 100_000, 100_000),
        )
        client = openai.OpenAI(base_url=replay.openai_base_url, api_key="sk-x", max_retries=0)
        with ExecutionContext(
            max_cost_usd=2.4, on_budget_pressure=cheaper
        ) as ctx:  # 0.8 by default
            for _ in range(2):
                client.chat.completions.create(model="big-model", messages=MESSAGES)
        sent = [request.json() for request in replay.requests]
    assert [(r["model"], r.get("max_tokens")) for r in sent] == [
        ("big-model", None),
        ("cheap-model", 7),
    ]
    assert sent[1]["messages"] == MESSAGES
    assert ctx.stats.get_gauge(KEY_COST) == Decimal("2.02")


def test_the_anthropic_sdk_gets_the_same_policies(
    anthropic_client: anthropic.Anthropic, llm_server: LocalLLMServer
) -> None:
    with ExecutionContext(max_repeats=1, max_input_tokens_per_call=40) as ctx:
        anthropic_client.messages.create(model=llm_server.model, max_tokens=2, messages=MESSAGES)
        with pytest.raises(LimitExceeded, match="loop detected"):
            anthropic_client.messages.create(
                model=llm_server.model, max_tokens=2, messages=MESSAGES
            )
        # the system prompt is part of the request: not a repeat
        anthropic_client.messages.create(
            model=llm_server.model, max_tokens=2, messages=MESSAGES, system="Be brief."
        )
        with pytest.raises(LimitExceeded, match="max_input_tokens_per_call"):
            anthropic_client.messages.create(
                model=llm_server.model,
                max_tokens=2,
                messages=[{"role": "user", "content": "colour " * 40}],
            )
    assert ctx.stats.get_counter(KEY_LLM_CALLS) == 2


async def test_async_requests_get_final_call_and_budget_pressure(
    async_openai_client: openai.AsyncOpenAI, llm_server: LocalLLMServer
) -> None:
    ampmeter.set_price(llm_server.model, input_per_mtok=10_000, output_per_mtok=10_000)
    asked: list[str] = []

    def note(ctx: ExecutionContext, request: dict[str, Any]) -> dict[str, Any]:
        asked.append(request["model"])
        return request

    with ExecutionContext(
        max_cost_usd=1.0, final_reserve_usd=0.95, on_budget_pressure=note, pressure_at=0.01
    ) as ctx:
        with pytest.raises(LimitExceeded, match="final-answer reserve"):
            await async_openai_client.chat.completions.create(
                model=llm_server.model, messages=MESSAGES, max_tokens=5
            )
        with ampmeter.final_call():
            await async_openai_client.chat.completions.create(
                model=llm_server.model, messages=MESSAGES, max_tokens=5
            )
        assert asked == []  # nothing spent before the final call
        with ampmeter.final_call():
            await async_openai_client.chat.completions.create(
                model=llm_server.model, messages=MESSAGES, max_tokens=1
            )
    assert asked == [llm_server.model]
    assert ctx.stats.get_counter(KEY_LLM_CALLS) == 2


# -- the SDKs' stream helpers ---------------------------------------------------------------------


def _pressure_hook(seen: list[str]) -> Any:
    def cheaper(ctx: ExecutionContext, request: dict[str, Any]) -> dict[str, Any] | None:
        seen.append(request["model"])
        if request["messages"][0]["content"] == "refuse me":
            return None
        return {**request, "model": "cheap-model"}

    return cheaper


REFUSE_ME = [{"role": "user", "content": "refuse me"}]


def test_stream_helpers_get_budget_pressure(
    openai_client: openai.OpenAI,
    anthropic_client: anthropic.Anthropic,
    llm_server: LocalLLMServer,
) -> None:
    ampmeter.set_price(llm_server.model, input_per_mtok=20_000, output_per_mtok=20_000)
    ampmeter.set_price("cheap-model", input_per_mtok=0.1, output_per_mtok=0.1)
    seen: list[str] = []
    sink = MemorySink()
    with ExecutionContext(
        max_cost_usd=100.0, on_budget_pressure=_pressure_hook(seen), pressure_at=0.001, sinks=[sink]
    ) as ctx:
        openai_client.chat.completions.create(
            model=llm_server.model, messages=MESSAGES, max_tokens=3
        )
        assert seen == [] and ctx.stats.get_gauge(KEY_COST) > 0.1  # now under pressure
        with openai_client.chat.completions.stream(
            model=llm_server.model, messages=MESSAGES, max_tokens=3
        ) as chat_stream:
            for _ in chat_stream:
                pass
        with anthropic_client.messages.stream(
            model=llm_server.model, messages=MESSAGES, max_tokens=3
        ) as message_stream:
            message_stream.get_final_message()
        refused_chat = openai_client.chat.completions.stream(
            model=llm_server.model, messages=REFUSE_ME, max_tokens=3
        )
        with pytest.raises(LimitExceeded, match="on_budget_pressure hook"), refused_chat:
            pytest.fail("a refused chat stream was sent")
        refused = anthropic_client.messages.stream(
            model=llm_server.model, messages=REFUSE_ME, max_tokens=3
        )
        with pytest.raises(LimitExceeded, match="on_budget_pressure hook"), refused:
            pytest.fail("a refused message stream was sent")
    assert seen == [llm_server.model] * 4
    nodes = [n for n in sink.nodes if n.kind == "llm"]
    assert [(n.name, n.model, n.status) for n in nodes] == [
        ("chat.completions.create", llm_server.model, "success"),
        ("chat.completions.stream", "cheap-model", "success"),  # the SDK names its helper
        ("messages.stream", "cheap-model", "success"),
        ("chat.completions.stream", llm_server.model, "halt"),
        ("messages.stream", llm_server.model, "halt"),
    ]
    assert all(n.cost_usd < 0.01 for n in nodes[1:])  # priced as the cheap model


async def test_the_async_anthropic_stream_helper_gets_budget_pressure(
    async_anthropic_client: anthropic.AsyncAnthropic, llm_server: LocalLLMServer
) -> None:
    ampmeter.set_price(llm_server.model, input_per_mtok=20_000, output_per_mtok=20_000)
    ampmeter.set_price("cheap-model", input_per_mtok=0.1, output_per_mtok=0.1)
    seen: list[str] = []
    with ExecutionContext(
        max_cost_usd=100.0, on_budget_pressure=_pressure_hook(seen), pressure_at=0.001
    ) as ctx:
        ctx.stats.incr_gauge(KEY_COST, 1.0)
        async with async_anthropic_client.messages.stream(
            model=llm_server.model, messages=MESSAGES, max_tokens=3
        ) as stream:
            await stream.get_final_message()
        with pytest.raises(LimitExceeded, match="on_budget_pressure hook"):
            async with async_anthropic_client.messages.stream(
                model=llm_server.model, messages=REFUSE_ME, max_tokens=3
            ):
                pytest.fail("a refused message stream was sent")
    assert seen == [llm_server.model] * 2
    assert ctx.stats.get_counter(KEY_LLM_CALLS) == 1


def test_the_anthropic_stream_helper_sends_the_changed_request() -> None:
    ampmeter.set_price("cheap-model", input_per_mtok=0.1, output_per_mtok=0.1)
    ampmeter.set_price("claude-haiku-4-5", input_per_mtok=1000, output_per_mtok=1000)
    seen: list[str] = []
    with ReplayServer() as replay:
        replay.script("/v1/messages", recorded.anthropic_message_stream())
        client = anthropic.Anthropic(
            base_url=replay.anthropic_base_url, api_key="sk-ant-x", max_retries=0
        )
        with ExecutionContext(
            max_cost_usd=10.0, on_budget_pressure=_pressure_hook(seen), pressure_at=0.01
        ) as ctx:
            ctx.stats.incr_gauge(KEY_COST, 1.0)
            with client.messages.stream(
                model="claude-haiku-4-5", messages=MESSAGES, max_tokens=50
            ) as stream:
                stream.get_final_text()
        sent = [request.json()["model"] for request in replay.requests]
    assert seen == ["claude-haiku-4-5"]
    assert sent == ["cheap-model"]
