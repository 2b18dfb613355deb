"""StreamMetricsLogger: the four files, cumulative metrics, and the per-problem sink."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ampmeter.graph import ExecutionGraph
from ampmeter.logs import ProblemSink, StreamMetricsLogger, read_jsonl, validate_event
from ampmeter.logs.stream_totals import percentile
from ampmeter.sinks.jsonl import SinkClosedError

CALL_KEYS = {
    "call_id",
    "parent_id",
    "t",
    "problem_id",
    "operation",
    "attempt_index",
    "temperature",
    "validator_passed",
    "failure_reason",
    "prompt_variant",
    "prompt_tokens",
    "completion_tokens",
    "total_tokens",
    "latency_ms",
    "api_cost_usd",
    "error_type",
    "raw_output",
    "candidate_line",
    "normalization",
    "precheck_failure_reason",
}
PROBLEM_KEYS = {
    "t",
    "problem_id",
    "solved",
    "attempts",
    "solved_attempt",
    "attempt_success_rate",
    "llm_calls",
    "tokens_total",
    "latency_total_ms",
    "api_cost_usd",
    "retrieval_hit",
    "reuse_count",
    "memory_n_nodes",
    "memory_n_edges",
    "contamination_rate",
}
STREAM_KEYS = {
    "t",
    "cumulative_solved",
    "cumulative_api_cost_usd",
    "cost_per_solved",
    "contamination_rate",
    "p50_latency_ms",
    "p95_latency_ms",
}


def read(path: str) -> list[dict[str, Any]]:
    return list(read_jsonl(path))


def test_manual_calls_and_problems_write_all_four_files(tmp_path: Path) -> None:
    with StreamMetricsLogger(tmp_path / "out", "run1") as log:
        log.log_call(call_id="c1", t=1, problem_id="q1", operation="retrieve")
        log.log_call(
            call_id="c2",
            parent_id="c1",
            t=1,
            problem_id="q1",
            operation="solve",
            prompt_tokens=50,
            completion_tokens=10,
            latency_ms=100.0,
            api_cost_usd=0.01,
            model="llama",
        )
        first = log.log_problem(1, "q1", True)
        log.log_call(
            call_id="c3",
            t=2,
            problem_id="q2",
            operation="solve",
            prompt_tokens=5,
            completion_tokens=1,
            latency_ms=300.0,
            api_cost_usd=0.03,
            error_type="ParseError",
        )
        second = log.log_problem(2, "q2", False, contamination_rate=0.5)
    calls = read(log.calls_path)
    assert [set(c) for c in calls] == [CALL_KEYS] * 3
    assert calls[0]["prompt_tokens"] is None and calls[0]["parent_id"] is None
    assert calls[1]["total_tokens"] == 60 and calls[1]["parent_id"] == "c1"
    problems = read(log.problems_path)
    assert [set(p) for p in problems] == [PROBLEM_KEYS] * 2
    assert problems[0]["llm_calls"] == 1  # the retrieve call is not an LLM call
    assert problems[0]["tokens_total"] == 60
    assert problems[0]["latency_total_ms"] == 100.0
    assert problems[0]["api_cost_usd"] == pytest.approx(0.01)
    assert problems[1]["api_cost_usd"] == pytest.approx(0.03)
    stream = read(log.stream_path)
    assert [set(s) for s in stream] == [STREAM_KEYS] * 2
    assert stream[1] == second.to_dict()
    assert first.cost_per_solved == pytest.approx(0.01)
    assert second.cumulative_solved == 1
    assert second.cumulative_api_cost_usd == pytest.approx(0.04)
    assert second.cost_per_solved == pytest.approx(0.04)
    assert second.contamination_rate == 0.5
    assert second.p50_latency_ms == pytest.approx(200.0)
    assert second.p95_latency_ms == pytest.approx(290.0)
    events = read(log.token_events_path)
    for e in events:
        validate_event(e)
    assert [e["event_type"] for e in events] == [
        "rag_retrieval",
        "llm_completion",
        "llm_completion",
    ]
    assert events[0]["run_id"] == "run1:q1" and "parent_id" not in events[0]
    assert events[1]["parent_id"] == "c1"
    assert events[0]["metadata"]["cost_status"] == "unpriced"
    expected = {
        "stream_run_id": "run1",
        "problem_id": "q2",
        "t": 2,
        "operation": "solve",
        "status": "fail",
    }
    assert {k: events[2]["metadata"][k] for k in expected} == expected


def test_explicit_problem_fields_win_and_no_calls_means_zero(tmp_path: Path) -> None:
    with StreamMetricsLogger(tmp_path, "r") as log:
        log.log_call(call_id="c", t=1, problem_id="q", operation="solve", prompt_tokens=9)
        m = log.log_problem(
            1,
            "q",
            False,
            llm_calls=7,
            tokens_total=3,
            latency_total_ms=5.0,
            api_cost_usd=2.0,
            attempts=3,
            solved_attempt=None,
        )
        empty = log.log_problem(2, "q2", False)
    p1, p2 = read(log.problems_path)
    assert (p1["llm_calls"], p1["tokens_total"], p1["latency_total_ms"]) == (7, 3, 5.0)
    assert p1["attempts"] == 3
    assert (p2["llm_calls"], p2["tokens_total"], p2["api_cost_usd"]) == (0, 0, 0.0)
    assert m.cost_per_solved == 2.0  # divided by max(1, 0)
    assert empty.cumulative_api_cost_usd == 2.0


def test_problem_sink_refuses_an_unfinished_node_and_counts_nothing(tmp_path: Path) -> None:
    with StreamMetricsLogger(tmp_path, "run3") as log:
        sink = log.problem(0, "q0")
        g = ExecutionGraph("chain")
        running = g.begin_node(g.create_root("problem"), "llm", "solve")
        with pytest.raises(ValueError, match="not finished"):
            sink.emit(g.node(running), g.chain_id)
        problem = sink.log_problem(False)
    assert read(log.calls_path) == [] and read(log.token_events_path) == []
    assert problem.cumulative_api_cost_usd == 0.0
    assert read(log.problems_path)[0]["llm_calls"] == 0


def test_problem_sink_feeds_from_graph_nodes(tmp_path: Path) -> None:
    log = StreamMetricsLogger(tmp_path, "run2")
    sink = log.problem(1, "q1")
    assert isinstance(sink, ProblemSink)
    g = ExecutionGraph("chain")
    root = g.create_root("problem")
    a = g.begin_node(root, "llm", "solve", model="m", metadata={"attempt_index": 0})
    g.mark_success(a, 0.02, 100, 20)
    sink.emit(g.node(a), g.chain_id)
    b = g.begin_node(a, "tool", "run_code")
    g.mark_failure(b, "ValueError")
    sink.emit(g.node(b), g.chain_id)
    c = g.begin_node(root, "llm", "validate", metadata={"cost_status": "unpriced"})
    g.mark_success(c, 0.0, 10, 1)
    sink.emit(g.node(c), g.chain_id)
    g.mark_success(root, 0.0)
    root_node = g.node(root)
    sink.emit(root_node, g.chain_id)
    sink.flush()
    cumulative = sink.log_problem(True, retrieval_hit=True)
    sink.close()
    with pytest.raises(SinkClosedError):
        sink.emit(g.node(a), g.chain_id)
    log.close()
    calls = read(log.calls_path)
    assert [c["call_id"] for c in calls] == [a, b, c]
    assert [set(c) for c in calls] == [CALL_KEYS] * 3
    assert calls[0]["parent_id"] is None and calls[1]["parent_id"] == a
    assert calls[0]["attempt_index"] == 0
    assert calls[1]["error_type"] == "ValueError"
    assert calls[2]["api_cost_usd"] is None
    (problem,) = read(log.problems_path)
    assert problem["llm_calls"] == 2
    assert problem["tokens_total"] == 131
    assert problem["api_cost_usd"] == pytest.approx(0.02)
    assert problem["latency_total_ms"] == float(root_node.latency_ms or 0)
    assert problem["retrieval_hit"] is True
    assert cumulative.cumulative_solved == 1
    events = read(log.token_events_path)
    assert len(events) == 3
    for e in events:
        validate_event(e)
        assert e["run_id"] == "run2:q1"
        assert e["metadata"]["stream_run_id"] == "run2"
        assert e["metadata"]["problem_id"] == "q1"
        assert e["metadata"]["t"] == 1
        assert e["metadata"]["operation"] == e["operation"]
    assert [e["metadata"]["status"] for e in events] == ["success", "fail", "success"]


def test_bad_input_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="run_id"):
        StreamMetricsLogger(tmp_path, "a/b")
    with pytest.raises(ValueError, match="run_id"):
        StreamMetricsLogger(tmp_path, "")
    with pytest.raises(ValueError, match="component"):
        StreamMetricsLogger(tmp_path, "x", component="ui")
    log = StreamMetricsLogger(tmp_path, "r")
    bad_calls: list[dict[str, Any]] = [
        {"t": -1},
        {"t": True},
        {"problem_id": ""},
        {"prompt_tokens": -3},
        {"latency_ms": math.nan},
        {"api_cost_usd": -0.1},
        {"event_type": "llm"},
        {"validator_passed": "yes"},
        {"call_id": 5},
    ]
    for bad in bad_calls:
        kwargs = {"call_id": "c", "t": 1, "problem_id": "q", "operation": "solve"} | bad
        with pytest.raises((TypeError, ValueError)):
            log.log_call(**kwargs)
    for args, kw in [
        ((1, "q", "yes"), {}),
        ((1, "q", True), {"attempts": None}),
        ((1, "q", True), {"contamination_rate": 1.5}),
        ((1, "q", True), {"llm_calls": -1}),
        ((1, "q", True), {"latency_total_ms": math.inf}),
    ]:
        with pytest.raises((TypeError, ValueError)):
            log.log_problem(*args, **kw)
    with pytest.raises(TypeError):
        log.problem("1", "q")  # type: ignore[arg-type]
    log.close()
    for path in (log.calls_path, log.problems_path, log.stream_path, log.token_events_path):
        assert Path(path).read_bytes() == b""
    with pytest.raises(SinkClosedError):
        log.log_problem(1, "q", True)
    log.close()


def test_percentile_matches_linear_interpolation() -> None:
    assert percentile([], 50) == 0.0
    assert percentile([7.0], 95) == 7.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([0.0, 10.0], 95) == pytest.approx(9.5)


@settings(max_examples=60, deadline=None)
@given(
    problems=st.lists(
        st.tuples(st.booleans(), st.floats(0, 10, allow_nan=False), st.floats(0, 1e4)),
        min_size=1,
        max_size=15,
    )
)
def test_cumulative_metrics_follow_the_formulas(
    tmp_path_factory: pytest.TempPathFactory, problems: list[tuple[bool, float, float]]
) -> None:
    out = tmp_path_factory.mktemp("stream")
    with StreamMetricsLogger(out, "p") as log:
        results = [
            log.log_problem(t, f"q{t}", solved, api_cost_usd=cost, latency_total_ms=lat)
            for t, (solved, cost, lat) in enumerate(problems, 1)
        ]
    last = results[-1]
    solved_n = sum(1 for s, _, _ in problems if s)
    total = sum(c for _, c, _ in problems)
    assert last.cumulative_solved == solved_n
    assert last.cumulative_api_cost_usd == pytest.approx(total)
    assert last.cost_per_solved == pytest.approx(total / max(1, solved_n))
    lats = sorted(lat for _, _, lat in problems)
    assert min(lats) <= last.p50_latency_ms <= last.p95_latency_ms <= max(lats)
    assert [s["t"] for s in read(log.stream_path)] == list(range(1, len(problems) + 1))


def test_a_call_stopped_by_a_limit_is_marked_halted_in_calls(tmp_path: Path) -> None:
    from ampmeter import ExecutionContext, LimitExceeded

    with StreamMetricsLogger(tmp_path, "run") as logger:
        sink = logger.problem(1, "q1")
        with ExecutionContext("solve", max_steps=1, sinks=[sink]) as ctx:
            with ctx.llm_call("first", model="m") as call:
                call.record(10, 2, cost_usd=0.0)
            with pytest.raises(LimitExceeded), ctx.llm_call("second", model="m"):
                pytest.fail("the second call must not run")
        sink.log_problem(False)
    calls = {c["operation"]: c for c in read(str(tmp_path / "run.calls.jsonl"))}
    assert calls["first"]["error_type"] is None and calls["first"]["failure_reason"] is None
    assert calls["second"]["error_type"] == "halt"
    assert "amp:steps" in calls["second"]["failure_reason"]


def test_token_events_use_the_node_status_vocabulary(tmp_path: Path) -> None:
    """Every event ampmeter writes says success / fail / halt; the error's name goes beside."""
    import orjson

    with StreamMetricsLogger(tmp_path, "vocab") as logger:
        logger.log_call(call_id="c1", t=0, problem_id="p", operation="solve", model="m")
        logger.log_call(
            call_id="c2",
            t=0,
            problem_id="p",
            operation="solve",
            model="m",
            error_type="ERR_TIMEOUT",
        )
    lines = (tmp_path / "vocab.token_events.jsonl").read_bytes().splitlines()
    metas = [orjson.loads(line)["metadata"] for line in lines]
    assert [m["status"] for m in metas] == ["success", "fail"]
    assert metas[1]["error_class"] == "ERR_TIMEOUT"
