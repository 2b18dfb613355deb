"""The ampmeter CLI, through typer's CliRunner and as a real ``python -m ampmeter`` process."""

from __future__ import annotations

import csv
import io
import re
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from ampmeter.analysis import EXTENDED_COLUMNS, V0_COLUMNS, amortization_curve
from ampmeter.cli import app
from support.event_logs import make_event_log, make_research_log, make_stream_logs

runner = CliRunner()


def _one_clear_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


@pytest.mark.parametrize(
    "command",
    [[], ["summary"], ["amortize"], ["validate"], ["report"], ["demo"], ["run"], ["watch"]],
)
def test_help_reads_well(command: list[str]) -> None:
    result = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "Usage" in result.stdout
    assert "§" not in result.stdout  # no sections of documents users do not have
    if command == ["validate"]:  # a paragraph is reflowed, not broken where the source was
        assert "analysis needs. Exit status: 0 when every line is valid" in result.stdout
    if command == ["amortize"]:
        for option in (
            "--problems",
            "--events",
            "--format",
            "--output",
            "--plot",
            "--best-effort",
            "--engine",
        ):
            assert option in result.stdout
    if not command:
        for name in ("summary", "amortize", "validate", "report", "demo", "run", "watch"):
            assert name in result.stdout


def test_summary_prints_a_table(tmp_path: Path) -> None:
    a = make_event_log(tmp_path / "a.jsonl", "run-a")
    b = make_event_log(tmp_path / "b.jsonl", "run-b", halt=False)
    result = runner.invoke(app, ["summary", str(a), str(b)])
    assert result.exit_code == 0, result.output
    for text in ("run-a", "run-b", "limit_exceeded", "p50", "p95", "2 run(s)"):
        assert text in result.stdout


