"""Deep logs: a JSONL line nested deeper than the reader goes is one clear error naming the file,
the line and the depth, in every command (the one reader they share refuses it); a call tree
thousands of levels deep is walked without recursion."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ampmeter.cli import app
from ampmeter.logs import JsonlError, iter_lines
from ampmeter.logs.events import MAX_DEPTH, nesting_depth
from support.event_logs import make_event_log, make_stream_logs


def _nested(depth: int, inner: str = "0") -> str:
    """A JSON value nested ``depth`` arrays and objects deep (alternating, as a hostile log)."""
    opening = "".join('{"k":' if level % 2 else "[" for level in range(depth))
    closing = "".join("}" if level % 2 else "]" for level in reversed(range(depth)))
    return opening + inner + closing


def _with_deep_field(line: str, depth: int) -> str:
    """``line`` (a JSON object) with one more field nested so that the line is ``depth`` deep."""
    record: dict[str, Any] = json.loads(line)
    body = json.dumps(record)
    return body[:-1] + f', "deep": {_nested(depth - 1)}}}'


def _deep_copy_of_first_line(source: Path, target: Path, depth: int) -> Path:
    first = source.read_text().splitlines()[0]
    target.write_text(first + "\n" + _with_deep_field(first, depth) + "\n")
    return target


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("deep")
    events = make_event_log(out / "events.jsonl")
    stream = make_stream_logs(out / "stream")
    return {
        "events": _deep_copy_of_first_line(events, out / "deep_events.jsonl", 2001),
        "stream": _deep_copy_of_first_line(stream["stream"], out / "deep.stream.jsonl", 2001),
        "good_stream": stream["stream"],
        "stream_events": _deep_copy_of_first_line(
            stream["events"], out / "deep.token_events.jsonl", 2001
        ),
    }


COMMANDS = {  # the command, its exit status, and which log it reads the deep line from
    "validate": (["validate", "{events}"], 1, "events"),
    "summary": (["summary", "{events}"], 2, "events"),
    "summary-duckdb": (["summary", "--engine", "duckdb", "{events}"], 2, "events"),
    "report": (["report", "{events}", "-o", "{out}/r.html"], 2, "events"),
    "amortize": (["amortize", "{stream}", "-o", "{out}/a.csv"], 2, "stream"),
    "amortize-duckdb": (
        ["amortize", "--engine", "duckdb", "{stream}", "-o", "{out}/a.csv"],
        2,
        "stream",
    ),
    "amortize-events": (
        ["amortize", "{good_stream}", "--events", "{stream_events}", "-o", "{out}/a.csv"],
        2,
        "stream_events",
    ),
}


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_line_nested_2000_deep_is_one_line_naming_file_line_and_depth(
    logs: dict[str, Path], tmp_path: Path, name: str
) -> None:
    args, status, deep = COMMANDS[name]
    paths = {key: str(path) for key, path in logs.items()}
    argv = [arg.format(out=tmp_path, **paths) for arg in args]
    result = CliRunner().invoke(app, argv, env={"COLUMNS": "400"})
    assert result.exit_code == status, (result.output, result.exception)
    bad = logs[deep]
    expected = f"{bad}:2: arrays and objects nested 2,001 levels deep, more than the 1,024 allowed"
    assert expected in result.output
    assert "Traceback" not in result.output and "RecursionError" not in result.output


def test_watch_skips_and_counts_a_deep_line(logs: dict[str, Path]) -> None:
    result = CliRunner().invoke(app, ["watch", "--once", str(logs["events"])])
    assert result.exit_code == 0, (result.output, result.exception)
    assert "1 bad line(s) skipped" in result.output


def test_the_deepest_line_read_and_the_first_refused() -> None:
    record = '{"a": 1, "deep": %s}\n'
    deepest = record % _nested(MAX_DEPTH - 1)
    assert [obj["a"] for obj in iter_lines([deepest])] == [1]
    with pytest.raises(JsonlError, match=r"<lines>:1: .*nested 1,025 levels deep"):
        list(iter_lines([record % _nested(MAX_DEPTH)]))
    # A line Python's own parser cannot walk, refused for another reason, is still one error.
    with pytest.raises(JsonlError, match=r"<lines>:1: invalid JSON"):
        list(iter_lines([record % _nested(MAX_DEPTH - 1, "NaN")]))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kept = list(iter_lines([record % _nested(5000), '{"a": 2}\n'], best_effort=True))
    assert [obj["a"] for obj in kept] == [2] and "skipped 1 bad line" in str(caught[0].message)


def test_nesting_is_counted_outside_strings() -> None:
    assert nesting_depth(b'{"a": "[[[{{\\"[[", "b": [1, {"c": []}]}') == 4
    assert nesting_depth("[]") == 1 and nesting_depth(b"3") == 0
    assert nesting_depth(b'["unterminated [[[') == 1


def test_watch_draws_a_5000_deep_call_chain(tmp_path: Path) -> None:
    first = json.loads(make_event_log(tmp_path / "one.jsonl").read_text().splitlines()[0])
    first.pop("parent_id", None)
    lines = []
    for level in range(5000):
        event = {**first, "span_id": f"s{level}", "event_type": "llm_completion"}
        event["operation"] = f"level-{level}"
        if level:
            event["parent_id"] = f"s{level - 1}"
        lines.append(json.dumps(event))
    log = tmp_path / "chain.jsonl"
    log.write_text("\n".join(lines) + "\n")
    result = CliRunner().invoke(app, ["watch", "--once", str(log)], env={"COLUMNS": "120"})
    assert result.exit_code == 0, (result.output, result.exception)
    assert "… 4980 earlier call(s)" in result.output  # the newest 20 rows of the one chain
    summary = CliRunner().invoke(app, ["summary", str(log)], env={"COLUMNS": "300"})
    assert summary.exit_code == 0 and "5,000" in summary.output  # its depth
