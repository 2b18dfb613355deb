"""One row per run (calls, tokens, cost, amplification, context growth, depth, termination)
and the p50/p95 of every numeric column across runs."""

from __future__ import annotations

import functools
import operator
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Final

from ampmeter.analysis.amortization import Engine, use_duckdb
from ampmeter.analysis.lineage import is_own_stop, run_name
from ampmeter.analysis.quantiles import percentile
from ampmeter.analysis.runs import Call, Run, is_estimated, is_unsettled, load_runs
from ampmeter.metrics import TaskResult

__all__ = [
    "NUMERIC_COLUMNS",
    "RunSummary",
    "SummaryTable",
    "refused",
    "summarize",
    "summarize_run",
    "summary_table",
    "termination_of",
]


@dataclass(frozen=True, slots=True)
class RunSummary:
    """What one run did. ``cost_usd`` is the priced cost; ``unpriced_calls`` counts calls whose
    cost could not be priced (their cost is unknown, not zero); ``unsettled_cost_usd`` is the
    part of ``cost_usd`` charged at a reservation: calls in flight when stopped, holds of workers
    that died mid-call (events with ``cost_status: "unsettled"``); ``estimated_cost_usd`` the
    part charged for calls whose provider did not report their usage (``cost_status:
    "estimated"``: estimated from the request and what came back). Every run has one root, so
    the ``*_per_root`` amplification factors equal the totals (amplification-factor spec).

    ``name`` is the run's root context's name (None when the log does not say it).
    ``llm_calls`` and ``tool_calls`` count every call that ended, refused ones too (the
    graph's totals); ``llm_sent`` counts the LLM calls that were sent, and ``refused_calls``
    the LLM and tool calls a limit stopped before they were sent (no tokens). ``termination``
    is ``limit_exceeded`` only for a stop by the run's own ceiling: a sub-agent stopped by its
    own cap ends the sub-agent, not the run."""

    run_id: str
    name: str | None
    llm_calls: int
    llm_sent: int
    refused_calls: int
    tool_calls: int
    retries: int
    tokens_in: int
    tokens_out: int
    cost_usd: float
    unpriced_calls: int
    unsettled_cost_usd: float
    estimated_cost_usd: float
    llm_calls_per_root: float
    tool_calls_per_root: float
    retries_per_root: float
    base_context: int
    context_growth_avg: float
    max_depth: int
    halted: int
    failed: int
    termination: str
    stop_reason: str | None

    def to_dict(self) -> dict[str, Any]:
        """The row as a plain dict."""
        return asdict(self)


NUMERIC_COLUMNS: Final = tuple(
    f.name
    for f in fields(RunSummary)
    if f.name not in ("run_id", "name", "termination", "stop_reason")
)


@dataclass(frozen=True, slots=True)
class SummaryTable:
    """Per-run rows and, for every numeric column, its ``p50`` and ``p95`` across runs."""

    runs: list[RunSummary]
    across: dict[str, dict[str, float | None]] = field(default_factory=dict)

    def rows(self) -> list[dict[str, Any]]:
        """The per-run rows as dicts."""
        return [r.to_dict() for r in self.runs]


def termination_of(
    reason: str | None, first_halt: tuple[str | None] | None, last_top: tuple[str, str | None]
) -> tuple[str, str | None]:
    """How a run ended, and why: ``reason`` is the last ``termination_reason`` string of its
    events, ``first_halt`` holds the ``stop_reason`` of its first halted call (None when no
    call halted), ``last_top`` the status and ``error_class`` of its last top-level call."""
    stop = first_halt[0] if first_halt is not None else None
    if reason:
        return reason, stop
    if first_halt is not None:
        return _stop_kind(stop), stop
    if last_top[0] == "fail":
        return "error", last_top[1]
    return "success", None


def _stop_kind(stop: str | None) -> str:
    """What kind of stop a halted call's ``stop_reason`` names: a wait for other calls'
    reservations that ran out (``BudgetBusy``: the budget was not spent) is an
    ``admission_wait``, the wall-time limit a ``timeout``, anything else a limit."""
    if stop is None:
        return "limit_exceeded"
    if "calls in flight" in stop:  # both BudgetBusy reasons (local and shared) say so
        return "admission_wait"
    if "amp:elapsed_s" in stop:
        return "timeout"
    return "limit_exceeded"


