"""The contexts a logged call ran in (``metadata.contexts``, root first), as views read them.

ampmeter writes, on every event, the contexts from the run's root down to the call's own, each
with its name and the ceilings it set itself (``{"name": "research_run", "limits":
{"amp:cost": "0.0004"}}``). A view names a run by its root, shows each limit on the context
that set it, and tells a sub-agent stopped by its own cap from a run stopped by the run's.
Logs from other producers (or older ones) have no such list: every function here then answers
None and the views fall back to what they did before.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from ampmeter.analysis.ceilings import call_usage, derivable, parse_stop_reason
from ampmeter.analysis.runs import Call

__all__ = [
    "ContextInfo",
    "Path",
    "RunContexts",
    "SubAgentLimits",
    "is_own_stop",
    "lineage_of",
    "process_of",
    "run_labels",
    "stop_owner",
]

_KEY: Final = "contexts"


@dataclass(frozen=True, slots=True)
class ContextInfo:
    """One context of a call's lineage: its name, its own ceilings (stats key -> value), and
    for a root its id and the process it ran in."""

    name: str
    limits: dict[str, float] = field(default_factory=dict)
    pid: int | None = None
    host: str | None = None
    id: str | None = None


def _number(value: object) -> float | None:
    """A ceiling as the log writes it: money as decimal text, counts as numbers."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        number = float(value)
    except ValueError:  # text that is not a number
        return None
    return number if math.isfinite(number) else None


def _entry(raw: object) -> ContextInfo | None:
    if not isinstance(raw, Mapping):
        return None
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        return None
    limits: dict[str, float] = {}
    given = raw.get("limits")
    if isinstance(given, Mapping):
        for key, value in given.items():
            number = _number(value)
            if isinstance(key, str) and number is not None:
                limits[key] = number
    pid = raw.get("pid")
    host = raw.get("host")
    ident = raw.get("id")
    return ContextInfo(
        name,
        limits,
        pid if type(pid) is int and pid > 0 else None,
        host if isinstance(host, str) else None,
        ident if isinstance(ident, str) else None,
    )


def lineage_of(metadata: Mapping[str, Any]) -> tuple[ContextInfo, ...] | None:
    """The contexts an event's call ran in, root first; None when the event does not say (or
    says it in a shape ampmeter never writes)."""
    raw = metadata.get(_KEY)
    if not isinstance(raw, Sequence) or isinstance(raw, (str, bytes)) or not raw:
        return None
    found = []
    for item in raw:
        entry = _entry(item)
        if entry is None:
            return None
        found.append(entry)
    return tuple(found)


def process_of(
    lineage: Sequence[ContextInfo] | None, metadata: Mapping[str, Any]
) -> tuple[str | None, int] | None:
    """(host, pid) of the process that logged an event: its root context's, else the ``pid``
    that ``ampmeter run`` writes on its other processes' events; None if the event names none."""
    if lineage and lineage[0].pid is not None:
        return lineage[0].host, lineage[0].pid
    pid = metadata.get("pid")
    if type(pid) is int and pid > 0:
        return None, pid
    return None


def stop_owner(lineage: Sequence[ContextInfo], stop_reason: str | None) -> int | None:
    """The position in ``lineage`` of the context whose ceiling made ``stop_reason``: the
    outermost one with that key and ceiling (an outer cap hit at the same value is the one
    that binds every inner context too); None when no context of the lineage set it."""
    limit = parse_stop_reason(stop_reason)
    if limit is None:
        return None
    for index, context in enumerate(lineage):
        for key, ceiling in context.limits.items():
            matches = limit.key == key or (key.endswith("*") and limit.key.startswith(key[:-1]))
            if matches and math.isclose(ceiling, limit.ceiling, rel_tol=1e-9, abs_tol=1e-12):
                return index
    return None


def is_own_stop(metadata: Mapping[str, Any], stop_reason: str | None) -> bool:
    """Whether a stopped call was stopped by a ceiling of the run's own root context, or by
    one the log does not place (then it is taken for the run's, as before lineages were
    logged); a sub-agent's stop by its own ceiling is the sub-agent's, not the run's end."""
    lineage = lineage_of(metadata)
    return not lineage or stop_owner(lineage, stop_reason) in (0, None)


