"""The metering proxy: how much of a shared cap concurrent clients use, and what it adds.

* **cap**: W client threads (the real ``openai`` SDK, plain calls and streams in turn) call
  through one ``ampmeter proxy`` on a dollar cap worth about 100 calls of a loopback provider
  that bills like a real one (``ampmeter.testing.BillingProvider``), until refused; the figure
  is billed ÷ cap (target: at most 1.00, i.e. no overshoot) at 8, 32 and 128 clients. Beside
  it, in the same run, LiteLLM's proxy (``litellm[proxy]``, the release
  ``peers-requirements.txt`` pins, in its own virtualenv ``bench/.litellm-proxy-venv``) with
  the same cap as its deployment's ``max_budget``: the budget it enforces without a database
  (key, user and global budgets need its Postgres database, and fail open without one).
* **latency**: one client, sequential requests, directly to the provider and through the proxy
  in alternating rounds; "added" is the median over rounds of the difference of the per-request
  means (target: under 2 ms per request on loopback), for a plain call and, per chunk, for a
  stream of about 200 chunks.

Run: ``python bench/proxy_bench.py [--quick]``.
"""

from __future__ import annotations

import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import openai

from _options import parse
from _venvs import clean_python
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


HERE = Path(__file__).resolve().parent
Served = Callable[[BillingProvider, Decimal], contextlib.AbstractContextManager[str]]


@contextlib.contextmanager
def ampmeter_proxy(provider: BillingProvider, cap: Decimal) -> Iterator[str]:
    """An ``ampmeter proxy`` on ``cap``; yields the clients' ``OPENAI_BASE_URL``."""
    with _proxy(provider, cap) as proxy:
        yield proxy.base_urls()["OPENAI_BASE_URL"]


def _litellm_python() -> tuple[Path | None, str]:
    pins = (HERE / "peers-requirements.txt").read_text().splitlines()
    litellm = next(line for line in pins if line.startswith("litellm=="))
    return clean_python(HERE / ".litellm-proxy-venv", [litellm.replace("==", "[proxy]==")])


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextlib.contextmanager
def litellm_proxy(provider: BillingProvider, cap: Decimal) -> Iterator[str]:
    """LiteLLM's proxy with ``cap`` as its one deployment's ``max_budget``."""
    python, why = _litellm_python()
    if python is None:
        raise RuntimeError(why)
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="proxy_bench.") as tmp:
        config = Path(tmp) / "config.yaml"
        config.write_text(
            "model_list:\n  - model_name: gpt-4o-mini\n    litellm_params:\n"
            f"      model: openai/gpt-4o-mini\n      api_base: {provider.openai_base_url}\n"
            f"      api_key: sk-bench\n      max_budget: {cap}\n      budget_duration: 1d\n"
        )
        with open(Path(tmp) / "litellm.log", "w") as log:
            process = subprocess.Popen(
                [str(python.parent / "litellm"), "--config", str(config), "--port", str(port)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
            )
        try:
            deadline = time.monotonic() + 180
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), 1).close()
                    break
                except OSError:
                    if process.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError("LiteLLM's proxy did not start") from None
                    time.sleep(0.5)
            yield f"http://127.0.0.1:{port}"
        finally:
            process.terminate()
            process.wait(timeout=30)


def cap_fraction(serve: Served, workers: int) -> tuple[float, int]:
    """Billed ÷ cap with ``workers`` concurrent clients on a cap worth about 100 calls."""
    with BillingProvider(prices=PRICES, output_tokens=40) as provider:
        probe = openai.OpenAI(base_url=provider.openai_base_url, api_key="bench")
        probe.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, max_tokens=40)
        before = provider.billed_usd  # one call, sent directly: the cap is worth 100 of them
        cap = before * 100
        with serve(provider, cap) as base_url:
            _hammer(base_url, workers)
        return float((provider.billed_usd - before) / cap), len(provider.calls) - 1


def _hammer(base_url: str, workers: int) -> None:
    """``workers`` threads call until refused (a 429 with ``retry-after`` is tried again)."""
    client = openai.OpenAI(base_url=base_url, api_key="bench", max_retries=0)

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
                if refused.response.headers.get("retry-after"):  # busy, not spent
                    time.sleep(0.01)
                    continue
                return

    threads = [threading.Thread(target=work) for _ in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


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
        fraction, calls = cap_fraction(ampmeter_proxy, workers)
        try:
            peer: float | None = cap_fraction(litellm_proxy, workers)[0]
        except RuntimeError as why:
            print(f"[proxy] LiteLLM's proxy left out: {why}", file=sys.stderr)
            peer = None
        rows.append(
            {
                "name": f"proxy: billed / cap, {workers} clients ({calls} calls billed)",
                "unit": "×",
                "ampmeter": round(fraction, 3),
                "baseline": None if peer is None else round(peer, 3),
                "baseline_name": "LiteLLM proxy, deployment max_budget",
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
        beside = "" if row["baseline"] is None else f"   {row['baseline_name']} {row['baseline']}"
        print(f"{row['name']:60s} {row['ampmeter']:>9} {row['unit']}{beside}")
