"""summarize(): per-run rows and p50/p95 across runs, from logs written by real contexts; the
DuckDB engine gives identical rows."""

from __future__ import annotations

import random
import re
import time
import warnings
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from ampmeter._core import nodes
from ampmeter.analysis import NUMERIC_COLUMNS, AnalysisError, SummaryTable, load_runs, summarize
from ampmeter.analysis._duck_summary import summarize_runs
from ampmeter.analysis.digest import digest_logs
from ampmeter.analysis.summary import summary_table
from ampmeter.cli import app
from ampmeter.context import ExecutionContext
from ampmeter.logs import JsonlError
from ampmeter.metrics import TaskResult
from ampmeter.sinks.jsonl import JsonlSink
from support.event_logs import make_event_log, make_stream_logs, reference_percentile


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
    assert (run.base_context, run.context_growth_avg) == (
        task.base_context,
        task.context_growth_avg,
    )
    assert run.base_context == 200
    assert run.max_depth == 2  # tools under LLM calls
    assert run.halted == 1 and run.failed == 1
    assert run.termination == "limit_exceeded"
    assert run.stop_reason is not None and "amp:steps" in run.stop_reason


def test_successful_run_and_sub_agent_depth(tmp_path: Path) -> None:
    path = tmp_path / "nested.jsonl"
    with (
        JsonlSink(path, flush="line") as sink,
        ExecutionContext("outer", sinks=[sink], chain_id="nested") as ctx,
    ):
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
    paths = [
        make_event_log(tmp_path / "a.jsonl", "a"),
        make_event_log(tmp_path / "b.jsonl", "b", halt=False),
    ]
    with (
        JsonlSink(tmp_path / "c.jsonl", flush="line") as sink,
        ExecutionContext("c", sinks=[sink], chain_id="c") as ctx,
        ctx.llm_call("only", model="m") as call,
    ):
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
    assert (
        summarize([broken], best_effort=True).runs[0].llm_calls
        + summarize([broken], best_effort=True).runs[0].tool_calls
        == 2
    )
    bad = tmp_path / "bad.jsonl"
    event = orjson.loads(good[1])
    event["cost_usd"] = "free"
    bad.write_text("\n".join([good[0], orjson.dumps(event).decode()]) + "\n")
    with pytest.raises(JsonlError, match=rf"{bad}:2: field 'cost_usd': must be a number"):
        summarize([bad])
    with pytest.raises(FileNotFoundError):
        summarize([tmp_path / "missing.jsonl"])


# -- the DuckDB engine ------------------------------------------------------------------------


def _assert_identical(plain: SummaryTable, duck: SummaryTable) -> None:
    """Row by row, every value equal and of the same type (repr tells 0.0 from -0.0)."""
    assert [r.run_id for r in duck.runs] == [r.run_id for r in plain.runs]
    for a, b in zip(plain.runs, duck.runs, strict=True):
        left, right = a.to_dict(), b.to_dict()
        assert [(k, type(v), repr(v)) for k, v in right.items()] == [
            (k, type(v), repr(v)) for k, v in left.items()
        ]
    assert repr(duck.across) == repr(plain.across)


def _both(paths: list[Path]) -> SummaryTable:
    plain = summarize(paths, engine="python")
    fast = summarize_runs([str(p) for p in paths])
    assert fast is not None, "the DuckDB path fell back to the plain reader"
    _assert_identical(plain, summary_table(fast))
    _assert_identical(plain, summarize(paths, engine="duckdb"))
    return plain


def test_duckdb_engine_is_identical_on_real_logs(tmp_path: Path) -> None:
    paths = [
        make_event_log(tmp_path / "a.jsonl", "a"),
        make_event_log(tmp_path / "b.jsonl", "b", halt=False),
    ]
    nested = tmp_path / "nested.jsonl"
    with (
        JsonlSink(nested, flush="line") as sink,
        ExecutionContext("outer", sinks=[sink], chain_id="nested") as ctx,
    ):
        with ctx.llm_call("plan", model="gpt-4o-mini") as call:
            call.record(tokens_in=10, tokens_out=1, cost_usd=0.25)
        with ctx.spawn_child("helper") as child, child.llm_call("sub", model="m") as call:
            call.record(tokens_in=25, tokens_out=1, cost_usd=0.1)
            with child.tool_call("deep"):
                pass
    paths.append(nested)
    paths.append(make_stream_logs(tmp_path / "stream", problems=9)["events"])
    paths.append(paths[0])  # the same file twice: its events count twice in both engines
    table = _both(paths)
    assert len(table.runs) >= 4 and max(r.max_depth for r in table.runs) == 3
    assert {r.termination for r in table.runs} >= {"limit_exceeded", "error", "success"}


