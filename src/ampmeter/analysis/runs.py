"""TokenTracker logs as runs: events grouped by ``run_id``, checked, with their call tree.

Shared by :func:`ampmeter.analysis.summarize` and the HTML report.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Final, TypeVar

from ampmeter.logs import event_problem, read_jsonl

__all__ = [
    "KIND_OF_EVENT",
    "STATUS_OF",
    "Call",
    "CallTree",
    "LoggedCalls",
    "Run",
    "call_depths",
    "call_from_event",
    "event_time_ms",
    "is_estimated",
    "is_unsettled",
    "load_runs",
]

H = TypeVar("H", bound=Hashable)

KIND_OF_EVENT: Final = {
    "llm_completion": "llm",
    "tool_call": "tool",
    "cpu_op": "system",
    "embedding": "embedding",
    "rag_retrieval": "retrieval",
    "memory_update": "memory",
}
STATUS_OF: Final = {"ok": "success", "error": "fail", "timeout": "fail"}
"""Other producers' status words, as the node statuses ``success``/``fail``/``halt``."""
_FAILED, _HAS_PARENT = 1, 2


@dataclass(slots=True)
class Call:
    """One event of a run, as the summary and the report need it."""

    span_id: str
    parent_id: str | None
    kind: str
    name: str
    status: str
    model: str
    tokens_in: int
    tokens_out: int
    cost_usd: float
    unpriced: bool
    latency_ms: float | None
    retries: int
    stop_reason: str | None
    error_class: str | None
    tool_calls_made: int
    end_ms: float | None = None  # the event's timestamp (epoch ms); it starts latency_ms earlier
    depth: int = 1
    metadata: dict[str, Any] = field(default_factory=dict)


def is_unsettled(call: Call) -> bool:
    """Whether ``call`` records the hold of a worker that died mid-call, charged as unsettled
    spend (``metadata.cost_status`` is ``"unsettled"``; its cost is the charged hold)."""
    return call.metadata.get("cost_status") == "unsettled"


def is_estimated(call: Call) -> bool:
    """Whether ``call``'s cost is ampmeter's estimate: its provider billed it without reporting
    its usage (``metadata.cost_status`` is ``"estimated"``; its cost counts in the total)."""
    return call.metadata.get("cost_status") == "estimated"


@dataclass(slots=True)
class Run:
    """The events of one ``run_id``, in log order, and where they came from."""

    run_id: str
    sources: list[str] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)


def event_time_ms(value: object) -> float | None:
    """Epoch milliseconds of an ISO 8601 timestamp (``...Z`` too); None if it is not one."""
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00", 1))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp() * 1000.0


def call_from_event(obj: dict[str, Any], index: int = 0) -> Call:
    """One TokenTracker event that passed :func:`ampmeter.logs.event_problem` as a
    :class:`Call` (that check is what makes its fields safe to read here).

    ``index`` (the event's position) names events that have no ``span_id``.
    """
    event_type: str = obj["event_type"]
    usage: dict[str, Any] = obj["usage"]
    latency = obj.get("latency_ms")
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    span = obj.get("span_id")
    parent = obj.get("parent_id")
    name = obj.get("operation", meta.get("operation"))
    stop = meta.get("stop_reason")
    error = meta.get("error_class")
    tools = meta.get("tool_calls_made")
    status = str(meta.get("status", obj.get("status", "success")))
    return Call(
        span_id=str(span) if span is not None else f"#{index}",
        parent_id=str(parent) if parent is not None else None,
        kind=KIND_OF_EVENT.get(event_type, event_type),
        name=str(name) if name is not None else event_type,
        status=STATUS_OF.get(status, status),
        model=str(obj.get("model") or ""),
        tokens_in=usage.get("prompt_tokens") or 0,
        tokens_out=usage.get("completion_tokens") or 0,
        cost_usd=float(obj["cost_usd"]),
        unpriced=meta.get("cost_status") == "unpriced",
        latency_ms=float(latency) if latency is not None else None,
        retries=meta.get("retries_used") or 0,
        stop_reason=str(stop) if stop is not None else None,
        error_class=str(error) if error is not None else None,
        tool_calls_made=tools if type(tools) is int and tools >= 0 else 0,
        end_ms=event_time_ms(obj.get("timestamp")),
        metadata=meta,
    )


