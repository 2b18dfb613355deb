"""The DuckDB engine of :func:`ampmeter.analysis.summarize`: the same rows, read in parallel.

DuckDB reads the fields the summary needs into a table, in log order (one insert per file,
so ``rowid`` is the event's position across all files); SQL groups the runs and adds up their
columns (floats one by one in log order, as the plain path adds them, so every value is
identical, not merely close). The totals then fill the plain path's own
:class:`~ampmeter.analysis.digest.RunDigest`, which places each event in its run's call tree
and lineage in log order and gives the summary row: one definition of a run's row, damaged
trees (a span id seen twice, a cycle) included.

The fast path only takes what it can read exactly. Any record it cannot vouch for (a field of
the wrong JSON type, a span id that is not a string, ``NaN``/``Infinity`` or a trailing comma,
which DuckDB accepts and the JSON reader does not, a cut-off last line, a file DuckDB cannot
open) makes :func:`summarize_runs` return None, and the caller reads everything again with the
plain reader: it either raises the precise ``file:line`` error or gives the rows by the
contract's rules.
"""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final

import duckdb
import orjson

from ampmeter.analysis._duck import (
    count_ok,
    is_null,
    number_ok,
    progress,
    readable,
    strict_json_only,
    text_of,
    text_ok,
)
from ampmeter.analysis.digest import RunDigest
from ampmeter.analysis.run_summary import RunSummary
from ampmeter.analysis.runs import STATUS_OF
from ampmeter.logs.events import MAX_COST_USD

__all__ = ["summarize_runs"]

_HALT, _FAIL = 1, 2
_STATUS_WORDS: Final = {_HALT: "halt", _FAIL: "fail"}
# The status as the plain path reads it (call_from_event): metadata's, else the event's own,
# with other producers' words for a failure (STATUS_OF) counted as one.
_STATUS: Final = "coalesce(metadata.status, status)"
_FAILED: Final = str(("fail", *(word for word, status in STATUS_OF.items() if status == "fail")))
_BATCH: Final = 10_000  # rows fetched at a time

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
    CASE WHEN json_type({_STATUS}) <> 'VARCHAR' THEN 0
         WHEN {_STATUS}->>'$' = 'halt' THEN {_HALT}
         WHEN {_STATUS}->>'$' IN {_FAILED} THEN {_FAIL} ELSE 0 END,
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
    'status': 'JSON',
    'usage': 'STRUCT(prompt_tokens JSON, completion_tokens JSON, total_tokens JSON,
                     tokens_saved JSON)',
    'cost_usd': 'JSON', 'latency_ms': 'JSON',
    'metadata': 'STRUCT(status JSON, cost_status JSON, retries_used JSON, stop_reason JSON,
                        error_class JSON, termination_reason JSON, contexts JSON, pid JSON)'}})
"""

# Runs in first-seen order, with their integer totals and the rows the termination needs.
_RUNS: Final = """
CREATE TABLE runs AS
SELECT run_id, row_number() OVER (ORDER BY min(rowid)) - 1 AS idx,
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

# The run's row with the events its termination and context growth are read from.
_RUN_ROWS: Final = """
SELECT r.run_id, r.llm AS llm_calls, r.llm - r.llm_refused AS llm_sent,
       r.refused AS stopped_unsent, r.tool AS tool_calls, r.retries, r.tokens_in, r.tokens_out,
       r.cost AS cost_usd, r.unpriced AS unpriced_calls, r.unsettled_cost AS unsettled_cost_usd,
       r.estimated_cost AS estimated_cost_usd, r.halted, r.failed, r.completions,
       coalesce(f.tokens_in, 0) AS first_completion_in,
       coalesce(l.tokens_in, 0) AS last_completion_in, t.termination AS termination_reason
FROM runs r
LEFT JOIN ev t ON t.rowid = r.term_row
LEFT JOIN ev f ON f.rowid = r.first_completion
LEFT JOIN ev l ON l.rowid = r.last_completion
ORDER BY r.idx
"""

# Every event's place in its run's tree and its lineage, in log order.
_TREES: Final = """
SELECT r.idx, e.span_id, e.parent_id, e.status, e.error_class, e.stop_reason, e.contexts,
       e.other_process
FROM ev e JOIN runs r USING (run_id)
ORDER BY e.rowid
"""


def summarize_runs(paths: list[str], *, show: bool = False) -> list[RunSummary] | None:
    """The summary rows of the runs in ``paths`` (see the module docs); None when a file must
    be read by the plain reader instead."""
    con = duckdb.connect(":memory:")
    try:
        con.execute(_CREATE)
        if not all(map(readable, paths)):
            return None
        # The byte scan runs beside DuckDB's reads, which release the GIL.
        with ThreadPoolExecutor(1, thread_name_prefix="ampmeter-scan") as pool:
            strict = [pool.submit(strict_json_only, path) for path in paths]
            with progress(con, show) as read:
                for path in paths:
                    try:
                        read(path, functools.partial(con.execute, _INSERT, [path]))
                    except duckdb.Error:
                        return None
            if not all(job.result() for job in strict):
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
    """Each run's counts from SQL, and its tree, name and own stop from its events in log
    order, in the plain path's :class:`~ampmeter.analysis.digest.RunDigest`, whose summary
    row is then the one both engines give."""
    result = con.execute(_RUN_ROWS)  # columns named as RunDigest's fields
    names = [column[0] for column in result.description]
    runs = [RunDigest(**dict(zip(names, row, strict=True))) for row in result.fetchall()]
    cursor = con.execute(_TREES)
    while rows := cursor.fetchmany(_BATCH):
        for index, span, parent, status, error, stop, contexts, other in rows:
            meta: dict[str, Any] = {}
            if contexts is not None:
                meta["contexts"] = orjson.loads(contexts)
            if other:
                meta["pid"] = True
            run = runs[index]
            run.contexts.add_root(meta)
            run.place(span, parent, _STATUS_WORDS.get(status, "success"), error, meta, stop)
    for run in runs:
        run.finish()
    return [run.summary() for run in runs]