# What the DuckDB path's byte scan reads as lenient JSON (NaN, Infinity, a trailing comma, a
# huge exponent) even inside a string: such text hands the file to the plain reader on purpose.
_LENIENT_LOOKING = re.compile(r"NaN|Infinity|,[ \t\r]*[}\]]|[0-9][eE]\+?[0-9]{3}")
_EVENT_TYPES = ["llm_completion", "tool_call", "cpu_op", "embedding", "llm", "tool", "custom"]
_event = st.fixed_dictionaries(
    {
        "file": st.integers(0, 2),
        "run": st.sampled_from(["r0", "r1", "r2", "r3"]),
        "event_type": st.sampled_from(_EVENT_TYPES),
        "span": st.integers(0, 12),
        "parent": st.none() | st.integers(0, 12) | st.just("root"),
        "status": st.sampled_from(["success", "fail", "halt", None]),
        "tokens_in": st.none() | st.integers(0, 5000),
        "tokens_out": st.integers(0, 500),
        "cost": st.floats(0, 1) | st.integers(0, 3),
        "unpriced": st.booleans(),
        "retries": st.none() | st.integers(0, 3),
        "stop": st.none() | st.sampled_from(["limit amp:cost", "wall time elapsed", "timeout"]),
        # Free text, minus the bare tokens the DuckDB path's byte scan treats as lenient JSON
        # (it then hands the file to the plain reader on purpose; a test below covers that).
        "error": st.none()
        | st.text(max_size=8).filter(lambda text: not _LENIENT_LOOKING.search(text)),
        "termination": st.none()
        | st.sampled_from(["success", "error", "timeout", ""])
        | st.integers(0, 2),
        "latency": st.none() | st.integers(0, 10**4) | st.floats(0, 1e4),
    }
)


def _write_events(directory: Path, items: list[dict[str, Any]], unique: bool) -> list[Path]:
    paths = [directory / f"log{i}.jsonl" for i in range(3)]
    lines: list[list[bytes]] = [[], [], []]
    for n, item in enumerate(items):
        meta: dict[str, Any] = {"retries_used": item["retries"]}
        for key, value in (
            ("status", item["status"]),
            ("stop_reason", item["stop"]),
            ("error_class", item["error"]),
            ("termination_reason", item["termination"]),
        ):
            if value is not None:
                meta[key] = value
        if item["unpriced"]:
            meta["cost_status"] = "unpriced"
        event: dict[str, Any] = {
            "run_id": item["run"],
            "event_type": item["event_type"],
            "span_id": f"n{n}" if unique else f"n{item['span']}",
            "usage": {"prompt_tokens": item["tokens_in"], "completion_tokens": item["tokens_out"]},
            "cost_usd": item["cost"],
            "latency_ms": item["latency"],
            "metadata": meta,
        }
        if item["parent"] is not None:
            event["parent_id"] = f"n{item['parent']}" if item["parent"] != "root" else "root"
        lines[item["file"]].append(orjson.dumps(event))
    for path, content in zip(paths, lines, strict=True):
        path.write_bytes(b"\n".join(content) + b"\n" if content else b"")
    return paths


@given(st.lists(_event, max_size=80), st.booleans())
@settings(max_examples=40, deadline=None)
def test_duckdb_engine_is_identical_on_random_logs(
    tmp_path_factory: pytest.TempPathFactory, items: list[dict[str, Any]], unique: bool
) -> None:
    # unique=False reuses span ids: duplicates and parent cycles, as in damaged logs
    _both(_write_events(tmp_path_factory.mktemp("summary"), items, unique))