class LoggedCalls:
    """The calls of TokenTracker logs, event by event, as ``(path, event, call)``.

    Lines are read by the one reading every tool shares (:func:`ampmeter.logs.read_jsonl`
    with :func:`ampmeter.logs.event_problem`, which names ``file:line`` and the field of an
    event no reader accepts). ``skipped_lines`` counts the lines ``best_effort`` skipped so far.
    """

    def __init__(
        self, paths: Iterable[str | os.PathLike[str]], *, best_effort: bool = False
    ) -> None:
        self._paths = paths
        self._best_effort = best_effort
        self.skipped_lines = 0

    def __iter__(self) -> Iterator[tuple[str, dict[str, Any], Call]]:
        best_effort = self._best_effort
        for raw_path in self._paths:
            path = os.fspath(raw_path)
            with read_jsonl(path, best_effort=best_effort, check=event_problem) as reader:
                for index, obj in enumerate(reader):
                    yield path, obj, call_from_event(obj, index)
                self.skipped_lines += reader.skipped


def load_runs(
    paths: Iterable[str | os.PathLike[str]], *, best_effort: bool = False
) -> dict[str, Run]:
    """Read TokenTracker logs and group their events by ``run_id`` (first-seen order).

    Lines are read as :class:`LoggedCalls` reads them: a line that is not JSON, or an event
    whose fields no reader accepts, raises :class:`ampmeter.logs.JsonlError` naming the file,
    the line and the field (skipped and counted with ``best_effort``).
    """
    runs: dict[str, Run] = {}
    for path, obj, call in LoggedCalls(paths, best_effort=best_effort):
        run_id = obj["run_id"]
        run = runs.get(run_id)
        if run is None:
            run = runs[run_id] = Run(run_id)
        if path not in run.sources:
            run.sources.append(path)
        run.calls.append(call)
    for run in runs.values():
        _set_depths(run.calls)
    return runs


def _set_depths(calls: list[Call]) -> None:
    depths = call_depths([c.span_id for c in calls], [c.parent_id for c in calls])
    for call, depth in zip(calls, depths, strict=True):
        call.depth = depth


class CallTree:
    """One run's calls in log order, in 21 bytes each (the ids as hashes, whether it failed,
    its error class as a number), until the pass ends and :meth:`finish` finds their depths and
    the last top-level call: what both engines of :func:`ampmeter.analysis.summarize` keep."""

    __slots__ = ("_error_names", "_errors", "_flags", "_parents", "_spans")

    def __init__(self) -> None:
        self._spans = array("q")
        self._parents = array("q")
        self._flags = array("b")  # _FAILED | _HAS_PARENT
        self._errors = array("i")
        self._error_names: dict[str | None, int] = {None: 0}

    def add(
        self, span_id: str, parent_id: str | None, failed: bool, error_class: str | None
    ) -> None:
        """One more call of the run (its error class matters only when it ``failed``)."""
        names = self._error_names
        self._spans.append(hash(span_id))
        self._parents.append(0 if parent_id is None else hash(parent_id))
        self._flags.append(failed | (0 if parent_id is None else _HAS_PARENT))
        self._errors.append(names.setdefault(error_class, len(names)) if failed else 0)

    def finish(self) -> tuple[list[int], tuple[str, str | None]]:
        """Every call's depth (:func:`call_depths`), and ``("fail", error class)`` or
        ``("other", None)`` for the last top-level call (``("", None)`` when there is none)."""
        flags = self._flags
        parents = [self._parents[i] if flags[i] & _HAS_PARENT else None for i in range(len(flags))]
        depths = call_depths(self._spans, parents)
        last = next((i for i in range(len(depths) - 1, -1, -1) if depths[i] == 1), None)
        top: tuple[str, str | None] = ("", None)
        if last is not None and flags[last] & _FAILED:
            names = {number: name for name, number in self._error_names.items()}
            top = ("fail", names[self._errors[last]])
        elif last is not None:
            top = ("other", None)
        return depths, top


def call_depths(span_ids: Sequence[H], parent_ids: Sequence[H | None]) -> list[int]:
    """Depth of each call of one run, given in log order (1 for a call without a parent).

    A parent that is not in the log (the root, say) counts as one level above the call. In a
    damaged log, a span id seen twice resolves to its last occurrence and keeps the depth first
    found for that id (the later call stays at 1), and a cycle stops the climb where it closes.
    Both engines of :func:`ampmeter.analysis.summarize` rely on exactly these rules. Any
    hashable ids will do (the report's digest passes hashes of the ids).
    """
    index = {span: i for i, span in enumerate(span_ids)}
    out = [1] * len(span_ids)
    known: dict[H, int] = {}
    for i in range(len(span_ids)):
        chain: list[int] = []
        node: int | None = i
        depth = 0
        seen: set[H] = set()
        while node is not None:
            span = span_ids[node]
            if span in known:
                depth = known[span]
                break
            if span in seen:  # a cycle in a damaged log: stop climbing
                break
            seen.add(span)
            chain.append(node)
            parent = parent_ids[node]
            if parent is None:
                break
            node = index.get(parent)
            if node is None:  # parent not in the log (e.g. the root): one level above
                depth = 1
        for item in reversed(chain):
            depth += 1
            known[span_ids[item]] = depth
            out[item] = depth
    return out
