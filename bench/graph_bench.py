"""ExecutionGraph speed and memory, side by side with an OpenTelemetry SDK span.

Rows (each measured in this run):

* ``node lifecycle``: begin -> running -> success (with tokens and cost), µs per lifecycle. Each
  batch times 200 lifecycles in a fresh graph; the row is the median of the batch means.
  Baseline: one OTel SDK span with six attributes through a BatchSpanProcessor, timed the same
  way with batches interleaved. ``ratio`` = baseline / ampmeter (how many times cheaper).
* ``snapshot 100k nodes``: ``snapshot()`` of a graph of 100,000 finished nodes, ms (median).
  Reported too: the CPU time of the calling thread (wall time on a busy machine includes
  time spent preempted), and the same snapshot with three metadata keys on every node (what
  integrations write).
* ``memory per node``: tracemalloc bytes per finished node of a 100,000-node graph, with cost
  and token values the caller already holds; a second row (reported only) also counts fresh
  cost and token objects per node.

Run: ``python bench/graph_bench.py [--quick] [--instructions]``; ``--instructions`` counts the
instructions of one node lifecycle and of one span under callgrind instead (2,000 of each; see
``bench/_instructions.py``), which the machine's load does not move.
"""

from __future__ import annotations

import gc
import os
import statistics
import time
import tracemalloc
from typing import Any

# bench/ is on sys.path both when this file runs as a script and under bench/run.py.
from _instructions import print_beside_span
from _options import parse
from _otel_baseline import NAME as OTEL_NAME
from _otel_baseline import OtelSpanBaseline, spans
from ampmeter.graph import ExecutionGraph

LIFECYCLE_TARGET_US = 2.0
LIFECYCLE_TARGET_RATIO = 5.0
SNAPSHOT_TARGET_MS = 150.0
MEMORY_TARGET_BYTES = 400.0
BIG = 100_000
BATCH = 200  # short batches: on a busy machine fewer of them are cut by a preemption


def _lifecycle_batch_us(batch_size: int) -> float:
    graph = ExecutionGraph()
    root = graph.create_root("agent_run")
    begin, running, success = graph.begin_node, graph.mark_running, graph.mark_success
    start = time.perf_counter_ns()
    for _ in range(batch_size):
        node = begin(root, "llm", "step", "gpt-4o-mini")
        running(node)
        success(node, 0.00125, 1200, 350)
    elapsed = time.perf_counter_ns() - start
    return elapsed / batch_size / 1_000


def _lifecycles(count: int) -> None:
    """One warm-up lifecycle, then ``count`` lifecycles, in a fresh graph."""
    graph = ExecutionGraph()
    root = graph.create_root("agent_run")
    for _ in range(count + 1):
        node = graph.begin_node(root, "llm", "step", "gpt-4o-mini")
        graph.mark_running(node)
        graph.mark_success(node, 0.00125, 1200, 350)


ROUNDS = {"ampmeter": _lifecycles, "otel": spans}


def _lifecycle_rows(batches: int) -> list[dict[str, Any]]:
    ours: list[float] = []
    theirs: list[float] = []
    with OtelSpanBaseline() as otel:
        for _ in range(3):  # warm both paths up
            _lifecycle_batch_us(BATCH)
            otel.batch_us(BATCH)
        for _ in range(batches):
            ours.append(_lifecycle_batch_us(BATCH))
            theirs.append(otel.batch_us(BATCH))
    amp = statistics.median(ours)
    base = statistics.median(theirs)
    ratio = base / amp
    return [
        _row(
            "node lifecycle (begin, running, success)",
            "µs",
            amp,
            base,
            OTEL_NAME,
            ratio,
            f"<= {LIFECYCLE_TARGET_US} µs and >= {LIFECYCLE_TARGET_RATIO:g}x cheaper",
            amp <= LIFECYCLE_TARGET_US and ratio >= LIFECYCLE_TARGET_RATIO,
        )
    ]


def _build(n_nodes: int, metadata: dict[str, Any] | None = None) -> ExecutionGraph:
    graph = ExecutionGraph()
    root = graph.create_root("agent_run")
    for i in range(n_nodes - 1):
        node = graph.begin_node(root, "llm", "step", "gpt-4o-mini", metadata)
        graph.mark_running(node)
        graph.mark_success(node, (i % 997) * 1e-6, 1000 + i % 5000, 300 + i % 700)
    return graph


