"""``ampmeter run --proxy``: programs in any language metered and capped with the run.

The provider's bill is the truth: a Node program's calls through the run's proxy are logged in
the run and stopped at the run's cap; a Python program's calls, metered in-process and marked,
pass the proxy without being counted a second time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest

from ampmeter.analysis import load_runs
from ampmeter.testing.billing import BillingProvider
from support.node_sdks import NODE_DIR, node_with_sdks

PRICES = {"gpt-4o-mini": ("0.15", "0.60"), "claude-haiku-4-5": ("1.00", "5.00")}


def run(args: list[str], provider: BillingProvider, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "OPENAI_BASE_URL": provider.openai_base_url,
        "ANTHROPIC_BASE_URL": provider.url,
    }
    return subprocess.run(
        [sys.executable, "-m", "ampmeter", "run", "--proxy", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def logged_cost(log: Path) -> tuple[Decimal, int]:
    calls = [c for run in load_runs([log]).values() for c in run.calls if c.kind == "llm"]
    cost = sum((Decimal(repr(c.cost_usd)) for c in calls), Decimal(0))
    return cost, sum(1 for c in calls if c.status != "halt")


def test_a_node_program_is_metered_and_stopped_at_the_runs_cap(tmp_path: Path) -> None:
    node = node_with_sdks()
    log = tmp_path / "run.jsonl"
    with BillingProvider(prices=PRICES, output_tokens=40) as provider:
        done = run(
            ["--max-cost", "0.002", "--out", str(log), "--", node, "clients.mjs", "12"],
            provider,
            NODE_DIR,
        )
        results = [json.loads(line) for line in done.stdout.splitlines()]
        answered = [r for r in results if r["ok"]]
        assert any(not r["ok"] and r["status"] == 402 for r in results), done.stderr
        assert done.returncode == 3, done.stderr  # a limit stopped calls: the run's status
        assert "limit_exceeded" in done.stderr
        assert len(provider.calls) == len(answered) > 0
        cost, sent = logged_cost(log)
        assert sent == len(provider.calls)
        assert cost == provider.billed_usd <= Decimal("0.002")


PYTHON_AGENT = """
import openai
client = openai.OpenAI(api_key="sk-own")  # OPENAI_BASE_URL: the run's proxy
for _ in range(3):
    client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "Hello there"}], max_tokens=20
    )
    for _ in client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "Hi"}], max_tokens=20,
        stream=True,
    ):
        pass
"""


# Raw HTTP clients below the SDKs: aiohttp (json=) and urllib (http.client), to the run's proxy.
RAW_AGENT = """
import asyncio, json, os, urllib.request, aiohttp
url = os.environ["OPENAI_BASE_URL"] + "/chat/completions"
body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hi"}]}
async def main():
    async with aiohttp.ClientSession() as session:
        for _ in range(2):
            async with session.post(url, json=body) as response:
                assert response.status == 200, await response.text()
                await response.read()
asyncio.run(main())
request = urllib.request.Request(
    url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
)
urllib.request.urlopen(request).read()
"""


@pytest.mark.parametrize(
    ("agent", "calls"),
    [(PYTHON_AGENT, 6), (RAW_AGENT, 3)],
    ids=["openai SDK (httpx)", "aiohttp and urllib (http.client)"],
)
def test_a_python_program_under_the_proxy_is_counted_once(
    tmp_path: Path, agent: str, calls: int
) -> None:
    """Metered in-process and marked, its requests pass the proxy uncounted: each call is
    logged once (without the mark, twice)."""
    script = tmp_path / "agent.py"
    script.write_text(agent)
    log = tmp_path / "run.jsonl"
    with BillingProvider(prices=PRICES) as provider:
        done = run(["--out", str(log), "--", sys.executable, str(script)], provider, tmp_path)
        assert done.returncode == 0, done.stderr
        assert len(provider.calls) == calls
        cost, sent = logged_cost(log)
        assert sent == calls
        assert cost == provider.billed_usd


def test_upstream_needs_the_proxy_and_names_a_route(tmp_path: Path) -> None:
    with BillingProvider(prices=PRICES) as provider:
        done = run(["--upstream", "gemini=http://127.0.0.1:9", "--", "true"], provider, tmp_path)
        assert done.returncode == 2
        assert "the proxy's routes are openai, anthropic" in done.stderr
