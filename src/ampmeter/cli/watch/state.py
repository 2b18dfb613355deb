"""What ``ampmeter watch`` knows: every run's call tree, usage against ceilings, stops, rates.

Logs hold one line per *finished* call, so a call still running is seen only through its
children: a ``parent_id`` that has no event yet is a call that has not ended, shown as running
until its own line arrives. A call in flight with no inner call ended logs nothing at all, so
a run counts as going while a process that wrote it is alive (the root context in
``metadata.contexts`` names it). The run's own ceilings are those its root context set (the
log says them), else the caller's (flags, ``AMPMETER_MAX_*``), completed from the run's own
stops, whose reasons name the limit and its ceiling; each sub-agent's limits stay its own.

Everything a frame shows is kept up to date as events arrive (totals per stats key, the tree's
child lists, stops, calls and dollars per second), so drawing a frame does not walk every call
of a long run. A span seen again, or a file read anew, rebuilds its run from its calls.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from ampmeter.analysis.ceilings import derivable
from ampmeter.analysis.digest import RunDigest
from ampmeter.analysis.runs import Call, call_from_event
from ampmeter.analysis.summary import termination_of
from ampmeter.cli.watch.processes import verdict

__all__ = ["RATE_WINDOW_MS", "RUNNING", "Rates", "RunState", "Stop", "WatchState"]

RUNNING: Final = "running"
RATE_WINDOW_MS: Final = 60_000.0


@dataclass(slots=True)
class Stop:
    """A call a limit stopped before it ran."""

    run_id: str
    span_id: str
    name: str
    reason: str
    at_ms: float | None


@dataclass(slots=True)
class Rates:
    """Calls and dollars per minute over the last minute that the logs cover."""

    calls_per_min: float
    usd_per_min: float
    window_s: float


@dataclass
class RunState:
    """One run: its finished calls, the calls inferred to be running, and its usage."""

    run_id: str
    calls: dict[str, Call] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)  # span id -> file it came from
    # Counted as ``ampmeter summary`` counts: calls sent and refused, usage by stats key,
    # unpriced calls, unsettled and estimated spend, own stops and the ceilings they tell, and
    # the run's contexts (root, processes, sub-agents).
    digest: RunDigest = field(init=False)
    children: dict[str, list[str]] = field(default_factory=dict)  # parent -> spans, arrival order
    top: dict[str, None] = field(default_factory=dict)  # top-level spans, first-seen order
    halted: list[str] = field(default_factory=list)
    per_second: dict[int, list[float]] = field(default_factory=dict)  # s -> [LLM calls, USD]
    first_start_ms: float = math.inf
    last_end_ms: float = -math.inf
    name: str | None = None  # the run's root context (else: the context of its top-level calls)
    named_by_call: bool = False  # the name came from a call (not from a sub-agent's own node)
    last_top: tuple[str, str | None] = ("", None)  # status and error of the last top-level call
    last_top_end_ms: float = -math.inf
    arrived_ms: float = -math.inf  # when (wall clock) its last line was read

    def __post_init__(self) -> None:
        self.digest = RunDigest(self.run_id)

    def running(self) -> list[str]:
        """Span ids named as a parent by some call but not (yet) ended themselves."""
        return sorted(p for p in self.children if p not in self.calls)

    def usage(self, key: str) -> float | None:
        """This run's value of a stats key, added up from its calls (None: not derivable)."""
        return self.digest.usage.get(key, 0.0) if derivable(key) else None

    def ending(self, now_ms: float | None) -> tuple[str, str | None] | None:
        """How the run ended (termination and reason, by ``ampmeter summary``'s rules), or
        None while it is going or may be: something is running, one of the processes that
        wrote it is alive, or it cannot be told (see :meth:`quiet_ms`)."""
        if self.running() or self.liveness() != "ended":
            return None
        return termination_of(None, self.digest.first_halt, self.last_top)

    def liveness(self) -> str | None:
        """``"alive"`` while a process that wrote the run runs, ``"ended"`` once every one has
        ended, None when the log names no process this machine can check."""
        began = self.digest.start_ms  # when its earliest call began
        return verdict(self.digest.contexts.processes, math.inf if began is None else began)

    def quiet_ms(self, now_ms: float | None) -> float | None:
        """How long no line arrived, when nothing tells whether the run goes on (the log names
        no process this machine can check): None otherwise."""
        if self.running() or self.liveness() is not None:
            return None
        return max((now_ms if now_ms is not None else time.time() * 1000.0) - self.arrived_ms, 0)

    def index(self, call: Call) -> None:
        """Count a call that is new to this run into every derived figure."""
        span, parent = call.span_id, call.parent_id
        self.digest.add(call, keep=False)
        contexts = self.digest.contexts
        if contexts.name is not None:
            self.name = contexts.name
        if parent is None:
            # A sub-agent's own node carries its own name; a call, the run's context's name
            # (both only stand in for the root's name in logs that do not give it).
            context = call.metadata.get("context")
            if isinstance(context, str) and not self.named_by_call and contexts.root is None:
                if context != call.name:
                    self.name, self.named_by_call = context, True
                elif self.name is None:
                    self.name = context
            end = call.end_ms if call.end_ms is not None else -math.inf
            if end >= self.last_top_end_ms:
                self.last_top, self.last_top_end_ms = (call.status, call.error_class), end
            self.top.setdefault(span)
        else:
            self.top.pop(span, None)  # it was shown as a running parent at the top until now
            self.children.setdefault(parent, []).append(span)
            if parent not in self.calls:
                self.top.setdefault(parent)
        if call.status == "halt":
            self.halted.append(span)
        elif call.end_ms is not None:
            bucket = self.per_second.setdefault(int(call.end_ms // 1000), [0.0, 0.0])
            bucket[0] += call.kind == "llm"
            bucket[1] += call.cost_usd
            self.first_start_ms = min(self.first_start_ms, call.end_ms - (call.latency_ms or 0))
            self.last_end_ms = max(self.last_end_ms, call.end_ms)

    def reindex(self) -> None:
        """Derive every figure again from the calls (after a call was replaced or dropped)."""
        calls = list(self.calls.values())
        fresh = RunState(self.run_id)
        for call in calls:
            fresh.calls[call.span_id] = call
            fresh.index(call)
        fresh.sources = self.sources
        fresh.arrived_ms = self.arrived_ms
        self.__dict__.update(fresh.__dict__)


class WatchState:
    """Runs built from the events that :class:`~ampmeter.cli.watch.follow.LogFollower` reads."""

    def __init__(self, ceilings: Mapping[str, float] | None = None) -> None:
        self.ceilings: dict[str, float] = dict(ceilings or {})
        self.runs: dict[str, RunState] = {}
        self.malformed = 0  # JSON objects that are not TokenTracker events

    def add(
        self, events: Iterable[dict[str, Any]], source: str, arrived_ms: float | None = None
    ) -> None:
        """Take events read from ``source`` (at wall-clock ``arrived_ms``, default now); a
        later event for a span replaces the earlier."""
        arrived = time.time() * 1000.0 if arrived_ms is None else arrived_ms
        stale: set[str] = set()
        for event in events:
            try:
                call = call_from_event(event)
            except ValueError:
                self.malformed += 1
                continue
            run_id = event["run_id"]
            run = self.runs.get(run_id)
            if run is None:
                run = self.runs[run_id] = RunState(run_id)
            run.arrived_ms = arrived
            replaced = call.span_id in run.calls
            run.calls[call.span_id] = call
            run.sources[call.span_id] = source
            if replaced:
                stale.add(run_id)
            elif run_id not in stale:
                run.index(call)
        for run_id in stale:
            self.runs[run_id].reindex()

    def forget(self, source: str) -> None:
        """Drop what came from ``source`` (it was truncated or replaced and is read anew)."""
        for run_id, run in list(self.runs.items()):
            gone = [span for span, src in run.sources.items() if src == source]
            if not gone:
                continue
            for span in gone:
                del run.calls[span], run.sources[span]
            if run.calls:
                run.reindex()
            else:
                del self.runs[run_id]

    def ceilings_of(self, run: RunState) -> dict[str, float]:
        """The run's own ceilings: those its root context set (as the log says), the given
        ones, then any a stop by the run's own ceiling revealed."""
        found = run.digest.contexts.own_limits()
        for key, value in (*self.ceilings.items(), *run.digest.ceilings.items()):
            found.setdefault(key, value)
        return found

    def stops(self, last: int = 5) -> list[Stop]:
        """The ``last`` most recent halted calls, newest first."""
        found = []
        for run in self.runs.values():
            for span in run.halted:
                c = run.calls[span]
                found.append(Stop(run.run_id, span, c.name, c.stop_reason or "stopped", c.end_ms))
        found.sort(key=lambda s: (s.at_ms or 0.0, s.span_id), reverse=True)
        return found[:last]

    def rates(self, now_ms: float | None = None) -> Rates:
        """LLM calls and dollars per minute over the minute before ``now_ms`` (to the second).

        ``None`` means the newest event's time, so a finished log shows the rate it ended with.
        A log shorter than a minute is measured over its own span (at least one second).
        """
        runs = [r for r in self.runs.values() if r.per_second]
        if not runs:
            return Rates(0.0, 0.0, 0.0)
        newest = max(r.last_end_ms for r in runs)
        end = newest if now_ms is None else max(now_ms, newest)
        start = max(end - RATE_WINDOW_MS, min(r.first_start_ms for r in runs))
        first_second = int(start // 1000)
        calls = dollars = 0.0
        for run in runs:
            for second, (n, usd) in run.per_second.items():
                if second >= first_second:
                    calls += n
                    dollars += usd
        minutes = max(end - start, 1000.0) / 60_000.0
        return Rates(calls / minutes, dollars / minutes, minutes * 60.0)