def _snapshot_ms(graph: ExecutionGraph, runs: int) -> tuple[float, float]:
    """Median wall ms and median CPU ms of the calling thread for one snapshot()."""
    wall, cpu = [], []
    for _ in range(runs):
        start, start_cpu = time.perf_counter_ns(), time.thread_time_ns()
        snap = graph.snapshot()
        cpu.append((time.thread_time_ns() - start_cpu) / 1e6)
        wall.append((time.perf_counter_ns() - start) / 1e6)
        del snap
    return statistics.median(wall), statistics.median(cpu)


def _snapshot_rows(runs: int) -> list[dict[str, Any]]:
    plain, plain_cpu = _snapshot_ms(_build(BIG), runs)
    meta = {"provider": "openai", "cost_status": "priced", "pricing_version": "0.2.1"}
    with_meta, _ = _snapshot_ms(_build(BIG, meta), runs)
    return [
        _row(
            f"snapshot() of {BIG:,} nodes",
            "ms",
            plain,
            None,
            None,
            None,
            f"<= {SNAPSHOT_TARGET_MS:g} ms",
            plain <= SNAPSHOT_TARGET_MS,
        ),
        _row(
            f"snapshot() of {BIG:,} nodes, CPU time of the thread",
            "ms",
            plain_cpu,
            None,
            None,
            None,
            "reported",
            None,
        ),
        _row(
            f"snapshot() of {BIG:,} nodes, 3 metadata keys each",
            "ms",
            with_meta,
            None,
            None,
            None,
            "reported",
            None,
        ),
    ]


def _bytes_per_node(fresh_values: bool) -> float:
    n = BIG - 1
    costs = [(i % 997) * 1e-6 for i in range(n)]
    tokens_in = [1000 + i % 5000 for i in range(n)]
    tokens_out = [300 + i % 700 for i in range(n)]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        graph = ExecutionGraph()
        root = graph.create_root("agent_run")
        for i in range(n):
            node = graph.begin_node(root, "llm", "step", "gpt-4o-mini")
            graph.mark_running(node)
            if fresh_values:  # new float and int objects per node, as a live caller makes them
                graph.mark_success(node, (i % 997) * 1e-6, 1000 + i % 5000, 300 + i % 700)
            else:
                graph.mark_success(node, costs[i], tokens_in[i], tokens_out[i])
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    return used / len(graph)


def _memory_rows() -> list[dict[str, Any]]:
    held = _bytes_per_node(fresh_values=False)
    fresh = _bytes_per_node(fresh_values=True)
    return [
        _row(
            "memory per node (tracemalloc)",
            "bytes",
            held,
            None,
            None,
            None,
            f"<= {MEMORY_TARGET_BYTES:g} bytes",
            held <= MEMORY_TARGET_BYTES,
        ),
        _row(
            "memory per node incl. fresh cost/token objects",
            "bytes",
            fresh,
            None,
            None,
            None,
            "reported",
            None,
        ),
    ]


def _row(
    name: str,
    unit: str,
    amp: float,
    base: float | None,
    base_name: str | None,
    ratio: float | None,
    target: str,
    met: bool | None,
) -> dict[str, Any]:
    return {
        "name": name,
        "unit": unit,
        "ampmeter": amp,
        "baseline": base,
        "baseline_name": base_name,
        "ratio": ratio,
        "target": target,
        "met": met,
    }


def run(quick: bool) -> list[dict[str, Any]]:
    """Measure every row; ``quick`` uses fewer repetitions (same sizes)."""
    rows = _lifecycle_rows(batches=200 if quick else 1_500)
    rows += _snapshot_rows(runs=3 if quick else 7)
    rows += _memory_rows()
    return rows


def _print(rows: list[dict[str, Any]]) -> None:
    print(f"{'measure':<50} {'ampmeter':>12} {'baseline':>12} {'ratio':>7}  target / met")
    for r in rows:
        base = "-" if r["baseline"] is None else f"{r['baseline']:.3f}"
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.1f}x"
        met = {True: "met", False: "MISSED", None: ""}[r["met"]]
        print(
            f"{r['name']:<50} {r['ampmeter']:>9.3f} {r['unit']:<2} {base:>12} {ratio:>7}  "
            f"{r['target']} {met}"
        )
    names = {r["baseline_name"] for r in rows if r["baseline_name"]}
    for name in sorted(names):
        print(f"baseline: {name}; ratio = baseline / ampmeter")
    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    options = parse(__doc__, instructions="count instructions under callgrind instead of timing")
    if options.instructions:
        print_beside_span("graph_bench", "node lifecycle", 5)
    else:
        _print(run(quick=options.quick))
