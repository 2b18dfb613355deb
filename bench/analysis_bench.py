"""Extended amortization over a large stream run, beside a plain pure-Python implementation.

Generates N problems (1,000,000; ``--quick``: 50,000) as the three files of a stream run
(``.stream.jsonl``, ``.problems.jsonl`` and a TokenTracker log with 1.25 events per problem,
in contract format), then times, in the same run:

* ampmeter: ``amortization_curve(stream, problems_jsonl=..., token_events_jsonl=...)`` with
  ``engine="auto"`` (the plain reader: it measured faster than DuckDB's on large curves);
* baseline: a straightforward pure-Python implementation: ``json.loads`` line by line, lists
  and dicts, running percentiles with ``heapq`` (a ``statistics`` call at every ``t`` would be
  O(n²) and never finish at this size).

Each side runs in its own child process, so its peak memory (max RSS) is measured alone; both
hash their rows and the hashes must match (identical results). Target: >= 10x faster than the
baseline and <= 5 s at 1,000,000 problems.

A second row times ``summarize()`` over a log of many agent runs (1,000,000 events in 1,000
runs; ``--quick``: 60,000 in 60): the DuckDB engine beside ampmeter's plain-Python engine, each
in its own process; their rows must be identical, value for value.

Run: ``python bench/analysis_bench.py [--quick]``.
"""

from __future__ import annotations

import csv
import hashlib
import heapq
import json
import math
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

from _options import parse
from ampmeter.analysis import EXTENDED_COLUMNS

TARGET_RATIO = 10.0
TARGET_SECONDS = 5.0


def generate(prefix: Path, n: int, seed: int = 7) -> dict[str, Path]:
    """Write the stream, problems and events files of an ``n``-problem run."""
    rng = random.Random(seed)
    paths = {k: Path(f"{prefix}.{k}.jsonl") for k in ("stream", "problems", "token_events")}
    dumps = orjson.dumps
    with (
        paths["stream"].open("wb") as s,
        paths["problems"].open("wb") as p,
        paths["token_events"].open("wb") as e,
    ):
        cost_total, solved_total = 0.0, 0
        for t in range(1, n + 1):
            solved = rng.random() < 0.6
            latency = round(rng.lognormvariate(7.0, 0.5), 3)
            tokens = rng.randint(200, 5000)
            c_pipe = round(tokens * 2e-7, 9)
            pid = f"q{t}"
            p.write(
                dumps(
                    {
                        "t": t,
                        "problem_id": pid,
                        "solved": solved,
                        "attempts": 1,
                        "solved_attempt": 1 if solved else None,
                        "attempt_success_rate": rng.choice((0.0, 0.5, 1.0, None)),
                        "llm_calls": 1,
                        "tokens_total": tokens,
                        "latency_total_ms": latency,
                        "api_cost_usd": c_pipe,
                        "retrieval_hit": False,
                        "reuse_count": 0,
                        "memory_n_nodes": 0,
                        "memory_n_edges": 0,
                        "contamination_rate": None,
                    }
                )
                + b"\n"
            )
            events = [("pipeline", c_pipe, "solve")]
            if t % 4 == 0:
                events.append(("auxiliary", round(rng.random() * 1e-4, 9), "validate"))
            for component, cost, op in events:
                e.write(
                    dumps(
                        {
                            "timestamp": "2026-01-22T08:10:00.000Z",
                            "run_id": f"bench:{pid}",
                            "span_id": f"{op}{t}",
                            "event_type": "llm_completion",
                            "operation": op,
                            "component": component,
                            "model": "gpt-4o-mini",
                            "usage": {
                                "prompt_tokens": tokens - 50,
                                "completion_tokens": 50,
                                "total_tokens": tokens,
                            },
                            "cost_usd": cost,
                            "latency_ms": int(latency),
                            "metadata": {
                                "stream_run_id": "bench",
                                "problem_id": pid,
                                "t": t,
                                "operation": op,
                                "status": "success",
                            },
                        }
                    )
                    + b"\n"
                )
                cost_total += cost
            solved_total += solved
            s.write(
                dumps(
                    {
                        "t": t,
                        "cumulative_solved": solved_total,
                        "cumulative_api_cost_usd": cost_total,
                        "cost_per_solved": cost_total / max(1, solved_total),
                        "contamination_rate": None,
                    }
                )
                + b"\n"
            )
    return paths


