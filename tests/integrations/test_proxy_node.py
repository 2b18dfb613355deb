"""Agents in another language: the official Node SDKs (``openai``, ``@anthropic-ai/sdk``)
through the metering proxy, as ``ampmeter run --proxy`` would point them at it (the SDKs:
:mod:`support.node_sdks`)."""

from __future__ import annotations

import json
import os
import subprocess
from decimal import Decimal

import pytest

from ampmeter.proxy import MeteringProxy
from ampmeter.proxy.budget_file import budgets_from
from ampmeter.testing.billing import BillingProvider
from support.node_sdks import NODE_DIR, node_with_sdks

PRICES = {"gpt-4o-mini": ("0.15", "0.60"), "claude-haiku-4-5": ("1.00", "5.00")}


@pytest.fixture(scope="module")
def node() -> str:
    return node_with_sdks()


def test_the_node_sdks_are_metered_and_stopped_by_the_proxy(node: str) -> None:
    cap = Decimal("0.002")
    with BillingProvider(prices=PRICES, output_tokens=40) as bill:
        config = budgets_from(
            {
                "upstreams": {"openai": bill.openai_base_url, "anthropic": bill.url},
                "callers": {"agent": {"max_cost_usd": float(cap)}},
            }
        )
        with MeteringProxy(config) as proxy:
            done = subprocess.run(
                [node, "clients.mjs", "12"],
                cwd=NODE_DIR,
                env={**os.environ, **proxy.base_urls()},
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            assert done.returncode == 0, done.stderr[-2000:]
            recorded = proxy.context("agent").stats.total_cost()
        results = [json.loads(line) for line in done.stdout.splitlines()]
        answered = [r for r in results if r["ok"]]
        refused = [r for r in results if not r["ok"]]
        # every kind got through before the cap, and the cap stopped the rest
        assert {(r["sdk"], r["kind"]) for r in answered} == {
            ("openai", "plain"),
            ("openai", "stream"),
            ("anthropic", "plain"),
            ("anthropic", "stream"),
        }
        assert refused, "the cap never stopped the Node agent"
        assert {r["status"] for r in refused} == {402}
        assert all("amp:cost" in r["message"] for r in refused)
        assert len(bill.calls) == len(answered)
        assert recorded == bill.billed_usd <= cap
