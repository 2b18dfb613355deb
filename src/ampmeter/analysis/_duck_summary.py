"""The DuckDB engine of :func:`ampmeter.analysis.summarize`: the same rows, read in parallel.

DuckDB reads the fields the summary needs into a table, in log order (one insert per file,
so ``rowid`` is the event's position across all files); SQL groups the runs and adds up their
integer columns; numpy computes every call's depth from a parent-row column by pointer jumping.
Floats are added by Python's own ``sum`` in log order, as the plain path does, so every value
is identical, not merely close.

The fast path only takes what it can read exactly. Any record it cannot vouch for (a field of
the wrong JSON type, a span id that is not a string, ``NaN``/``Infinity`` or a trailing comma,
which DuckDB accepts and the JSON reader does not, a cut-off last line, a file DuckDB cannot
open) makes :func:`summarize_runs` return None, and the caller reads everything again with the
plain reader: it either raises the precise ``file:line`` error or gives the rows by the
contract's rules. Runs whose call tree is damaged (a span id seen twice, a parent cycle) get
their depths from :func:`ampmeter.analysis.runs.call_depths`, the plain path's own rules.
"""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final

import duckdb
import numpy as np
import orjson

from ampmeter.analysis._duck import Progress, strict_json_only
from ampmeter.analysis.lineage import is_own_stop, run_name
from ampmeter.analysis.runs import call_depths
from ampmeter.analysis.summary import RunSummary, termination_of
from ampmeter.logs.events import MAX_COST_USD

__all__ = ["summarize_runs"]

_HALT, _FAIL = 1, 2

_COUNT = "('BIGINT', 'UBIGINT')"
_NUMBER = "('BIGINT', 'UBIGINT', 'DOUBLE')"


def _count_ok(col: str) -> str:
    # None / missing is 0; otherwise an int >= 0 that fits a BIGINT (else: the plain path)
    return (
        f"({col} IS NULL OR json_type({col}) = 'NULL' OR (json_type({col}) IN {_COUNT} "
        f"AND TRY_CAST({col} AS BIGINT) >= 0))"
    )


def _text_ok(col: str) -> str:
    return f"({col} IS NULL OR json_type({col}) IN ('NULL', 'VARCHAR'))"


def _text(col: str) -> str:
    return f"CASE WHEN json_type({col}) = 'VARCHAR' THEN {col}->>'$' END"


_CREATE: Final = """
CREATE TABLE ev (
    run_id VARCHAR, kind TINYINT, llm_completion BOOLEAN, span_id VARCHAR, parent_id VARCHAR,
    status TINYINT, tokens_in BIGINT, tokens_out BIGINT, cost DOUBLE, unpriced BOOLEAN,
    unsettled BOOLEAN, estimated BOOLEAN, retries BIGINT, stop_reason VARCHAR, error_class VARCHAR,
    termination VARCHAR, contexts VARCHAR, other_process BOOLEAN, ok BOOLEAN
)
"""

