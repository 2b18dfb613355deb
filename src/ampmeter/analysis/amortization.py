"""Amortization curves (contract §3-4): cost per solved problem and quality against ``t``.

:func:`amortization_curve` reads a ``*.stream.jsonl`` file and, optionally, the matching
``*.problems.jsonl`` and TokenTracker event log, and returns one row per ``t`` (every ``t``
seen in any of the files, ascending). Each row has the v0 columns (from the stream line of that
``t``; None when the stream has none) and the extended columns, computed over every problem and
event with ``t' <= t`` ("so far"):

* ``cum_accuracy``: solved problems / problems;
* ``attempt_success_rate_p50``, ``tokens_total_p50``, ``latency_ms_p50``, ``latency_ms_p95``:
  percentiles (linear interpolation) of the problems' values, nulls left out;
* ``cost_usd_pipeline_avg`` (Track A: events with ``component == "pipeline"``) and
  ``cost_usd_total_avg`` (Track B: every event): event cost / problems. Without a problems
  file each ``t`` counts as one problem.

Columns whose input file was not given (or that have no value yet) are None.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterable, Mapping
from operator import itemgetter
from typing import Any, Final, Literal

from ampmeter.analysis._records import (
    AnalysisError,
    EventRow,
    ProblemRow,
    StreamRow,
    event_fields,
    problem_fields,
    read_records,
    record_line,
    stream_fields,
)
from ampmeter.analysis.quantiles import RunningPercentile

__all__ = [
    "DUCKDB_THRESHOLD_BYTES",
    "EXTENDED_COLUMNS",
    "V0_COLUMNS",
    "amortization_curve",
    "write_csv",
    "write_extended_csv",
    "write_v0_csv",
]

V0_COLUMNS: Final = ("t", "cumulative_api_cost_usd", "cumulative_solved", "cost_per_solved")
EXTENDED_COLUMNS: Final = (
    "t",
    "cum_accuracy",
    "attempt_success_rate_p50",
    "tokens_total_p50",
    "latency_ms_p50",
    "latency_ms_p95",
    "cost_usd_pipeline_avg",
    "cost_usd_total_avg",
)
# Past this many bytes of input, engine="auto" reads with DuckDB (when it is installed).
DUCKDB_THRESHOLD_BYTES: Final = 64 * 1024 * 1024

Engine = Literal["auto", "python", "duckdb"]
PathLike = str | os.PathLike[str]


def amortization_curve(
    stream_jsonl: PathLike,
    *,
    problems_jsonl: PathLike | None = None,
    token_events_jsonl: PathLike | None = None,
    best_effort: bool = False,
    engine: Engine = "auto",
    progress: bool = False,
) -> list[dict[str, Any]]:
    """Rows of the amortization curve, one per ``t`` in ascending order (see the module docs).

    Invalid JSON raises :class:`ampmeter.logs.JsonlError` naming ``file:line`` (skipped and
    counted with ``best_effort=True``); a record without an int ``t`` or with a required field
    of the wrong type raises :class:`AnalysisError` naming ``file:line``; so does a ``t`` that
    appears twice in the stream file. ``engine="duckdb"`` (or ``"auto"`` on inputs over
    :data:`DUCKDB_THRESHOLD_BYTES`) reads the files with DuckDB and gives the same rows;
    ``progress`` shows a progress bar on stderr while it reads.
    """
    if engine not in ("auto", "python", "duckdb"):
        raise ValueError(f"engine must be 'auto', 'python' or 'duckdb', got {engine!r}")
    paths = [os.fspath(p) for p in (stream_jsonl, problems_jsonl, token_events_jsonl) if p]
    for path in paths:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no such file: {path}")
    use_duck = engine == "duckdb" or (
        engine == "auto" and not best_effort and _duckdb_available()
        and sum(os.path.getsize(p) for p in paths) >= DUCKDB_THRESHOLD_BYTES
    )  # fmt: skip
    if use_duck and best_effort:
        raise ValueError("the duckdb engine reads strictly; use engine='python' for best_effort")
    stream_path = os.fspath(stream_jsonl)
    if use_duck:
        from ampmeter.analysis._duck import read_inputs

        stream, problems, events = read_inputs(
            stream_path,
            os.fspath(problems_jsonl) if problems_jsonl else None,
            os.fspath(token_events_jsonl) if token_events_jsonl else None,
            progress=progress,
        )
    else:
        stream = read_records(stream_path, stream_fields, best_effort=best_effort)
        problems = (
            read_records(problems_jsonl, problem_fields, best_effort=best_effort)
            if problems_jsonl
            else None
        )
        events = (
            read_records(token_events_jsonl, event_fields, best_effort=best_effort)
            if token_events_jsonl
            else None
        )
    return curve_rows(stream, problems, events, stream_path=stream_path, best_effort=best_effort)


def _duckdb_available() -> bool:
    try:
        import duckdb  # noqa: F401
    except ImportError:
        return False
    return True


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


def _cell(value: object) -> object:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    return value


def write_csv(
    rows: Iterable[Mapping[str, Any]], path: PathLike, columns: Iterable[str]
) -> int:
    """Write ``rows`` as CSV with exactly ``columns`` (None as an empty cell, floats in full
    precision); returns the number of data rows. The file is replaced only when complete."""
    names = list(columns)
    target = os.fspath(path)
    tmp = f"{target}.tmp-{os.getpid()}"
    count = 0
    try:
        with open(tmp, "w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle, lineterminator="\n")
            writer.writerow(names)
            for row in rows:
                writer.writerow([_cell(row.get(name)) for name in names])
                count += 1
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return count


def write_v0_csv(rows: Iterable[Mapping[str, Any]], path: PathLike) -> int:
    """The v0 CSV (contract §3.1): ``t`` and the stream's three columns, for every ``t`` that
    has a stream line, in ``t`` order."""
    return write_csv(
        (r for r in rows if r.get("cumulative_solved") is not None), path, V0_COLUMNS
    )


def write_extended_csv(rows: Iterable[Mapping[str, Any]], path: PathLike) -> int:
    """The extended CSV (contract §4.1) with its stable column names, one row per ``t``."""
    return write_csv(rows, path, EXTENDED_COLUMNS)
