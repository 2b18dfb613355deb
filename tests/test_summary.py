"""summarize(): per-run rows and p50/p95 across runs, from logs written by real contexts."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from ampmeter.analysis import NUMERIC_COLUMNS, AnalysisError, load_runs, summarize
from ampmeter.context import ExecutionContext
from ampmeter.logs import JsonlError
from ampmeter.metrics import TaskResult
from ampmeter.sinks.jsonl import JsonlSink
from test_analysis import make_event_log, reference_percentile


def _events(path: Path) -> list[dict]:  # type: ignore[type-arg]
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def test_summary_row_matches_the_raw_events(tmp_path: Path) -> None:
    path = make_event_log(tmp_path / "a.jsonl", "agent-a")
    events = _events(path)
    (run,) = summarize([path]).runs
    llm = [e for e in events if e["event_type"] == "llm_completion"]
    tools = [e for e in events if e["event_type"] == "tool_call"]
    assert run.run_id == "agent-a"
    assert run.llm_calls == len(llm) == run.llm_calls_per_root
    assert run.tool_calls == len(tools) == run.tool_calls_per_root
    assert run.retries == sum(e["metadata"]["retries_used"] for e in events) == 1
    assert run.tokens_in == sum(e["usage"]["prompt_tokens"] for e in events)
    assert run.tokens_out == sum(e["usage"]["completion_tokens"] for e in events)
    unpriced = [e for e in events if e["metadata"].get("cost_status") == "unpriced"]
    assert run.unpriced_calls == len(unpriced) == 1
    assert run.cost_usd == pytest.approx(sum(e["cost_usd"] for e in events if e not in unpriced))
    task = TaskResult.from_events(path)
    assert (run.base_context, run.context_growth_avg) == (task.base_context,
                                                          task.context_growth_avg)  # fmt: skip
    assert run.base_context == 200
    assert run.max_depth == 2  # tools under LLM calls
    assert run.halted == 1 and run.failed == 1
    assert run.termination == "limit_exceeded"
    assert run.stop_reason is not None and "amp:steps" in run.stop_reason


def test_successful_run_and_sub_agent_depth(tmp_path: Path) -> None:
    path = tmp_path / "nested.jsonl"
    with JsonlSink(path, flush="line") as sink, ExecutionContext(
        "outer", sinks=[sink], chain_id="nested"
    ) as ctx:
        with ctx.llm_call("plan", model="gpt-4o-mini") as call:
            call.record(tokens_in=10, tokens_out=1, cost_usd=0.0)
        with ctx.spawn_child("helper") as child, child.llm_call("sub", model="m") as call:
            call.record(tokens_in=5, tokens_out=1, cost_usd=0.0)
            with child.tool_call("deep"):
                pass
    (run,) = summarize([path]).runs
    assert run.termination == "success" and run.stop_reason is None
    assert run.max_depth == 3  # helper (system) > sub (llm) > deep (tool)
    assert run.halted == run.failed == 0


def test_across_runs_p50_and_p95(tmp_path: Path) -> None:
    paths = [make_event_log(tmp_path / "a.jsonl", "a"),
             make_event_log(tmp_path / "b.jsonl", "b", halt=False)]  # fmt: skip
    with JsonlSink(tmp_path / "c.jsonl", flush="line") as sink, ExecutionContext(
        "c", sinks=[sink], chain_id="c"
    ) as ctx, ctx.llm_call("only", model="m") as call:
        call.record(tokens_in=1, tokens_out=1, cost_usd=0.5)
    paths.append(tmp_path / "c.jsonl")
    table = summarize(paths)
    assert [r.run_id for r in table.runs] == ["a", "b", "c"]
    # b's last top-level call failed (the root is not in the log, so that is what tells)
    assert [r.termination for r in table.runs] == ["limit_exceeded", "error", "success"]
    for name in NUMERIC_COLUMNS:
        values = [float(getattr(r, name)) for r in table.runs]
        assert table.across[name]["p50"] == reference_percentile(values, 50)
        assert table.across[name]["p95"] == reference_percentile(values, 95)
    assert len(table.rows()) == 3 and table.rows()[2]["cost_usd"] == 0.5


def test_runs_are_grouped_by_run_id_across_files(tmp_path: Path) -> None:
    a = make_event_log(tmp_path / "a.jsonl", "same", halt=False)
    b = make_event_log(tmp_path / "b.jsonl", "same", halt=False)
    runs = load_runs([a, b])
    assert list(runs) == ["same"] and runs["same"].sources == [str(a), str(b)]
    (one,) = summarize([a]).runs
    (two,) = summarize([a, b]).runs
    assert two.llm_calls == 2 * one.llm_calls


def test_summary_errors_name_file_and_line(tmp_path: Path) -> None:
    path = make_event_log(tmp_path / "a.jsonl", "a", halt=False)
    good = path.read_text().splitlines()
    broken = tmp_path / "broken.jsonl"
    broken.write_text("\n".join([good[0], "", "{oops", good[1]]) + "\n")
    with pytest.raises(JsonlError, match=rf"{broken}:3"):
        summarize([broken])
    assert summarize([broken], best_effort=True).runs[0].llm_calls + \
        summarize([broken], best_effort=True).runs[0].tool_calls == 2  # fmt: skip
    bad = tmp_path / "bad.jsonl"
    event = orjson.loads(good[1])
    event["cost_usd"] = "free"
    bad.write_text("\n".join([good[0], orjson.dumps(event).decode()]) + "\n")
    with pytest.raises(AnalysisError, match=rf"{bad}:2: 'cost_usd' must be a number"):
        summarize([bad])
    with pytest.raises(FileNotFoundError):
        summarize([tmp_path / "missing.jsonl"])
