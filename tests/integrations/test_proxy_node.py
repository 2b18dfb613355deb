"""Agents in another language: the official Node SDKs (``openai``, ``@anthropic-ai/sdk``)
through the metering proxy, as ``ampmeter run --proxy`` would point them at it.

The SDKs are the pinned ones of ``tests/support/node/package.json``, installed with ``npm ci``
on first use (the lock file records no download addresses). Without Node.js the test is skipped
on a developer's machine and fails under CI, where it must run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from decimal import Decimal
from pathlib import Path

import pytest

from ampmeter.proxy import MeteringProxy
from ampmeter.proxy.budget_file import budgets_from
from ampmeter.testing.billing import BillingProvider

NODE_DIR = Path(__file__).resolve().parents[1] / "support" / "node"
PRICES = {"gpt-4o-mini": ("0.15", "0.60"), "claude-haiku-4-5": ("1.00", "5.00")}


@pytest.fixture(scope="module")
def node() -> str:
    found, npm = shutil.which("node"), shutil.which("npm")
    if found is None or npm is None:
        if os.environ.get("CI"):
            pytest.fail("Node.js and npm are needed for the proxy's Node test")
        pytest.skip("Node.js and npm are not installed")
    if not (NODE_DIR / "node_modules" / "openai").is_dir():
        done = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts"],
            cwd=NODE_DIR,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-2000:]
    return found


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
