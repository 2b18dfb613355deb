"""How the per-call cost grows: threads, context depth, number of limits; and memory.

Rows: a counter increment beside the floor (a bare ``threading.Lock`` + ``dict`` update); one
``llm_call`` round with 1/4/16 threads, at context depth 1/3/8, with 0/10/100 limits (half of
them prefix limits, so a hidden scan of every key would show); bytes per node and per stats key;
peak memory of a 1M-node run kept to ``max_nodes=10_000``.
"""

from __future__ import annotations

import contextvars
import gc
import statistics
import threading
import time
import tracemalloc
from typing import Any

from _options import parse
from ampmeter import ExecutionContext, ExecutionGraph, ExecutionStats, Limit, LimitType


def _median_us(fn: Any, rounds: int, repeat: int = 5) -> float:
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter_ns()
        fn(rounds)
        samples.append((time.perf_counter_ns() - t0) / rounds / 1000)
    return statistics.median(samples)


def _counter_rows(n: int) -> list[dict[str, Any]]:
    stats = ExecutionStats()

    def ampmeter_incr(rounds: int) -> None:
        incr = stats.incr_counter
        for _ in range(rounds):
            incr("amp:llm_calls", 1)

    lock = threading.Lock()
    table: dict[str, int] = {}

    def floor_incr(rounds: int) -> None:
        for _ in range(rounds):
            with lock:
                table["amp:llm_calls"] = table.get("amp:llm_calls", 0) + 1

    ours, floor = _median_us(ampmeter_incr, n), _median_us(floor_incr, n)
    return [
        {
            "name": "counter increment",
            "unit": "µs",
            "ampmeter": ours,
            "baseline": floor,
            "baseline_name": "Lock+dict",
            "ratio": ours / floor,
            "target": "<= 5x the floor",
            "met": ours / floor <= 5,
        }
    ]


def _nested(depth: int, limits: list[Limit]) -> ExecutionContext:
    ctx = ExecutionContext("bench", limits=limits)
    for level in range(depth - 1):
        ctx = ctx.spawn_child(f"level{level}", limits=limits)
    return ctx


def _limits(count: int) -> list[Limit]:
    out = []
    for i in range(count):
        if i % 2:
            # Ceilings that never fire, within what a limit may count (2**53 tokens, $9.2B).
            out.append(Limit(f"amp:input_tokens:model{i}", 10**15, LimitType.PREFIX))
        else:
            out.append(Limit(f"amp:cost:model{i}", 10**9))
    return out


def _call_round_us(ctx: ExecutionContext, rounds: int, threads: int = 1) -> float:
    def work(count: int) -> None:
        for _ in range(count):
            with ctx.llm_call("step", model="bench-model", estimate_usd=0.001, max_tokens=64) as c:
                c.record(tokens_in=100, tokens_out=20, cost_usd=0.001)

    if threads == 1:
        return _median_us(work, rounds, repeat=3)
    samples = []
    for _ in range(3):
        per = rounds // threads
        workers = [
            threading.Thread(target=contextvars.copy_context().run, args=(work, per))
            for _ in range(threads)
        ]
        t0 = time.perf_counter_ns()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        samples.append((time.perf_counter_ns() - t0) / (per * threads) / 1000)
    return statistics.median(samples)


def _row(name: str, value: float, base: float | None, target: str = "") -> dict[str, Any]:
    return {
        "name": name,
        "unit": "µs/call",
        "ampmeter": value,
        "baseline": base,
        "baseline_name": "same, 1 thread/depth 1/0 limits" if base else None,
        "ratio": value / base if base else None,
        "target": target,
        "met": None,
    }


def _scaling_rows(n: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    base = _call_round_us(_nested(1, []), n)
    rows.append(_row("llm_call round, 1 thread, depth 1, 0 limits", base, None))
    for threads in (4, 16):
        value = _call_round_us(_nested(1, []), n, threads)
        rows.append(_row(f"llm_call round, {threads} threads (wall per call)", value, base))
    for depth in (3, 8):
        value = _call_round_us(_nested(depth, []), n)
        rows.append(_row(f"llm_call round, depth {depth}", value, base))
    for count in (10, 100):
        ctx = _nested(1, _limits(count))
        # Many distinct keys, so a limit check that scanned every key would grow with them.
        for i in range(2000):
            ctx.stats.incr_counter(f"myapp:key{i}", 1)
        value = _call_round_us(ctx, n)
        rows.append(_row(f"llm_call round, {count} limits (+2,000 keys)", value, base))
    return rows


def _memory_rows(nodes: int) -> list[dict[str, Any]]:
    gc.collect()
    graph = ExecutionGraph()
    root = graph.create_root("bench")
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for _ in range(nodes):
        node = graph.begin_node(root, "llm", "step", "bench-model")
        graph.mark_running(node)
        graph.mark_success(node, 0.001, 100, 20)
    per_node = (tracemalloc.get_traced_memory()[0] - before) / nodes
    tracemalloc.stop()

    stats = ExecutionStats()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(nodes):
        stats.incr_counter(f"myapp:key{i}", 1)
    per_key = (tracemalloc.get_traced_memory()[0] - before) / nodes
    tracemalloc.stop()
    return [
        {
            "name": "memory per node",
            "unit": "bytes",
            "ampmeter": per_node,
            "baseline": None,
            "baseline_name": None,
            "ratio": None,
            "target": "<= 400",
            "met": per_node <= 400,
        },
        {
            "name": "memory per stats key",
            "unit": "bytes",
            "ampmeter": per_key,
            "baseline": None,
            "baseline_name": None,
            "ratio": None,
            "target": "",
            "met": None,
        },
    ]


def _long_run_row(nodes: int) -> dict[str, Any]:
    ctx = ExecutionContext("long", max_nodes=10_000)
    with ctx.llm_call("warm-up", model="bench-model") as call:  # loads the price table once
        call.record(tokens_in=10, tokens_out=2, cost_usd=0.0)
    gc.collect()
    tracemalloc.start()
    for _ in range(nodes):
        with ctx.llm_call("step", model="bench-model") as call:
            call.record(tokens_in=10, tokens_out=2, cost_usd=0.0)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    kept = len(ctx.graph)
    assert ctx.graph.aggregates()["total_llm_calls"] == nodes + 1
    return {
        "name": f"peak memory, {nodes:,}-node run, max_nodes=10,000 ({kept:,} kept)",
        "unit": "MiB",
        "ampmeter": peak / 2**20,
        "baseline": None,
        "baseline_name": None,
        "ratio": None,
        "target": "flat in run length",
        "met": None,
    }


def run(quick: bool) -> list[dict[str, Any]]:
    """All rows; ``quick`` uses smaller sizes."""
    n = 8_000 if quick else 100_000
    rows = _counter_rows(n * 2)
    rows += _scaling_rows(n // 4)
    rows += _memory_rows(10_000 if quick else 100_000)
    rows.append(_long_run_row(30_000 if quick else 1_000_000))
    return rows


if __name__ == "__main__":
    for r in run(parse(__doc__).quick):
        print(r)
