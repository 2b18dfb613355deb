"""LLMCallMetrics and TaskResult: context growth, from nodes, from a TokenTracker log."""

from __future__ import annotations

import itertools
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ampmeter.graph import ExecutionGraph
from ampmeter.logs import JsonlError
from ampmeter.metrics import LLMCallMetrics, TaskResult
from ampmeter.sinks.jsonl import JsonlSink


def calls(inputs: list[int]) -> list[LLMCallMetrics]:
    out, total = [], 0
    for i, t_in in enumerate(inputs, 1):
        total += t_in
        out.append(LLMCallMetrics(i, t_in, 1, 0, total, 10.0))
    return out


def test_defaults_and_growth_properties() -> None:
    empty = TaskResult()
    assert (empty.base_context, empty.context_growth_avg) == (0, 0.0)
    one = TaskResult(llm_call_metrics=calls([500]))
    assert (one.base_context, one.context_growth_avg) == (500, 0.0)
    many = TaskResult(llm_call_metrics=calls([500, 700, 650, 1100]))
    assert many.base_context == 500
    assert many.context_growth_avg == pytest.approx((200 - 50 + 450) / 3)
    shrink = TaskResult(llm_call_metrics=calls([900, 300]))
    assert shrink.context_growth_avg == -600.0  # not clamped
    assert many.input_tokens == 0 and many.cost_usd == 0.0


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 10**6), min_size=2, max_size=30))
def test_growth_is_the_mean_consecutive_difference(inputs: list[int]) -> None:
    result = TaskResult(llm_call_metrics=calls(inputs))
    diffs = [b - a for a, b in itertools.pairwise(inputs)]
    assert result.context_growth_avg == pytest.approx(sum(diffs) / len(diffs))


def build_run() -> ExecutionGraph:
    g = ExecutionGraph("task-1")
    root = g.create_root("agent")
    for i, (t_in, tools) in enumerate([(1000, 2), (1300, 1), (1250, 0)]):
        n = g.begin_node(root, "llm", f"turn{i}", model="m")
        g.mark_running(n)
        g.mark_success(n, 0.01, t_in, 50 + i, metadata={"tool_calls_made": tools})
        for j in range(tools):
            t = g.begin_node(n, "tool", f"tool{j}")
            g.mark_success(t, 0.0)
    e = g.begin_node(root, "embedding", "embed")
    g.mark_success(e, 0.001, 30)
    g.begin_node(root, "llm", "never-finished")
    g.mark_success(root, 0.0)
    return g


def check_run(result: TaskResult) -> None:
    assert [c.input_tokens for c in result.llm_call_metrics] == [1000, 1300, 1250]
    assert [c.output_tokens for c in result.llm_call_metrics] == [50, 51, 52]
    assert [c.tool_calls_made for c in result.llm_call_metrics] == [2, 1, 0]
    assert [c.cumulative_input for c in result.llm_call_metrics] == [1000, 2300, 3550]
    assert [c.call_number for c in result.llm_call_metrics] == [1, 2, 3]
    assert result.llm_calls == 3
    assert result.tool_calls == 3
    assert result.input_tokens == 3580
    assert result.output_tokens == 153
    assert result.cost_usd == pytest.approx(0.031)
    assert result.base_context == 1000
    assert result.context_growth_avg == 125.0
    assert result.duration_seconds >= 0.0


def test_from_nodes_and_from_context() -> None:
    g = build_run()
    from_nodes = TaskResult.from_nodes(g.nodes())
    check_run(from_nodes)
    root = g.node(g.root_id or "")
    assert from_nodes.duration_seconds == (root.latency_ms or 0) / 1000

    class Ctx:
        graph = g

    assert TaskResult.from_context(Ctx()) == from_nodes
    with pytest.raises(TypeError, match="Node"):
        TaskResult.from_nodes(["n1"])  # type: ignore[list-item]


def test_from_events_matches_from_nodes(tmp_path: Path) -> None:
    g = build_run()
    path = tmp_path / "run.jsonl"
    with JsonlSink(path) as sink:
        for n in g.nodes():
            if n.is_terminal:
                sink.emit(n, g.chain_id)
    from_file = TaskResult.from_events(path)
    check_run(from_file)
    lines = path.read_text().splitlines()
    assert TaskResult.from_events(lines).llm_call_metrics == from_file.llm_call_metrics
    parsed = [orjson.loads(line) for line in lines]
    assert TaskResult.from_events(parsed, run_id="task-1").llm_call_metrics == (
        from_file.llm_call_metrics
    )


