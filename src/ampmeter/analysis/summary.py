"""One row per run (calls, tokens, cost, amplification, context growth, depth, termination)
and the p50/p95 of every numeric column across runs."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Final

from ampmeter.analysis.quantiles import percentile
from ampmeter.analysis.runs import Run, load_runs
from ampmeter.metrics import TaskResult

__all__ = ["NUMERIC_COLUMNS", "RunSummary", "SummaryTable", "summarize", "summarize_run"]


@dataclass(frozen=True, slots=True)
class RunSummary:
    """What one run did. ``cost_usd`` is the priced cost; ``unpriced_calls`` counts calls whose
    cost could not be priced (their cost is unknown, not zero). Every run has one root, so the
    ``*_per_root`` amplification factors equal the totals (amplification-factor spec)."""

    run_id: str
    llm_calls: int
    tool_calls: int
    retries: int
    tokens_in: int
    tokens_out: int
    cost_usd: float
    unpriced_calls: int
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
    if f.name not in ("run_id", "termination", "stop_reason")
)


@dataclass(frozen=True, slots=True)
class SummaryTable:
    """Per-run rows and, for every numeric column, its ``p50`` and ``p95`` across runs."""

    runs: list[RunSummary]
    across: dict[str, dict[str, float | None]] = field(default_factory=dict)

    def rows(self) -> list[dict[str, Any]]:
        """The per-run rows as dicts."""
        return [r.to_dict() for r in self.runs]


def _termination(run: Run) -> tuple[str, str | None]:
    halts = [c for c in run.calls if c.status == "halt"]
    stop = halts[0].stop_reason if halts else None
    if run.termination_reason:
        return run.termination_reason, stop
    if halts:
        timed_out = stop is not None and ("elapsed" in stop or "timeout" in stop)
        return ("timeout" if timed_out else "limit_exceeded"), stop
    top = [c for c in run.calls if c.depth == 1]
    if top and top[-1].status == "fail":
        return "error", top[-1].error_class
    return "success", None


def summarize_run(run: Run) -> RunSummary:
    """The summary row of one run."""
    calls = run.calls
    counted = [c for c in calls if c.kind in ("llm", "tool")]
    llm = sum(1 for c in counted if c.kind == "llm")
    tools = len(counted) - llm
    retries = sum(c.retries for c in calls)
    task = TaskResult.from_events(run.events, run_id=run.run_id)
    termination, stop = _termination(run)
    return RunSummary(
        run_id=run.run_id,
        llm_calls=llm,
        tool_calls=tools,
        retries=retries,
        tokens_in=sum(c.tokens_in for c in calls),
        tokens_out=sum(c.tokens_out for c in calls),
        cost_usd=sum(c.cost_usd for c in calls if not c.unpriced),
        unpriced_calls=sum(1 for c in calls if c.unpriced),
        llm_calls_per_root=float(llm),
        tool_calls_per_root=float(tools),
        retries_per_root=float(retries),
        base_context=task.base_context,
        context_growth_avg=task.context_growth_avg,
        max_depth=max((c.depth for c in calls), default=0),
        halted=sum(1 for c in calls if c.status == "halt"),
        failed=sum(1 for c in calls if c.status == "fail"),
        termination=termination,
        stop_reason=stop,
    )


def summarize(
    paths: Iterable[str | os.PathLike[str]], *, best_effort: bool = False
) -> SummaryTable:
    """Summarize the runs in TokenTracker logs (runs are told apart by ``run_id``).

    Reading follows :func:`ampmeter.analysis.runs.load_runs`; a path that does not exist
    raises ``FileNotFoundError``.
    """
    runs = [summarize_run(r) for r in load_runs(paths, best_effort=best_effort).values()]
    across: dict[str, dict[str, float | None]] = {}
    for name in NUMERIC_COLUMNS:
        values = sorted(float(getattr(r, name)) for r in runs)
        across[name] = {"p50": percentile(values, 50.0), "p95": percentile(values, 95.0)}
    return SummaryTable(runs, across)
