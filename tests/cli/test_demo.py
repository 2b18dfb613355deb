"""The demo agent: its tools, its parser, its argument checks, and a real run on the local model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from ampmeter.demo.agent import parse_reply
from ampmeter.demo.output import USAGE_KEYS, matches, sum_usage, totals
from ampmeter.demo.run import run_demo
from ampmeter.demo.settings import RUN_MAX_COST
from ampmeter.demo.tools import ToolError, calculator, lookup
from ampmeter.errors import DemoError
from ampmeter.integrations import is_instrumented
from ampmeter.local_llm import LocalLLMServer
from ampmeter.logs.schema import validate_event


@given(st.integers(-(10**6), 10**6), st.integers(-(10**6), 10**6))
def test_calculator_adds_and_multiplies(a: int, b: int) -> None:
    assert calculator(f"{a} + {b}") == str(a + b)
    assert calculator(f"({a}) * ({b})") == str(a * b)


@pytest.mark.parametrize("expr", ["__import__('os')", "x + 1", "", "1 / 0", "2 ** 1000", "1 +"])
def test_calculator_refuses_anything_but_arithmetic(expr: str) -> None:
    with pytest.raises(ToolError):
        calculator(expr)


def test_lookup() -> None:
    assert "8849" in lookup("Mount Everest")
    with pytest.raises(ToolError, match="no entry"):
        lookup("atlantis")


def test_parse_reply() -> None:
    action = parse_reply("Thought: add\nAction: calculator[2 + 3]")
    assert action is not None and (action.tool, action.argument) == ("calculator", "2 + 3")
    final = parse_reply("Thought: done\nFinal Answer: 5\nmore")
    assert final is not None and final.final == "5"
    assert parse_reply("I think the answer is five") is None
    first = parse_reply("Action: lookup(paris)\nFinal Answer: Paris")
    assert first is not None and first.tool == "lookup"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"price_in": -1.0}, "price_in"),
        ({"max_steps": 0}, "max_steps"),
        ({"questions": 99}, "questions"),
        ({"run_max_llm_calls": 0}, "run_max_llm_calls"),
        ({"run_max_llm_calls": 2.5}, "run_max_llm_calls"),
        ({"run_max_cost": -0.01}, "run_max_cost"),
        ({"price_as": "no-such-model-xyz"}, "price table does not know"),
        ({"max_cost": float("nan")}, "max_cost"),
        ({"model_path": "x.gguf", "base_url": "http://127.0.0.1:1/v1"}, "not both"),
        ({"model_path": "/nonexistent/model.gguf"}, "not found"),
    ],
)
def test_bad_arguments(kwargs: dict[str, object], match: str, tmp_path: Path) -> None:
    with pytest.raises(DemoError, match=match):
        run_demo(out_dir=tmp_path, echo=lambda _: None, **kwargs)  # type: ignore[arg-type]


def test_demo_on_local_model_writes_logs_and_prices_as_hosted(
    tmp_path: Path, llm_server: LocalLLMServer
) -> None:
    lines: list[str] = []
    # By default the local model is priced as gpt-4o-mini, and both outputs say so.
    outcome = run_demo(
        base_url=llm_server.base_url,
        model_name=llm_server.model,
        questions=1,
        max_steps=2,
        out_dir=tmp_path,
        echo=lines.append,
    )
    text = "\n".join(lines)
    assert "priced as gpt-4o-mini ($0.15 / $0.6 per million" in text and "summary:" in text
    (summary,) = outcome.summaries
    assert 1 <= summary["llm_calls"] <= 2  # calls sent; a halted one is not counted
    assert summary["stopped_by"] in (None, "question limit")  # the run budget is far away
    assert {k: outcome.run_summary[k] for k in USAGE_KEYS} == {k: summary[k] for k in USAGE_KEYS}
    assert summary["tokens_in"] > 0
    assert summary["cost_usd"] > 0  # priced as a hosted model
    log = (tmp_path / "demo.token_events.jsonl").read_text()
    events = [json.loads(line) for line in log.splitlines()]
    assert events
    for event in events:
        validate_event(event)
    llm = [e for e in events if e["event_type"] == "llm_completion"]
    assert sum(e["usage"]["prompt_tokens"] for e in llm) == summary["tokens_in"]
    for name in ("calls", "problems", "stream"):
        assert (tmp_path / f"demo.{name}.jsonl").read_text().strip()
    assert not is_instrumented()  # the demo leaves the SDK as it found it
    assert outcome.report is not None
    page = outcome.report.read_text()
    assert page.lstrip().lower().startswith("<!doctype html")
    # Each question's own ceilings, named by who set them (the log says them).
    assert "priced as gpt-4o-mini" in page and "ceiling set by q0" in page


def test_run_budget_stops_a_sub_agent_and_the_run_totals_are_the_sum(
    tmp_path: Path, llm_server: LocalLLMServer
) -> None:
    lines: list[str] = []
    outcome = run_demo(
        base_url=llm_server.base_url,
        model_name=llm_server.model,
        price_as="gpt-4o-mini",
        questions=2,
        run_max_llm_calls=1,
        out_dir=tmp_path,
        echo=lines.append,
    )
    text = "\n".join(lines)
    run, summaries = outcome.run_summary, outcome.summaries
    # The parent's own stats roll up both sub-agents: its totals are their sum.
    summed = sum_usage(summaries)
    for key in ("llm_calls", "tool_calls", "tokens_in", "tokens_out"):
        assert run[key] == summed[key], key
    assert run["cost_usd"] == pytest.approx(summed["cost_usd"])
    assert run["cost_usd"] > 0
    assert run["llm_calls"] == 1  # the budget: one call, the next one is stopped before it runs
    assert run["name"] == "demo_run" and run["termination"] == "limit_exceeded"
    assert run["stop_reason"] == "limit exceeded: amp:llm_calls = 2 > 1"
    stopped = [t for t, s in enumerate(summaries) if s["stopped_by"] == "run budget"]
    assert stopped, text  # q0's second call, or q1's first if q0 answered in one
    t = stopped[0]
    result = outcome.results[t]
    assert result.stop_before is not None and result.stop_before.startswith("LLM call ")
    assert result.stop_node is not None
    assert (
        f"[q{t}]" in text
        and f"stopped before {result.stop_before}: run budget "
        f"amp:llm_calls = 2 > 1 (node {result.stop_node})"
        in text
    )
    assert "equals the sum of the 2 questions" in text
    # Every question, stopped or not, has its problem and stream line.
    problems = [json.loads(x) for x in (tmp_path / "demo.problems.jsonl").read_text().splitlines()]
    assert [p["t"] for p in problems] == [0, 1]
    assert problems[t]["solved"] is False
    assert [p["llm_calls"] for p in problems] == [s["llm_calls"] for s in summaries]
    stream = (tmp_path / "demo.stream.jsonl").read_text().splitlines()
    assert [json.loads(x)["t"] for x in stream] == [0, 1]
    # Each question's calls went to its own problem sink only (the run context has none).
    log = (tmp_path / "demo.token_events.jsonl").read_text()
    events = [e for e in map(json.loads, log.splitlines()) if e["event_type"] == "llm_completion"]
    for q, summary in enumerate(summaries):
        mine = [e for e in events if e["run_id"] == f"demo:q{q}"]
        assert sum(e["usage"]["prompt_tokens"] for e in mine) == summary["tokens_in"]
    calls = [json.loads(x) for x in (tmp_path / "demo.calls.jsonl").read_text().splitlines()]
    assert len({c["call_id"] for c in calls}) == len(calls)  # no node logged twice


def test_default_run_budget_in_dollars_stops_a_call_before_it_is_made(
    tmp_path: Path, llm_server: LocalLLMServer
) -> None:
    lines: list[str] = []
    outcome = run_demo(
        base_url=llm_server.base_url,
        model_name=llm_server.model,
        out_dir=tmp_path,
        echo=lines.append,
    )
    text = "\n".join(lines)
    run = outcome.run_summary
    assert run["termination"] == "limit_exceeded"
    assert run["stop_reason"].startswith("limit exceeded: amp:cost = ")
    assert 0 < run["cost_usd"] <= RUN_MAX_COST  # the budget held: the stopped call never ran
    stopped = [s for s in outcome.summaries if s["stopped_by"] == "run budget"]
    assert stopped and all(s["stop_before"].startswith("LLM call ") for s in stopped)
    assert f"of a ${RUN_MAX_COST:g} budget" in text and "1 by the run budget" in text
    assert outcome.report is not None
    page = outcome.report.read_text()
    assert f"run budget: ${RUN_MAX_COST:g} for all questions together" in page
    assert "before a call" in page and "priced as gpt-4o-mini" in page


def test_free_prices_every_call_at_zero(tmp_path: Path, llm_server: LocalLLMServer) -> None:
    lines: list[str] = []
    outcome = run_demo(
        base_url=llm_server.base_url,
        model_name=llm_server.model,
        free=True,
        questions=1,
        max_steps=1,
        out_dir=tmp_path,
        echo=lines.append,
    )
    assert "pricing: free (--free)" in "\n".join(lines)
    (summary,) = outcome.summaries
    assert summary["llm_calls"] == 1 and summary["cost_usd"] == 0.0 and summary["tokens_in"] > 0


def test_totals_says_when_the_run_is_not_the_sum(tmp_path: Path) -> None:
    q = {
        "llm_calls": 2,
        "tool_calls": 1,
        "tokens_in": 10,
        "tokens_out": 3,
        "cost_usd": 0.1,
        "stopped_by": None,
    }
    run = {"name": "demo_run", **sum_usage([q, q])}
    assert matches(run, sum_usage([q, q]))
    assert "equals the sum of the 2 questions" in totals(run, [q, q], "$1", 1.0, tmp_path, "demo")
    text = totals({**run, "llm_calls": 5}, [q, q], "$1", 1.0, tmp_path, "demo")
    assert "NOT the sum" in text and "--run-max-cost below 0.200000" in text
    assert "$0.200000 of a $1 budget" in text


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--questions", "0"], "questions"),
        (["--run-max-llm-calls", "0"], "run_max_llm_calls"),
    ],
)
def test_demo_command_reports_bad_flags(args: list[str], match: str) -> None:
    from ampmeter.cli import app

    result = CliRunner().invoke(app, ["demo", *args])
    assert result.exit_code == 2
    assert match in result.output


def test_demo_checks_for_its_server_before_installing_the_model(tmp_path: Path) -> None:
    """Issue 39: without xllamacpp the demo says so before it installs (or starts) anything."""
    script = (
        "import sys; sys.modules['xllamacpp'] = None\n"
        "from ampmeter.cli import main\n"
        f"main(['demo', '--out-dir', {str(tmp_path / 'out')!r}])\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert "'xllamacpp' package, which is not installed" in done.stderr
    assert "installing" not in done.stdout + done.stderr and "starting" not in done.stdout
    assert not (tmp_path / "out").exists()