# kind: 1 llm, 2 tool, 0 anything else (KIND_OF_EVENT maps llm_completion/tool_call; the
# names "llm" and "tool" themselves pass through unchanged).
_INSERT: Final = f"""
INSERT INTO ev SELECT
    {_text("run_id")},
    CASE WHEN json_type(event_type) <> 'VARCHAR' THEN 0
         WHEN event_type->>'$' IN ('llm_completion', 'llm') THEN 1
         WHEN event_type->>'$' IN ('tool_call', 'tool') THEN 2 ELSE 0 END,
    coalesce(json_type(event_type) = 'VARCHAR' AND event_type->>'$' = 'llm_completion', false),
    {_text("span_id")},
    {_text("parent_id")},
    CASE WHEN json_type(metadata.status) <> 'VARCHAR' THEN 0
         WHEN metadata.status->>'$' = 'halt' THEN {_HALT}
         WHEN metadata.status->>'$' = 'fail' THEN {_FAIL} ELSE 0 END,
    coalesce(TRY_CAST(usage.prompt_tokens AS BIGINT), 0),
    coalesce(TRY_CAST(usage.completion_tokens AS BIGINT), 0),
    TRY_CAST(cost_usd AS DOUBLE),
    coalesce(json_type(metadata.cost_status) = 'VARCHAR'
             AND metadata.cost_status->>'$' = 'unpriced', false),
    coalesce(json_type(metadata.cost_status) = 'VARCHAR'
             AND metadata.cost_status->>'$' = 'unsettled', false),
    coalesce(json_type(metadata.cost_status) = 'VARCHAR'
             AND metadata.cost_status->>'$' = 'estimated', false),
    coalesce(TRY_CAST(metadata.retries_used AS BIGINT), 0),
    {_text("metadata.stop_reason")},
    {_text("metadata.error_class")},
    {_text("metadata.termination_reason")},
    CASE WHEN json_type(metadata.contexts) = 'ARRAY' THEN metadata.contexts::VARCHAR END,
    coalesce(json_type(metadata.pid) <> 'NULL', false),
    coalesce(
        json_type(run_id) = 'VARCHAR' AND json_type(event_type) = 'VARCHAR'
        AND json_type(span_id) = 'VARCHAR' AND {_text_ok("parent_id")}
        AND usage IS NOT NULL AND {_count_ok("usage.prompt_tokens")}
        AND {_count_ok("usage.completion_tokens")} AND {_count_ok("usage.total_tokens")}
        AND {_count_ok("usage.tokens_saved")}
        AND json_type(cost_usd) IN {_NUMBER} AND isfinite(TRY_CAST(cost_usd AS DOUBLE))
        AND TRY_CAST(cost_usd AS DOUBLE) BETWEEN 0 AND {MAX_COST_USD}
        AND (latency_ms IS NULL OR json_type(latency_ms) = 'NULL'
             OR (json_type(latency_ms) IN {_NUMBER}
                 AND isfinite(TRY_CAST(latency_ms AS DOUBLE))
                 AND TRY_CAST(latency_ms AS DOUBLE) >= 0))
        AND {_count_ok("metadata.retries_used")} AND {_text_ok("metadata.stop_reason")}
        AND {_text_ok("metadata.error_class")},
        false)
FROM read_json(?, format='newline_delimited', records=true, columns={{
    'run_id': 'JSON', 'event_type': 'JSON', 'span_id': 'JSON', 'parent_id': 'JSON',
    'usage': 'STRUCT(prompt_tokens JSON, completion_tokens JSON, total_tokens JSON,
                     tokens_saved JSON)',
    'cost_usd': 'JSON', 'latency_ms': 'JSON',
    'metadata': 'STRUCT(status JSON, cost_status JSON, retries_used JSON, stop_reason JSON,
                        error_class JSON, termination_reason JSON, contexts JSON, pid JSON)'}})
"""

# Runs in first-seen order, with their integer totals and the rows the termination needs.
_RUNS: Final = """
CREATE TABLE runs AS
SELECT run_id, row_number() OVER (ORDER BY min(rowid)) - 1 AS idx, min(rowid) AS first_row,
       count(*) FILTER (WHERE kind = 1) AS llm, count(*) FILTER (WHERE kind = 2) AS tool,
       sum(retries) AS retries, sum(tokens_in) AS tokens_in, sum(tokens_out) AS tokens_out,
       count(*) FILTER (WHERE unpriced) AS unpriced,
       count(*) FILTER (WHERE status = 1 AND kind IN (1, 2)) AS halted,
       count(*) FILTER (WHERE status = 1 AND kind IN (1, 2) AND tokens_in = 0
                        AND tokens_out = 0) AS refused,
       count(*) FILTER (WHERE status = 1 AND kind = 1 AND tokens_in = 0
                        AND tokens_out = 0) AS llm_refused,
       count(*) FILTER (WHERE status = 2) AS failed,
       min(rowid) FILTER (WHERE status = 1) AS halt_row,
       max(rowid) FILTER (WHERE termination IS NOT NULL) AS term_row,
       count(*) FILTER (WHERE sent) AS completions,
       min(rowid) FILTER (WHERE sent) AS first_completion,
       max(rowid) FILTER (WHERE sent) AS last_completion
FROM (
    -- Per-call metrics: completions that were sent (ampmeter.metrics.was_sent, in SQL).
    SELECT *, rowid AS rowid,
           llm_completion AND NOT (status = 1 AND tokens_in = 0 AND tokens_out = 0) AS sent
    FROM ev
) GROUP BY run_id
"""

_RUN_ROWS: Final = """
SELECT r.run_id, r.llm, r.tool, r.retries, r.tokens_in, r.tokens_out, r.unpriced, r.halted,
       r.halt_row IS NOT NULL, r.failed, h.stop_reason, t.termination, r.completions,
       f.tokens_in, l.tokens_in, r.refused, r.llm_refused
FROM runs r
LEFT JOIN ev h ON h.rowid = r.halt_row
LEFT JOIN ev t ON t.rowid = r.term_row
LEFT JOIN ev f ON f.rowid = r.first_completion
LEFT JOIN ev l ON l.rowid = r.last_completion
ORDER BY r.idx
"""