def generate_runs(path: Path, events: int, runs: int, seed: int = 11) -> Path:
    """A TokenTracker log of ``runs`` agent runs with ``events`` events in all, as ampmeter's
    JsonlSink writes them: LLM calls with tool calls under them, a retry now and then, a failed
    tool, unpriced calls, and the last call of some runs halted by a limit."""
    rng = random.Random(seed)
    dumps = orjson.dumps
    per_run = max(1, events // runs)
    with path.open("wb") as out:
        for r in range(runs):
            run_id = f"agent-{r:05d}"
            parent = None
            context = rng.randint(500, 3000)
            for i in range(per_run):
                span = f"n{i + 2:06d}"
                llm = i % 2 == 0 or parent is None
                halted = i == per_run - 1 and r % 7 == 0
                status = (
                    "halt" if halted else "fail" if not llm and rng.random() < 0.01 else "success"
                )
                context += rng.randint(50, 400) if llm else 0
                unpriced = llm and rng.random() < 0.05
                meta = {
                    "pricing_version": None,
                    "status": status,
                    "retries_used": 1 if llm and rng.random() < 0.05 else 0,
                    "error_class": "RuntimeError" if status == "fail" else None,
                    "stop_reason": "limit amp:cost exceeded" if halted else None,
                    "cost_status": "unpriced" if unpriced else None,
                }
                event = {
                    "timestamp": "2026-01-22T08:10:00.000Z",
                    "run_id": run_id,
                    "span_id": span,
                    "event_type": "llm_completion" if llm else "tool_call",
                    "operation": "step" if llm else "search",
                    "component": "pipeline",
                    "model": "gpt-4o-mini" if llm else "",
                    "usage": {
                        "prompt_tokens": context if llm else 0,
                        "completion_tokens": rng.randint(10, 300) if llm else 0,
                        "total_tokens": 0,
                    },
                    "cost_usd": 0.0 if unpriced or not llm else round(context * 1.5e-7, 9),
                    "latency_ms": rng.randint(50, 3000),
                    "metadata": meta,
                }
                if not llm:
                    event["parent_id"] = parent
                out.write(dumps(event) + b"\n")
                if llm:
                    parent = span
    return path


def _summary_child(which: str, path: str, repeats: int) -> None:
    import time

    from ampmeter.analysis import summarize

    result: dict[str, Any] = {"times": []}
    for _ in range(repeats):
        start = time.perf_counter()
        table = summarize([path], engine=which)  # type: ignore[arg-type]
        result["times"].append(time.perf_counter() - start)
        result["digest"] = hashlib.sha256(
            orjson.dumps(
                [[(k, type(v).__name__, repr(v)) for k, v in row.items()] for row in table.rows()]
                + [repr(table.across)]
            )
        ).hexdigest()
        result["runs"] = len(table.runs)
        del table
    result["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(json.dumps(result))


def summary_rows(quick: bool) -> list[dict[str, Any]]:
    """summarize() over many runs: the DuckDB engine beside the plain-Python engine."""
    events, runs = (60_000, 60) if quick else (1_000_000, 1_000)
    with tempfile.TemporaryDirectory(prefix="ampmeter-summary-bench-") as tmp:
        path = generate_runs(Path(tmp) / "runs.jsonl", events, runs)
        size_mb = os.path.getsize(path) / 1e6
        duck = _measure("summary-duckdb", Path(path), 3)
        plain = _measure("summary-python", Path(path), 3 if quick else 1)
    if duck["digest"] != plain["digest"] or duck["runs"] != runs:
        raise SystemExit("analysis_bench: the summary engines disagree")
    duck_s, plain_s = statistics.median(duck["times"]), statistics.median(plain["times"])
    name = "summarize(), DuckDB engine vs the plain-Python engine"
    return [
        {
            "name": f"{name}, {events:,} events in {runs:,} runs ({size_mb:,.0f} MB)",
            "unit": "s",
            "ampmeter": duck_s,
            "baseline": plain_s,
            "baseline_name": "ampmeter's own plain-Python summarize (engine='python')",
            "ratio": plain_s / duck_s,
            "target": "information (identical rows; peak RSS "
            f"{duck['rss_mb']:,.0f} MB vs {plain['rss_mb']:,.0f} MB)",
            "met": None,
        }
    ]


# -- the baseline: plain Python ----------------------------------------------------------------


class _Running:
    """Running percentile with two heaps (plain Python)."""

    def __init__(self, q: float) -> None:
        self.q, self.low, self.high, self.n = q, [], [], 0  # type: ignore[var-annotated]

    def add(self, x: float) -> None:
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
        rows.append(
            {
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
            }
        )
    return rows


def baseline_csv(rows: list[dict[str, Any]], path: str) -> None:
    """The extended CSV with the csv module (None as empty, floats as repr)."""
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(EXTENDED_COLUMNS)
        for row in rows:
            writer.writerow(
                [
                    "" if row[k] is None else repr(row[k]) if isinstance(row[k], float) else row[k]
                    for k in EXTENDED_COLUMNS
                ]
            )


def check_with_statistics(problems: str, rows: list[dict[str, Any]], samples: int = 5) -> None:
    """Spot-check the baseline's latency percentiles against ``statistics`` at a few t."""
    latencies = []
    with open(problems, encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                latencies.append(json.loads(line)["latency_total_ms"])
    for i in sorted({(len(rows) - 1) * k // samples for k in range(1, samples + 1)}):
        prefix = latencies[: i + 1]
        median = statistics.median(prefix)
        p95 = statistics.quantiles(prefix, n=20, method="inclusive")[18] if i else prefix[0]
        got50, got95 = rows[i]["latency_ms_p50"], rows[i]["latency_ms_p95"]
        if not (
            math.isclose(got50, median, rel_tol=1e-12) and math.isclose(got95, p95, rel_tol=1e-12)
        ):
            raise SystemExit(f"baseline disagrees with statistics at t={rows[i]['t']}")


# -- child processes ---------------------------------------------------------------------------


def _digest(path: str) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _child(which: str, prefix: str, repeats: int) -> None:
    import time

    if which.startswith("summary-"):
        _summary_child(which.removeprefix("summary-"), prefix, repeats)
        return

    paths = [f"{prefix}.{k}.jsonl" for k in ("stream", "problems", "token_events")]
    out_csv = f"{prefix}.{which}.csv"
    result: dict[str, Any] = {"times": [], "csv_times": []}
    for _ in range(repeats):
        if which == "ampmeter-csv":
            from ampmeter.analysis import amortization_table, write_extended_csv

            start = time.perf_counter()
            table = amortization_table(
                paths[0], problems_jsonl=paths[1], token_events_jsonl=paths[2]
            )
            write_extended_csv(table, out_csv)
            result["csv_times"].append(time.perf_counter() - start)
            del table
            result["csv_digest"] = _digest(out_csv)
        elif which == "ampmeter-rows":
            from ampmeter.analysis import amortization_curve

            start = time.perf_counter()
            rows = amortization_curve(
                paths[0], problems_jsonl=paths[1], token_events_jsonl=paths[2]
            )
            result["times"].append(time.perf_counter() - start)
            result["digest"] = hashlib.sha256(orjson.dumps(rows)).hexdigest()
            del rows
        else:
            start = time.perf_counter()
            rows = baseline(*paths)
            middle = time.perf_counter()
            baseline_csv(rows, out_csv)
            end = time.perf_counter()
            result["times"].append(middle - start)
            result["csv_times"].append(end - start)
            result["digest"] = hashlib.sha256(orjson.dumps(rows)).hexdigest()
            result["csv_digest"] = _digest(out_csv)
            check_with_statistics(paths[1], rows)
            del rows
    result["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(json.dumps(result))


def _measure(which: str, prefix: Path, repeats: int) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", which, str(prefix), str(repeats)],
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


BASELINE_NAME = (
    "pure Python: json.loads per line, lists+dicts, two-heapq running percentiles "
    "(statistics.quantiles per t is O(n^2)), csv module"
)


def run(quick: bool) -> list[dict[str, Any]]:
    """Generate the run, time both implementations, return the bench rows."""
    n = 50_000 if quick else 1_000_000
    repeats = 3
    with tempfile.TemporaryDirectory(prefix="ampmeter-analysis-bench-") as tmp:
        prefix = Path(tmp) / "bench"
        paths = generate(prefix, n)
        size_mb = sum(os.path.getsize(p) for p in paths.values()) / 1e6
        amp = _measure("ampmeter-csv", prefix, repeats)
        amp_rows = _measure("ampmeter-rows", prefix, 1 if not quick else repeats)
        base = _measure("baseline", prefix, 1 if not quick else repeats)
    if amp["csv_digest"] != base["csv_digest"] or amp_rows["digest"] != base["digest"]:
        raise SystemExit("analysis_bench: ampmeter and the baseline disagree on the curve")
    # The target is for 1,000,000 problems; --quick is only a smoke run.
    target = f">= {TARGET_RATIO:g}x faster, <= {TARGET_SECONDS:g} s"
    rows = []
    for name, amp_s, base_s, bounded in (
        (
            f"extended amortization to CSV, {n:,} problems ({size_mb:,.0f} MB of JSONL)",
            statistics.median(amp["csv_times"]),
            statistics.median(base["csv_times"]),
            True,
        ),
        (
            f"extended amortization to rows in memory, {n:,} problems",
            statistics.median(amp_rows["times"]),
            statistics.median(base["times"]),
            False,
        ),
    ):
        ratio = base_s / amp_s
        rows.append(
            {
                "name": name,
                "unit": "s",
                "ampmeter": amp_s,
                "baseline": base_s,
                "baseline_name": BASELINE_NAME,
                "ratio": ratio,
                "target": target if bounded and not quick else "information",
                "met": (ratio >= TARGET_RATIO and amp_s <= TARGET_SECONDS)
                if bounded and not quick
                else None,
            }
        )
    rows.append(
        {
            "name": "peak memory of the CSV job (max RSS of the process)",
            "unit": "MB",
            "ampmeter": amp["rss_mb"],
            "baseline": base["rss_mb"],
            "baseline_name": BASELINE_NAME,
            "ratio": base["rss_mb"] / amp["rss_mb"],
            "target": "information",
            "met": None,
        },
    )
    rows.extend(summary_rows(quick))
    return rows


def main() -> None:
    """Print the rows as a small table."""
    if len(sys.argv) >= 2 and sys.argv[1] == "--child":
        _child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    quick = parse(__doc__).quick
    for row in run(quick):
        ratio = f"{row['ratio']:.1f}x" if row["ratio"] is not None else "-"
        print(
            f"{row['name']:<72} ampmeter {row['ampmeter']:>9.2f} {row['unit']:<3} "
            f"baseline {row['baseline']:>9.2f} {row['unit']:<3} ratio {ratio:>6}  "
            f"target {row['target']}  met {row['met']}"
        )


if __name__ == "__main__":
    main()
