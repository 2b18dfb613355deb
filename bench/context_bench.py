"""One ``llm_call`` round through a grandchild context, side by side with an OpenTelemetry span.

Row (measured in this run):

* ``llm_call round``: enter a call in a grandchild context that has three limits (cost ceiling,
  total input tokens, a per-model prefix limit on input tokens) with a cost reservation ->
  ``record(tokens_in, tokens_out, cost_usd)`` -> exit, so stats settle in the context and its two
  ancestors and the limits are checked before and after the call. µs per round: each batch times
  1,000 rounds in a fresh context tree; the row is the median of the batch means.
  Baseline: one OTel SDK span with six attributes through a BatchSpanProcessor, timed the same
  way with batches interleaved. ``ratio`` = baseline / ampmeter (how many times cheaper).

Run: ``python bench/context_bench.py [--quick] [--phases] [--instructions]``; ``--phases`` also
prints where a round's time goes (``llm_call()``, entering, ``record``, exiting), for profiling
work; ``--instructions`` counts instead the instructions of one round and of one span under
callgrind (2,000 of each; see ``bench/_instructions.py``), which the machine's load does not
move.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

from _options import parse
from ampmeter import ExecutionContext, Limit, LimitType
from ampmeter.keys import KEY_INPUT_TOKENS, KEY_INPUT_TOKENS_FOR

# The shared OTel baseline lives beside this file (also when imported from the repository root).
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _instructions import print_beside_span
from _otel_baseline import NAME as OTEL_NAME
from _otel_baseline import OtelSpanBaseline, spans

TARGET_US = 5.0
TARGET_RATIO = 3.0
BATCH = 1_000


def _grandchild() -> tuple[ExecutionContext, ExecutionContext, ExecutionContext]:
    root = ExecutionContext("agent_run")
    child = root.spawn_child("planner")
    grandchild = child.spawn_child(
        "worker",
        limits=[
            Limit(KEY_INPUT_TOKENS, 1e12),
            Limit(KEY_INPUT_TOKENS_FOR, 1e12, LimitType.PREFIX),
        ],
        max_cost_usd=1e9,
    )
    return root, child, grandchild


def _round_batch_us(batch_size: int) -> float:
    root, child, ctx = _grandchild()
    llm_call = ctx.llm_call
    start = time.perf_counter_ns()
    for _ in range(batch_size):
        with llm_call("plan", model="gpt-4o-mini", estimate_usd=0.002) as call:
            call.record(tokens_in=1200, tokens_out=350, cost_usd=0.00125)
    elapsed = time.perf_counter_ns() - start
    if root.stats.total_input_tokens() != 1200 * batch_size:  # the work really reached the root
        raise AssertionError("stats did not propagate to the root")
    ctx.close()
    child.close()
    root.close()
    return elapsed / batch_size / 1_000


def _rounds(count: int) -> None:
    """One warm-up round, then ``count`` rounds, in a fresh context tree."""
    root, child, ctx = _grandchild()
    for _ in range(count + 1):
        with ctx.llm_call("plan", model="gpt-4o-mini", estimate_usd=0.002) as call:
            call.record(tokens_in=1200, tokens_out=350, cost_usd=0.00125)
    for context in (ctx, child, root):
        context.close()


ROUNDS = {"ampmeter": _rounds, "otel": spans}


def _phases_us(rounds: int = 20_000) -> dict[str, float]:
    """Mean µs of each phase of a round (each timer read adds a little to every phase)."""
    root, child, ctx = _grandchild()
    clock = time.perf_counter_ns
    totals = dict.fromkeys(("llm_call()", "__enter__", "record", "__exit__"), 0)
    for _ in range(rounds):
        t0 = clock()
        call = ctx.llm_call("plan", model="gpt-4o-mini", estimate_usd=0.002)
        t1 = clock()
        call.__enter__()
        t2 = clock()
        call.record(tokens_in=1200, tokens_out=350, cost_usd=0.00125)
        t3 = clock()
        call.__exit__(None, None, None)
        t4 = clock()
        totals["llm_call()"] += t1 - t0
        totals["__enter__"] += t2 - t1
        totals["record"] += t3 - t2
        totals["__exit__"] += t4 - t3
    for context in (ctx, child, root):
        context.close()
    return {phase: ns / rounds / 1_000 for phase, ns in totals.items()}


def run(quick: bool) -> list[dict[str, Any]]:
    """Measure the row; ``quick`` uses fewer batches."""
    batches = 30 if quick else 200
    ours: list[float] = []
    theirs: list[float] = []
    with OtelSpanBaseline() as otel:
        for _ in range(3):  # warm both paths up
            _round_batch_us(BATCH)
            otel.batch_us(BATCH)
        for _ in range(batches):
            ours.append(_round_batch_us(BATCH))
            theirs.append(otel.batch_us(BATCH))
    amp = statistics.median(ours)
    base = statistics.median(theirs)
    ratio = base / amp
    return [
        {
            "name": "llm_call round (grandchild, 3 limits, reservation, record)",
            "unit": "µs",
            "ampmeter": amp,
            "baseline": base,
            "baseline_name": OTEL_NAME,
            "ratio": ratio,
            "target": f"<= {TARGET_US:g} µs and >= {TARGET_RATIO:g}x cheaper",
            "met": amp <= TARGET_US and ratio >= TARGET_RATIO,
        }
    ]


def _print(rows: list[dict[str, Any]]) -> None:
    print(f"{'measure':<60} {'ampmeter':>12} {'baseline':>12} {'ratio':>7}  target / met")
    for r in rows:
        base = "-" if r["baseline"] is None else f"{r['baseline']:.3f}"
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.1f}x"
        met = {True: "met", False: "MISSED", None: ""}[r["met"]]
        print(
            f"{r['name']:<60} {r['ampmeter']:>9.3f} {r['unit']:<2} {base:>12} {ratio:>7}  "
            f"{r['target']} {met}"
        )
        if r["baseline_name"]:
            print(f"baseline: {r['baseline_name']}; ratio = baseline / ampmeter")


if __name__ == "__main__":
    options = parse(
        __doc__,
        phases="also time each phase of a context round",
        instructions="count instructions under callgrind instead of timing",
    )
    if options.instructions:
        print_beside_span("context_bench", "llm_call round", 1.7)
        sys.exit()
    _print(run(quick=options.quick))
    if options.phases:
        _phases_us()  # warm up
        phases = _phases_us()
        print("phases (µs): " + ", ".join(f"{k} {v:.2f}" for k, v in phases.items()))