Path = tuple[str, ...]
"""A context's names from the run's root down to it."""


@dataclass(slots=True)
class SubAgentLimits:
    """A sub-agent's own ceilings, what its calls used of each stats key, and its first stop."""

    limits: dict[str, float]
    usage: dict[str, float] = field(default_factory=dict)
    stop: str | None = None

    def used(self, key: str) -> float | None:
        """Its value of limit ``key`` (a prefix limit ``key*``: its largest matching key);
        None when logs cannot tell it."""
        if key.endswith("*"):
            prefix = key[:-1]
            return max((v for k, v in self.usage.items() if k.startswith(prefix)), default=0.0)
        return self.usage.get(key, 0.0) if derivable(key) else None


@dataclass(slots=True)
class RunContexts:
    """What a run's lineages tell, gathered call by call: its root context (the one of its
    own process before another process's), the processes that wrote it,
    and each sub-agent's own limits with its usage and stop."""

    root: ContextInfo | None = None
    root_is_run: bool = False
    processes: set[tuple[str | None, int]] = field(default_factory=set)
    subagents: dict[Path, SubAgentLimits] = field(default_factory=dict)

    def add_root(self, metadata: Mapping[str, Any]) -> tuple[ContextInfo, ...] | None:
        """Take the root of an event's lineage as the run's unless one is known (one of the
        run's own process is kept over another process's); the lineage, None if it has none."""
        lineage = lineage_of(metadata)
        if lineage is not None:
            own_process = metadata.get("pid") is None
            if self.root is None or (own_process and not self.root_is_run):
                self.root, self.root_is_run = lineage[0], own_process
        return lineage

    def add(self, call: Call) -> None:
        """Count one call (its lineage, if it has one)."""
        lineage = self.add_root(call.metadata)
        if lineage is None:
            return
        process = process_of(lineage, call.metadata)
        if process is not None:
            self.processes.add(process)
        if len(lineage) == 1:
            return
        usage = call_usage(call)
        path: Path = (lineage[0].name,)
        for context in lineage[1:]:
            path += (context.name,)
            if context.limits:
                sub = self.subagents.get(path)
                if sub is None:
                    sub = self.subagents[path] = SubAgentLimits(context.limits)
                for key, value in usage.items():
                    sub.usage[key] = sub.usage.get(key, 0.0) + value
        if call.status == "halt":
            owner = stop_owner(lineage, call.stop_reason)
            if owner is not None and owner > 0:
                names = tuple(c.name for c in lineage[: owner + 1])
                stopped = self.subagents.get(names)
                if stopped is not None and stopped.stop is None:
                    stopped.stop = call.stop_reason

    @property
    def name(self) -> str | None:
        """The run's name: its root context's (None when no call said it)."""
        return self.root.name if self.root is not None else None

    def own_limits(self) -> dict[str, float]:
        """The ceilings the run's root context set itself."""
        return dict(self.root.limits) if self.root is not None else {}

    def subagent_rows(self) -> list[tuple[float, Path, str, float | None, float, bool]]:
        """Every sub-agent limit as (share used, path, key, used, ceiling, stopped it), the
        nearest to (or past) its ceiling first."""
        rows = []
        for path, sub in self.subagents.items():
            for key, cap in sub.limits.items():
                used = sub.used(key)
                share = (used or 0.0) / cap if cap > 0 else float(bool(used))
                rows.append((share, path, key, used, cap, sub.stop is not None))
        rows.sort(key=lambda row: -row[0])
        return rows


def _short_id(run_id: str) -> str:
    return run_id if len(run_id) <= 12 else run_id[:8] + "…"


def run_labels(runs: Iterable[tuple[str, str | None]]) -> dict[str, str]:
    """How every view names runs, from (run id, root name) pairs: the root context's name,
    with the run's id (long ids cut to 8 characters) where two runs share a name; the id
    alone for a run whose log gives no name."""
    pairs = list(runs)
    counts: dict[str, int] = {}
    for _, name in pairs:
        if name:
            counts[name] = counts.get(name, 0) + 1
    labels = {}
    for run_id, name in pairs:
        if not name:
            labels[run_id] = run_id
        elif counts[name] > 1:
            labels[run_id] = f"{name} ({_short_id(run_id)})"
        else:
            labels[run_id] = name
    return labels
