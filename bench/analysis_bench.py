"""Extended amortization over a large stream run, beside a plain pure-Python implementation.

Generates N problems (1,000,000; ``--quick``: 50,000) as the three files of a stream run
(``.stream.jsonl``, ``.problems.jsonl`` and a TokenTracker log with 1.25 events per problem,
in contract format), then times, in the same run:

* ampmeter: ``amortization_curve(stream, problems_jsonl=..., token_events_jsonl=...)`` with
  ``engine="auto"`` (DuckDB reads inputs over 64 MB);
* baseline: a straightforward pure-Python implementation: ``json.loads`` line by line, lists
  and dicts, running percentiles with ``heapq`` (a ``statistics`` call at every ``t`` would be
  O(n²) and never finish at this size).

Each side runs in its own child process, so its peak memory (max RSS) is measured alone; both
hash their rows and the hashes must match (identical results). Target: >= 10x faster than the
baseline and <= 5 s at 1,000,000 problems.

Run: ``python bench/analysis_bench.py [--quick]``.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson

TARGET_RATIO = 10.0
TARGET_SECONDS = 5.0


def generate(prefix: Path, n: int, seed: int = 7) -> dict[str, Path]:
    """Write the stream, problems and events files of an ``n``-problem run."""
    rng = random.Random(seed)
    paths = {k: Path(f"{prefix}.{k}.jsonl") for k in ("stream", "problems", "token_events")}
    dumps = orjson.dumps
    with paths["stream"].open("wb") as s, paths["problems"].open("wb") as p, \
            paths["token_events"].open("wb") as e:  # fmt: skip
        cost_total, solved_total = 0.0, 0
        for t in range(1, n + 1):
            solved = rng.random() < 0.6
            latency = round(rng.lognormvariate(7.0, 0.5), 3)
            tokens = rng.randint(200, 5000)
            c_pipe = round(tokens * 2e-7, 9)
            pid = f"q{t}"
            p.write(dumps({
                "t": t, "problem_id": pid, "solved": solved, "attempts": 1,
                "solved_attempt": 1 if solved else None,
                "attempt_success_rate": rng.choice((0.0, 0.5, 1.0, None)), "llm_calls": 1,
                "tokens_total": tokens, "latency_total_ms": latency, "api_cost_usd": c_pipe,
                "retrieval_hit": False, "reuse_count": 0, "memory_n_nodes": 0,
                "memory_n_edges": 0, "contamination_rate": None,
            }) + b"\n")  # fmt: skip
            events = [("pipeline", c_pipe, "solve")]
            if t % 4 == 0:
                events.append(("auxiliary", round(rng.random() * 1e-4, 9), "validate"))
            for component, cost, op in events:
                e.write(dumps({
                    "timestamp": "2026-01-22T08:10:00.000Z", "run_id": f"bench:{pid}",
                    "span_id": f"{op}{t}", "event_type": "llm_completion", "operation": op,
                    "component": component, "model": "gpt-4o-mini",
                    "usage": {"prompt_tokens": tokens - 50, "completion_tokens": 50,
                              "total_tokens": tokens},
                    "cost_usd": cost, "latency_ms": int(latency),
                    "metadata": {"stream_run_id": "bench", "problem_id": pid, "t": t,
                                 "operation": op, "status": "success"},
                }) + b"\n")  # fmt: skip
                cost_total += cost
            solved_total += solved
            s.write(dumps({
                "t": t, "cumulative_solved": solved_total, "cumulative_api_cost_usd": cost_total,
                "cost_per_solved": cost_total / max(1, solved_total), "contamination_rate": None,
            }) + b"\n")  # fmt: skip
    return paths


# -- the baseline: plain Python ----------------------------------------------------------------


class _Running:
    """Running percentile with two heaps (plain Python)."""

    def __init__(self, q: float) -> None:
        self.q, self.low, self.high, self.n = q, [], [], 0  # type: ignore[var-annotated]

    def add(self, x: float) -> None:
        import heapq
        import math

        if self.low and x <= -self.low[0]:
            heapq.heappush(self.low, -x)
        else:
            heapq.heappush(self.high, x)
        self.n += 1
        want = math.floor((self.n - 1) * self.q / 100.0) + 1
        if len(self.low) > want:
            heapq.heappush(self.high, -heapq.heappop(self.low))
        elif len(self.low) < want:
            heapq.heappush(self.low, -heapq.heappop(self.high))

    def value(self) -> float | None:
        import math

        if not self.n:
            return None
        rank = (self.n - 1) * self.q / 100.0
        lo = math.floor(rank)
        a = -self.low[0]
        b = self.high[0] if lo + 1 <= self.n - 1 else a
        return a + (b - a) * (rank - lo)


def baseline(stream: str, problems: str, events: str) -> list[dict[str, Any]]:
    """The extended curve with json, lists and dicts, in the most direct way."""

    def lines(path: str) -> list[dict[str, Any]]:
        out = []
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                if line.strip():
                    out.append(json.loads(line))
        return out

    s_rows = {r["t"]: r for r in lines(stream)}
    probs = sorted(lines(problems), key=lambda r: r["t"])
    pipe: dict[int, float] = {}
    total: dict[int, float] = {}
    for ev in lines(events):
        meta = ev.get("metadata") or {}
        t = meta.get("t") if meta.get("t") is not None else ev.get("t")
        total[t] = total.get(t, 0.0) + float(ev["cost_usd"])
        if ev.get("component") == "pipeline":
            pipe[t] = pipe.get(t, 0.0) + float(ev["cost_usd"])
    ts = sorted(set(s_rows) | set(total) | {p["t"] for p in probs})
    rate, tok, l50, l95 = _Running(50), _Running(50), _Running(50), _Running(95)
    rows, i, n, solved, ca, cb = [], 0, 0, 0, 0.0, 0.0
    for t in ts:
        while i < len(probs) and probs[i]["t"] <= t:
            p = probs[i]
            i += 1
            n += 1
            solved += 1 if p["solved"] else 0
            if p.get("attempt_success_rate") is not None:
                rate.add(float(p["attempt_success_rate"]))
            if p.get("tokens_total") is not None:
                tok.add(p["tokens_total"])
            if p.get("latency_total_ms") is not None:
                l50.add(float(p["latency_total_ms"]))
                l95.add(float(p["latency_total_ms"]))
        s = s_rows.get(t)
        ca += pipe.get(t, 0.0)
        cb += total.get(t, 0.0)
        rows.append({
            "t": t,
            "cumulative_api_cost_usd": float(s["cumulative_api_cost_usd"]) if s else None,
            "cumulative_solved": s["cumulative_solved"] if s else None,
            "cost_per_solved": float(s["cost_per_solved"]) if s else None,
            "cum_accuracy": solved / n if n else None,
            "attempt_success_rate_p50": rate.value() if n else None,
            "tokens_total_p50": tok.value() if n else None,
            "latency_ms_p50": l50.value() if n else None,
            "latency_ms_p95": l95.value() if n else None,
            "cost_usd_pipeline_avg": ca / n if n else None,
            "cost_usd_total_avg": cb / n if n else None,
        })  # fmt: skip
    return rows


# -- child processes ---------------------------------------------------------------------------


def _child(which: str, prefix: str, repeats: int) -> None:
    import time

    paths = [f"{prefix}.{k}.jsonl" for k in ("stream", "problems", "token_events")]
    times, digest = [], ""
    for _ in range(repeats):
        start = time.perf_counter()
        if which == "ampmeter":
            from ampmeter.analysis import amortization_curve

            rows = amortization_curve(paths[0], problems_jsonl=paths[1],
                                      token_events_jsonl=paths[2])  # fmt: skip
        else:
            rows = baseline(*paths)
        times.append(time.perf_counter() - start)
        digest = hashlib.sha256(orjson.dumps(rows)).hexdigest()
        del rows
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(json.dumps({"times": times, "digest": digest, "rss_mb": rss_mb}))


def _measure(which: str, prefix: Path, repeats: int) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", which, str(prefix), str(repeats)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def run(quick: bool) -> list[dict[str, Any]]:
    """Generate the run, time both implementations, return the bench rows."""
    n = 50_000 if quick else 1_000_000
    repeats = 3 if quick else 1
    with tempfile.TemporaryDirectory(prefix="ampmeter-analysis-bench-") as tmp:
        prefix = Path(tmp) / "bench"
        paths = generate(prefix, n)
        size_mb = sum(os.path.getsize(p) for p in paths.values()) / 1e6
        amp = _measure("ampmeter", prefix, repeats)
        base = _measure("baseline", prefix, repeats)
    if amp["digest"] != base["digest"]:
        raise SystemExit("analysis_bench: ampmeter and the baseline disagree on the curve")
    amp_s = statistics.median(amp["times"])
    base_s = statistics.median(base["times"])
    ratio = base_s / amp_s
    name = f"extended amortization, {n:,} problems ({size_mb:,.0f} MB of JSONL)"
    base_name = "pure Python (json + lists + heapq)"
    rows = [
        {"name": name, "unit": "s", "ampmeter": amp_s, "baseline": base_s,
         "baseline_name": base_name, "ratio": ratio,
         "target": f">= {TARGET_RATIO:g}x faster" + ("" if quick else f", <= {TARGET_SECONDS:g} s"),
         "met": ratio >= TARGET_RATIO and (quick or amp_s <= TARGET_SECONDS)},
        {"name": "peak memory (max RSS of the process)", "unit": "MB", "ampmeter": amp["rss_mb"],
         "baseline": base["rss_mb"], "baseline_name": base_name,
         "ratio": base["rss_mb"] / amp["rss_mb"], "target": "information", "met": None},
    ]  # fmt: skip
    return rows


def main() -> None:
    """Print the rows as a small table."""
    if len(sys.argv) >= 2 and sys.argv[1] == "--child":
        _child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    quick = "--quick" in sys.argv[1:]
    for row in run(quick):
        ratio = f"{row['ratio']:.1f}x" if row["ratio"] is not None else "-"
        print(f"{row['name']:<62} ampmeter {row['ampmeter']:>9.2f} {row['unit']:<3} "
              f"baseline {row['baseline']:>9.2f} {row['unit']:<3} ratio {ratio:>6}  "
              f"target {row['target']}  met {row['met']}")  # fmt: skip


if __name__ == "__main__":
    main()
