"""The downgrade ladder through the real openai SDK against the loopback billing provider:
past each fraction of the cost ceiling the provider sees the cheaper model, the reservation is
priced at it, and the node keeps the model asked for."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

import ampmeter
from ampmeter import ExecutionContext, LimitExceeded
from ampmeter.keys import KEY_COST
from ampmeter.policies import registry
from ampmeter.policies.options import Option, Policy
from ampmeter.policies.step import Relief
from ampmeter.testing import BillingProvider

pytestmark = pytest.mark.usefixtures("instrumented")  # conftest.py

PRICES = {"big-a": ("1000", "1000"), "big-b": ("1000", "1000"), "small": ("10", "10")}
MESSAGES = [{"role": "user", "content": "Name one colour."}]
LADDER = {0.5: {"big-a": "small"}, 0.9: {"*": "small"}}


@pytest.fixture(autouse=True)
def prices() -> Iterator[None]:
    for model, (price_in, price_out) in PRICES.items():
        ampmeter.set_price(model, input_per_mtok=price_in, output_per_mtok=price_out)
    yield
    ampmeter.clear_prices()


def test_the_provider_sees_the_cheaper_model_past_each_rung() -> None:
    sent: list[tuple[str, float]] = []
    with BillingProvider(output_tokens=5, prices=PRICES) as server:
        client = openai.OpenAI(base_url=server.openai_base_url, api_key="k", max_retries=0)
        # $0.20: a prompt this short never teaches the estimate, which keeps its prior (a token
        # a character), so a big call reserves 1.8x its bill; the cap leaves room past 0.9.
        with ExecutionContext(max_cost_usd=0.2, downgrade=LADDER) as ctx:
            for number in range(60):
                asked = "big-a" if number % 2 == 0 else "big-b"
                spent = float(ctx.stats.get_gauge(KEY_COST)) / 0.2
                try:
                    client.chat.completions.create(model=asked, messages=MESSAGES, max_tokens=5)
                except LimitExceeded:
                    break
                sent.append((asked, spent))
        models = [request.json()["model"] for request in server.requests]
        assert len(models) == len(sent) > 6
        for (asked, spent), model in zip(sent, models, strict=True):
            if spent >= 0.9 or (spent >= 0.5 and asked == "big-a"):
                assert model == "small", (asked, spent)
            else:
                assert model == asked, (asked, spent)
        assert {m for (a, s), m in zip(sent, models, strict=True) if a == "big-b"} == {
            "big-b",
            "small",
        }
        # What was counted is what the provider billed, at the model it was sent.
        assert ctx.stats.get_gauge(KEY_COST) == server.billed_usd
        nodes = [n for n in ctx.snapshot()["graph"]["nodes"].values() if n["kind"] == "llm"]
        swapped = [n for n in nodes if "requested_model" in n["metadata"]]
        assert swapped and all(n["model"] == "small" for n in swapped)
        assert {n["metadata"]["requested_model"] for n in swapped} == {"big-a", "big-b"}
        assert len(swapped) == models.count("small")


def test_a_ladder_is_checked_and_is_the_one_pressure_hook() -> None:
    with pytest.raises(TypeError, match="downgrade"):
        ExecutionContext(max_cost_usd=1.0, downgrade={0.5: "small"})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="fraction"):
        ExecutionContext(max_cost_usd=1.0, downgrade={1.5: {"a": "b"}})
    with pytest.raises(ValueError, match="not both"):
        ExecutionContext(
            max_cost_usd=1.0, downgrade=LADDER, on_budget_pressure=lambda ctx, request: request
        )


def test_a_rung_names_models_as_prices_do() -> None:
    # GPT-4o, a dated gpt-4o and openai/gpt-4o are all priced as gpt-4o, so a rung keyed
    # gpt-4o takes them; gpt-4o-2024-05-13 has a price of its own, so it is another model.
    spellings = ["GPT-4o", "gpt-4o-2024-08-06", "openai/gpt-4o", "gpt-4o-2024-05-13"]
    prices = {name: ("2.50", "10") for name in spellings} | {"gpt-4o-mini": ("0.15", "0.60")}
    with BillingProvider(output_tokens=5, prices=prices) as server:
        client = openai.OpenAI(base_url=server.openai_base_url, api_key="k", max_retries=0)
        with ExecutionContext(max_cost_usd=1.0, downgrade={0.5: {"gpt-4o": "gpt-4o-mini"}}) as ctx:
            with ctx.llm_call("earlier work", estimate_usd=0.6) as call:
                call.record(cost_usd=0.6)  # past the rung
            for asked in spellings:
                client.chat.completions.create(model=asked, messages=MESSAGES, max_tokens=5)
        sent = [request.json()["model"] for request in server.requests]
        assert sent == ["gpt-4o-mini", "gpt-4o-mini", "gpt-4o-mini", "gpt-4o-2024-05-13"]
        nodes = [n for n in ctx.snapshot()["graph"]["nodes"].values() if n["kind"] == "llm"]
        asked_for = [n["metadata"].get("requested_model") for n in nodes if n["model"]]
        assert [a for a in asked_for if a] == spellings[:3]


class Tagged(Relief):
    """A relief policy of one's own: past half the cost ceiling, every request is tagged."""

    __slots__ = ()

    def relieve(self, ctx: Any, request: dict[str, Any], notes: dict[str, Any]) -> None:
        if self.spent() >= 0.5:
            request["user"] = "under-pressure"
            notes["tagged"] = True


