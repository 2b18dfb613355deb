"""The DuckDB engine of :func:`ampmeter.analysis.summarize`: the same rows, read in parallel.

DuckDB reads the fields the summary needs into a table, in log order (one insert per file,
so ``rowid`` is the event's position across all files); SQL groups the runs, adds up their
columns (floats one by one in log order, as the plain path adds them, so every value is
identical, not merely close) and finds every call's depth by pointer jumping.

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
import orjson

from ampmeter.analysis._duck import (
    Progress,
    count_ok,
    is_null,
    number_ok,
    strict_json_only,
    text_of,
    text_ok,
)
from ampmeter.analysis.lineage import is_own_stop, run_name
from ampmeter.analysis.run_summary import RunSummary, termination_of
from ampmeter.analysis.runs import call_depths
from ampmeter.logs.events import MAX_COST_USD

__all__ = ["summarize_runs"]

_HALT, _FAIL = 1, 2

_CREATE: Final = """
CREATE TABLE ev (
    run_id VARCHAR, kind TINYINT, span_id VARCHAR, parent_id VARCHAR,
    status TINYINT, tokens_in BIGINT, tokens_out BIGINT, cost DOUBLE, unpriced BOOLEAN,
    unsettled BOOLEAN, estimated BOOLEAN, retries BIGINT, stop_reason VARCHAR, error_class VARCHAR,
    termination VARCHAR, contexts VARCHAR, other_process BOOLEAN, ok BOOLEAN
)
"""

# kind: 1 llm, 2 tool, 0 anything else (KIND_OF_EVENT maps llm_completion/tool_call; the
# names "llm" and "tool" themselves pass through unchanged).
_INSERT: Final = f"""
INSERT INTO ev SELECT
    {text_of("run_id")},
    CASE WHEN json_type(event_type) <> 'VARCHAR' THEN 0
         WHEN event_type->>'$' IN ('llm_completion', 'llm') THEN 1
         WHEN event_type->>'$' IN ('tool_call', 'tool') THEN 2 ELSE 0 END,
    {text_of("span_id")},
    {text_of("parent_id")},
    CASE WHEN json_type(metadata.status) <> 'VARCHAR' THEN 0
         WHEN metadata.status->>'$' = 'halt' THEN {_HALT}
         WHEN metadata.status->>'$' = 'fail' THEN {_FAIL} ELSE 0 END,
    coalesce(TRY_CAST(usage.prompt_tokens AS BIGINT), 0),
    coalesce(TRY_CAST(usage.completion_tokens AS BIGINT), 0),
    TRY_CAST(cost_usd AS DOUBLE),
    coalesce({text_of("metadata.cost_status")} = 'unpriced', false),
    coalesce({text_of("metadata.cost_status")} = 'unsettled', false),
    coalesce({text_of("metadata.cost_status")} = 'estimated', false),
    coalesce(TRY_CAST(metadata.retries_used AS BIGINT), 0),
    {text_of("metadata.stop_reason")},
    {text_of("metadata.error_class")},
    {text_of("metadata.termination_reason")},
    CASE WHEN json_type(metadata.contexts) = 'ARRAY' THEN metadata.contexts::VARCHAR END,
    coalesce(json_type(metadata.pid) <> 'NULL', false),
    coalesce(
        json_type(run_id) = 'VARCHAR' AND json_type(event_type) = 'VARCHAR'
        AND json_type(span_id) = 'VARCHAR' AND {text_ok("parent_id")}
        AND usage IS NOT NULL AND {count_ok("usage.prompt_tokens")}
        AND {count_ok("usage.completion_tokens")} AND {count_ok("usage.total_tokens")}
        AND {count_ok("usage.tokens_saved")}
        AND {number_ok("cost_usd")} AND TRY_CAST(cost_usd AS DOUBLE) BETWEEN 0 AND {MAX_COST_USD}
        AND ({is_null("latency_ms")}
             OR ({number_ok("latency_ms")} AND TRY_CAST(latency_ms AS DOUBLE) >= 0))
        AND {count_ok("metadata.retries_used")} AND {text_ok("metadata.stop_reason")}
        AND {text_ok("metadata.error_class")},
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
       -- floats added one by one in log order, as the plain path adds them
       coalesce(sum(cost ORDER BY rowid) FILTER (WHERE NOT unpriced), 0.0) AS cost,
       coalesce(sum(cost ORDER BY rowid) FILTER (WHERE unsettled), 0.0) AS unsettled_cost,
       coalesce(sum(cost ORDER BY rowid) FILTER (WHERE estimated), 0.0) AS estimated_cost,
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
           kind = 1 AND NOT (status = 1 AND tokens_in = 0 AND tokens_out = 0) AS sent
    FROM ev
) GROUP BY run_id
"""

# Every event's parent row, by pointer jumping in SQL (each step doubles how far a row has
# climbed): ``up`` is -1 for no parent, -2 for a parent that is not in the run's log. A span id
# seen twice resolves to its last row, as in the plain path; such runs are redone by
# call_depths, and so are runs still climbing at the end (a cycle).
_LINKS: Final = """
CREATE OR REPLACE TEMP TABLE links AS
WITH spans AS (SELECT run_id, span_id, max(rowid) AS row FROM ev GROUP BY run_id, span_id)
SELECT e.rowid AS row, CASE WHEN e.parent_id IS NULL THEN -1 ELSE coalesce(s.row, -2) END AS up,
       1::BIGINT AS dist
