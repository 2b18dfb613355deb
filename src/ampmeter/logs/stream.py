"""The stream logger: per-call, per-problem, cumulative and TokenTracker files of a problem stream.

``StreamMetricsLogger(out_dir, run_id)`` appends to four JSONL files in ``out_dir``:
``{run_id}.calls.jsonl`` (one line per operation), ``{run_id}.problems.jsonl`` (one per problem),
``{run_id}.stream.jsonl`` (cumulative metrics after each problem) and
``{run_id}.token_events.jsonl`` (TokenTracker v0 events, ``run_id`` ``{run_id}:{problem_id}``).
Every line is written (and handed to the OS) before the call returns.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any, Final

import orjson

from ampmeter import _validate
from ampmeter._scoped import Closeable
from ampmeter.errors import SinkClosedError
from ampmeter.logs.lines import COMPONENTS, EVENT_TYPES, encode_event, iso_utc, node_to_event
from ampmeter.logs.stream_totals import StreamCumulativeMetrics, StreamTotals, Tally
from ampmeter.node import META_COST_STATUS, Node
from ampmeter.sinks.base import Sink

__all__ = ["ProblemSink", "StreamCumulativeMetrics", "StreamMetricsLogger"]

_EVENT_TYPE_VALUES: Final = frozenset(EVENT_TYPES.values())


_name: Final = functools.partial(_validate.text, empty=False)


def _flag(value: object, what: str) -> None:
    if value is not None and not isinstance(value, bool):
        raise TypeError(f"{what} must be a bool or None, got {value!r}")


def _cost(value: object, what: str) -> None:
    if value is not None:
        _validate.dollars(value, what)


# The fields of a calls.jsonl line that log_call is given, in order, each with its check.
_CALL_FIELDS: Final[dict[str, Callable[[object, str], object]]] = {
    "call_id": _name,
    "parent_id": _validate.optional_text,
    "t": _validate.count,
    "problem_id": _name,
    "operation": _name,
    "attempt_index": _validate.optional_count,
    "temperature": _validate.optional_amount,
    "validator_passed": _flag,
    "failure_reason": _validate.optional_text,
    "prompt_variant": _validate.optional_text,
    "prompt_tokens": _validate.optional_count,
    "completion_tokens": _validate.optional_count,
    "total_tokens": _validate.optional_count,
    "latency_ms": _validate.optional_amount,
    "api_cost_usd": _cost,
    "error_type": _validate.optional_text,
    "raw_output": _validate.optional_text,
    "candidate_line": _validate.optional_text,
    "normalization": _validate.optional_text,
    "precheck_failure_reason": _validate.optional_text,
}


class _LineFile:
    """An append-only JSONL file written one whole line per ``os.write``."""

    __slots__ = ("fd", "path")

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)

    def write(self, line: bytes) -> None:
        view = memoryview(line)
        while view:
            done = os.write(self.fd, view)
            view = view[done:]

    def close(self) -> None:
        os.close(self.fd)


class StreamMetricsLogger(Closeable):
    """Writes the four files of one stream run; see the module docs. A context manager.

    Per problem, either call :meth:`log_call` for each operation, or pass
    ``logger.problem(t, problem_id)`` as a sink to the problem's ``ExecutionContext``; then
    :meth:`log_problem` fills ``llm_calls``, ``tokens_total``, ``latency_total_ms`` and
    ``api_cost_usd`` from what it saw unless they are given.
    """

    def __init__(
        self, out_dir: str | os.PathLike[str], run_id: str, *, component: str = "pipeline"
    ) -> None:
        if not isinstance(run_id, str) or not run_id or run_id in (".", ".."):
            raise ValueError(f"run_id must be a non-empty file-name-safe str, got {run_id!r}")
        if "/" in run_id or os.sep in run_id or "\0" in run_id:
            raise ValueError(f"run_id must not contain path separators or NUL, got {run_id!r}")
        if component not in COMPONENTS:
            raise ValueError(f"component must be one of {sorted(COMPONENTS)}, got {component!r}")
        self.run_id = run_id
        self.component = component
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._closed = False
        files: list[_LineFile] = []
        try:
            for suffix in ("calls", "problems", "stream", "token_events"):
                files.append(_LineFile(self.out_dir / f"{run_id}.{suffix}.jsonl"))
        except OSError:
            for opened in files:
                opened.close()
            raise
        self._calls, self._problems, self._stream, self._events = files
        self._tallies: dict[tuple[int, str], Tally] = {}
        self._totals = StreamTotals()

    # -- paths ------------------------------------------------------------------------------

    @property
    def calls_path(self) -> str:
        """Path of ``{run_id}.calls.jsonl``."""
        return self._calls.path

    @property
    def problems_path(self) -> str:
        """Path of ``{run_id}.problems.jsonl``."""
        return self._problems.path

    @property
    def stream_path(self) -> str:
        """Path of ``{run_id}.stream.jsonl``."""
        return self._stream.path

    @property
    def token_events_path(self) -> str:
        """Path of ``{run_id}.token_events.jsonl``."""
        return self._events.path

    # -- calls ------------------------------------------------------------------------------

    def log_call(
        self,
        *,
        call_id: str,
        t: int,
        problem_id: str,
        operation: str,
        parent_id: str | None = None,
        attempt_index: int | None = None,
        temperature: float | None = None,
        validator_passed: bool | None = None,
        failure_reason: str | None = None,
        prompt_variant: str | None = None,
        prompt_tokens: int | None = None,
        completion_tokens: int | None = None,
        total_tokens: int | None = None,
        latency_ms: float | None = None,
        api_cost_usd: float | Decimal | None = None,
        error_type: str | None = None,
        raw_output: str | None = None,
        candidate_line: str | None = None,
        normalization: str | None = None,
        precheck_failure_reason: str | None = None,
        model: str = "",
        event_type: str | None = None,
    ) -> None:
        """Append one operation to ``calls.jsonl`` and ``token_events.jsonl``.

        ``total_tokens`` defaults to prompt + completion. ``event_type`` (TokenTracker) defaults
        to ``rag_retrieval`` for ``operation="retrieve"`` and ``llm_completion`` otherwise; a
        call without ``api_cost_usd`` is written with cost 0.0 and ``cost_status="unpriced"``.
        """
        given = locals()  # the arguments by name, before anything else is bound here
        for name, check in _CALL_FIELDS.items():
            check(given[name], name)
        _validate.text(model, "model")
        cost = None if api_cost_usd is None else _validate.dollars(api_cost_usd, "api_cost_usd")
        if event_type is None:
            event_type = "rag_retrieval" if operation == "retrieve" else "llm_completion"
        elif event_type not in _EVENT_TYPE_VALUES:
            raise ValueError(
                f"event_type must be one of {sorted(_EVENT_TYPE_VALUES)}, got {event_type!r}"
            )
        if total_tokens is None and (prompt_tokens is not None or completion_tokens is not None):
            total_tokens = (prompt_tokens or 0) + (completion_tokens or 0)
        call = {name: given[name] for name in _CALL_FIELDS}
        call["total_tokens"] = total_tokens
        call["latency_ms"] = None if latency_ms is None else float(latency_ms)
        call["api_cost_usd"] = None if cost is None else float(cost)
        event: dict[str, Any] = {
            "timestamp": iso_utc(time.time_ns() // 1_000_000),
            "run_id": f"{self.run_id}:{problem_id}",
            "span_id": call_id,
        }
        if parent_id is not None:
            event["parent_id"] = parent_id
        event.update(
            event_type=event_type,
            operation=operation,
            component=self.component,
            model=model,
            usage={
                "prompt_tokens": prompt_tokens or 0,
                "completion_tokens": completion_tokens or 0,
                "total_tokens": total_tokens or 0,
            },
            cost_usd=float(api_cost_usd or 0.0),
        )
        if latency_ms is not None:
            event["latency_ms"] = round(latency_ms)
        event["metadata"] = {
            "stream_run_id": self.run_id,
            "problem_id": problem_id,
            "t": t,
            "operation": operation,
            # One vocabulary in every event ampmeter writes (the node statuses); the caller's
            # error name travels beside it.
            "status": "success" if error_type is None else "fail",
            "error_class": error_type,
            "cost_status": "given" if api_cost_usd is not None else "unpriced",
        }
        with self._lock:
            self._check_open()
            self._write_call((t, problem_id), call, event, cost or Decimal(0))

    def problem(self, t: int, problem_id: str) -> ProblemSink:
        """A sink for one problem's ``ExecutionContext`` (``sinks=[logger.problem(t, pid)]``).

        Each finished call becomes a ``calls.jsonl`` line and a TokenTracker event; the
        context's root gives the problem's wall-clock latency.
        """
        _validate.count(t, "t")
        _validate.text(problem_id, "problem_id", empty=False)
        return ProblemSink(self, t, problem_id)

    def _record_node(self, node: Node, t: int, problem_id: str) -> None:
        with self._lock:
            self._check_open()
            if node.parent_id is None:
                if node.end_ts_ms is not None:
                    tally = self._tallies.setdefault((t, problem_id), Tally())
                    tally.root_latency_ms = (tally.root_latency_ms or 0.0) + (
                        node.end_ts_ms - node.start_ts_ms
                    )
                return
            # A node not finished, or of a kind no event has, is refused here (ValueError),
            # before anything is written or counted.
            event = node_to_event(
                node,
                f"{self.run_id}:{problem_id}",
                self.component,
                {
                    "stream_run_id": self.run_id,
                    "problem_id": problem_id,
                    "t": t,
                    "operation": node.name,
                },
            )
            meta = node.metadata
            unpriced = meta.get(META_COST_STATUS) == "unpriced"
            t_in, t_out = node.tokens_in, node.tokens_out
            total = None if t_in is None and t_out is None else (t_in or 0) + (t_out or 0)
            # The fields a node does not give come from its metadata, where a caller may put them.
            call: dict[str, Any] = {name: meta.get(name) for name in _CALL_FIELDS}
            call.update(
                call_id=node.node_id,
                parent_id=node.parent_id if node.depth > 1 else None,
                t=t,
                problem_id=problem_id,
                operation=node.name,
                prompt_tokens=t_in,
                completion_tokens=t_out,
                total_tokens=total,
                latency_ms=float(event["latency_ms"]),
                api_cost_usd=None if unpriced else float(node.cost_usd),
                # A call stopped before it ran has no error class; say that it was halted.
                error_type=node.error_class or ("halt" if node.status == "halt" else None),
            )
            if node.status != "success" and call["failure_reason"] is None:
                call["failure_reason"] = node.stop_reason
            self._write_call((t, problem_id), call, event, node.cost_usd)

    def _write_call(
        self, key: tuple[int, str], call: dict[str, Any], event: dict[str, Any], cost: Decimal
    ) -> None:
        """Write one call's ``calls.jsonl`` line and event, and count it for its problem (the
        caller holds the lock)."""
        self._calls.write(_dumps(call))
        self._events.write(encode_event(event))
        tally = self._tallies.setdefault(key, Tally())
        tally.llm_calls += event["event_type"] == "llm_completion"
        tally.tokens += call["total_tokens"] or 0
        tally.latency_ms += call["latency_ms"] or 0.0
        tally.cost += cost

    # -- problems ---------------------------------------------------------------------------

    def log_problem(
        self,
        t: int,
        problem_id: str,
        solved: bool,
        *,
        attempts: int = 1,
        solved_attempt: int | None = None,
        attempt_success_rate: float | None = None,
        llm_calls: int | None = None,
        tokens_total: int | None = None,
        latency_total_ms: float | None = None,
        api_cost_usd: float | Decimal | None = None,
        retrieval_hit: bool = False,
        reuse_count: int = 0,
        memory_n_nodes: int = 0,
        memory_n_edges: int = 0,
        contamination_rate: float | None = None,
    ) -> StreamCumulativeMetrics:
        """Append the problem's ``problems.jsonl`` and ``stream.jsonl`` lines; return the latter.

        ``llm_calls``, ``tokens_total``, ``latency_total_ms`` and ``api_cost_usd`` default to
        what :meth:`log_call` or :meth:`problem`'s sink saw for ``(t, problem_id)`` (latency:
        the contexts' wall-clock time when a context was seen, else the sum of call latencies).
        """
        _validate.count(t, "t")
        _validate.text(problem_id, "problem_id", empty=False)
        for name, flag in (("solved", solved), ("retrieval_hit", retrieval_hit)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
        _validate.count(attempts, "attempts")
        for name, count in (
            ("solved_attempt", solved_attempt),
            ("llm_calls", llm_calls),
            ("tokens_total", tokens_total),
            ("reuse_count", reuse_count),
            ("memory_n_nodes", memory_n_nodes),
            ("memory_n_edges", memory_n_edges),
        ):
            _validate.optional_count(count, name)
        _validate.optional_amount(latency_total_ms, "latency_total_ms")
        for name, rate in (
            ("attempt_success_rate", attempt_success_rate),
            ("contamination_rate", contamination_rate),
        ):
            if rate is not None and _validate.amount(rate, name) > 1.0:
                raise ValueError(f"{name} must be between 0 and 1, got {rate!r}")
        with self._lock:
            self._check_open()
            tally = self._tallies.get((t, problem_id)) or Tally()
            if latency_total_ms is None:
                seen = tally.root_latency_ms
                latency_total_ms = seen if seen is not None else tally.latency_ms
            cost = (
                tally.cost
                if api_cost_usd is None
                else _validate.dollars(api_cost_usd, "api_cost_usd")
            )
            line = {
                "t": t,
                "problem_id": problem_id,
                "solved": solved,
                "attempts": attempts,
                "solved_attempt": solved_attempt,
                "attempt_success_rate": attempt_success_rate,
                "llm_calls": llm_calls if llm_calls is not None else tally.llm_calls,
                "tokens_total": tokens_total if tokens_total is not None else tally.tokens,
                "latency_total_ms": float(latency_total_ms),
                "api_cost_usd": float(cost),
                "retrieval_hit": retrieval_hit,
                "reuse_count": reuse_count,
                "memory_n_nodes": memory_n_nodes,
                "memory_n_edges": memory_n_edges,
                "contamination_rate": contamination_rate,
            }
            totals = self._totals.after(solved, cost, float(latency_total_ms), contamination_rate)
            cumulative = totals.line(t)
            self._problems.write(_dumps(line))
            self._stream.write(_dumps(cumulative.to_dict()))
            # Only now, with both lines written, does the state move on.
            self._tallies.pop((t, problem_id), None)
            self._totals = totals
            return cumulative

    # -- lifetime ---------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise SinkClosedError(f"StreamMetricsLogger for run {self.run_id!r} is closed")

    def close(self) -> None:
        """Close the four files (closing twice is harmless)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for file in (self._calls, self._problems, self._stream, self._events):
                file.close()


