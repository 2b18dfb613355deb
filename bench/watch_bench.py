"""``ampmeter watch``: taking in a log that grows, and drawing a frame of a large run.

Rows: lines/s that the follower and the watch state take in while a log is appended in 100
pieces (each cutting a line in two), against ``read_jsonl`` reading the finished file once;
and the milliseconds to draw one frame of a run with that many calls. Run as a script:
``python bench/watch_bench.py [--quick]``.
"""

from __future__ import annotations

import io
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console

from _options import parse
from ampmeter.cli.watch.follow import LogFollower
from ampmeter.cli.watch.state import WatchState
from ampmeter.cli.watch.view import FrameInfo, render_frame
from ampmeter.logs import read_jsonl

PIECES = 100


def make_log(count: int) -> bytes:
    """TokenTracker lines of one run: every fifth call an LLM call with four tool calls in it."""
    lines = []
    for i in range(count):
        top = i % 5 == 0
        minute, second, ms = i // 60000 % 60, i // 1000 % 60, i % 1000
        event: dict[str, Any] = {
            "timestamp": f"2026-01-22T08:{minute:02d}:{second:02d}.{ms:03d}Z",
            "run_id": "bench",
            "span_id": f"n{i + 2:06d}",
            "event_type": "llm_completion" if top else "tool_call",
            "operation": f"op-{i % 7}",
            "component": "pipeline",
            "model": "gpt-4o-mini" if top else "",
            "usage": {"prompt_tokens": 1200, "completion_tokens": 85, "total_tokens": 1285},
            "cost_usd": 0.000231 if top else 0.0,
            "latency_ms": 420,
            "metadata": {"status": "halt" if i % 997 == 0 else "success", "cost_status": "priced"},
        }
        if not top:
            event["parent_id"] = f"n{i - i % 5 + 2:06d}"
        lines.append(orjson.dumps(event))
    return b"\n".join(lines) + b"\n"


def follow_round(data: bytes, path: Path) -> tuple[float, WatchState, LogFollower]:
    """Seconds to take in ``data`` appended in PIECES pieces, polling after each."""
    path.write_bytes(b"")
    follower, state = LogFollower([path]), WatchState({"amp:cost": 1.0, "amp:llm_calls": 10**6})
    step = len(data) // PIECES + 1
    spent = 0.0
    with path.open("ab") as handle:
        for start in range(0, len(data), step):
            handle.write(data[start : start + step])
            handle.flush()
            began = time.perf_counter()
            for batch in follower.poll():
                state.add(batch.records, batch.path)
            spent += time.perf_counter() - began
    return spent, state, follower


def read_round(path: Path) -> tuple[float, int]:
    began = time.perf_counter()
    count = sum(1 for _ in read_jsonl(path))
    return time.perf_counter() - began, count


def frame_round(state: WatchState, follower: LogFollower) -> float:
    info = FrameInfo(follower.patterns, 1, follower.lines_read(follower.paths[0]), 0, 0)
    console = Console(file=io.StringIO(), width=120, force_terminal=True)
    began = time.perf_counter()
    console.print(render_frame(state, info))
    return time.perf_counter() - began


def run(quick: bool) -> list[dict[str, Any]]:
    """Measure and return the bench rows."""
    count = 20_000 if quick else 200_000
    data = make_log(count)
    rounds = 3
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "grow.jsonl"
        ours, frames = [], []
        for _ in range(rounds):
            spent, state, follower = follow_round(data, path)
            assert len(state.runs["bench"].calls) == count, "the watch lost lines"
            ours.append(count / spent)
            frames.append(frame_round(state, follower) * 1000)
        reads = [read_round(path) for _ in range(rounds)]
    assert all(n == count for _, n in reads)
    rate = statistics.median(ours)
    base = statistics.median(count / s for s, _ in reads)
    frame_ms = statistics.median(frames)
    return [
        {
            "name": f"watch: take in a growing log, {count:,} lines",
            "unit": "lines/s",
            "ampmeter": rate,
            "baseline": base,
            "baseline_name": "read_jsonl of the finished file (no state)",
            "ratio": rate / base,
            "target": ">= 20,000 lines/s (far above any agent's pace)",
            "met": rate >= 20_000,
        },
        {
            "name": f"watch: one frame of a run of {count:,} calls",
            "unit": "ms",
            "ampmeter": frame_ms,
            "baseline": None,
            "baseline_name": None,
            "ratio": None,
            "target": "<= 1000 ms (the default interval)",
            "met": frame_ms <= 1000,
        },
    ]


def main() -> None:
    for r in run(parse(__doc__).quick):
        base = f"{r['baseline']:,.0f}" if r["baseline"] is not None else "-"
        ratio = f"{r['ratio']:.2f}x" if r["ratio"] is not None else "-"
        print(
            f"{r['name']:52} {r['ampmeter']:>14,.1f} {base:>12} {ratio:>7}  {r['target']}"
            f" / {r['met']}"
        )


if __name__ == "__main__":
    main()
