"""The DuckDB reader of the amortization inputs: the files are parsed in parallel, off the GIL.

It gives exactly the records the plain reader would, in the same order, so the one curve
computation (:mod:`ampmeter.analysis._curve`) gives identical rows. ``t`` is
checked to be a JSON integer here as well; any other problem (bad JSON, a cut-off last line,
a field DuckDB cannot convert) makes that file be read again by the plain reader, which either
raises the precise ``file:line`` error or, for a cut-off last line, reads it by the contract's
rules.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any, Final

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

__all__ = [
    "Reader",
    "count_ok",
    "int_ok",
    "is_null",
    "number_ok",
    "progress",
    "read_inputs",
    "readable",
    "strict_json_only",
    "text_of",
    "text_ok",
]


# Every field is read as JSON and its JSON type checked before the cast, as the plain reader
# checks Python types: DuckDB would otherwise cast true to 1, "5" to 5.0 and 1e400 to inf.
_INTEGER = "('BIGINT', 'UBIGINT')"
_NUMBER = "('BIGINT', 'UBIGINT', 'DOUBLE')"


def int_ok(col: str) -> str:
    """SQL: JSON field ``col`` is an integer that fits a BIGINT."""
    # an int beyond BIGINT is valid JSON the plain reader takes: leave it to that reader
    return f"(json_type({col}) IN {_INTEGER} AND TRY_CAST({col} AS BIGINT) IS NOT NULL)"


_INT_T = int_ok("t")


def number_ok(col: str) -> str:
    """SQL: JSON field ``col`` is a finite number."""
    return f"(json_type({col}) IN {_NUMBER} AND isfinite(TRY_CAST({col} AS DOUBLE)))"


def is_null(col: str) -> str:
    """SQL: JSON field ``col`` is missing or null."""
    return f"({col} IS NULL OR json_type({col}) = 'NULL')"


def count_ok(col: str) -> str:
    """SQL: JSON field ``col`` is missing, null (a count of 0) or a BIGINT ``>= 0``."""
    return f"({is_null(col)} OR ({int_ok(col)} AND TRY_CAST({col} AS BIGINT) >= 0))"


def text_ok(col: str) -> str:
    """SQL: JSON field ``col`` is missing, null or a string."""
    return f"({is_null(col)} OR json_type({col}) = 'VARCHAR')"


def text_of(col: str) -> str:
    """SQL: JSON field ``col`` as text when it is a string, else NULL."""
    return f"CASE WHEN json_type({col}) = 'VARCHAR' THEN {col}->>'$' END"


def _opt(col: str, cast: str) -> str:
    """``col`` cast to ``cast`` (SQL NULL for JSON null), for a field that may be null."""
    return f"CASE WHEN NOT {is_null(col)} THEN TRY_CAST({col} AS {cast}) END"


_STREAM_SQL = f"""
SELECT coalesce({_INT_T} AND {number_ok("cumulative_api_cost_usd")}
                AND {int_ok("cumulative_solved")} AND {number_ok("cost_per_solved")}, false)
       AS ok,
       TRY_CAST(t AS BIGINT) AS t, TRY_CAST(cumulative_api_cost_usd AS DOUBLE)
       AS cumulative_api_cost_usd, TRY_CAST(cumulative_solved AS BIGINT) AS cumulative_solved,
       TRY_CAST(cost_per_solved AS DOUBLE) AS cost_per_solved
FROM read_json(?, format='newline_delimited', columns={{
    't': 'JSON', 'cumulative_api_cost_usd': 'JSON', 'cumulative_solved': 'JSON',
    'cost_per_solved': 'JSON'}})
"""

_PROBLEMS_SQL = f"""
SELECT coalesce({_INT_T} AND json_type(solved) = 'BOOLEAN'
                AND ({is_null("attempt_success_rate")} OR {number_ok("attempt_success_rate")})
                AND ({is_null("tokens_total")} OR {int_ok("tokens_total")})
                AND ({is_null("latency_total_ms")} OR {number_ok("latency_total_ms")}), false)
       AS ok,
       TRY_CAST(t AS BIGINT) AS t, TRY_CAST(solved AS BOOLEAN) AS solved,
       {_opt("attempt_success_rate", "DOUBLE")} AS attempt_success_rate,
       {_opt("tokens_total", "BIGINT")} AS tokens_total,
       {_opt("latency_total_ms", "DOUBLE")} AS latency_total_ms
FROM read_json(?, format='newline_delimited', columns={{
    't': 'JSON', 'solved': 'JSON', 'attempt_success_rate': 'JSON', 'tokens_total': 'JSON',
    'latency_total_ms': 'JSON'}})
"""

_EVENTS_SQL = f"""
WITH raw AS (
    SELECT CASE WHEN metadata.t IS NULL OR json_type(metadata.t) = 'NULL' THEN t
                ELSE metadata.t END AS t,
           component, cost_usd
    FROM read_json(?, format='newline_delimited', columns={{
        't': 'JSON', 'component': 'JSON', 'cost_usd': 'JSON', 'metadata': 'STRUCT(t JSON)'}})
)
SELECT coalesce({_INT_T} AND {number_ok("cost_usd")}, false) AS ok,
       TRY_CAST(t AS BIGINT) AS t,
       coalesce(json_type(component) = 'VARCHAR' AND component->>'$' = 'pipeline', false)
       AS pipeline, TRY_CAST(cost_usd AS DOUBLE) AS cost_usd
