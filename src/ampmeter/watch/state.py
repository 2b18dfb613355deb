"""What ``ampmeter watch`` knows: every run's call tree, usage against ceilings, stops, rates.

Logs hold one line per *finished* call, so a call still running is seen only through its
children: a ``parent_id`` that has no event yet is a call that has not ended, shown as running
until its own line arrives. Ceilings come from the caller (flags, ``AMPMETER_MAX_*``) and are
completed from the stops seen in the logs, whose reasons name the limit and its ceiling.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from ampmeter.analysis.ceilings import parse_stop_reason, usage_for_key
from ampmeter.analysis.runs import Call, call_from_event

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
    learned_ceilings: dict[str, float] = field(default_factory=dict)

    def running(self) -> list[str]:
        """Span ids named as a parent by some call but not (yet) ended themselves."""
        calls = self.calls
        return sorted({c.parent_id for c in calls.values()
                       if c.parent_id is not None and c.parent_id not in calls})  # fmt: skip

    def usage(self, key: str) -> float | None:
        """This run's value of a stats key, added up from its calls (None: not derivable)."""
        return usage_for_key(list(self.calls.values()), key)

    def unpriced_calls(self) -> int:
        """Calls whose cost could not be priced (their $0 is not a real zero)."""
        return sum(1 for c in self.calls.values() if c.unpriced)


class WatchState:
    """Runs built from the events that :class:`~ampmeter.watch.follow.LogFollower` reads."""

    def __init__(self, ceilings: Mapping[str, float] | None = None) -> None:
        self.ceilings: dict[str, float] = dict(ceilings or {})
        self.runs: dict[str, RunState] = {}
        self.malformed = 0  # JSON objects that are not TokenTracker events

    def add(self, events: Iterable[dict[str, Any]], source: str) -> None:
        """Take events read from ``source``; a later event for a span replaces the earlier."""
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
            run.calls[call.span_id] = call
            run.sources[call.span_id] = source
            limit = parse_stop_reason(call.stop_reason) if call.status == "halt" else None
            if limit is not None:
                run.learned_ceilings[limit.key] = limit.ceiling

    def forget(self, source: str) -> None:
        """Drop what came from ``source`` (it was truncated or replaced and is read anew)."""
        for run_id, run in list(self.runs.items()):
            gone = [span for span, src in run.sources.items() if src == source]
            for span in gone:
                del run.calls[span], run.sources[span]
            if not run.calls:
                del self.runs[run_id]

    def ceilings_of(self, run: RunState) -> dict[str, float]:
        """The run's ceilings: the given ones, then any a stop in this run revealed."""
        return {**run.learned_ceilings, **self.ceilings}

    def stops(self, last: int = 5) -> list[Stop]:
        """The ``last`` most recent halted calls, newest first."""
        found = [Stop(run.run_id, c.span_id, c.name, c.stop_reason or "stopped", c.end_ms)
                 for run in self.runs.values() for c in run.calls.values()
                 if c.status == "halt"]  # fmt: skip
        found.sort(key=lambda s: (s.at_ms or 0.0, s.span_id), reverse=True)
        return found[:last]

    def rates(self, now_ms: float | None = None) -> Rates:
        """LLM calls and dollars per minute over the minute before ``now_ms``.

        ``None`` means the newest event's time, so a finished log shows the rate it ended with.
        A log shorter than a minute is measured over its own span (at least one second).
        """
        ended = [(c.end_ms, c.end_ms - (c.latency_ms or 0.0), c.kind == "llm", c.cost_usd)
                 for run in self.runs.values() for c in run.calls.values()
                 if c.end_ms is not None and c.status != "halt"]  # fmt: skip
        if not ended:
            return Rates(0.0, 0.0, 0.0)
        newest = max(e[0] for e in ended)
        end = newest if now_ms is None else max(now_ms, newest)
        start = max(end - RATE_WINDOW_MS, min(e[1] for e in ended))
        window = [e for e in ended if e[0] >= start]
        minutes = max(end - start, 1000.0) / 60_000.0
        calls = sum(1 for e in window if e[2])
        dollars = sum(e[3] for e in window)
        return Rates(calls / minutes, dollars / minutes, minutes * 60.0)
