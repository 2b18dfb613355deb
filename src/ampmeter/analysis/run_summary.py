"""One run's summary row: what a run did and how it ended (the row every engine gives)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Final

__all__ = ["NUMERIC_COLUMNS", "RunSummary", "termination_of"]


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
