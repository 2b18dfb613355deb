"""Logs written by real contexts, for the tests that read them (analysis, report, summary, the
CLI): a stream run, an agent run with a retry, a failure and a halt, and a stopped sub-agent."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import pytest

from ampmeter.context import ExecutionContext
from ampmeter.errors import LimitExceeded
from ampmeter.keys import KEY_LLM_CALLS
from ampmeter.limits import Limit
from ampmeter.logs import StreamMetricsLogger
from ampmeter.sinks.jsonl import JsonlSink

SCRIPT_NAME = "<script>window.__pwned = 1</script>"
IMG_PAYLOAD = '<img src=x onerror="window.__pwned = 2">'


def make_stream_logs(out: Path, problems: int = 6, run_id: str = "s1") -> dict[str, Path]:
    """A real stream run: each problem is an ExecutionContext whose nodes go to the logger."""
    with StreamMetricsLogger(out, run_id) as logger:
        for t in range(1, problems + 1):
            sink = logger.problem(t, f"q{t}")
            with ExecutionContext(f"problem-{t}", sinks=[sink]) as ctx:
                for step in range(t % 3 + 1):
                    with ctx.llm_call(f"solve-{step}", model="gpt-4o-mini") as call:
                        call.record(
                            tokens_in=100 * (step + 1) + t, tokens_out=10 + t, cost_usd=0.001 * t
                        )
                with ctx.step("recall", kind="retrieval", metadata={"component": "rag_infra"}):
                    pass
            solved = t % 2 == 1
            sink.log_problem(solved, attempt_success_rate=1.0 if solved else 0.0)
    return {
        "stream": Path(logger.stream_path),
        "problems": Path(logger.problems_path),
        "events": Path(logger.token_events_path),
    }


def make_event_log(path: Path, run_id: str = "agent-1", *, halt: bool = True) -> Path:
    """A real agent run through a JsonlSink: nested calls, a retry, a failure, a halt."""
    with JsonlSink(path, flush="line") as sink:
        steps = 9 if halt else None
        ctx = ExecutionContext("agent", sinks=[sink], chain_id=run_id, max_steps=steps)
        try:
            with ctx:
                for step in range(3):
                    with ctx.llm_call(f"step-{step}", model="gpt-4o-mini") as call:
                        call.record(
                            tokens_in=200 + 150 * step,
                            tokens_out=40,
                            cost_usd=0.002,
                            tool_calls_made=1,
                        )
                        with ctx.tool_call("search", metadata={"query": SCRIPT_NAME}):
                            pass
                        if step == 1:
                            call.retry()
                with ctx.llm_call(SCRIPT_NAME, model="local-model-x") as call:
                    call.record(tokens_in=50, tokens_out=5)
                with pytest.raises(RuntimeError), ctx.tool_call("flaky"):
                    raise RuntimeError(IMG_PAYLOAD)
                if halt:
                    for step in range(3, 10):
                        with ctx.llm_call(f"step-{step}", model="gpt-4o-mini") as call:
                            call.record(tokens_in=10, tokens_out=1, cost_usd=0.0001)
        except LimitExceeded:
            pass
    return path


def reference_percentile(values: list[float], q: float) -> float:
    """Linear interpolation between the closest ranks, written out independently."""
    data = sorted(values)
    pos = (len(data) - 1) * q / 100.0
    i = int(pos)
    j = min(i + 1, len(data) - 1)
    return data[i] + (data[j] - data[i]) * (pos - i)


def make_subagent_log(path: Path) -> Path:
    """A real run whose sub-agent is stopped by its own cost ceiling: two LLM calls that were
    sent (30 ms and 60 ms of real time) and one the child's ceiling stopped before sending."""
    with JsonlSink(path, flush="line") as sink:
        ctx = ExecutionContext("agent", sinks=[sink], chain_id="sub")
        with ctx:
            with ctx.llm_call("plan", model="gpt-4o-mini") as call:
                time.sleep(0.03)
                call.record(tokens_in=100, tokens_out=10, cost_usd=0.001)
            child = ctx.spawn_child("researcher", max_cost_usd=0.0015)
            with contextlib.suppress(LimitExceeded), child:
                with child.llm_call("read", model="gpt-4o-mini", estimate_usd=0.0005) as call:
                    time.sleep(0.06)
                    call.record(tokens_in=300, tokens_out=20, cost_usd=0.001)
                with child.llm_call("again", model="gpt-4o-mini", estimate_usd=0.001):
                    pass
    return path


def make_research_log(path: Path, runs: int = 1, chain_ids: tuple[str, ...] = ()) -> Path:
    """Runs like issue 39's: a root ``research_run`` capped at $0.0004 with six sub-agents,
    each capped at 2 LLM calls of $0.00001 and refused a third (the program goes on)."""
    with JsonlSink(path) as sink:
        for number in range(runs):
            chain = chain_ids[number] if chain_ids else None
            root = ExecutionContext(
                "research_run", max_cost_usd=0.0004, sinks=[sink], chain_id=chain
            )
            with root:
                for i in range(6):
                    child = root.spawn_child(f"researcher-{i}", limits=[Limit(KEY_LLM_CALLS, 2)])
                    with contextlib.suppress(LimitExceeded), child:
                        for j in range(3):
                            with child.llm_call(f"ask-{j}", model="m", estimate_usd=1e-5) as c:
                                c.record(tokens_in=100, tokens_out=10, cost_usd=0.00001)
    return path
