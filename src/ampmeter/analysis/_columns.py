"""The amortization curve computed column-wise with numpy (the fast path of both engines).

Every number is produced by the same IEEE operations, in the same order, as the record-by-record
reference (:func:`ampmeter.analysis._pycurve.curve_rows`): per-``t`` event costs are summed in
file order (``bincount`` adds sequentially from 0.0), the running sums are sequential
``cumsum``s starting from 0.0, averages divide by the same integer counts, and percentiles come
from :func:`ampmeter.analysis.quantiles.prefix_percentiles`, which is exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from ampmeter.analysis._records import (
    AnalysisError,
    EventRow,
    ProblemRow,
    StreamRow,
    record_line,
)
from ampmeter.analysis._table import CurveTable
from ampmeter.analysis.quantiles import number_array, prefix_percentiles

__all__ = [
    "EventColumns",
    "ProblemColumns",
    "ProblemStats",
    "StreamColumns",
    "curve_table",
    "event_columns",
    "problem_columns",
    "problem_stats",
    "stream_columns",
]

Array = npt.NDArray[Any]


@dataclass(slots=True)
class StreamColumns:
    """The four v0 fields of a stream file, one array each, in file order."""

    t: Array
    cost: Array
    solved: Array
    cost_per_solved: Array


@dataclass(slots=True)
class ProblemColumns:
    """Fields of a problems file; ``*_ok`` say where the nullable ones have a value."""

    t: Array
    solved: Array
    rate: Array
    rate_ok: Array
    tokens: Array
    tokens_ok: Array
    latency: Array
    latency_ok: Array


@dataclass(slots=True)
class EventColumns:
    """``t``, Track A membership and cost of each TokenTracker event, in file order."""

    t: Array
    pipeline: Array
    cost: Array


def _ints(values: Sequence[int]) -> Array:
    return number_array(values) if values else np.zeros(0, dtype=np.int64)


def _optional(values: Sequence[Any], ints: bool) -> tuple[Array, Array]:
    ok = np.fromiter((v is not None for v in values), dtype=bool, count=len(values))
    present = [v for v in values if v is not None]
    if ints:
        return _ints(present), ok
    return np.array(present, dtype=np.float64), ok


def stream_columns(records: list[StreamRow]) -> StreamColumns:
    """Columns of records read by the plain reader."""
    t, cost, solved, cps = zip(*records, strict=True) if records else ((), (), (), ())
    return StreamColumns(
        _ints(t), np.array(cost, dtype=np.float64), _ints(solved), np.array(cps, dtype=np.float64)
    )


def problem_columns(records: list[ProblemRow]) -> ProblemColumns:
    """Columns of records read by the plain reader (nullable ones keep only their values)."""
    t, solved, rate, tokens, latency = (
        zip(*records, strict=True) if records else ((), (), (), (), ())
    )
    return ProblemColumns(
        _ints(t),
        np.array(solved, dtype=bool),
        *_optional(rate, False),
        *_optional(tokens, True),
        *_optional(latency, False),
    )


def event_columns(records: list[EventRow]) -> EventColumns:
    """Columns of records read by the plain reader."""
    t, pipeline, cost = zip(*records, strict=True) if records else ((), (), ())
    return EventColumns(_ints(t), np.array(pipeline, dtype=bool), np.array(cost, dtype=np.float64))


def _check_unique_t(stream: StreamColumns, stream_path: str, best_effort: bool) -> None:
    order = np.argsort(stream.t, kind="stable")
    ordered = stream.t[order]
    repeats = order[1:][ordered[1:] == ordered[:-1]]
    if len(repeats):
        index = int(repeats.min())  # the first record whose t was seen before
        line = record_line(stream_path, index, best_effort) if stream_path[:1] != "<" else None
        raise AnalysisError(stream_path, line, f"t={stream.t[index]} appears twice in the stream")


def _distinct(values: Array) -> Array:
    """Sorted distinct values (np.unique's hash path is slow on millions of ints)."""
    ordered = np.sort(values)
    if len(ordered) < 2:
        return ordered
    step = np.empty(len(ordered), dtype=bool)
    step[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=step[1:])
    return ordered[step]


def _lookup(keys: Array, all_t: Array) -> Array:
    return np.searchsorted(all_t, keys).astype(np.intp, copy=False)


@dataclass(slots=True)
class ProblemStats:
    """What the curve needs from the problems, per group of equal ``t`` (ascending):
    ``counts[j]`` problems have ``t' <= `` the group's ``t``; ``solved[j]`` of them are solved;
    ``columns`` holds each percentile column (values, valid) at every group."""

    sorted_t: Array
    counts: Array
    solved: Array
    columns: dict[str, tuple[Array, Array]]


_PERCENTILE_COLUMNS: Final = (
    (("attempt_success_rate_p50",), "rate", (50.0,)),
    (("tokens_total_p50",), "tokens", (50.0,)),
    (("latency_ms_p50", "latency_ms_p95"), "latency", (50.0, 95.0)),
)


def problem_stats(problems: ProblemColumns) -> ProblemStats:
    """The problem side of the curve; it needs no other file, so it can run while they are
    read. The percentile columns are computed in two threads (numpy releases the GIL)."""
    order = np.argsort(problems.t, kind="stable")
    sorted_t = problems.t[order]
    n = len(sorted_t)
    last = np.ones(n, dtype=bool)  # the last problem of each group of equal t
    if n > 1:
        np.not_equal(sorted_t[1:], sorted_t[:-1], out=last[:-1])
    counts = np.flatnonzero(last) + 1
    solved = np.cumsum(problems.solved[order], dtype=np.int64)[counts - 1]
    columns: dict[str, tuple[Array, Array]] = {}

    def job(names: tuple[str, ...], field: str, qs: tuple[float, ...]) -> None:
        values = getattr(problems, field)
        ok = getattr(problems, field + "_ok")
        columns.update(_percentiles(names, qs, values, ok, order, counts))

    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="ampmeter-percentiles") as pool:
        for future in [pool.submit(job, *spec) for spec in _PERCENTILE_COLUMNS]:
            future.result()
    return ProblemStats(sorted_t, counts, solved, columns)