class ProblemSink(Sink):
    """Sink for one problem of a :class:`StreamMetricsLogger`; made by ``logger.problem()``.

    Lines are written as nodes arrive, so :meth:`flush` has nothing to do; :meth:`close` only
    stops this sink (the logger owns the files).
    """

    def __init__(self, logger: StreamMetricsLogger, t: int, problem_id: str) -> None:
        self.logger = logger
        self.t = t
        self.problem_id = problem_id
        self._closed = False

    def emit(self, node: Node, chain_id: str) -> None:
        """Record one finished node of the problem (the root only gives the wall time)."""
        if not isinstance(node, Node):
            raise TypeError(f"node must be an ampmeter Node, got {type(node).__name__}")
        if self._closed:
            raise SinkClosedError(f"the sink of problem {self.problem_id!r} is closed")
        self.logger._record_node(node, self.t, self.problem_id)

    def log_problem(self, solved: bool, **fields: Any) -> StreamCumulativeMetrics:
        """``logger.log_problem(t, problem_id, solved, **fields)`` for this sink's problem."""
        return self.logger.log_problem(self.t, self.problem_id, solved, **fields)

    def close(self) -> None:
        """Refuse further nodes."""
        self._closed = True


def _dumps(obj: dict[str, Any]) -> bytes:
    return orjson.dumps(obj, default=str, option=orjson.OPT_APPEND_NEWLINE)
