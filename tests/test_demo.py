"""The demo agent: its tools, its parser, its argument checks, and a real run on the local model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from ampmeter.cli_run import register
from ampmeter.demo import DemoError, run_demo
from ampmeter.demo.agent import parse_reply
from ampmeter.demo.tools import ToolError, calculator, lookup
from ampmeter.integrations import is_instrumented
from ampmeter.local_llm import LocalLLMServer
from ampmeter.logs.schema import validate_event


@given(st.integers(-10**6, 10**6), st.integers(-10**6, 10**6))
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


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"price_in": -1.0}, "price_in"),
    ({"max_steps": 0}, "max_steps"),
    ({"questions": 99}, "questions"),
    ({"max_cost": float("nan")}, "max_cost"),
    ({"model_path": "x.gguf", "base_url": "http://127.0.0.1:1/v1"}, "not both"),
    ({"model_path": "/nonexistent/model.gguf"}, "not found"),
])
def test_bad_arguments(kwargs: dict[str, object], match: str, tmp_path: Path) -> None:
    with pytest.raises(DemoError, match=match):
        run_demo(out_dir=tmp_path, echo=lambda _: None, **kwargs)  # type: ignore[arg-type]


def test_demo_on_local_model_writes_logs_and_prices_as_hosted(
    tmp_path: Path, llm_server: LocalLLMServer
) -> None:
    lines: list[str] = []
    outcome = run_demo(base_url=llm_server.base_url, model_name=llm_server.model,
                       price_as="gpt-4o-mini", questions=1, max_steps=2, out_dir=tmp_path,
                       echo=lines.append)  # fmt: skip
    text = "\n".join(lines)
    assert "priced as gpt-4o-mini" in text and "summary:" in text
    (summary,) = outcome.summaries
    assert 1 <= summary["llm_calls"] <= 3  # two allowed, plus the one a limit may halt
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
    if outcome.report is not None:  # rendered once the report package is importable
        assert outcome.report.read_text().lstrip().lower().startswith("<!doctype html")


def test_demo_command_reports_bad_flags() -> None:
    app = typer.Typer()
    register(app)
    result = CliRunner().invoke(app, ["demo", "--questions", "0"])
    assert result.exit_code == 2
    assert "questions" in result.output
