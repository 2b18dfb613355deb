"""One streaming pass over TokenTracker logs that keeps what the report shows, in bounded memory.

A 1 GB log holds millions of events; holding each one as a dict (as :func:`load_runs` does)
takes several times the file's size. :func:`digest_logs` reads each event once and keeps:

- per run, the totals of its summary row (the same row :func:`summarize_run` gives), the usage
  of every stats key the logs can tell (for the limit panel), the ceilings its stops name, its
  first stops and limit events, and 21 bytes per event (span and parent hashes, the status
  and the failure's error class as a number) from which its call depths and last top-level
  call are found when the pass ends;
- per model, the priced cost and the tokens; the latencies of the LLM calls that were sent
  (as a count per value, so the percentiles stay exact);
- the events themselves (as :class:`Call`) only for the first runs, up to a node budget, so the
  report can draw their trees and timelines.

A call stopped before it was sent (``halt`` with no tokens) is counted as a stopped call, never
as a sent one, and has no latency (issue 26: the p50 of the real calls only).
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

from ampmeter.analysis.ceilings import call_usage, parse_stop_reason
from ampmeter.analysis.lineage import RunContexts, is_own_stop
from ampmeter.analysis.run_summary import RunSummary, termination_of
from ampmeter.analysis.runs import Call, CallTree, LoggedCalls, is_estimated, is_unsettled
from ampmeter.metrics import was_sent
from ampmeter.policies import META_LIMIT_EVENTS

__all__ = [
    "DETAIL_BUDGET",
    "DETAIL_PER_RUN",
    "STOPS_KEPT",
    "LogDigest",
    "RunDigest",
    "digest_logs",
]

DETAIL_BUDGET: Final = 60_000
"""Events kept in full (for trees and timelines) across all runs."""
DETAIL_PER_RUN: Final = 12_000
"""Events kept in full for any one run."""
STOPS_KEPT: Final = 50
"""Stopped calls (and limit events) kept per run for the stop list."""
_DISTINCT_LATENCIES: Final = 100_000  # past this many distinct values, count whole ms only


@dataclass(slots=True)
class RunDigest:
    """What the report keeps of one run (see the module's docstring)."""

    run_id: str
    sources: list[str] = field(default_factory=list)
    events: int = 0
    llm_calls: int = 0
    llm_sent: int = 0
    tool_calls: int = 0
    sent_calls: int = 0
    stopped_unsent: int = 0
    retries: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    unpriced_calls: int = 0
    unsettled_cost_usd: float = 0.0
    estimated_cost_usd: float = 0.0
    halted: int = 0
    """Stopped LLM and tool calls (the summary's ``halted``)."""
    halted_nodes: int = 0
    """Stopped nodes of any kind (a sub-agent's own node too): the length of the stop list."""
    failed: int = 0
    completions: int = 0
    first_completion_in: int = 0
    last_completion_in: int = 0
    first_halt: tuple[str | None] | None = None
    termination_reason: str | None = None
    start_ms: float | None = None
    end_ms: float | None = None
    usage: dict[str, float] = field(default_factory=dict)
    ceilings: dict[str, float] = field(default_factory=dict)
    stops: list[Call] = field(default_factory=list)
    limit_events: list[dict[str, Any]] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    """The run's events in full, in log order, while the detail budget lasts."""
    calls_dropped: int = 0
    max_depth: int = 0
    _tree: CallTree = field(default_factory=CallTree)
    _stop_positions: list[int] = field(default_factory=list)
    _last_top: tuple[str, str | None] = ("", None)
    contexts: RunContexts = field(default_factory=RunContexts)
    """The run's root context (its name, its own ceilings) and its sub-agents' own limits."""

    @property
    def detailed(self) -> bool:
        """True when every event of the run is kept in :attr:`calls`."""
        return self.calls_dropped == 0 and len(self.calls) == self.events

    def add(self, call: Call, keep: bool) -> None:
        """Count one event of this run; keep it in full when ``keep``."""
        position = self.events
        self.events += 1
        kind, status = call.kind, call.status
        counted = kind in ("llm", "tool")
        if kind == "llm":
            self.llm_calls += 1
        elif kind == "tool":
            self.tool_calls += 1
        sent = was_sent(status, call.tokens_in, call.tokens_out)
        if counted:
            if sent:
                self.sent_calls += 1
            else:
                self.stopped_unsent += 1
        if kind == "llm" and sent:
            self.llm_sent += 1
            if self.completions == 0:
                self.first_completion_in = call.tokens_in
            self.last_completion_in = call.tokens_in
            self.completions += 1
        self.retries += call.retries
        self.tokens_in += call.tokens_in
        self.tokens_out += call.tokens_out
        if call.unpriced:
            self.unpriced_calls += 1
        else:
            self.cost_usd += call.cost_usd
        if is_unsettled(call):
            self.unsettled_cost_usd += call.cost_usd
        elif is_estimated(call):
            self.estimated_cost_usd += call.cost_usd
        self.contexts.add(call)
        meta, stop = call.metadata, call.stop_reason
        own_stop = self.place(call.span_id, call.parent_id, status, call.error_class, meta, stop)
        if status == "halt":
            self.halted_nodes += 1
            if counted:  # a sub-agent's own node is not a call (DESIGN.md §2)
                self.halted += 1
            limit = parse_stop_reason(stop) if own_stop else None
            if limit is not None:
                self.ceilings[limit.key] = limit.ceiling
            if len(self.stops) < STOPS_KEPT:
                self.stops.append(_light(call))
                self._stop_positions.append(position)
        elif status == "fail":
            self.failed += 1
        reason = call.metadata.get("termination_reason")
        if isinstance(reason, str):
            self.termination_reason = reason
        listed = call.metadata.get(META_LIMIT_EVENTS)
        if isinstance(listed, list):
            room = STOPS_KEPT - len(self.limit_events)
            self.limit_events.extend([e for e in listed if isinstance(e, dict)][: max(room, 0)])
        usage = self.usage
        for key, value in call_usage(call).items():
            usage[key] = usage.get(key, 0.0) + value
        if call.end_ms is not None:
            start = call.end_ms - (call.latency_ms or 0.0)
            if self.start_ms is None or start < self.start_ms:
                self.start_ms = start
            if self.end_ms is None or call.end_ms > self.end_ms:
                self.end_ms = call.end_ms
        if keep:
            self.calls.append(_light(call))
        else:
            self.calls_dropped += 1

    def place(
        self,
        span_id: str,
        parent_id: str | None,
        status: str,
        error_class: str | None,
        metadata: Mapping[str, Any],
        stop_reason: str | None,
    ) -> bool:
        """Note where one event sits in the run's call tree, and whether it is a stop by the
        run's own ceiling (True): only such a stop ends the run or tells its ceiling. The part
        of :meth:`add` the DuckDB engine runs too, having added up the counts in SQL."""
        self._tree.add(span_id, parent_id, status == "fail", error_class)
        own = status == "halt" and is_own_stop(metadata, stop_reason)
        if own and self.first_halt is None:
            self.first_halt = (stop_reason,)
        return own

    def finish(self) -> None:
        """Find the call depths (and with them the last top-level call) once the pass is over."""
        depths, self._last_top = self._tree.finish()
        self._tree = CallTree()  # the per-event arrays are only needed for the depths
        self.max_depth = max(depths, default=0)
        # the kept calls are the run's first events, in order
        for call, depth in zip(self.calls, depths, strict=False):
            call.depth = depth
        for stop, position in zip(self.stops, self._stop_positions, strict=True):
            stop.depth = depths[position]

    def summary(self) -> RunSummary:
        """The run's summary row (equal to :func:`ampmeter.analysis.summarize_run`'s)."""
        termination, stop = termination_of(self.termination_reason, self.first_halt, self._last_top)
        growth = 0.0
        if self.completions >= 2:
            growth = (self.last_completion_in - self.first_completion_in) / (self.completions - 1)
        return RunSummary(
            run_id=self.run_id,
            name=self.contexts.name,
            llm_calls=self.llm_calls,
            llm_sent=self.llm_sent,
            refused_calls=self.stopped_unsent,
            tool_calls=self.tool_calls,
            retries=self.retries,
            tokens_in=self.tokens_in,
            tokens_out=self.tokens_out,
            cost_usd=self.cost_usd,
            unpriced_calls=self.unpriced_calls,
            unsettled_cost_usd=self.unsettled_cost_usd,
            estimated_cost_usd=self.estimated_cost_usd,
            llm_calls_per_root=float(self.llm_calls),
            tool_calls_per_root=float(self.tool_calls),
            retries_per_root=float(self.retries),
            base_context=self.first_completion_in if self.completions else 0,
            context_growth_avg=growth,
            max_depth=self.max_depth,
            halted=self.halted,
            failed=self.failed,
            termination=termination,
            stop_reason=stop,
        )


def _light(call: Call) -> Call:
    """A copy of ``call`` without its metadata dict (the report reads only the fields)."""
    return replace(call, metadata={})


@dataclass(slots=True)
class LogDigest:
    """Every run's digest (first-seen order) and the figures' inputs across runs."""

    runs: list[RunDigest] = field(default_factory=list)
    by_model: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per model (``(none)`` for LLM calls without one): priced ``cost_usd`` and ``tokens``."""
    latencies: Counter[float] = field(default_factory=Counter)
    """How many sent LLM calls took each latency (ms)."""
    skipped_lines: int = 0

    @property
    def latency_count(self) -> int:
        """How many sent LLM calls have a latency."""
        return sum(self.latencies.values())

    def latency_percentile(self, q: float) -> float | None:
        """The ``q``-th percentile of the sent LLM calls' latencies, by the rule of
        :func:`ampmeter.analysis.percentile` (linear between the two nearest ranks)."""
        total = self.latency_count
        if total == 0:
            return None
        rank = (total - 1) * q / 100.0
        low = math.floor(rank)
        below = _value_at(self.latencies, low)
        above = _value_at(self.latencies, min(low + 1, total - 1))
        return below + (above - below) * (rank - low)


def _value_at(counts: Counter[float], index: int) -> float:
    """The ``index``-th (0-based) value of the sorted multiset ``counts``."""
    seen = 0
    for value in sorted(counts):
        seen += counts[value]
        if seen > index:
            return value
    raise IndexError(index)


def digest_logs(
    paths: Iterable[str | os.PathLike[str]],
    *,
    best_effort: bool = False,
    detail_budget: int = DETAIL_BUDGET,
    detail_per_run: int = DETAIL_PER_RUN,
) -> LogDigest:
    """Read TokenTracker logs once and digest them (see the module's docstring), with the
    errors of :func:`ampmeter.analysis.load_runs`."""
    digest = LogDigest()
    runs: dict[str, RunDigest] = {}
    budget = detail_budget
    latencies = digest.latencies
    logged = LoggedCalls(paths, best_effort=best_effort)
    for path, obj, call in logged:
        run_id: str = obj["run_id"]
        run = runs.get(run_id)
        if run is None:
            run = runs[run_id] = RunDigest(run_id)
            digest.runs.append(run)
        if path not in run.sources:
            run.sources.append(path)
        keep = budget > 0 and run.calls_dropped == 0 and len(run.calls) < detail_per_run
        if keep:
            budget -= 1
        run.add(call, keep)
        if call.kind == "llm":
            _add_model(digest.by_model, call)
            if call.latency_ms is not None and was_sent(
                call.status, call.tokens_in, call.tokens_out
            ):
                latency = call.latency_ms
                if len(latencies) >= _DISTINCT_LATENCIES:
                    latency = float(round(latency))
                latencies[latency] += 1
    digest.skipped_lines += logged.skipped_lines
    for run in digest.runs:
        run.finish()
    return digest


def _add_model(by_model: dict[str, dict[str, float]], call: Call) -> None:
    slot = by_model.setdefault(call.model or "(none)", {"cost_usd": 0.0, "tokens": 0.0})
    if not call.unpriced:
        slot["cost_usd"] += call.cost_usd
    slot["tokens"] += call.tokens_in + call.tokens_out
