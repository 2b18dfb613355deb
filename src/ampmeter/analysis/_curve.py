"""The amortization curve from records already read: the one computation both readers share.

Whichever reader read the files (DuckDB's, in parallel, or the record-by-record reader), the
numbers come from here, so both engines give the same rows by construction: per-``t`` event
costs are added in file order, running sums in ``t`` order, and percentiles come from
:class:`~ampmeter.analysis.quantiles.RunningPercentile`, which is exact.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any, Final

from ampmeter.analysis._records import (
    EXTENDED_COLUMNS,
    V0_COLUMNS,
    AnalysisError,
    EventRow,
    ProblemRow,
    StreamRow,
    record_line,
)
from ampmeter.analysis.quantiles import RunningPercentile

__all__ = ["ROW_COLUMNS", "curve_cells"]

ROW_COLUMNS: Final = V0_COLUMNS + EXTENDED_COLUMNS[1:]
"""Every column of a curve row, once, in the order of :func:`curve_cells`' tuples."""

_NO_PROBLEMS: Final = (None,) * 5  # cum_accuracy and the four percentiles
_NO_EVENTS: Final = (None, None)


def curve_cells(
    stream: list[StreamRow],
    problems: list[ProblemRow] | None,
    events: list[EventRow] | None,
    *,
    stream_path: str = "<stream>",
    best_effort: bool = False,
) -> list[tuple[Any, ...]]:
    """One tuple of :data:`ROW_COLUMNS` per ``t``, ascending (see
    :mod:`ampmeter.analysis.amortization` for what each column means)."""
    by_t: dict[int, StreamRow] = {}
    for index, record in enumerate(stream):
        if record[0] in by_t:
            line = record_line(stream_path, index, best_effort) if stream_path[:1] != "<" else None
            raise AnalysisError(stream_path, line, f"t={record[0]} appears twice in the stream")
        by_t[record[0]] = record
    pipeline: dict[int, float] = {}
    total: dict[int, float] = {}
    for t, is_pipeline, cost in events or ():
        total[t] = total.get(t, 0.0) + cost
        if is_pipeline:
            pipeline[t] = pipeline.get(t, 0.0) + cost
    ordered = sorted(problems, key=itemgetter(0)) if problems is not None else []
    all_t = set(by_t)
    all_t.update(total)
    all_t.update(p[0] for p in ordered)
    rate_p50 = RunningPercentile(50.0)
    tokens_p50 = RunningPercentile(50.0)
    latency_p50 = RunningPercentile(50.0)
    latency_p95 = RunningPercentile(95.0)
    n_problems = solved = 0
    cost_a = cost_b = 0.0
    next_problem = 0
    rows: list[tuple[Any, ...]] = []
    for index, t in enumerate(sorted(all_t)):
        while next_problem < len(ordered) and ordered[next_problem][0] <= t:
            _, ok, rate, tokens, latency = ordered[next_problem]
            next_problem += 1
            n_problems += 1
            solved += ok
            if rate is not None:
                rate_p50.add(rate)
            if tokens is not None:
                tokens_p50.add(tokens)
            if latency is not None:
                latency_p50.add(latency)
                latency_p95.add(latency)
        s = by_t.get(t)
        quality: tuple[float | None, ...] = _NO_PROBLEMS
        if problems is not None and n_problems:
            quality = (
                solved / n_problems,
                rate_p50.value(),
                tokens_p50.value(),
                latency_p50.value(),
                latency_p95.value(),
            )
        costs: tuple[float | None, ...] = _NO_EVENTS
        if events is not None:
            cost_a += pipeline.get(t, 0.0)
            cost_b += total.get(t, 0.0)
            # without a problems file each t counts as one problem
            denominator = n_problems if problems is not None else index + 1
            if denominator:
                costs = (cost_a / denominator, cost_b / denominator)
        rows.append((t, *(s[1:] if s else (None, None, None)), *quality, *costs))
    return rows
