"""Amortization curves: cost per solved problem and quality against ``t``.

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
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Final, Literal

from ampmeter._files import replaced_when_complete, require_file
from ampmeter.analysis._pycurve import curve_rows
from ampmeter.analysis._records import (
    EXTENDED_COLUMNS,
    V0_COLUMNS,
    event_fields,
    problem_fields,
    read_records,
    stream_fields,
)

if TYPE_CHECKING:
    from ampmeter.analysis._table import CurveTable

__all__ = [
    "DUCKDB_THRESHOLD_BYTES",
    "EXTENDED_COLUMNS",
    "V0_COLUMNS",
    "amortization_curve",
    "amortization_table",
    "duckdb_available",
    "write_csv",
    "write_extended_csv",
    "write_v0_csv",
]

# Past this many bytes of input, engine="auto" reads with DuckDB (when it is installed).
DUCKDB_THRESHOLD_BYTES: Final = 64 * 1024 * 1024

Engine = Literal["auto", "python", "duckdb"]
PathLike = str | os.PathLike[str]


def amortization_table(
    stream_jsonl: PathLike,
    *,
    problems_jsonl: PathLike | None = None,
    token_events_jsonl: PathLike | None = None,
    best_effort: bool = False,
    engine: Engine = "auto",
    progress: bool = False,
) -> CurveTable:
    """The curve of :func:`amortization_curve` as columns (a :class:`CurveTable`), without
    building a dict per row; the fast way to a CSV of a large run. Needs numpy (the
    ``analysis`` extra). Same arguments and errors as :func:`amortization_curve`."""
    from ampmeter.analysis import _columns

    stream_path, problems_path, events_path, use_duck = _plan(
        stream_jsonl, problems_jsonl, token_events_jsonl, best_effort, engine
    )
    # The problem side (percentiles) runs in a thread while the other files are read.
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ampmeter-problems")
    pending: list[Future[_columns.ProblemStats]] = []

    def start(problems: _columns.ProblemColumns) -> None:
        pending.append(pool.submit(_columns.problem_stats, problems))

    try:
        if use_duck:
            from ampmeter.analysis._duck import read_inputs

            stream, _, events = read_inputs(
                stream_path, problems_path, events_path, progress=progress, on_problems=start
            )
        else:
            if problems_path:
                start(
                    _columns.problem_columns(
                        read_records(problems_path, problem_fields, best_effort=best_effort)
                    )
                )
            stream = _columns.stream_columns(
                read_records(stream_path, stream_fields, best_effort=best_effort)
            )
            events = (
                _columns.event_columns(
                    read_records(events_path, event_fields, best_effort=best_effort)
                )
                if events_path
                else None
            )
        stats = pending[0].result() if pending else None
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return _columns.curve_table(
        stream, stats, events, stream_path=stream_path, best_effort=best_effort
    )


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
    ``progress`` shows a progress bar on stderr while it reads. With numpy installed the curve
    is computed column-wise (:func:`amortization_table`); without it, record by record, with
    the same results.
    """
    if _numpy_available():
        return amortization_table(
            stream_jsonl,
            problems_jsonl=problems_jsonl,
            token_events_jsonl=token_events_jsonl,
            best_effort=best_effort,
            engine=engine,
            progress=progress,
        ).rows()
    stream_path, problems_path, events_path, use_duck = _plan(
        stream_jsonl, problems_jsonl, token_events_jsonl, best_effort, engine
    )
    if use_duck:
        raise ImportError("the duckdb engine needs numpy: install ampmeter[analysis]")
    stream = read_records(stream_path, stream_fields, best_effort=best_effort)
    problems = (
        read_records(problems_path, problem_fields, best_effort=best_effort)
        if problems_path
        else None
    )
    events = (
        read_records(events_path, event_fields, best_effort=best_effort) if events_path else None
    )
    return curve_rows(stream, problems, events, stream_path=stream_path, best_effort=best_effort)


def _plan(
    stream_jsonl: PathLike,
    problems_jsonl: PathLike | None,
    token_events_jsonl: PathLike | None,
    best_effort: bool,
    engine: str,
) -> tuple[str, str | None, str | None, bool]:
    """Check the arguments; the three paths and whether DuckDB reads them."""
    if engine not in ("auto", "python", "duckdb"):
        raise ValueError(f"engine must be 'auto', 'python' or 'duckdb', got {engine!r}")
    stream_path = os.fspath(stream_jsonl)
    problems_path = os.fspath(problems_jsonl) if problems_jsonl else None
    events_path = os.fspath(token_events_jsonl) if token_events_jsonl else None
    paths = [p for p in (stream_path, problems_path, events_path) if p]
    for path in paths:
        require_file(path)
    use_duck = engine == "duckdb" or (
        engine == "auto"
        and not best_effort
        and duckdb_available()
        and sum(os.path.getsize(p) for p in paths) >= DUCKDB_THRESHOLD_BYTES
    )
    if use_duck and best_effort:
        raise ValueError("the duckdb engine reads strictly; use engine='python' for best_effort")
    return stream_path, problems_path, events_path, use_duck


def _numpy_available() -> bool:
    try:
        import numpy  # noqa: F401
    except ImportError:
        return False
    return True


def duckdb_available() -> bool:
    """Whether the DuckDB engine can run here (duckdb and numpy are installed)."""
    try:
        import duckdb  # noqa: F401
    except ImportError:
        return False
    return _numpy_available()


def _cell(value: object) -> object:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    return value


Rows = Iterable[Mapping[str, Any]]


def _as_table(rows: object) -> CurveTable | None:
    if not _numpy_available():
        return None
    from ampmeter.analysis._table import CurveTable

    return rows if isinstance(rows, CurveTable) else None


def write_csv(rows: Rows | CurveTable, path: PathLike, columns: Iterable[str]) -> int:
    """Write ``rows`` (dicts, or a :class:`CurveTable`, written column-wise and much faster)
    as CSV with exactly ``columns`` (None as an empty cell, floats in full precision); returns
    the number of data rows. The file is replaced only when complete."""
    table = _as_table(rows)
    if table is not None:
        return table.write_csv(path, columns)
    names = list(columns)
    count = 0
    with replaced_when_complete(path) as tmp, open(tmp, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(names)
        for row in rows:  # type: ignore[union-attr]
            writer.writerow([_cell(row.get(name)) for name in names])
            count += 1
    return count


def write_v0_csv(rows: Rows | CurveTable, path: PathLike) -> int:
    """The v0 CSV: ``t`` and the stream's three columns, for every ``t`` that
    has a stream line, in ``t`` order."""
    table = _as_table(rows)
    if table is not None:
        return table.write_csv(path, V0_COLUMNS, only_stream_rows=True)
    return write_csv(
        (r for r in rows if r.get("cumulative_solved") is not None),  # type: ignore[union-attr]
        path,
        V0_COLUMNS,
    )


def write_extended_csv(rows: Rows | CurveTable, path: PathLike) -> int:
    """The extended CSV (:data:`EXTENDED_COLUMNS`, stable names), one row per ``t``."""
    return write_csv(rows, path, EXTENDED_COLUMNS)