def _tagged(admission: Any, configured: Any) -> Tagged | None:
    step = Tagged(admission)
    return step if configured.values.tag_under_pressure and step.ceilings else None


def test_a_relief_of_ones_own_is_one_module_and_one_line() -> None:
    # The ladder and the hook are two policies of one protocol (Relief); a third needs no
    # other module to name it.
    before = list(registry.POLICIES)
    registry.POLICIES.append(Policy("tag", (Option("tag_under_pressure", bool),), _tagged))
    try:
        with BillingProvider(output_tokens=5, prices=PRICES) as server:
            client = openai.OpenAI(base_url=server.openai_base_url, api_key="k", max_retries=0)
            with ExecutionContext(max_cost_usd=1.0, tag_under_pressure=True) as ctx:
                client.chat.completions.create(model="small", messages=MESSAGES, max_tokens=5)
                with ctx.llm_call("earlier work", estimate_usd=0.6) as call:
                    call.record(cost_usd=0.6)  # past half
                client.chat.completions.create(model="small", messages=MESSAGES, max_tokens=5)
            users = [request.json().get("user") for request in server.requests]
        assert users == [None, "under-pressure"]
        nodes = [n for n in ctx.snapshot()["graph"]["nodes"].values() if n["model"] == "small"]
        assert [n["metadata"].get("tagged") for n in nodes] == [None, True]
    finally:
        registry.POLICIES[:] = before


def test_a_childs_own_hook_or_ladder_replaces_the_inherited_one() -> None:
    asked: list[str] = []

    def hook(ctx: Any, request: dict[str, Any]) -> dict[str, Any]:
        asked.append(request["model"])
        return request

    with BillingProvider(output_tokens=5, prices=PRICES) as server:
        client = openai.OpenAI(base_url=server.openai_base_url, api_key="k", max_retries=0)
        with ExecutionContext(max_cost_usd=1.0, downgrade={0.5: {"big-a": "small"}}) as ctx:
            with ctx.llm_call("earlier work", estimate_usd=0.6) as call:
                call.record(cost_usd=0.6)  # past the rung and past pressure_at 0.5
            with ctx.spawn_child("hooked", on_budget_pressure=hook, pressure_at=0.5) as child:
                assert child.policies.downgrade is None
                client.chat.completions.create(model="big-a", messages=MESSAGES, max_tokens=5)
            with ctx.spawn_child("plain") as plain:  # inherits the ladder
                assert plain.policies.on_budget_pressure is None
                client.chat.completions.create(model="big-a", messages=MESSAGES, max_tokens=5)
            with ctx.spawn_child("laddered", downgrade={0.5: {"big-b": "small"}}) as laddered:
                for model in ("big-a", "big-b"):  # its own ladder, not the parent's
                    client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=5)
                with laddered.spawn_child("inner", on_budget_pressure=hook) as inner:
                    assert inner.policies.downgrade is None
        sent = [request.json()["model"] for request in server.requests]
    assert asked == ["big-a"]  # the child's hook, not the parent's ladder
    assert sent == ["big-a", "small", "big-a", "small"]
