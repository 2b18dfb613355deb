"""The amortization curve record by record in plain Python: the reference the numpy path
(:mod:`ampmeter.analysis._columns`) matches bit for bit, and the path used without numpy."""

from __future__ import annotations

from operator import itemgetter
from typing import Any

from ampmeter.analysis._records import (
    AnalysisError,
    EventRow,
    ProblemRow,
    StreamRow,
    record_line,
)
from ampmeter.analysis.quantiles import RunningPercentile

__all__ = ["curve_rows"]


def curve_rows(
    stream: list[StreamRow],
    problems: list[ProblemRow] | None,
    events: list[EventRow] | None,
    *,
    stream_path: str = "<stream>",
    best_effort: bool = False,
) -> list[dict[str, Any]]:
    """The curve from records already read (the part both engines share)."""
    by_t: dict[int, StreamRow] = {}
    for index, record in enumerate(stream):
        if record[0] in by_t:
            line = record_line(stream_path, index, best_effort) if stream_path[:1] != "<" else None
            raise AnalysisError(stream_path, line, f"t={record[0]} appears twice in the stream")
        by_t[record[0]] = record
    pipeline: dict[int, float] = {}
    total: dict[int, float] = {}
    if events is not None:
        for t, is_pipeline, cost in events:
            total[t] = total.get(t, 0.0) + cost
            if is_pipeline:
                pipeline[t] = pipeline.get(t, 0.0) + cost
    ordered = sorted(problems, key=itemgetter(0)) if problems is not None else []
    all_t = set(by_t)
    all_t.update(total)
    if ordered:
        all_t.update(p[0] for p in ordered)
    has_problems = problems is not None
    has_events = events is not None
    rate_p50 = RunningPercentile(50.0)
    tokens_p50 = RunningPercentile(50.0)
    latency_p50 = RunningPercentile(50.0)
    latency_p95 = RunningPercentile(95.0)
    n_problems = solved = 0
    cost_a = cost_b = 0.0
    pi, np_ = 0, len(ordered)
    rows: list[dict[str, Any]] = []
    for index, t in enumerate(sorted(all_t)):
        while pi < np_ and ordered[pi][0] <= t:
            _, ok, rate, tokens, latency = ordered[pi]
            pi += 1
            n_problems += 1
            if ok:
                solved += 1
            if rate is not None:
                rate_p50.add(rate)
            if tokens is not None:
                tokens_p50.add(tokens)
            if latency is not None:
                latency_p50.add(latency)
                latency_p95.add(latency)
        s = by_t.get(t)
        row: dict[str, Any] = {
            "t": t,
            "cumulative_api_cost_usd": s[1] if s else None,
            "cumulative_solved": s[2] if s else None,
            "cost_per_solved": s[3] if s else None,
            "cum_accuracy": None,
            "attempt_success_rate_p50": None,
            "tokens_total_p50": None,
            "latency_ms_p50": None,
            "latency_ms_p95": None,
            "cost_usd_pipeline_avg": None,
            "cost_usd_total_avg": None,
        }
        if has_problems and n_problems:
            row["cum_accuracy"] = solved / n_problems
            row["attempt_success_rate_p50"] = rate_p50.value()
            row["tokens_total_p50"] = tokens_p50.value()
            row["latency_ms_p50"] = latency_p50.value()
            row["latency_ms_p95"] = latency_p95.value()
        if has_events:
            cost_a += pipeline.get(t, 0.0)
            cost_b += total.get(t, 0.0)
            denominator = n_problems if has_problems else index + 1
            if denominator:
                row["cost_usd_pipeline_avg"] = cost_a / denominator
                row["cost_usd_total_avg"] = cost_b / denominator
        rows.append(row)
    return rows
