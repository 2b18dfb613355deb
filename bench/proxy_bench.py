"""The metering proxy: how much of a shared cap concurrent clients use, and what it adds.

* **cap**: W client threads (the real ``openai`` SDK, plain calls and streams in turn) call
  through one ``ampmeter proxy`` on a dollar cap worth about 100 calls of a loopback provider
  that bills like a real one (``ampmeter.testing.BillingProvider``), until refused; the figure
  is billed ÷ cap (target: at most 1.00, i.e. no overshoot) at 8, 32 and 128 clients.
* **latency**: one client, sequential requests, directly to the provider and through the proxy
  in alternating rounds; "added" is the median over rounds of the difference of the per-request
  means (target: under 2 ms per request on loopback), for a plain call and, per chunk, for a
  stream of about 200 chunks.

Run: ``python bench/proxy_bench.py [--quick]``.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from decimal import Decimal
from typing import Any

import openai

from _options import parse
from ampmeter.proxy import MeteringProxy
from ampmeter.proxy.budget_file import budgets_from
from ampmeter.testing import BillingProvider

PRICES = {"gpt-4o-mini": ("0.15", "0.60")}
MESSAGES = [{"role": "user", "content": "Summarise the meeting notes, please. " * 8}]


def _proxy(provider: BillingProvider, cap: Decimal | None) -> MeteringProxy:
    caller: dict[str, Any] = {} if cap is None else {"max_cost_usd": float(cap)}
    if cap is None:
        caller["limits"] = {"amp:llm_calls": 10**9}
    return MeteringProxy(
        budgets_from(
            {"upstreams": {"openai": provider.openai_base_url}, "callers": {"bench": caller}}
        )
    )


def cap_fraction(workers: int) -> tuple[float, int]:
    """Billed ÷ cap with ``workers`` concurrent clients on a cap worth about 100 calls."""
    with BillingProvider(prices=PRICES, output_tokens=40) as provider:
        probe = openai.OpenAI(base_url=provider.openai_base_url, api_key="bench")
        probe.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, max_tokens=40)
        before = provider.billed_usd  # one call, sent directly: the cap is worth 100 of them
        cap = before * 100
        with _proxy(provider, cap) as proxy:
            return _hammer(proxy, provider, workers, cap, before)


def _hammer(
    proxy: MeteringProxy, provider: BillingProvider, workers: int, cap: Decimal, before: Decimal
) -> tuple[float, int]:
    client = openai.OpenAI(
        base_url=proxy.base_urls()["OPENAI_BASE_URL"], api_key="bench", max_retries=0
    )

    def work() -> None:
        for i in range(10_000):
            try:
                if i % 2:
                    client.chat.completions.create(
                        model="gpt-4o-mini", messages=MESSAGES, max_tokens=40
                    )
                else:
                    for _ in client.chat.completions.create(
                        model="gpt-4o-mini", messages=MESSAGES, max_tokens=40, stream=True
                    ):
                        pass
            except openai.APIStatusError as refused:
                if refused.status_code == 429:  # busy: calls in flight hold the rest
                    time.sleep(0.01)
                    continue
                return

    threads = [threading.Thread(target=work) for _ in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return float((provider.billed_usd - before) / cap), len(provider.calls) - 1


def _mean_request_s(client: openai.OpenAI, calls: int, stream: bool) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        if stream:
            for _ in client.chat.completions.create(
                model="gpt-4o-mini", messages=MESSAGES, max_tokens=200, stream=True
            ):
                pass
        else:
            client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, max_tokens=40)
    return (time.perf_counter() - start) / calls


def latency(rounds: int, calls: int) -> dict[str, float]:
    """Milliseconds the proxy adds per plain request and per streamed chunk."""
    with (
        BillingProvider(prices=PRICES, output_tokens=200) as provider,
        _proxy(provider, None) as proxy,
    ):
        direct = openai.OpenAI(base_url=provider.openai_base_url, api_key="b", max_retries=0)
        proxied = openai.OpenAI(
            base_url=proxy.base_urls()["OPENAI_BASE_URL"], api_key="b", max_retries=0
        )
        chunks = sum(
            1
            for _ in direct.chat.completions.create(
                model="gpt-4o-mini", messages=MESSAGES, max_tokens=200, stream=True
            )
        )
        added: dict[str, list[float]] = {"plain": [], "stream": []}
        for _ in range(rounds):
            for kind, stream in (("plain", False), ("stream", True)):
                through = _mean_request_s(proxied, calls, stream)
                alone = _mean_request_s(direct, calls, stream)
                added[kind].append((through - alone) * 1000)
    return {
        "plain_ms": statistics.median(added["plain"]),
        "stream_ms_per_chunk": statistics.median(added["stream"]) / chunks,
        "chunks": chunks,
    }


def run(quick: bool) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for workers in (8, 32) if quick else (8, 32, 128):
        fraction, calls = cap_fraction(workers)
        rows.append(
            {
                "name": f"proxy: billed / cap, {workers} clients ({calls} calls billed)",
                "unit": "×",
                "ampmeter": round(fraction, 3),
                "baseline": None,
                "baseline_name": "the cap",
                "ratio": None,
                "target": "<= 1.00",
                "met": fraction <= 1.0,
            }
        )
    found = latency(*((3, 20) if quick else (7, 60)))
    for name, value, target in (
        ("proxy: added per plain request", found["plain_ms"], 2.0),
        (
            f"proxy: added per streamed chunk ({found['chunks']:.0f} chunks)",
            found["stream_ms_per_chunk"],
            None,
        ),
    ):
        rows.append(
            {
                "name": name,
                "unit": "ms",
                "ampmeter": round(value, 3),
                "baseline": None,
                "baseline_name": "direct to the provider",
                "ratio": None,
                "target": None if target is None else f"< {target:g} ms",
                "met": None if target is None else value < target,
            }
        )
    return rows


if __name__ == "__main__":
    options = parse(__doc__)
    for row in run(options.quick):
        print(f"{row['name']:60s} {row['ampmeter']:>9} {row['unit']}", file=sys.stdout)