FROM raw
"""


# Lines DuckDB reads and the plain reader refuses: NaN/Infinity, trailing commas, numbers too
# big for a double (1e400, 400 digits: DuckDB reads inf or a huge int), and (a line over 2 KiB
# with more than 1,024 opening brackets) nesting that may be deeper than the 1,024 levels a
# log line may have. Found anywhere in a line (inside strings too), the file goes to the plain
# reader, which knows. DuckDB scans the lines as plain text, in parallel and without holding
# the GIL: a few times faster than searching the bytes from Python.
_LENIENT_LINES_SQL: Final = r"""
SELECT count(*) FROM read_csv(?, columns = {'line': 'VARCHAR'}, delim = '\x01', quote = '',
    escape = '', header = false, auto_detect = false, new_line = '\n')
WHERE contains(line, 'NaN') OR contains(line, 'Infinity')
    OR regexp_matches(line, ',[ \t\r]*[}\]]')
    OR regexp_matches(line, '[0-9][eE]\+?[0-9]{3}') OR regexp_matches(line, '[0-9]{300}')
    OR (length(line) > 2 * 1024
        AND length(line) - length(replace(replace(line, '[', ''), '{', '')) > 1024)
"""


def strict_json_only(path: str) -> bool:
    """False when ``path`` may hold JSON that DuckDB accepts and the plain reader rejects, or
    cannot be read (the plain reader then says what is wrong with it)."""
    try:
        if os.stat(path).st_size == 0:
            return True
    except OSError:
        return False
    con = duckdb.connect(":memory:")
    try:
        row = con.execute(_LENIENT_LINES_SQL, [path]).fetchone()
    except duckdb.Error:
        return False  # a file DuckDB cannot scan as lines: the plain reader decides
    finally:
        con.close()
    return row is not None and row[0] == 0


def read_inputs(
    stream: str, problems: str | None, events: str | None, *, show: bool = False
) -> tuple[list[StreamRow], list[ProblemRow] | None, list[EventRow] | None]:
    """The records of the given files, as the plain reader gives them (see the module docs)."""
    jobs: list[tuple[str, str | None, str, Callable[[dict[str, Any]], Any]]] = [
        ("stream", stream, _STREAM_SQL, stream_fields),
        ("problems", problems, _PROBLEMS_SQL, problem_fields),
        ("events", events, _EVENTS_SQL, event_fields),
    ]
    con = duckdb.connect(":memory:")
    # The byte scan for lenient JSON runs beside DuckDB's reads, which release the GIL.
    pool = ThreadPoolExecutor(1, thread_name_prefix="ampmeter-scan")
    try:
        strict = {path: pool.submit(strict_json_only, path) for _, path, _, _ in jobs if path}
        out: list[Any] = []
        with progress(con, show) as read:
            for label, path, sql, fields in jobs:
                records = None
                if path and readable(path):
                    records = read(label, functools.partial(_read, con, path, sql))
                if path and (records is None or not strict[path].result()):
                    # the plain reader names the bad line, or reads a cut-off last line
                    records = read_records(path, fields)
                out.append(records)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        con.close()
    return out[0], out[1], out[2]


def readable(path: str) -> bool:
    """Whether DuckDB may be given ``path``: it expands glob characters, so a name holding one
    could read another file (``a[1].jsonl`` reads ``a1.jsonl``); such a file is the plain
    reader's."""
    return not any(c in path for c in "*?[{")


def _read(con: duckdb.DuckDBPyConnection, path: str, sql: str) -> list[Any] | None:
    """The records ``sql`` reads when it vouches for every one of them; None when it does not
    (a record breaks the contract: the plain reader names its line, and it is the authority
    should it accept what the checks rejected)."""
    try:
        con.execute(f"CREATE OR REPLACE TEMP TABLE records AS {sql}", [path])
    except duckdb.Error:
        return None
    (all_ok,) = con.execute("SELECT coalesce(bool_and(ok), true) FROM records").fetchone() or (
        False,
    )
    if not all_ok:
        return None
    return con.execute("SELECT * EXCLUDE (ok) FROM records ORDER BY rowid").fetchall()


Reader = Callable[[str, Callable[[], Any]], Any]
"""Runs one labelled DuckDB read and gives its result."""


@contextlib.contextmanager
def progress(con: duckdb.DuckDBPyConnection, enabled: bool) -> Iterator[Reader]:
    """Runs DuckDB reads; when ``enabled``, each on a worker thread under a rich progress bar
    on stderr that follows the query's own progress."""
    if not enabled:
        yield lambda label, job: job()
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(
        TextColumn("reading {task.description}", markup=False),
        BarColumn(),
        TextColumn("{task.percentage:>5.1f}%"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )

    def run(label: str, job: Callable[[], Any]) -> Any:
        task = bar.add_task(label, total=100.0)
        future = worker.submit(job)
        while not wait([future], timeout=0.1).done:
            try:
                done = float(con.query_progress())
            except duckdb.Error:
                done = -1.0
            if done >= 0:
                bar.update(task, completed=min(done, 100.0))
        bar.update(task, completed=100.0)
        return future.result()

    with bar, ThreadPoolExecutor(1, thread_name_prefix="ampmeter-duckdb-read") as worker:
        yield run
