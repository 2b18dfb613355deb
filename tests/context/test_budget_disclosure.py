"""The budget told to the agent: ``ctx.remaining()``, ``ctx.budget_note()`` and, with
``disclose_budget=True``, the line sent as system text through the real openai and anthropic
SDKs to the loopback billing provider (which sees it and bills it)."""

from __future__ import annotations

import uuid
from decimal import Decimal
from pathlib import Path

import anthropic
import openai
import pytest

from ampmeter import ExecutionContext
from ampmeter.ledgers import SqliteLedger
from ampmeter.testing import BillingProvider
from support.ledger_backends import reserve

pytestmark = pytest.mark.usefixtures("instrumented")  # conftest.py

PRICES = {"gpt-4o": ("2.50", "10"), "claude-sonnet-4-5": ("3", "15")}
MESSAGES = [{"role": "user", "content": "Name one colour."}]


def spend(ctx: ExecutionContext, cost: float, estimate: float | None = None) -> None:
    with ctx.llm_call("step", estimate_usd=cost if estimate is None else estimate) as call:
        call.record(cost_usd=cost)


def test_remaining_counts_spend_holds_in_flight_and_the_tightest_limit_above() -> None:
    with ExecutionContext(max_cost_usd=1.0, max_steps=20) as ctx:
        for _ in range(7):
            spend(ctx, 0.05)
        assert ctx.remaining() == {"amp:cost": Decimal("0.65"), "amp:steps": 13}
        assert ctx.budget_note() == "Budget left: $0.65 of $1.00, 13 of 20 steps"
        child = ctx.spawn_child("worker", max_cost_usd=0.5)
        with child, child.llm_call("in flight", estimate_usd=0.2) as call:
            # The child's own cap is tighter than what the parent has left.
            assert child.remaining() == {"amp:cost": Decimal("0.3"), "amp:steps": 12}
            assert ctx.remaining()["amp:cost"] == Decimal("0.45")
            call.record(cost_usd=0.1)
        assert ctx.budget_note() == "Budget left: $0.55 of $1.00, 12 of 20 steps"
    with ExecutionContext() as free:
        assert free.remaining() == {}
        assert free.budget_note() == "Budget left: no limit"


def test_remaining_reads_the_shared_ledger(tmp_path: Path) -> None:
    scope = f"team-{uuid.uuid4().hex[:8]}"
    with SqliteLedger(tmp_path / "b.sqlite3", scope) as ledger:
        with SqliteLedger(tmp_path / "b.sqlite3", scope) as other:  # another worker's spend
            held = reserve(other, {"amp:cost": 0.3}, {"amp:cost": 1.0})
            assert held is not None
            other.commit(held, {"amp:cost": 0.25})
        with ExecutionContext(max_cost_usd=1.0, ledger=ledger) as ctx:
            spend(ctx, 0.1)
            assert ctx.remaining() == {"amp:cost": Decimal("0.65")}
            ledger.set_ceiling(scope, "amp:cost", 0.5)  # the operator lowers the shared cap
            assert ctx.budget_note() == "Budget left: $0.15 of $0.50"


def test_disclosed_budget_reaches_the_provider_through_the_openai_sdk() -> None:
    with BillingProvider(output_tokens=5, prices=PRICES) as server:
        client = openai.OpenAI(base_url=server.openai_base_url, api_key="k", max_retries=0)
        with ExecutionContext(max_cost_usd=1.0, max_steps=20, disclose_budget=True) as ctx:
            with ctx.spawn_child("worker") as child:  # inherited
                client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
            client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
        first, second = (request.json()["messages"] for request in server.requests)
        assert first[0] == {
            "role": "system",
            "content": "Budget left: $1.00 of $1.00, 20 of 20 steps",
        }
        assert first[1:] == MESSAGES and [MESSAGES[0]] == MESSAGES  # the caller's list unchanged
        assert second[0]["content"].startswith("Budget left: $0.99")
        assert second[0]["content"].endswith("19 of 20 steps")
        nodes = [n for n in ctx.snapshot()["graph"]["nodes"].values() if n["kind"] == "llm"]
        told = sorted(n["metadata"]["budget_note"] for n in nodes)
        assert told == sorted([first[0]["content"], second[0]["content"]])
        assert child.disclose_budget
    with BillingProvider(output_tokens=5, prices=PRICES) as server:  # off by default
        client = openai.OpenAI(base_url=server.openai_base_url, api_key="k", max_retries=0)
        with ExecutionContext(max_cost_usd=1.0) as ctx:
            client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
        assert server.requests[0].json()["messages"] == MESSAGES


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the SDK's notice on the model
def test_disclosed_budget_joins_the_anthropic_system_text() -> None:
    with BillingProvider(output_tokens=5, prices=PRICES) as server:
        client = anthropic.Anthropic(base_url=server.anthropic_base_url, api_key="k", max_retries=0)
        with ExecutionContext(max_cost_usd=2.0, disclose_budget=True):
            client.messages.create(
                model="claude-sonnet-4-5", max_tokens=5, system="Be brief.", messages=MESSAGES
            )
        body = server.requests[0].json()
        assert body["system"] == "Be brief.\n\nBudget left: $2.00 of $2.00"


def test_disclose_budget_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="disclose_budget"):
        ExecutionContext(disclose_budget="yes")  # type: ignore[arg-type]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the SDK's notice on the model
def test_disclosed_budget_joins_messages_and_blocks_given_as_tuples() -> None:
    blocks = ({"type": "text", "text": "Be brief."},)
    with BillingProvider(output_tokens=5, prices=PRICES) as server:
        openai_client = openai.OpenAI(base_url=server.openai_base_url, api_key="k", max_retries=0)
        anthropic_client = anthropic.Anthropic(
            base_url=server.anthropic_base_url, api_key="k", max_retries=0
        )
        with ExecutionContext(max_cost_usd=2.0, disclose_budget=True) as ctx:
            openai_client.chat.completions.create(model="gpt-4o", messages=tuple(MESSAGES))
            anthropic_client.messages.create(
                model="claude-sonnet-4-5", max_tokens=5, system=blocks, messages=tuple(MESSAGES)
            )
        chat, messages = (request.json() for request in server.requests)
        assert chat["messages"] == [
            {"role": "system", "content": "Budget left: $2.00 of $2.00"},
            *MESSAGES,
        ]
        assert messages["system"][0] == blocks[0]
        assert messages["system"][1]["text"].startswith("Budget left: $")
        nodes = [n for n in ctx.snapshot()["graph"]["nodes"].values() if n["kind"] == "llm"]
        assert all(n["metadata"]["budget_note"].startswith("Budget left") for n in nodes)
