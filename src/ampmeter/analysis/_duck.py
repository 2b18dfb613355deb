"""The DuckDB engine: read the amortization inputs column-wise, in parallel, off the GIL.

It yields exactly the records the plain reader would (same order, same Python types), so the
shared curve code gives identical rows. ``t`` is checked to be a JSON integer here as well; any
other problem (bad JSON, a cut-off last line, a field DuckDB cannot convert) makes that file be
read again by the plain reader, which either raises the precise ``file:line`` error or, for a
cut-off last line, reads it by the contract's rules.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import duckdb

from ampmeter.analysis._records import (
    EventRow,
    ProblemRow,
    StreamRow,
    event_fields,
    problem_fields,
    read_records,
    stream_fields,
)

__all__ = ["read_inputs"]

T = TypeVar("T")

_INT_T = "json_type(t) IN ('BIGINT', 'UBIGINT')"

_STREAM_SQL = f"""
SELECT {_INT_T} AND cumulative_api_cost_usd IS NOT NULL AND cumulative_solved IS NOT NULL
       AND cost_per_solved IS NOT NULL AS ok,
       t::BIGINT, cumulative_api_cost_usd, cumulative_solved, cost_per_solved
FROM read_json(?, format='newline_delimited', columns={{
    't': 'JSON', 'cumulative_api_cost_usd': 'DOUBLE', 'cumulative_solved': 'BIGINT',
    'cost_per_solved': 'DOUBLE'}})
"""

_PROBLEMS_SQL = f"""
SELECT {_INT_T} AND solved IS NOT NULL AS ok,
       t::BIGINT, solved, attempt_success_rate, tokens_total, latency_total_ms
FROM read_json(?, format='newline_delimited', columns={{
    't': 'JSON', 'solved': 'BOOLEAN', 'attempt_success_rate': 'DOUBLE', 'tokens_total': 'BIGINT',
    'latency_total_ms': 'DOUBLE'}})
"""

_EVENTS_SQL = f"""
WITH raw AS (
    SELECT CASE WHEN metadata.t IS NULL OR json_type(metadata.t) = 'NULL' THEN t
                ELSE metadata.t END AS t,
           component, cost_usd
    FROM read_json(?, format='newline_delimited', columns={{
        't': 'JSON', 'component': 'VARCHAR', 'cost_usd': 'DOUBLE', 'metadata': 'STRUCT(t JSON)'}})
)
SELECT {_INT_T} AND cost_usd IS NOT NULL AS ok,
       t::BIGINT, coalesce(component = 'pipeline', false), cost_usd
FROM raw
"""


def read_inputs(
    stream: str, problems: str | None, events: str | None, *, progress: bool = False
) -> tuple[list[StreamRow], list[ProblemRow] | None, list[EventRow] | None]:
    """The stream, problems and event records of the given files (see the module docs)."""
    con = duckdb.connect(":memory:")
    try:
        jobs: list[tuple[str, str, str, Callable[[dict[str, Any]], Any]]] = [
            ("stream", stream, _STREAM_SQL, stream_fields)
        ]
        if problems:
            jobs.append(("problems", problems, _PROBLEMS_SQL, problem_fields))
        if events:
            jobs.append(("events", events, _EVENTS_SQL, event_fields))
        out: dict[str, list[Any]] = {}
        with _Progress(con, progress, len(jobs)) as bar:
            for label, path, sql, fields in jobs:
                out[label] = bar.run(label, functools.partial(_read, con, path, sql, fields))
    finally:
        con.close()
    return out["stream"], out.get("problems"), out.get("events")


def _read(
    con: duckdb.DuckDBPyConnection,
    path: str,
    sql: str,
    fields: Callable[[dict[str, Any]], T],
) -> list[Any]:
    try:
        rows = con.execute(sql, [path]).fetchall()
    except duckdb.Error:
        return read_records(path, fields)
    if not all(row[0] for row in rows):
        # A record breaks the contract: the plain reader names its line. It is also the
        # authority should it accept what the SQL checks rejected.
        return read_records(path, fields)
    return [row[1:] for row in rows]


class _Progress:
    """A rich progress bar over DuckDB's own query progress (a no-op when disabled)."""

    def __init__(self, con: duckdb.DuckDBPyConnection, enabled: bool, total: int) -> None:
        self._con = con
        self._enabled = enabled
        self._total = total
        self._bar: Any = None

    def __enter__(self) -> _Progress:
        if self._enabled:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(
                TextColumn("reading {task.description}"),
                BarColumn(),
                TextColumn("{task.percentage:>5.1f}%"),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()

    def run(self, label: str, job: Callable[[], list[Any]]) -> list[Any]:
        """Run ``job`` (a DuckDB read); with the bar on, poll the query's progress meanwhile."""
        if self._bar is None:
            return job()
        task = self._bar.add_task(label, total=100.0)
        result: list[list[Any]] = []
        error: list[BaseException] = []

        def work() -> None:
            try:
                result.append(job())
            except BaseException as exc:  # handed back to the caller's thread
                error.append(exc)

        worker = threading.Thread(target=work, name="ampmeter-duckdb-read", daemon=True)
        worker.start()
        while worker.is_alive():
            worker.join(0.1)
            try:
                done = float(self._con.query_progress())
            except duckdb.Error:
                done = -1.0
            if done >= 0:
                self._bar.update(task, completed=min(done, 100.0))
        self._bar.update(task, completed=100.0)
        if error:
            raise error[0]
        return result[0]
