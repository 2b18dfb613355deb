"""One row per run (calls, tokens, cost, amplification, context growth, depth, termination)
and the p50/p95 of every numeric column across runs."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ampmeter.analysis.amortization import Engine, use_duckdb
from ampmeter.analysis.digest import RunDigest, digest_logs
from ampmeter.analysis.quantiles import percentile
from ampmeter.analysis.run_summary import NUMERIC_COLUMNS, RunSummary, termination_of
from ampmeter.analysis.runs import Run

__all__ = [
    "NUMERIC_COLUMNS",
    "RunSummary",
    "SummaryTable",
    "summarize",
    "summarize_run",
    "summary_table",
    "termination_of",
]


@dataclass(frozen=True, slots=True)
class SummaryTable:
    """Per-run rows and, for every numeric column, its ``p50`` and ``p95`` across runs."""

    runs: list[RunSummary]
    across: dict[str, dict[str, float | None]] = field(default_factory=dict)

    def rows(self) -> list[dict[str, Any]]:
        """The per-run rows as dicts."""
        return [r.to_dict() for r in self.runs]


def summarize_run(run: Run) -> RunSummary:
    """The summary row of one run (the report's digest of its calls: one definition)."""
    digest = RunDigest(run.run_id)
    for call in run.calls:
        digest.add(call, keep=False)
    digest.finish()
    return digest.summary()


def summarize(
    paths: Iterable[str | os.PathLike[str]],
    *,
    engine: Engine = "auto",
    best_effort: bool = False,
    progress: bool = False,
) -> SummaryTable:
    """Summarize the runs in TokenTracker logs (runs are told apart by ``run_id``).

    Reading and its errors follow :func:`ampmeter.analysis.runs.load_runs` (a missing path
    raises ``FileNotFoundError``).

    ``engine="duckdb"`` (or ``"auto"`` on inputs over :data:`DUCKDB_THRESHOLD_BYTES`, when
    duckdb is installed) reads the logs with DuckDB and gives identical rows; a log
    it cannot read exactly is read again by the plain reader, which reports the precise error.
    ``progress`` shows a progress bar on stderr while DuckDB reads.
    """
    names = [os.fspath(p) for p in paths]
    runs: list[RunSummary] | None = None
    if use_duckdb(engine, best_effort, names, auto=True):
        from ampmeter.analysis._duck_summary import summarize_runs

        runs = summarize_runs(names, show=progress)
    if runs is None:  # one streaming pass, in bounded memory, as the report reads
        digest = digest_logs(names, best_effort=best_effort, detail_budget=0)
        runs = [run.summary() for run in digest.runs]
    return summary_table(runs)


def summary_table(runs: list[RunSummary]) -> SummaryTable:
    """The table of ``runs`` with the p50 and p95 of every numeric column across them."""
    across: dict[str, dict[str, float | None]] = {}
    for name in NUMERIC_COLUMNS:
        values = sorted(float(getattr(r, name)) for r in runs)
        across[name] = {"p50": percentile(values, 50.0), "p95": percentile(values, 95.0)}
    return SummaryTable(runs, across)