def curve_table(
    stream: StreamColumns,
    problems: ProblemColumns | ProblemStats | None,
    events: EventColumns | None,
    *,
    stream_path: str = "<stream>",
    best_effort: bool = False,
) -> CurveTable:
    """The curve (see :mod:`ampmeter.analysis.amortization`) from columns already read."""
    _check_unique_t(stream, stream_path, best_effort)
    if isinstance(problems, ProblemColumns):
        problems = problem_stats(problems)
    parts = [stream.t] + [
        c.t if isinstance(c, EventColumns) else c.sorted_t
        for c in (problems, events)
        if c is not None
    ]
    if any(p.dtype == object for p in parts):
        parts = [p.astype(object) for p in parts]
    all_t = _distinct(np.concatenate(parts))
    n_rows = len(all_t)
    table = CurveTable(all_t)

    at = _lookup(stream.t, all_t)
    has_line = np.zeros(n_rows, dtype=bool)
    has_line[at] = True
    for name, values in (
        ("cumulative_api_cost_usd", stream.cost),
        ("cumulative_solved", stream.solved),
        ("cost_per_solved", stream.cost_per_solved),
    ):
        column = np.zeros(n_rows, dtype=values.dtype)
        column[at] = values
        table.set(name, column, has_line)

    n_problems = np.zeros(0, dtype=np.int64)
    if problems is not None:
        n_problems = np.searchsorted(problems.sorted_t, all_t, side="right").astype(np.int64)
        seen = n_problems > 0
        group = np.maximum(np.searchsorted(problems.counts, n_problems), 0)
        group = np.minimum(group, max(len(problems.counts) - 1, 0))
        if len(problems.counts):
            solved = np.where(seen, problems.solved[group], 0)
            table.set("cum_accuracy", _divide(solved, n_problems, seen), seen)
            for name, (values, valid) in problems.columns.items():
                table.set(name, values[group], valid[group] & seen)
        else:
            for name in ("cum_accuracy", *problems.columns):
                table.set(name, np.zeros(n_rows), seen)

    if events is not None:
        where = _lookup(events.t, all_t)
        total = np.bincount(where, weights=events.cost, minlength=n_rows)
        pipe = events.pipeline
        pipeline = np.bincount(where[pipe], weights=events.cost[pipe], minlength=n_rows)
        denominator = n_problems if problems is not None else np.arange(1, n_rows + 1)
        some = denominator > 0
        for name, per_t in (("cost_usd_pipeline_avg", pipeline), ("cost_usd_total_avg", total)):
            running = np.cumsum(np.concatenate(([0.0], per_t)))[1:]  # 0.0 + x, as in Python
            table.set(name, _divide(running, denominator, some), some)
    return table


def _divide(numerator: Array, denominator: Array, some: Array) -> Array:
    out = np.zeros(len(numerator), dtype=np.float64)
    np.divide(numerator, denominator, out=out, where=some)
    return out


def _percentiles(
    names: tuple[str, ...],
    qs: tuple[float, ...],
    values: Array,
    ok: Array,
    order: Array,
    counts: Array,
) -> dict[str, tuple[Array, Array]]:
    """Percentile columns, per group, over the non-null values of the first ``counts[j]``
    problems in ``t`` order."""
    # values holds only the non-null entries, in file order; put them in t order.
    position = np.cumsum(ok) - 1
    ok_sorted = ok[order]
    in_order = values[position[order][ok_sorted]]
    before = np.concatenate(([0], np.cumsum(ok_sorted, dtype=np.int64)))
    ends = before[counts]
    some = ends > 0
    out: dict[str, tuple[Array, Array]] = {}
    columns = prefix_percentiles(in_order, ends[some], qs) if some.any() else None
    for i, name in enumerate(names):
        full = np.zeros(len(ends), dtype=np.float64)
        if columns is not None:
            full[some] = columns[i]
        out[name] = (full, some)
    return out