# One row per event in log order: its run, cost, status and the row of its parent (-1: no
# parent, -2: a parent that is not in the run's log). A span id seen twice resolves to its
# last row, as in the plain path; such runs are flagged and redone by call_depths.
_EVENT_COLUMNS: Final = """
WITH spans AS (
    SELECT run_id, span_id, max(rowid) AS row, count(*) AS n FROM ev GROUP BY run_id, span_id
)
SELECT r.idx::INTEGER AS run, e.cost, e.unpriced, e.unsettled, e.estimated, e.status,
       CASE WHEN e.parent_id IS NULL THEN -1 ELSE coalesce(s.row, -2) END::BIGINT AS parent
FROM ev e
JOIN runs r ON r.run_id = e.run_id
LEFT JOIN spans s ON s.run_id = e.run_id AND s.span_id = e.parent_id
ORDER BY e.rowid
"""

# What the run's name and its own stop are read from (analysis.lineage, in Python): every
# event's lineage until a run's name is found, and every stopped call's.
_LINEAGES: Final = """
SELECT r.idx, e.status = 1, e.stop_reason, e.contexts, e.other_process
FROM ev e JOIN runs r USING (run_id)
WHERE e.contexts IS NOT NULL OR e.status = 1
ORDER BY e.rowid
"""

_DUPLICATED: Final = """
SELECT DISTINCT r.idx FROM (SELECT run_id FROM ev GROUP BY run_id, span_id HAVING count(*) > 1)
JOIN runs r USING (run_id)
"""


def summarize_runs(paths: list[str], *, progress: bool = False) -> list[RunSummary] | None:
    """The summary rows of the runs in ``paths`` (see the module docs); None when a file must
    be read by the plain reader instead."""
    con = duckdb.connect(":memory:")
    try:
        con.execute(_CREATE)
        # DuckDB would expand glob characters to other files
        if any(c in path for path in paths for c in "*?[{"):
            return None
        # The byte scan runs beside DuckDB's reads, which release the GIL.
        with ThreadPoolExecutor(1, thread_name_prefix="ampmeter-scan") as pool:
            strict = [pool.submit(strict_json_only, path) for path in paths]
            with Progress(con, progress, len(paths)) as bar:
                for path in paths:
                    try:
                        bar.run(path, functools.partial(con.execute, _INSERT, [path]))
                    except duckdb.Error:
                        return None
            try:
                if not all(job.result() for job in strict):
                    return None
            except OSError:
                return None
        total, bad, last = con.execute(
            "SELECT count(*), count(*) FILTER (WHERE NOT ok), max(rowid) FROM ev"
        ).fetchone() or (0, 0, None)
        if bad or (total and last != total - 1):
            return None
        con.execute(_RUNS)
        return _rows(con)
    finally:
        con.close()