def test_duckdb_engine_is_identical_on_thousands_of_deep_events(tmp_path: Path) -> None:
    rng = random.Random(11)
    items = [
        {
            "file": rng.randrange(3),
            "run": f"r{i // 150}",
            "event_type": rng.choice(_EVENT_TYPES),
            "span": 0,
            # mostly a recent call of the same run as parent: chains dozens of calls deep
            "parent": None if rng.random() < 0.02 else max(i // 150 * 150, i - rng.randrange(1, 9)),
            "status": rng.choice(["success", "success", "fail", "halt"]),
            "tokens_in": rng.randrange(5000),
            "tokens_out": rng.randrange(100),
            "cost": rng.random() / 7,
            "unpriced": rng.random() < 0.1,
            "retries": rng.randrange(3),
            "stop": None,
            "error": "E",
            "termination": None,
            "latency": rng.random() * 100,
        }
        for i in range(6000)
    ]
    table = _both(_write_events(tmp_path, items, unique=True))
    assert max(r.max_depth for r in table.runs) > 30


def _llm_event(run: str, span: str, **fields: Any) -> dict[str, Any]:
    """A small LLM event of ``run``, with ``fields`` added."""
    return {
        "run_id": run,
        "event_type": "llm_completion",
        "span_id": span,
        "usage": {"prompt_tokens": 1},
        "cost_usd": 0.0,
        **fields,
    }


def test_duplicated_span_ids_and_cycles_follow_the_plain_rules(tmp_path: Path) -> None:
    def event(span: str, parent: str | None, run: str) -> dict[str, Any]:
        return _llm_event(run, span) if parent is None else _llm_event(run, span, parent_id=parent)

    lines = [
        # "a" twice: "c" hangs under the id whose depth was found first (2, below a missing
        # parent), not under the second "a" (a top-level call): depth 3, not 2
        event("a", "missing", "dup"),
        event("a", None, "dup"),
        event("c", "a", "dup"),
        event("x", "y", "cycle"),
        event("y", "x", "cycle"),
        event("z", "y", "cycle"),
    ]
    path = tmp_path / "damaged.jsonl"
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in lines))
    runs = load_runs([path])
    assert [c.depth for c in runs["dup"].calls] == [2, 1, 3]
    assert [c.depth for c in runs["cycle"].calls] == [2, 1, 2]
    table = _both([path])
    assert [r.max_depth for r in table.runs] == [3, 2]


def test_other_producers_status_words_count_alike_in_both_engines(tmp_path: Path) -> None:
    error = {"error_class": "Boom"}
    lines = [
        _llm_event("a", "a", metadata={"status": "error", **error}),
        # other producers' events: the status at the top level, none in metadata
        _llm_event("b", "b", status="timeout", metadata=error),
        _llm_event("c", "c", status="halt", metadata=error),
        _llm_event("d", "d", status="ok", metadata=error),
    ]
    path = tmp_path / "other.jsonl"
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in lines))
    table = _both([path])
    assert [(r.failed, r.halted, r.termination) for r in table.runs] == [
        (1, 0, "error"),
        (1, 0, "error"),
        (0, 1, "limit_exceeded"),
        (0, 0, "success"),
    ]


def _damaged(tmp_path: Path, change: str) -> Path:
    path = make_event_log(tmp_path / "a.jsonl", "a", halt=False)
    lines = path.read_text().splitlines()
    event = orjson.loads(lines[1])
    if change == "nan elsewhere":
        lines[1] = lines[1][:-1] + ', "extra": NaN}'
    elif change == "trailing comma":
        lines[1] = lines[1][:-1] + ",}"
    elif change == "cut last line":
        lines.append(lines[2][:20])
    elif change == "run_id number":
        event["run_id"] = 7
    elif change == "span_id missing":
        del event["span_id"]
    elif change == "cost string":
        event["cost_usd"] = "0.5"
    elif change == "tokens negative":
        event["usage"]["prompt_tokens"] = -1
    elif change == "metadata not an object":
        event["metadata"] = ["x"]
    elif change == "not an object":
        lines[1] = "[1, 2]"
    if change in (
        "run_id number",
        "span_id missing",
        "cost string",
        "tokens negative",
        "metadata not an object",
    ):
        lines[1] = orjson.dumps(event).decode()
    path.write_text("\n".join(lines) + ("\n" if change != "cut last line" else ""))
    return path


@pytest.mark.parametrize(
    "change",
    [
        "nan elsewhere",
        "trailing comma",
        "cut last line",
        "run_id number",
        "span_id missing",
        "cost string",
        "tokens negative",
        "metadata not an object",
        "not an object",
    ],
)
def test_duckdb_engine_leaves_what_it_cannot_read_exactly_to_the_plain_reader(
    tmp_path: Path, change: str
) -> None:
    path = _damaged(tmp_path, change)
    assert summarize_runs([str(path)]) is None

    def outcome(engine: str) -> object:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                result: object = summarize([path], engine=engine)  # type: ignore[arg-type]
            except (JsonlError, AnalysisError) as exc:
                result = (type(exc), str(exc))
        return result, [str(w.message) for w in caught]

    plain, duck = outcome("python"), outcome("duckdb")
    assert repr(duck) == repr(plain)
    if change in ("nan elsewhere", "trailing comma", "not an object"):
        assert plain[0][0] is JsonlError  # type: ignore[index]
    if change in ("run_id number", "cost string", "tokens negative"):
        assert plain[0][0] is JsonlError  # type: ignore[index]
        assert "field '" in plain[0][1]  # type: ignore[index]
        assert f"{path}:2:" in plain[0][1]  # type: ignore[index]


