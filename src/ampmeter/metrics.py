"""Per-LLM-call metrics and context growth of one task (bench-metrics): a :class:`TaskResult`
holds one :class:`LLMCallMetrics` per LLM call, in call order, plus the task's totals, built from
a live context, the finished nodes of a graph or, after the fact, a TokenTracker log."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from ampmeter import money
from ampmeter.logs.reader import iter_lines, read_jsonl
from ampmeter.node import META_TOOL_CALLS_MADE, TERMINAL_STATUSES, Node

if TYPE_CHECKING:
    from ampmeter.context import ExecutionContext

__all__ = ["LLMCallMetrics", "TaskResult"]


@dataclass(frozen=True, slots=True)
class LLMCallMetrics:
    """One LLM call: its tokens, the tool calls it asked for, and the running input total."""

    call_number: int
    input_tokens: int
    output_tokens: int
    tool_calls_made: int
    cumulative_input: int
    latency_ms: float


@dataclass(slots=True)
class TaskResult:
    """Per-call metrics and totals of one task; every field has a default."""

    llm_call_metrics: list[LLMCallMetrics] = field(default_factory=list)
    input_tokens: int = 0
    output_tokens: int = 0
    llm_calls: int = 0
    tool_calls: int = 0
    cost_usd: float = 0.0
    duration_seconds: float = 0.0

    @property
    def base_context(self) -> int:
        """Input tokens of the first LLM call (system prompt and tools); 0 without calls."""
        calls = self.llm_call_metrics
        return calls[0].input_tokens if calls else 0

    @property
    def context_growth_avg(self) -> float:
        """Mean change of input tokens between consecutive calls; 0.0 with fewer than two.

        Not clamped: compaction can make it negative.
        """
        calls = self.llm_call_metrics
        if len(calls) < 2:
            return 0.0
        return (calls[-1].input_tokens - calls[0].input_tokens) / (len(calls) - 1)

    # -- builders ---------------------------------------------------------------------------

    @classmethod
    def from_nodes(cls, nodes: Iterable[Node]) -> TaskResult:
        """Build from graph nodes: finished ``llm`` nodes in start order, totals over all
        finished non-root nodes, duration from the root (or from the nodes' span)."""
        span: tuple[float | None, float | None] = (None, None)
        rows: list[_Row] = []
        llm: list[Node] = []
        for node in nodes:
            if not isinstance(node, Node):
                raise TypeError(f"nodes must be ampmeter Nodes, got {type(node).__name__}")
            if node.parent_id is None:
                span = (node.start_ts_ms, node.end_ts_ms)
                continue
            if node.status not in TERMINAL_STATUSES:
                continue
            t_in, t_out = node.tokens_in or 0, node.tokens_out or 0
            rows.append((node.kind, t_in, t_out, node.cost_usd, node.start_ts_ms, node.end_ts_ms))
            if node.kind == "llm" and was_sent(node.status, t_in, t_out):
                llm.append(node)
        llm.sort(key=lambda n: n.start_ts_ms)  # stable: creation order breaks ties
        calls = [
            (n.tokens_in or 0, n.tokens_out or 0, _tools(n.metadata), float(n.latency_ms or 0))
            for n in llm
        ]
        return _task(rows, calls, span)

    @classmethod
    def from_context(cls, ctx: ExecutionContext) -> TaskResult:
        """Build from a live or closed context: ``from_nodes(ctx.graph.nodes())``.

        With ``max_nodes`` set on the graph, evicted nodes are no longer there to count.
        """
        return cls.from_nodes(ctx.graph.nodes())

    @classmethod
    def from_events(
        cls,
        path_or_lines: str | os.PathLike[str] | Iterable[str | bytes | Mapping[str, Any]],
        run_id: str | None = None,
    ) -> TaskResult:
        """Build from a TokenTracker log: a file path, JSONL lines, or already-parsed events.

        ``llm_completion`` events in log order make the per-call metrics (``tool_calls_made``
        from their metadata). With ``run_id`` only that run's events count; without it the log
        must hold a single run. Reading follows :func:`ampmeter.logs.read_jsonl`.
        """
        if run_id is not None and not isinstance(run_id, str):
            raise TypeError(f"run_id must be a str or None, got {type(run_id).__name__}")
        rows: list[_Row] = []
        calls: list[_Call] = []
        runs: set[str] = set()
        for index, event in enumerate(_events(path_or_lines), 1):
            event_run = event.get("run_id")
            if run_id is not None and event_run != run_id:
                continue
            if isinstance(event_run, str):
                runs.add(event_run)
            kind, t_in, t_out, cost, latency, end_ms = _event_fields(event, index)
            rows.append(
                (kind, t_in, t_out, cost, None if end_ms is None else end_ms - latency, end_ms)
            )
            # the status is in the metadata (the contract's place) or else at the top level
            meta = event.get("metadata")
            status = (meta if isinstance(meta, dict) and "status" in meta else event).get("status")
            if kind == "llm" and was_sent(status, t_in, t_out):
                calls.append((t_in, t_out, _tools(meta), latency))
        if run_id is not None and not rows:
            raise ValueError(f"no events with run_id {run_id!r} in the log")
        if run_id is None and len(runs) > 1:
            names = ", ".join(repr(r) for r in sorted(runs)[:5])
            raise ValueError(
                f"the log holds {len(runs)} runs ({names}{', ...' if len(runs) > 5 else ''}); "
                "pass run_id= to choose one"
            )
        return _task(rows, calls)


# (kind, tokens in, tokens out, cost, start ms, end ms) of a finished call or event
_Row = tuple[str, int, int, "Decimal | float", "float | None", "float | None"]
# (tokens in, tokens out, tool calls made, latency ms) of an LLM call that was sent
_Call = tuple[int, int, int, float]


def _task(
    rows: list[_Row], calls: list[_Call], span: tuple[float | None, float | None] = (None, None)
) -> TaskResult:
    """The task of ``rows``, with ``calls`` in call order; its duration from ``span`` (the
    root's start and end) where known, else from the rows' earliest start and latest end."""
    metrics: list[LLMCallMetrics] = []
    cumulative = 0
    for number, (t_in, t_out, tools, latency) in enumerate(calls, 1):
        cumulative += t_in
        metrics.append(LLMCallMetrics(number, t_in, t_out, tools, cumulative, latency))
    starts = (row[4] for row in rows if row[4] is not None)
    ends = (row[5] for row in rows if row[5] is not None)
    first = span[0] if span[0] is not None else min(starts, default=None)
    last = span[1] if span[1] is not None else max(ends, default=None)
    duration = 0.0 if first is None or last is None else max(0.0, (last - first) / 1000.0)
    # summed exactly; a float only in the result
    cost = sum((money.usd(r[3], "cost_usd", allow_negative=True) for r in rows), Decimal(0))
    return TaskResult(
        metrics,
        sum(r[1] for r in rows),
        sum(r[2] for r in rows),
        sum(r[0] == "llm" for r in rows),
        sum(r[0] == "tool" for r in rows),
        float(cost),
        duration,
    )


def _tools(metadata: object) -> int:
    """The tool calls an LLM call asked for, from its metadata (0 when not a count)."""
    tools = metadata.get(META_TOOL_CALLS_MADE) if isinstance(metadata, Mapping) else None
    return tools if type(tools) is int and tools >= 0 else 0


def was_sent(status: object, tokens_in: int | None, tokens_out: int | None) -> bool:
    """Whether an LLM call reached the provider, so it is a per-call metrics entry.

    A call halted before it was sent reports no tokens; it still counts as an attempted call
    (amplification) but has no usage to measure context growth by.
    """
    return not (status == "halt" and not tokens_in and not tokens_out)


def _events(
    source: str | os.PathLike[str] | Iterable[str | bytes | Mapping[str, Any]],
) -> Iterable[Mapping[str, Any]]:
    if isinstance(source, (str, os.PathLike)):
        return read_jsonl(source)
    if isinstance(source, (bytes, Mapping)):
        raise TypeError("from_events takes a path or an iterable of lines/events, not one line")
    return _mixed(source)


def _mixed(items: Iterable[str | bytes | Mapping[str, Any]]) -> Iterable[Mapping[str, Any]]:
    buffered: list[str | bytes] = []
    for item in items:
        if isinstance(item, Mapping):
            yield from iter_lines(buffered)
            buffered.clear()
            yield item
        elif isinstance(item, (str, bytes)):
            buffered.append(item)
        else:
            raise TypeError(
                f"from_events takes str/bytes lines or dict events, got {type(item).__name__}"
            )
    yield from iter_lines(buffered)


def _event_fields(
    event: Mapping[str, Any], index: int
) -> tuple[str, int, int, float, float, float | None]:
    """(kind, tokens in, tokens out, cost, latency ms, end ms) of one event, or a clear error."""
    usage = event.get("usage")
    if not isinstance(usage, Mapping):
        raise ValueError(f"event {index} has no usage object")
    t_in = _count(usage.get("prompt_tokens"), index, "usage.prompt_tokens")
    t_out = _count(usage.get("completion_tokens"), index, "usage.completion_tokens")
    cost = event.get("cost_usd", 0.0)
    if isinstance(cost, bool) or not isinstance(cost, (int, float)):
        raise ValueError(f"event {index}: cost_usd must be a number, got {cost!r}")
    latency = event.get("latency_ms") or 0
    if isinstance(latency, bool) or not isinstance(latency, (int, float)):
        raise ValueError(f"event {index}: latency_ms must be a number, got {latency!r}")
    from ampmeter.analysis.runs import KIND_OF_EVENT, event_time_ms  # (as the analysis reads)

    end_ms = event_time_ms(event.get("timestamp"))
    kind = KIND_OF_EVENT.get(str(event.get("event_type")), "other")
    return kind, t_in, t_out, float(cost), float(latency), end_ms


def _count(value: object, index: int, what: str) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"event {index}: {what} must be an int >= 0, got {value!r}")
    return value