def test_from_events_picks_a_run_and_refuses_ambiguity(tmp_path: Path) -> None:
    path = tmp_path / "two.jsonl"
    for chain in ("a", "b"):
        g = ExecutionGraph(chain)
        root = g.create_root("r")
        n = g.begin_node(root, "llm", "x")
        g.mark_success(n, 0.0, 10 if chain == "a" else 20, 1)
        with JsonlSink(path, flush="line") as sink:
            sink.emit(g.node(n), chain)
    with pytest.raises(ValueError, match="run_id"):
        TaskResult.from_events(path)
    assert TaskResult.from_events(path, run_id="b").base_context == 20
    with pytest.raises(ValueError, match="no events"):
        TaskResult.from_events(path, run_id="zzz")
    assert TaskResult.from_events([]) == TaskResult()


def test_from_events_bad_input() -> None:
    with pytest.raises(JsonlError):
        TaskResult.from_events(["not json", "{}"])
    with pytest.raises(ValueError, match="usage"):
        TaskResult.from_events([{"event_type": "llm_completion", "run_id": "r"}])
    with pytest.raises(ValueError, match="prompt_tokens"):
        TaskResult.from_events([{"usage": {"prompt_tokens": -1}, "run_id": "r"}])
    with pytest.raises(TypeError, match="lines"):
        TaskResult.from_events([3])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        TaskResult.from_events(b'{"a":1}')  # type: ignore[arg-type]


def test_with_a_real_execution_context(tmp_path: Path) -> None:
    context = pytest.importorskip("ampmeter.context")
    from ampmeter.logs import StreamMetricsLogger, read_jsonl, validate_event
    from ampmeter.sinks.memory import MemorySink

    path = tmp_path / "ctx.jsonl"
    memory = MemorySink()
    with (
        JsonlSink(path) as sink,
        StreamMetricsLogger(tmp_path, "stream") as log,
    ):
        problem = log.problem(1, "q1")
        with context.ExecutionContext("solve", sinks=[sink, memory, problem]) as ctx:
            for t_in, tools in [(400, 1), (650, 0)]:
                with ctx.llm_call("chat", model="m") as call:
                    call.record(t_in, 20, cost_usd=0.01, tool_calls_made=tools)
                if tools:
                    with ctx.tool_call("search"):
                        pass
        live = TaskResult.from_context(ctx)
        cumulative = problem.log_problem(True)
    assert [c.input_tokens for c in live.llm_call_metrics] == [400, 650]
    assert [c.tool_calls_made for c in live.llm_call_metrics] == [1, 0]
    assert live.context_growth_avg == 250.0
    assert (live.llm_calls, live.tool_calls) == (2, 1)
    logged = TaskResult.from_events(path)
    assert logged.llm_call_metrics == [
        LLMCallMetrics(
            c.call_number,
            c.input_tokens,
            c.output_tokens,
            c.tool_calls_made,
            c.cumulative_input,
            c.latency_ms,
        )
        for c in live.llm_call_metrics
    ]
    assert any(n.parent_id is None for n in memory.nodes)  # the root reached the sinks
    for event in read_jsonl(path):
        validate_event(event)
    assert cumulative.cumulative_api_cost_usd == pytest.approx(0.02)
    (problem_line,) = read_jsonl(log.problems_path)
    assert problem_line["llm_calls"] == 2
    assert problem_line["tokens_total"] == 1090
    assert len(list(read_jsonl(log.calls_path))) == 3


def test_a_call_halted_before_it_was_sent_is_no_per_call_entry(tmp_path: Path) -> None:
    """It counts as an attempted call (amplification) but has no usage to measure growth by."""
    from ampmeter import ExecutionContext, LimitExceeded
    from ampmeter.analysis import summarize

    path = tmp_path / "run.jsonl"
    with (
        JsonlSink(path, run_id="r") as sink,
        ExecutionContext("agent", max_steps=2, sinks=[sink]) as ctx,
    ):
        for tokens_in in (100, 160):
            with ctx.llm_call("step", model="m") as call:
                call.record(tokens_in, 10, cost_usd=0.0)
        with pytest.raises(LimitExceeded), ctx.llm_call("step", model="m"):
            pytest.fail("must not run")
    live = TaskResult.from_context(ctx)
    logged = TaskResult.from_events(path)
    for task in (live, logged):
        assert [m.input_tokens for m in task.llm_call_metrics] == [100, 160]
        assert task.base_context == 100
        assert task.context_growth_avg == 60.0
        assert task.llm_calls == 3  # the halted call is still an attempt
    for engine in ("python", "duckdb"):
        (row,) = summarize([path], engine=engine).runs
        assert (row.base_context, row.context_growth_avg, row.llm_calls) == (100, 60.0, 3)
