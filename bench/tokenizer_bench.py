"""What the offline tokenizer (``ampmeter[tokenizer]``) adds to each call it measures.

With ``ampmeter.pricing.tokenizer.use()`` every request to an OpenAI model has its text counted
by the model's own encoding when it is measured (once per call, before it is sent): the
``learned`` estimate then starts from the exact count, and ``bound`` reserves it instead of a
token per byte. This measures that count on the benchmarks' agent-shaped request
(:mod:`ampmeter.testing.agent_requests`: a 1,180-character system prompt, a 502-character task,
0 or 10 tool schemas, gpt-4o-mini): the time of ``request_size.measure("chat", body)`` with the
tokenizer on, beside the same measure with it off (the baseline), and the encoding's one-time
load in a fresh process.

Run: ``python bench/tokenizer_bench.py [--quick]``.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from _options import parse

LOAD = (
    "import time; from ampmeter.pricing import tokenizer; tokenizer.use(); s = time.perf_counter();"
    " tokenizer.counter('gpt-4o-mini')('x'); print(time.perf_counter() - s)"
)


def _median_us(fn: Callable[[], object], calls: int, repeats: int) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def _body(tools: int) -> dict[str, Any]:
    from ampmeter.testing.agent_requests import SYSTEM_PROMPT, USER_PROMPT, tool_schemas

    body: dict[str, Any] = {
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": USER_PROMPT},
        ],
        "max_tokens": 100,
    }
    if tools:
        body["tools"] = tool_schemas(tools)
    return body


def run(quick: bool) -> list[dict[str, object]]:
    """µs per measure of the agent request, tokenizer on beside off; the encoding's load."""
    from ampmeter.pricing import request_size, tokenizer

    if not tokenizer.available():
        return []
    calls, repeats = (200, 5) if quick else (2_000, 9)
    rows: list[dict[str, object]] = []
    for tools in (0, 10):
        body = _body(tools)
        tokenizer.use(False)
        off = _median_us(lambda body=body: request_size.measure("chat", body), calls, repeats)
        tokenizer.use()
        try:
            on = _median_us(lambda body=body: request_size.measure("chat", body), calls, repeats)
        finally:
            tokenizer.use(False)
        rows.append(
            {
                "name": f"measure an agent request, {tools} tools: tokenizer on",
                "unit": "µs/call",
                "ampmeter": round(on, 1),
                "baseline": round(off, 1),
                "baseline_name": "the same measure, tokenizer off",
                "ratio": round(off / on, 3),
                "target": "recorded (adds to each call)",
                "met": True,
            }
        )
    done = subprocess.run([sys.executable, "-c", LOAD], capture_output=True, text=True, check=True)
    rows.append(
        {
            "name": "the encoding's first load in a process (once)",
            "unit": "s",
            "ampmeter": round(float(done.stdout.strip()), 3),
            "baseline": None,
            "baseline_name": None,
            "ratio": None,
            "target": "recorded",
            "met": True,
        }
    )
    return rows


def main() -> None:
    """Print the rows."""
    rows = run(parse(__doc__).quick)
    if not rows:
        print("the offline tokenizer is not installed: pip install 'ampmeter[tokenizer]'")
    for r in rows:
        base = "-" if r["baseline"] is None else r["baseline"]
        print(f"{r['name']:58} {r['ampmeter']!s:>9} {r['unit']:8} baseline {base}")


if __name__ == "__main__":
    main()