FROM ev e LEFT JOIN spans s ON s.run_id = e.run_id AND s.span_id = e.parent_id
"""

_JUMP: Final = """
CREATE OR REPLACE TEMP TABLE links AS
SELECT l.row, CASE WHEN l.up >= 0 THEN u.up ELSE l.up END AS up,
       l.dist + CASE WHEN l.up >= 0 THEN u.dist ELSE 0 END AS dist
FROM links l LEFT JOIN links u ON u.row = l.up
"""

# 1 + the parent's depth: 1 for a call without a parent, 2 under a parent not in the log.
_RUN_ROWS: Final = """
WITH depth AS (SELECT row, dist + (up = -2)::BIGINT AS depth FROM links),
per_run AS (
    SELECT e.run_id, max(d.depth) AS max_depth, max(e.rowid) FILTER (WHERE d.depth = 1) AS top
    FROM ev e JOIN depth d ON d.row = e.rowid GROUP BY e.run_id
)
SELECT r.run_id, r.llm, r.tool, r.retries, r.tokens_in, r.tokens_out, r.unpriced, r.halted,
       r.failed, t.termination, r.completions, f.tokens_in, l.tokens_in, r.refused,
       r.llm_refused, r.cost, r.unsettled_cost, r.estimated_cost, p.max_depth,
       coalesce(top.status = {fail}, false), top.error_class, top.rowid IS NOT NULL
FROM runs r
JOIN per_run p ON p.run_id = r.run_id
LEFT JOIN ev t ON t.rowid = r.term_row
LEFT JOIN ev f ON f.rowid = r.first_completion
LEFT JOIN ev l ON l.rowid = r.last_completion
LEFT JOIN ev top ON top.rowid = p.top
ORDER BY r.idx
""".replace("{fail}", str(_FAIL))

# What the run's name and its own stop are read from (analysis.lineage, in Python): every
# event's lineage until a run's name is found, and every stopped call's.
_LINEAGES: Final = """
SELECT r.idx, e.status = 1, e.stop_reason, e.contexts, e.other_process
FROM ev e JOIN runs r USING (run_id)
WHERE e.contexts IS NOT NULL OR e.status = 1
ORDER BY e.rowid
"""

_DAMAGED: Final = """
SELECT DISTINCT r.idx FROM (SELECT run_id FROM ev GROUP BY run_id, span_id HAVING count(*) > 1)
JOIN runs r USING (run_id)
UNION
SELECT DISTINCT r.idx FROM links l JOIN ev e ON e.rowid = l.row JOIN runs r USING (run_id)
WHERE l.up >= 0
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
        return _rows(con, total)
    finally:
        con.close()


def _rows(con: duckdb.DuckDBPyConnection, total: int) -> list[RunSummary]:
    con.execute(_LINKS)
    for _ in range(max(1, total).bit_length() + 2):
        if not con.execute("SELECT count(*) FROM links WHERE up >= 0").fetchone()[0]:  # type: ignore[index]
            break
        con.execute(_JUMP)
    damaged = {idx for (idx,) in con.execute(_DAMAGED).fetchall()}
    names, own_stops = _lineages(con)
    out = []
    for i, row in enumerate(con.execute(_RUN_ROWS).fetchall()):
        run_id, llm, tool, retries, t_in, t_out, unpriced, halted, failed, reason = row[:10]
        completions, first_in, last_in, refused, llm_refused, cost, unsettled, estimated = row[
            10:18
        ]
        max_depth, top_failed, top_error, has_top = row[18:]
        if i in damaged:
            max_depth, top_failed, top_error, has_top = _damaged_depths(con, i)
        top = ("fail" if top_failed else "other", top_error) if has_top else ("", None)
        termination, stop_reason = termination_of(reason, own_stops.get(i), top)
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
                cost_usd=cost,
                unpriced_calls=unpriced,
                unsettled_cost_usd=unsettled,
                estimated_cost_usd=estimated,
                llm_calls_per_root=float(llm),
                tool_calls_per_root=float(tool),
                retries_per_root=float(int(retries)),
                base_context=first_in if completions else 0,
                context_growth_avg=(last_in - first_in) / (completions - 1)
                if completions >= 2
                else 0.0,
                max_depth=int(max_depth),
                halted=halted,
                failed=failed,
                termination=termination,
                stop_reason=stop_reason,
            )
        )
    return out


def _damaged_depths(con: duckdb.DuckDBPyConnection, run: int) -> tuple[int, bool, str | None, bool]:
    """Depth, and the last top-level call, of a run whose call tree is damaged (a span id seen
    twice, a cycle), by the plain path's own rules (:func:`call_depths`)."""
    events = con.execute(
        "SELECT e.span_id, e.parent_id, e.status, e.error_class FROM ev e "
        "JOIN runs r USING (run_id) WHERE r.idx = ? ORDER BY e.rowid",
        [run],
    ).fetchall()
    depths = call_depths([e[0] for e in events], [e[1] for e in events])
    tops = [i for i, depth in enumerate(depths) if depth == 1]
    if not tops:
        return max(depths, default=0), False, None, False
    _, _, status, error = events[tops[-1]]
    return max(depths), status == _FAIL, error, True


def _lineages(
    con: duckdb.DuckDBPyConnection,
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