def test_engine_arguments(tmp_path: Path) -> None:
    path = make_event_log(tmp_path / "a.jsonl", "a", halt=False)
    with pytest.raises(ValueError, match="engine must be"):
        summarize([path], engine="spark")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="best_effort"):
        summarize([path], engine="duckdb", best_effort=True)
    # auto on a small log reads it the plain way, best-effort included
    assert summarize([path], best_effort=True) == summarize([path], engine="python")
    with pytest.raises(FileNotFoundError):
        summarize([tmp_path / "missing.jsonl"], engine="duckdb")
    with pytest.raises(IsADirectoryError):
        summarize([tmp_path], engine="duckdb")
    assert summarize([], engine="duckdb").runs == []
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    assert summarize([empty], engine="duckdb").runs == []


def test_progress_bar_does_not_change_the_rows(tmp_path: Path) -> None:
    paths = [make_event_log(tmp_path / "a.jsonl", "a")]
    assert summarize(paths, engine="duckdb", progress=True) == summarize(paths, engine="python")


def test_cli_summary_engines_print_the_same_table(tmp_path: Path) -> None:
    a = make_event_log(tmp_path / "a.jsonl", "run-a")
    b = make_event_log(tmp_path / "b.jsonl", "run-b", halt=False)
    runner = CliRunner()
    outputs = []
    for engine in ("python", "duckdb", "auto"):
        result = runner.invoke(app, ["summary", "--engine", engine, str(a), str(b)])
        assert result.exit_code == 0, result.output
        outputs.append(result.stdout)
    assert outputs[0] == outputs[1] == outputs[2] and "run-b" in outputs[0]
    assert "--engine" in runner.invoke(app, ["summary", "--help"]).stdout
    result = runner.invoke(app, ["summary", "--engine", "duckdb", "--best-effort", str(a)])
    assert result.exit_code == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "--best-effort" in lines[0] and "Traceback" not in result.stderr
    assert "best_effort" not in lines[0].replace("--best-effort", "")
    bad = _damaged(tmp_path, "run_id number")
    result = runner.invoke(app, ["summary", "--engine", "duckdb", str(bad)])
    assert result.exit_code == 2
    assert (
        result.stderr.strip() == f"ampmeter summary: error: {bad}:2: field 'run_id': must be a "
        "string, got 7 (--best-effort skips bad lines and counts them)"
    )
    result = runner.invoke(app, ["summary", "--engine", "spark", str(a)])
    assert result.exit_code == 2 and "Traceback" not in result.output


@pytest.mark.parametrize("engine", ["python", "duckdb"])
def test_summary_and_report_count_the_same_llm_calls_for_context_growth(
    tmp_path: Path, engine: str
) -> None:
    """A producer that writes event_type "llm" (a name readers accept) makes LLM calls: the
    summary's base context and growth count them, as the report's digest always did (the two
    were separate definitions before, and the summary's skipped them)."""
    path = tmp_path / "raw.jsonl"
    events = [
        {
            "run_id": "r",
            "span_id": f"s{i}",
            "event_type": "llm",
            "usage": {"prompt_tokens": tokens, "completion_tokens": 5},
            "cost_usd": 0.001,
            "metadata": {"status": "success"},
        }
        for i, tokens in enumerate((100, 160, 250))
    ]
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))
    (row,) = summarize([path], engine=engine).runs  # type: ignore[arg-type]
    assert (row.llm_calls, row.base_context, row.context_growth_avg) == (3, 100, 75.0)
    (digested,) = digest_logs([path]).runs
    assert digested.summary() == row


class _SteppedBackClock:
    """The wall clock as an NTP adjustment leaves it: each reading 5 s before the last (a real
    system clock cannot be set back from a test)."""

    def __init__(self) -> None:
        self.now = time.time_ns()

    def time_ns(self) -> int:
        self.now -= 5_000_000_000
        return self.now


def test_a_call_the_clock_stepped_back_across_is_logged_and_summed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wall clock set back while a call ran gave it a negative ``latency_ms``: its log line
    was refused by every reader (a summary in best-effort mode dropped it, cost and all). Its
    latency is 0 now, and its cost is in the summary."""
    path = tmp_path / "stepped.jsonl"
    with ExecutionContext("stepped", sinks=[JsonlSink(path)]) as ctx:
        monkeypatch.setattr(nodes, "time", _SteppedBackClock())
        with ctx.tool_call("search") as call:
            call.record(cost_usd=0.25)
        monkeypatch.undo()
    (tool,) = [n for n in ctx.graph.nodes() if n.kind == "tool"]
    assert tool.latency_ms == 0
    (run,) = summarize([path]).runs
    assert (run.tool_calls, run.cost_usd) == (1, Decimal("0.25"))
