"""JsonlSink (default ``line`` mode, and ``batch``) against json.dumps + file.write on the calling
thread; read_jsonl speed.

Rows: events/s into each (same events, same run, median of a few rounds), the caller-thread
CPU time per emit in each mode, and seconds to read a 1M-line log with read_jsonl. ``line``
writes each event with its own ``write`` call before emit returns (nothing lost to a SIGKILL);
the baseline's ``file.write`` buffers in the process. Run as a script:
``python bench/sink_bench.py [--quick]``.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from _options import parse
from ampmeter.logs import read_jsonl
from ampmeter.node import Node
from ampmeter.sinks.jsonl import JsonlSink, node_to_event


def make_nodes(count: int) -> list[Node]:
    """Finished LLM nodes like a real run's: model, usage, cost and pricing metadata."""
    base = 1_769_000_000_000
    return [
        Node(
            f"n{i + 2:06d}",
            "n000001",
            "llm",
            "chat",
            base + i,
            base + i + 420,
            "success",
            "gpt-4o-mini",
            0,
            123_000,  # nano-dollars: $0.000123
            1200 + i % 500,
            85,
            "stop",
            None,
            {
                "cost_status": "priced",
                "pricing_version": "genai-prices 0.2",
                "provider": "openai",
                "tool_calls_made": i % 3,
            },
            1,
        )
        for i in range(count)
    ]


def sink_round(nodes: list[Node], path: Path, mode: str) -> tuple[float, float]:
    """(wall seconds from first emit to closed file, caller-thread CPU seconds in emit)."""
    path.unlink(missing_ok=True)
    sink = JsonlSink(path, flush=mode)
    emit = sink.emit
    wall = time.perf_counter()
    cpu = time.thread_time()
    for node in nodes:
        emit(node, "chain")
    cpu = time.thread_time() - cpu
    sink.close()
    return time.perf_counter() - wall, cpu


def baseline_round(nodes: list[Node], path: Path) -> float:
    """Seconds for the same events mapped, json.dumps-ed and written on the calling thread."""
    path.unlink(missing_ok=True)
    wall = time.perf_counter()
    with open(path, "w", encoding="utf-8") as f:
        for node in nodes:
            f.write(json.dumps(node_to_event(node, "chain")) + "\n")
    return time.perf_counter() - wall


def read_round(path: Path) -> tuple[float, int]:
    wall = time.perf_counter()
    count = sum(1 for _ in read_jsonl(path))
    return time.perf_counter() - wall, count


def run(quick: bool) -> list[dict[str, Any]]:
    """Measure and return the bench rows."""
    count = 100_000 if quick else 1_000_000
    rounds = 3
    nodes = make_nodes(count)
    with tempfile.TemporaryDirectory() as tmp:
        ours_path = Path(tmp) / "sink.jsonl"
        base_path = Path(tmp) / "baseline.jsonl"
        ours: dict[str, list[float]] = {"line": [], "batch": []}
        cpu: dict[str, list[float]] = {"line": [], "batch": []}
        base = []
        for _ in range(rounds):
            for mode in ours:
                wall_s, cpu_s = sink_round(nodes, ours_path, mode)
                ours[mode].append(count / wall_s)
                cpu[mode].append(cpu_s / count * 1e6)
            base.append(count / baseline_round(nodes, base_path))
        reads = [read_round(ours_path) for _ in range(rounds)]
    assert all(n == count for _, n in reads), "read_jsonl lost lines"
    base_eps = statistics.median(base)
    read_s = statistics.median(s for s, _ in reads)
    scale = 1_000_000 / count  # reading is linear; report the 1M-line time
    rows = []
    for mode, target, floor in (("line", ">= 1x baseline", 1.0), ("batch", ">= 2x baseline", 2.0)):
        eps = statistics.median(ours[mode])
        caller_us = statistics.median(cpu[mode])
        rows += [
            {
                "name": f"JsonlSink {mode}, {count:,} events",
                "unit": "events/s",
                "ampmeter": eps,
                "baseline": base_eps,
                "baseline_name": "json.dumps + file.write on the calling thread",
                "ratio": eps / base_eps,
                "target": target,
                "met": eps / base_eps >= floor,
            },
            {
                "name": f"caller-thread CPU per emit ({mode})",
                "unit": "us/event",
                "ampmeter": caller_us,
                "baseline": None,
                "baseline_name": None,
                "ratio": None,
                "target": "reported",
                "met": None,
            },
        ]
    return [
        *rows,
        {
            "name": f"read_jsonl, {count:,} lines" + (" (scaled to 1M)" if scale != 1 else ""),
            "unit": "s per 1M lines",
            "ampmeter": read_s * scale,
            "baseline": None,
            "baseline_name": None,
            "ratio": None,
            "target": "reported",
            "met": None,
        },
    ]


def main() -> None:
    rows = run(parse(__doc__).quick)
    print(f"{'bench':44} {'ampmeter':>14} {'baseline':>14} {'ratio':>7}  target / met")
    for r in rows:
        base = f"{r['baseline']:,.0f}" if r["baseline"] is not None else "-"
        ratio = f"{r['ratio']:.2f}x" if r["ratio"] is not None else "-"
        value = f"{r['ampmeter']:,.2f}" if r["ampmeter"] < 100 else f"{r['ampmeter']:,.0f}"
        print(f"{r['name']:44} {value:>14} {base:>14} {ratio:>7}  {r['target']} / {r['met']}")
        print(f"{'':44} unit: {r['unit']}; baseline: {r['baseline_name'] or '-'}")


if __name__ == "__main__":
    main()