def refused(call: Call) -> bool:
    """Whether an LLM or tool call was refused before it was sent: stopped, with no tokens
    (a call stopped in flight was sent, and has them; ``ampmeter.metrics`` reads it so too)."""
    return call.status == "halt" and call.tokens_in == 0 and call.tokens_out == 0


def _termination(run: Run) -> tuple[str, str | None]:
    halts = (c for c in run.calls if c.status == "halt")
    halt = next((c for c in halts if is_own_stop(c.metadata, c.stop_reason)), None)
    top = [c for c in run.calls if c.depth == 1]
    return termination_of(
        run.termination_reason,
        (halt.stop_reason,) if halt is not None else None,
        (top[-1].status, top[-1].error_class) if top else ("", None),
    )


def _added(values: Iterable[float]) -> float:
    """Floats added one by one in log order, as every engine and the report's digest add them
    (``sum`` compensates its rounding from Python 3.12 on, which would set the engines apart)."""
    return functools.reduce(operator.add, values, 0.0)


def summarize_run(run: Run) -> RunSummary:
    """The summary row of one run."""
    calls = run.calls
    counted = [c for c in calls if c.kind in ("llm", "tool")]
    llm = sum(1 for c in counted if c.kind == "llm")
    refusals = [c for c in counted if refused(c)]
    tools = len(counted) - llm
    retries = sum(c.retries for c in calls)
    task = TaskResult.from_events(run.events, run_id=run.run_id)
    termination, stop = _termination(run)
    return RunSummary(
        run_id=run.run_id,
        name=run_name(c.metadata for c in calls),
        llm_calls=llm,
        llm_sent=llm - sum(1 for c in refusals if c.kind == "llm"),
        refused_calls=len(refusals),
        tool_calls=tools,
        retries=retries,
        tokens_in=sum(c.tokens_in for c in calls),
        tokens_out=sum(c.tokens_out for c in calls),
        cost_usd=_added(c.cost_usd for c in calls if not c.unpriced),
        unpriced_calls=sum(1 for c in calls if c.unpriced),
        unsettled_cost_usd=_added(c.cost_usd for c in calls if is_unsettled(c)),
        estimated_cost_usd=_added(c.cost_usd for c in calls if is_estimated(c)),
        llm_calls_per_root=float(llm),
        tool_calls_per_root=float(tools),
        retries_per_root=float(retries),
        base_context=task.base_context,
        context_growth_avg=task.context_growth_avg,
        max_depth=max((c.depth for c in calls), default=0),
        halted=sum(1 for c in counted if c.status == "halt"),  # calls only (DESIGN.md §2)
        failed=sum(1 for c in calls if c.status == "fail"),
        termination=termination,
        stop_reason=stop,
    )


def summarize(
    paths: Iterable[str | os.PathLike[str]],
    *,
    engine: Engine = "auto",
    best_effort: bool = False,
    progress: bool = False,
) -> SummaryTable:
    """Summarize the runs in TokenTracker logs (runs are told apart by ``run_id``).

    Reading follows :func:`ampmeter.analysis.runs.load_runs`: invalid JSON raises
    :class:`ampmeter.logs.JsonlError` naming ``file:line`` (skipped with ``best_effort``), an
    event lacking a field raises :class:`AnalysisError`, a missing path ``FileNotFoundError``.

    ``engine="duckdb"`` (or ``"auto"`` on inputs over :data:`DUCKDB_THRESHOLD_BYTES`, when
    duckdb is installed) reads the logs with DuckDB and gives identical rows; a log
    it cannot read exactly is read again by the plain reader, which reports the precise error.
    ``progress`` shows a progress bar on stderr while DuckDB reads.
    """
    names = [os.fspath(p) for p in paths]
    runs: list[RunSummary] | None = None
    if use_duckdb(engine, best_effort, names):
        from ampmeter.analysis._duck_summary import summarize_runs

        runs = summarize_runs(names, progress=progress)
    if runs is None:
        runs = [summarize_run(r) for r in load_runs(names, best_effort=best_effort).values()]
    return summary_table(runs)


def summary_table(runs: list[RunSummary]) -> SummaryTable:
    """The table of ``runs`` with the p50 and p95 of every numeric column across them."""
    across: dict[str, dict[str, float | None]] = {}
    for name in NUMERIC_COLUMNS:
        values = sorted(float(getattr(r, name)) for r in runs)
        across[name] = {"p50": percentile(values, 50.0), "p95": percentile(values, 95.0)}
    return SummaryTable(runs, across)
