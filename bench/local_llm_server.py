"""Local llama.cpp server (xllamacpp + SmolLM2-135M): start-up time and generation speed.

There is no baseline to race here; the rows record what the demo and the integration tests can
count on, on the machine at hand.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

import openai

from ampmeter.local_llm import LocalLLMServer

COMPLETION_TOKENS = 16


def _row(name: str, unit: str, value: float, target: str, met: bool) -> dict[str, Any]:
    return {
        "name": name,
        "unit": unit,
        "ampmeter": value,
        "baseline": None,
        "baseline_name": None,
        "ratio": None,
        "target": target,
        "met": met,
    }


def _speed(threads: int, calls: int) -> tuple[float, float | None]:
    """Median end-to-end and llama.cpp-reported decode tok/s for 16-token completions."""
    wall_rates: list[float] = []
    decode_rates: list[float] = []
    with LocalLLMServer(threads=threads) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="bench", max_retries=0)
        for i in range(calls + 1):
            began = time.perf_counter()
            response = client.chat.completions.create(
                model=server.model,
                messages=[{"role": "user", "content": f"Write a short story, number {i}."}],
                max_tokens=COMPLETION_TOKENS,
                temperature=0,
                extra_body={"ignore_eos": True, "cache_prompt": False},
            )
            elapsed = time.perf_counter() - began
            if i == 0:
                continue  # the first call warms caches
            assert response.usage is not None
            wall_rates.append(response.usage.completion_tokens / elapsed)
            timings = (response.model_extra or {}).get("timings", {})
            if "predicted_per_second" in timings:
                decode_rates.append(float(timings["predicted_per_second"]))
    decode = statistics.median(decode_rates) if decode_rates else None
    return statistics.median(wall_rates), decode


def run(quick: bool) -> list[dict[str, Any]]:
    """Start the server a few times, then time 16-token completions; return the rows."""
    starts = 2 if quick else 5
    calls = 5 if quick else 20
    startup: list[float] = []
    for _ in range(starts):
        began = time.perf_counter()
        with LocalLLMServer():
            startup.append(time.perf_counter() - began)
    startup_s = statistics.median(startup)
    rows = [_row("server start (load model, healthy)", "s", startup_s, "< 5 s", startup_s < 5)]
    for threads in (1, 2):
        wall, decode = _speed(threads, calls)
        name = f"{COMPLETION_TOKENS}-token completion, end to end, threads={threads}"
        rows.append(_row(name, "tok/s", wall, ">= 20 tok/s", wall >= 20))
        if decode is not None:
            name = f"decode speed reported by llama.cpp, threads={threads}"
            rows.append(_row(name, "tok/s", decode, ">= 20 tok/s", decode >= 20))
    return rows


def main() -> None:
    """Print the rows as a table."""
    rows = run(quick="--quick" in sys.argv[1:])
    print(f"{'benchmark':56} {'ampmeter':>10} {'unit':>6}  target        met")
    for row in rows:
        print(
            f"{row['name']:56} {row['ampmeter']:10.2f} {row['unit']:>6}  "
            f"{row['target']:12}  {row['met']}"
        )


if __name__ == "__main__":
    main()