def _rows(con: duckdb.DuckDBPyConnection) -> list[RunSummary]:
    runs = con.execute(_RUN_ROWS).fetchall()
    if not runs:
        return []
    cols = con.execute(_EVENT_COLUMNS).fetchnumpy()
    run = np.asarray(cols["run"], dtype=np.int64)
    depth = _depths(con, run, np.asarray(cols["parent"], dtype=np.int64), len(runs))
    count = len(runs)
    max_depth = np.zeros(count, dtype=np.int64)
    np.maximum.at(max_depth, run, depth)
    rows = np.arange(len(run), dtype=np.int64)
    top = depth == 1
    last_top = np.full(count, -1, dtype=np.int64)
    np.maximum.at(last_top, run[top], rows[top])
    status = np.asarray(cols["status"])
    cost = np.asarray(cols["cost"])
    costs = _costs_of(run, cost, ~np.asarray(cols["unpriced"]), count)
    unsettled = _costs_of(run, cost, np.asarray(cols["unsettled"]), count)
    estimated = _costs_of(run, cost, np.asarray(cols["estimated"]), count)
    failed_tops = [int(r) for r in last_top if r >= 0 and status[r] == _FAIL]
    errors = (
        dict(
            con.execute(
                "SELECT rowid, error_class FROM ev WHERE rowid IN (SELECT unnest(?::BIGINT[]))",
                [failed_tops],
            ).fetchall()
        )
        if failed_tops
        else {}
    )
    names, own_stops = _lineages(con, count)
    out = []
    for i, row in enumerate(runs):
        run_id, llm, tool, retries, t_in, t_out, unpriced, halted, _, failed = row[:10]
        _, reason, completions, first_in, last_in, refused, llm_refused = row[10:]
        top_row = int(last_top[i])
        top_status = "" if top_row < 0 else "fail" if status[top_row] == _FAIL else "other"
        termination, stop_reason = termination_of(
            reason, own_stops.get(i), (top_status, errors.get(top_row))
        )
        out.append(
            RunSummary(
                run_id=run_id,
                name=names.get(i),
                llm_calls=llm,
                llm_sent=llm - llm_refused,
                refused_calls=refused,
                tool_calls=tool,
                retries=int(retries),
                tokens_in=int(t_in),
                tokens_out=int(t_out),
                cost_usd=costs[i],
                unpriced_calls=unpriced,
                unsettled_cost_usd=unsettled[i],
                estimated_cost_usd=estimated[i],
                llm_calls_per_root=float(llm),
                tool_calls_per_root=float(tool),
                retries_per_root=float(int(retries)),
                base_context=first_in if completions else 0,
                context_growth_avg=(last_in - first_in) / (completions - 1)
                if completions >= 2
                else 0.0,
                max_depth=int(max_depth[i]),
                halted=halted,
                failed=failed,
                termination=termination,
                stop_reason=stop_reason,
            )
        )
    return out


def _lineages(
    con: duckdb.DuckDBPyConnection, count: int
) -> tuple[dict[int, str | None], dict[int, tuple[str | None]]]:
    """Each run's name and its first stop by its own ceiling, by the plain path's rules
    (:func:`~ampmeter.analysis.lineage.run_name`, :func:`~ampmeter.analysis.lineage.is_own_stop`)
    applied to the lineages DuckDB read."""
    metadatas: dict[int, list[dict[str, Any]]] = {}
    own_stops: dict[int, tuple[str | None]] = {}
    for run, halted, stop, contexts, other in con.execute(_LINEAGES).fetchall():
        meta: dict[str, Any] = {}
        if contexts is not None:
            meta["contexts"] = orjson.loads(contexts)
        if other:
            meta["pid"] = True
        if contexts is not None:
            metadatas.setdefault(run, []).append(meta)
        if halted and run not in own_stops and is_own_stop(meta, stop):
            own_stops[run] = (stop,)
    names = {run: run_name(found) for run, found in metadatas.items()}
    return names, own_stops


def _costs_of(run: Any, cost: Any, keep: Any, count: int) -> list[float]:
    """Each run's cost of the events ``keep`` marks (its priced, unsettled, estimated ones),
    added in log order by Python's ``sum`` (as the plain path)."""
    order = np.argsort(run[keep], kind="stable")
    values = cost[keep][order].tolist()
    ends = np.cumsum(np.bincount(run[keep], minlength=count)).tolist()
    out, start = [], 0
    for end in ends:
        out.append(sum(values[start:end], 0.0))
        start = end
    return out


def _depths(con: duckdb.DuckDBPyConnection, run: Any, parent: Any, count: int) -> Any:
    """Every event's depth: 1 + the parent's depth (0 without a parent, 1 for a parent not in
    the log), by pointer jumping; runs with a duplicated span id or a cycle by call_depths."""
    dist = np.ones(len(parent), dtype=np.int64)
    nxt = parent.copy()
    for _ in range(max(1, len(parent)).bit_length() + 2):
        active = np.flatnonzero(nxt >= 0)
        if not active.size:
            break
        up = nxt[active]
        dist[active] += dist[up]
        nxt[active] = nxt[up]
    depth = dist + (nxt == -2)
    redo = {int(r) for r in np.unique(run[nxt >= 0])}  # still climbing: a cycle
    redo.update(int(r) for (r,) in con.execute(_DUPLICATED).fetchall())
    if redo:
        for r in sorted(redo):
            spans = con.execute(
                "SELECT e.span_id, e.parent_id FROM ev e JOIN runs r USING (run_id) "
                "WHERE r.idx = ? ORDER BY e.rowid",
                [r],
            ).fetchall()
            rows = np.flatnonzero(run == r)
            depth[rows] = call_depths([s for s, _ in spans], [p for _, p in spans])
    return depth
