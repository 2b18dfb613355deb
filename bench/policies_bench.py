"""What the containment policies cost per call, beside the same call with none, in one run.

Rows (each: µs per ``llm_call`` round in a root context, record with a cost, exit; batches of
1,000 rounds in a fresh context, interleaved with the baseline's; the median of batch means):

* ``cost limit (unpriced check only)``: ``max_cost_usd`` set, so the unpriced-model check is in
  force; the call is priced (``estimate_usd``). Baseline: the same round with ``max_cost_usd``
  and ``on_unpriced="allow"`` (no policy at all: no policy step in the chain).
* ``every policy``: ``warn_at``, a soft limit, a windowed limit, a final-answer reserve, the loop
  guard (a distinct prompt per call) and the input cap. Same baseline.

``ratio`` = baseline / ampmeter (below 1: the policies' overhead).

Run: ``python bench/policies_bench.py [--quick]``.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from _options import parse
from ampmeter import ExecutionContext, Limit
from ampmeter.keys import KEY_LLM_CALLS

BATCH = 1_000


def _none() -> ExecutionContext:
    return ExecutionContext(max_cost_usd=1e9, on_unpriced="allow")


def _unpriced_check() -> ExecutionContext:
    return ExecutionContext(max_cost_usd=1e9)


def _every_policy() -> ExecutionContext:
    limits = [Limit(KEY_LLM_CALLS, 1e9, soft=True), Limit("amp:steps", 1e9, window_s=60)]
    return ExecutionContext(
        limits=limits,
        max_cost_usd=1e9,
        warn_at=(0.5, 0.8),
        final_reserve_usd=1.0,
        max_repeats=5,
        max_input_tokens_per_call=100_000,
    )


def _batch_us(make: Callable[[], ExecutionContext]) -> float:
    import time

    ctx = make()
    prompts = [f"prompt {i}" for i in range(BATCH)]
    llm_call = ctx.llm_call
    start = time.perf_counter_ns()
    for prompt in prompts:
        with llm_call("plan", model="gpt-4o-mini", estimate_usd=0.002, prompt_text=prompt) as call:
            call.record(tokens_in=1200, tokens_out=350, cost_usd=0.00125)
    elapsed = time.perf_counter_ns() - start
    if ctx.stats.get_counter(KEY_LLM_CALLS) != BATCH:
        raise AssertionError("calls were not all counted")
    ctx.close()
    return elapsed / BATCH / 1_000


def _row(name: str, make: Callable[[], ExecutionContext], batches: int) -> dict[str, Any]:
    ours: list[float] = []
    theirs: list[float] = []
    for _ in range(3):
        _batch_us(make)
        _batch_us(_none)
    for _ in range(batches):
        ours.append(_batch_us(make))
        theirs.append(_batch_us(_none))
    amp, base = statistics.median(ours), statistics.median(theirs)
    return {
        "name": name,
        "unit": "µs",
        "ampmeter": amp,
        "baseline": base,
        "baseline_name": "the same round with no policy (no policy step in the chain)",
        "ratio": base / amp,
        "target": "report",
        "met": None,
    }


def run(quick: bool) -> list[dict[str, Any]]:
    """Measure the rows; ``quick`` uses fewer batches."""
    batches = 15 if quick else 100
    return [
        _row("llm_call round, cost limit (unpriced check only)", _unpriced_check, batches),
        _row("llm_call round, every policy", _every_policy, batches),
    ]


if __name__ == "__main__":
    for r in run(quick=parse(__doc__).quick):
        print(
            f"{r['name']:<52} {r['ampmeter']:8.3f} µs  baseline {r['baseline']:8.3f} µs  "
            f"ratio {r['ratio']:.2f}x"
        )