def test_summary_fits_80_columns_and_prints_json_and_csv(tmp_path: Path) -> None:
    log = make_research_log(tmp_path / "r.jsonl", 2)
    result = runner.invoke(app, ["summary", str(log)], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80, result.stdout
    header = next(line for line in lines if "termination" in line)
    assert header.split() == ["run", "LLM", "sent", "refused", "tok", "in", "cost", "termination"]
    rows = [line for line in lines if line.lstrip().startswith("research_run (")]
    # Named by the root context, told apart by their ids; 12 calls sent, 6 refused, and the
    # sub-agents' stops are not the runs' end.
    assert len(rows) == 2 and all(
        re.search(r"\(\w{8}…\)\s+12\s+6\s+1,200\s+\$0\.00012\s+success", r) for r in rows
    ), rows

    wide = runner.invoke(app, ["summary", "--wide", str(log)])
    assert "unsettled" in wide.stdout and "growth" in wide.stdout and "depth" in wide.stdout

    result = runner.invoke(app, ["summary", "--format", "json", str(log)])
    assert result.exit_code == 0, result.output
    data = orjson.loads(result.stdout)
    run = data["runs"][0]
    assert run["name"] == "research_run" and run["label"].startswith("research_run (")
    assert (run["llm_calls"], run["llm_sent"], run["refused_calls"]) == (18, 12, 6)
    assert run["cost_usd"] == 0.00012 and run["termination"] == "success"
    assert data["across"]["llm_sent"] == {"p50": 12.0, "p95": 12.0}

    result = runner.invoke(app, ["summary", "--format", "csv", str(log)])
    table = list(csv.DictReader(io.StringIO(result.stdout)))
    assert len(table) == 2 and table[0]["name"] == "research_run"
    assert table[0]["refused_calls"] == "6" and table[0]["cost_usd"] == "0.00012"


def test_amortize_v0_and_extended_with_plot(tmp_path: Path) -> None:
    logs = make_stream_logs(tmp_path)
    v0 = tmp_path / "v0.csv"
    result = runner.invoke(app, ["amortize", str(logs["stream"]), "-o", str(v0)])
    assert result.exit_code == 0, result.output
    assert "wrote 6 row(s)" in result.stderr
    with v0.open() as handle:
        table = list(csv.DictReader(handle))
    assert tuple(table[0]) == V0_COLUMNS
    expected = amortization_curve(logs["stream"])
    assert [float(r["cost_per_solved"]) for r in table] == [r["cost_per_solved"] for r in expected]

    ext, png = tmp_path / "ext.csv", tmp_path / "curve.png"
    result = runner.invoke(
        app,
        [
            "amortize",
            str(logs["stream"]),
            "--problems",
            str(logs["problems"]),
            "--events",
            str(logs["events"]),
            "--format",
            "extended",
            "-o",
            str(ext),
            "--plot",
            str(png),
            "--engine",
            "duckdb",
        ],
    )
    assert result.exit_code == 0, result.output
    with ext.open() as handle:
        table = list(csv.DictReader(handle))
    assert tuple(table[0]) == EXTENDED_COLUMNS
    expected = amortization_curve(
        logs["stream"], problems_jsonl=logs["problems"], token_events_jsonl=logs["events"]
    )
    assert [float(r["cost_usd_total_avg"]) for r in table] == [
        r["cost_usd_total_avg"] for r in expected
    ]
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_amortize_errors_are_one_line_and_exit_2(tmp_path: Path) -> None:
    out = tmp_path / "out.csv"
    result = runner.invoke(app, ["amortize", str(tmp_path / "none.stream.jsonl"), "-o", str(out)])
    assert result.exit_code == 2
    assert "no such file" in _one_clear_line(result.stderr)

    bad = tmp_path / "bad.stream.jsonl"
    bad.write_text(
        '{"t": 1, "cumulative_api_cost_usd": 0, "cumulative_solved": 0, '
        '"cost_per_solved": 0}\n{broken\n{}\n'
    )
    result = runner.invoke(app, ["amortize", str(bad), "-o", str(out)])
    assert result.exit_code == 2
    assert f"{bad}:2: invalid JSON" in _one_clear_line(result.stderr)

    result = runner.invoke(app, ["amortize", str(bad), "-o", str(out), "--best-effort"])
    assert result.exit_code == 2  # the empty object on line 3 has no t
    assert f"{bad}:3: missing 't'" in _one_clear_line(result.stderr)
    assert not out.exists()

    result = runner.invoke(app, ["amortize", str(tmp_path), "-o", str(out)])
    assert result.exit_code == 2
    assert f"{tmp_path}: is a directory, not a file" in _one_clear_line(result.stderr)


def test_validate_reports_every_bad_line(tmp_path: Path) -> None:
    good = make_event_log(tmp_path / "good.jsonl", "g", halt=False)
    result = runner.invoke(app, ["validate", str(good)])
    assert result.exit_code == 0, result.output
    assert "1 file(s) valid" in result.stderr

    lines = good.read_text().splitlines()
    no_model = orjson.loads(lines[1])
    del no_model["model"]
    bad_tokens = orjson.loads(lines[2])
    bad_tokens["usage"]["prompt_tokens"] = "many"
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(
        "\n".join(
            [
                lines[0],
                orjson.dumps(no_model).decode(),
                "",
                "{not json",
                "[1, 2]",
                orjson.dumps(bad_tokens).decode(),
                lines[3],
                '{"cut',
            ]
        )
        + "\n"
    )
    stream = tmp_path / "x.stream.jsonl"
    stream.write_text('{"t": "one"}\n')
    result = runner.invoke(app, ["validate", str(good), str(mixed), str(stream)])
    assert result.exit_code == 1
    out = result.stdout
    assert f"{mixed}:2: " in out and "'model' is a required property" in out
    assert f"{mixed}:4: invalid JSON" in out
    assert f"{mixed}:5: expected a JSON object, got an array" in out
    assert f"{mixed}:6: field 'usage.prompt_tokens'" in out
    assert f"{mixed}:1:" not in out and f"{mixed}:7:" not in out
    # The last line has its newline: a line that does not parse, not a cut-off write.
    assert f"{mixed}:8: invalid JSON" in out
    assert f"{stream}:1: 't' must be an int" in out
    assert "6 bad line(s) in 2 of 3 file(s)" in result.stderr
    cut = tmp_path / "cut.jsonl"
    cut.write_text(lines[0] + "\n" + '{"cut')  # no newline: a cut-off write
    result = runner.invoke(app, ["validate", str(cut)])
    assert result.exit_code == 0
    assert f"{cut}:2: warning: incomplete last line" in result.stderr

    result = runner.invoke(app, ["validate", str(tmp_path / "missing.jsonl")])
    assert result.exit_code == 2
    _one_clear_line(result.stderr)


def test_report_command_writes_html(tmp_path: Path) -> None:
    log = make_event_log(tmp_path / "a.jsonl", "a")
    out = tmp_path / "report.html"
    result = runner.invoke(app, ["report", str(log), "-o", str(out), "--title", "My runs"])
    assert result.exit_code == 0, result.output
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and "<title>My runs</title>" in page
    bad = tmp_path / "wrong.jsonl"
    bad.write_text('{"run_id": "x", "event_type": "llm_completion"}\n')
    result = runner.invoke(app, ["report", str(bad), "-o", str(tmp_path / "r2.html")])
    assert result.exit_code == 2
    assert f"{bad}:1: field 'usage': must be an object" in _one_clear_line(result.stderr)
    # A log with no event: one clear error and exit 2, not a report of "0 run(s)".
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    result = runner.invoke(app, ["report", str(empty), "-o", str(tmp_path / "r3.html")])
    assert result.exit_code == 2 and not (tmp_path / "r3.html").exists()
    line = _one_clear_line(result.stderr)
    assert "empty.jsonl: no event in the log(s), so no run to report" in line


def test_real_process(tmp_path: Path) -> None:
    logs = make_stream_logs(tmp_path, problems=3)
    out = tmp_path / "o.csv"
    ok = subprocess.run(
        [
            sys.executable,
            "-m",
            "ampmeter",
            "amortize",
            str(logs["stream"]),
            "--problems",
            str(logs["problems"]),
            "--format",
            "extended",
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr
    assert out.read_text().splitlines()[0] == ",".join(EXTENDED_COLUMNS)
    assert len(out.read_text().splitlines()) == 4

    broken = tmp_path / "broken.stream.jsonl"
    broken.write_text(
        '{"t": 1.5, "cumulative_api_cost_usd": 0, "cumulative_solved": 0, "cost_per_solved": 0}\n'
    )
    bad = subprocess.run(
        [sys.executable, "-m", "ampmeter", "amortize", str(broken), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert bad.returncode == 2
    assert _one_clear_line(bad.stderr) == (
        f"ampmeter amortize: error: {broken}:1: 't' must be an int, got a float (1.5)"
    )
    usage = subprocess.run(
        [sys.executable, "-m", "ampmeter", "nonsense"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert usage.returncode == 2 and "Traceback" not in usage.stderr
