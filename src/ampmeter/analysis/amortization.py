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
from collections.abc import Callable, Iterable, Mapping
from operator import itemgetter
from typing import Any, Final, Literal, TypeVar

from ampmeter._files import replaced_when_complete, require_file
from ampmeter.analysis._curve import ROW_COLUMNS, curve_cells
from ampmeter.analysis._records import (
    EXTENDED_COLUMNS,
    V0_COLUMNS,
    event_fields,
    problem_fields,
    read_records,
    stream_fields,
)

__all__ = [
    "DUCKDB_THRESHOLD_BYTES",
    "EXTENDED_COLUMNS",
    "V0_COLUMNS",
    "CurveTable",
    "amortization_curve",
    "amortization_table",
    "duckdb_available",
    "write_csv",
    "write_extended_csv",
    "write_v0_csv",
]

# Past this many bytes of input, engine="auto" summarizes with DuckDB (when it is installed).
DUCKDB_THRESHOLD_BYTES: Final = 64 * 1024 * 1024

Engine = Literal["auto", "python", "duckdb"]
PathLike = str | os.PathLike[str]
T = TypeVar("T")
_SOLVED: Final = ROW_COLUMNS.index("cumulative_solved")


class CurveTable:
    """The curve's rows as tuples of :data:`~ampmeter.analysis._curve.ROW_COLUMNS` (a dict
    per row only when asked for): what :func:`amortization_table` gives."""

    __slots__ = ("_cells",)

    def __init__(self, cells: list[tuple[Any, ...]]) -> None:
        self._cells = cells

    def __len__(self) -> int:
        return len(self._cells)

    def column(self, name: str) -> list[Any]:
        """Column ``name`` as Python values (None where there is none)."""
        index = _index(name)
        return [cells[index] for cells in self._cells]

    def rows(self) -> list[dict[str, Any]]:
        """Every row as a dict with all the curve's columns, in ``t`` order."""
        return [dict(zip(ROW_COLUMNS, cells, strict=True)) for cells in self._cells]

    def write_csv(
        self, path: PathLike, columns: Iterable[str], *, only_stream_rows: bool = False
    ) -> int:
        """Write ``columns`` as CSV (None as an empty cell, floats as ``repr``), replacing
        ``path`` only when complete; ``only_stream_rows`` keeps the rows with a stream line.
        Returns the number of data rows."""
        indexes = [_index(name) for name in columns]
        rows = self._cells
        if only_stream_rows:
            rows = [cells for cells in rows if cells[_SOLVED] is not None]
        pick = itemgetter(*indexes)  # one cell, or a tuple of them
        picked = map(pick, rows) if len(indexes) > 1 else ((pick(cells),) for cells in rows)
        with replaced_when_complete(path) as tmp, open(tmp, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f, lineterminator="\n")
            writer.writerow([ROW_COLUMNS[i] for i in indexes])
            writer.writerows(picked)  # None as an empty cell, a float as its repr
        return len(rows)


def _index(name: str) -> int:
    try:
        return ROW_COLUMNS.index(name)
    except ValueError:
        raise KeyError(f"unknown curve column {name!r}") from None


def amortization_table(
    stream_jsonl: PathLike,
    *,
    problems_jsonl: PathLike | None = None,
    token_events_jsonl: PathLike | None = None,
    best_effort: bool = False,
    engine: Engine = "auto",
    progress: bool = False,
) -> CurveTable:
    """The curve of :func:`amortization_curve` as a :class:`CurveTable`, without building a
    dict per row: the way to a CSV of a large run. Same arguments and errors."""
    stream_path = os.fspath(stream_jsonl)
    problems_path = os.fspath(problems_jsonl) if problems_jsonl else None
    events_path = os.fspath(token_events_jsonl) if token_events_jsonl else None
    paths = [p for p in (stream_path, problems_path, events_path) if p]
    use_duck = use_duckdb(engine, best_effort, paths, auto=False)
    for path in paths:
        require_file(path)
    if use_duck:
        from ampmeter.analysis._duck import read_inputs

        stream, problems, events = read_inputs(
            stream_path, problems_path, events_path, show=progress
        )
    else:

        def read(path: str | None, fields: Callable[[dict[str, Any]], T]) -> list[T] | None:
            return read_records(path, fields, best_effort=best_effort) if path else None

        stream = read_records(stream_path, stream_fields, best_effort=best_effort)
        problems = read(problems_path, problem_fields)
        events = read(events_path, event_fields)
    return CurveTable(
        curve_cells(stream, problems, events, stream_path=stream_path, best_effort=best_effort)
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
    appears twice in the stream file. ``engine="duckdb"`` reads the files with DuckDB and gives
    the same rows, ``progress`` showing a progress bar on stderr while it reads; ``"auto"``
    reads them with the plain reader, which measured faster and smaller than DuckDB's at every
    size (bench/README.md).
    """
    return amortization_table(
        stream_jsonl,
        problems_jsonl=problems_jsonl,
        token_events_jsonl=token_events_jsonl,
        best_effort=best_effort,
        engine=engine,
        progress=progress,
    ).rows()


def use_duckdb(engine: str, best_effort: bool, paths: list[str], *, auto: bool) -> bool:
    """Whether DuckDB reads ``paths`` for ``engine`` (the rule every analysis job shares):
    always for ``"duckdb"``, and for ``"auto"`` when the job's ``auto`` says DuckDB measures
    faster for it (summaries, not the curve), DuckDB is installed, reading is strict and the
    inputs are over :data:`DUCKDB_THRESHOLD_BYTES`."""
    if engine not in ("auto", "python", "duckdb"):
        raise ValueError(f"engine must be 'auto', 'python' or 'duckdb', got {engine!r}")
    if engine == "duckdb" and best_effort:
        raise ValueError("the duckdb engine reads strictly; use engine='python' for best_effort")
    if engine == "duckdb" and not duckdb_available():
        raise ImportError(
            "the duckdb engine needs duckdb: install ampmeter[analysis]", name="duckdb"
        )
    return engine == "duckdb" or (
        engine == "auto"
        and auto
        and not best_effort
        and duckdb_available()
        and sum(os.path.getsize(p) for p in paths if os.path.isfile(p)) >= DUCKDB_THRESHOLD_BYTES
    )


def duckdb_available() -> bool:
    """Whether the DuckDB engine can run here (duckdb is installed)."""
    try:
        import duckdb  # noqa: F401
    except ImportError:
        return False
    return True


Rows = Iterable[Mapping[str, Any]]


def _table(rows: Rows | CurveTable) -> CurveTable:
    if isinstance(rows, CurveTable):
        return rows
    return CurveTable([tuple(row.get(name) for name in ROW_COLUMNS) for row in rows])


def write_csv(rows: Rows | CurveTable, path: PathLike, columns: Iterable[str]) -> int:
    """Write ``rows`` (dicts, or a :class:`CurveTable`) as CSV with exactly ``columns`` (None
    as an empty cell, floats in full precision); returns the number of data rows. The file is
    replaced only when complete."""
    return _table(rows).write_csv(path, columns)


def write_v0_csv(rows: Rows | CurveTable, path: PathLike) -> int:
    """The v0 CSV: ``t`` and the stream's three columns, for every ``t`` that
    has a stream line, in ``t`` order."""
    return _table(rows).write_csv(path, V0_COLUMNS, only_stream_rows=True)


def write_extended_csv(rows: Rows | CurveTable, path: PathLike) -> int:
    """The extended CSV (:data:`EXTENDED_COLUMNS`, stable names), one row per ``t``."""
    return write_csv(rows, path, EXTENDED_COLUMNS)
