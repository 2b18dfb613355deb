"""The CLI prints hostile log text literally and every error as one line with exit status 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ampmeter.cli import app
from ampmeter.cli.output import os_error_message, printable
from ampmeter.logs.reader import MAX_LINE_ENV
from support.event_logs import make_event_log, make_stream_logs

runner = CliRunner()

# Rich markup, a closing tag with nothing open, terminal escapes (colour, window title, clear
# screen), a bidi override and a line break.
HOSTILE_IDS = [
    "[/bold]",
    "[bold red]fake[/]",
    "run\x1b[31mred\x1b[0m",
    "title\x1b]0;pwned\x07",
    "wipe\x1b[2J\x1bc",
    "rtl\u202eexe.txt",
    "two\nlines",
]


def one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr and "╭" not in stderr and "│" not in stderr
    assert lines[0].startswith("ampmeter")
    assert ": error: " in lines[0]
    return lines[0]


def no_raw_control(text: str) -> None:
    assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text


def test_printable_escapes_controls_and_keeps_text() -> None:
    assert printable("a\x1b[31mb") == "a\\x1b[31mb"
    assert printable("x\ny\tz") == "x\\ny\\tz"
    assert printable("\u202e") == "\\u202e"
    assert printable("[/bold] naïve 😀") == "[/bold] naïve 😀"


@pytest.mark.parametrize("run_id", HOSTILE_IDS)
def test_summary_prints_hostile_run_ids_as_text(tmp_path: Path, run_id: str) -> None:
    log = make_event_log(tmp_path / "a.jsonl", run_id)
    for engine in ("python", "duckdb"):
        result = runner.invoke(app, ["summary", "--wide", "--engine", engine, str(log)])
        assert result.exit_code == 0, result.output
        no_raw_control(result.stdout)
        assert printable(run_id) in result.stdout.replace("\n", "")


def test_summary_as_a_real_process_prints_markup_literally(tmp_path: Path) -> None:
    log = make_event_log(tmp_path / "a.jsonl", "[/bold]\x1b[2J")
    done = subprocess.run(
        [sys.executable, "-m", "ampmeter", "summary", "--wide", str(log)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "[/bold]\\x1b[2J" in done.stdout
    no_raw_control(done.stdout + done.stderr)


def test_file_names_in_messages_are_escaped(tmp_path: Path) -> None:
    bad = tmp_path / "evil\x1b]0;x\x07.jsonl"
    bad.write_text("{broken\n{}\n")
    result = runner.invoke(app, ["validate", str(bad)])
    assert result.exit_code == 1
    no_raw_control(result.stdout + result.stderr)
    assert "evil\\x1b]0;x\\x07.jsonl:1: invalid JSON" in result.stdout
    result = runner.invoke(app, ["summary", str(bad)])
    no_raw_control(one_error_line(result.stderr))


@pytest.mark.parametrize(
    "args",
    [
        ["summary"],
        ["summary", "--bogus", "x.jsonl"],
        ["amortize", "x.stream.jsonl"],
        ["summary", "--engine", "spark", "x.jsonl"],
        ["nosuchcommand"],
    ],
)
def test_usage_errors_are_one_line_exit_2(args: list[str]) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    line = one_error_line(result.stderr)
    assert "--help" in line


@pytest.mark.parametrize("command", ["summary", "validate", "report", "amortize"])
def test_a_missing_file_is_named_once(tmp_path: Path, command: str) -> None:
    missing = tmp_path / "none.stream.jsonl"
    extra = ["-o", str(tmp_path / "out")] if command in ("report", "amortize") else []
    result = runner.invoke(app, [command, str(missing), *extra])
    assert result.exit_code == 2
    line = one_error_line(result.stderr)
    assert line == f"ampmeter {command}: error: {missing}: no such file"


@pytest.mark.parametrize("command", ["summary", "validate", "report", "amortize"])
def test_a_directory_given_for_a_file_says_so(tmp_path: Path, command: str) -> None:
    extra = ["-o", str(tmp_path / "out")] if command in ("report", "amortize") else []
    result = runner.invoke(app, [command, str(tmp_path), *extra])
    assert result.exit_code == 2
    line = one_error_line(result.stderr)
    assert line == f"ampmeter {command}: error: {tmp_path}: is a directory, not a file"


@pytest.mark.parametrize("output", ["/proc/version", "dir"])
def test_an_unwritable_output_is_named_not_its_temp_file(tmp_path: Path, output: str) -> None:
    log = make_event_log(tmp_path / "a.jsonl")
    streams = make_stream_logs(tmp_path / "s", problems=2)
    target = tmp_path if output == "dir" else Path(output)
    for args in (
        ["report", str(log), "-o", str(target)],
        ["amortize", str(streams["stream"]), "-o", str(target)],
    ):
        result = runner.invoke(app, args)
        assert result.exit_code == 2
        line = one_error_line(result.stderr)
        assert f"error: {target}: " in line and ".tmp-" not in line
        expected = "is a directory" if output == "dir" else "cannot write to it"
        assert expected in line
    assert Path("/proc/version").read_text()  # untouched


def test_a_too_long_line_is_named_with_its_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(MAX_LINE_ENV, "1000")
    log = make_event_log(tmp_path / "a.jsonl")
    with log.open("a") as f:
        f.write('{"pad": "' + "x" * 5000 + '"}\n')
    count = len(log.read_text().splitlines())
    result = runner.invoke(app, ["validate", str(log)])
    assert result.exit_code == 1
    assert f"{log}:{count}: line is 5,011 bytes, over the 1,000-byte maximum" in result.stdout
    result = runner.invoke(app, ["summary", str(log)])
    assert result.exit_code == 2
    assert f"{log}:{count}: line is 5,011 bytes" in one_error_line(result.stderr)


def test_os_error_messages_name_the_file_once() -> None:
    assert os_error_message(FileNotFoundError(2, "No such file or directory", "x")) == (
        "x: no such file"
    )
    assert os_error_message(PermissionError(13, "cannot write to it (denied)", "y")) == (
        "y: cannot write to it (denied)"
    )


@pytest.mark.parametrize(
    "args",
    [["run", "--max-cost", "-1", "--", "true"], ["run"], ["demo", "--questions", "0"]],
)
def test_run_and_demo_errors_have_the_same_shape(args: list[str]) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert one_error_line(result.stderr).startswith(f"ampmeter {args[0]}: error: ")


def test_numbers_have_one_format_and_no_exponent() -> None:
    from ampmeter.cli.output import number

    assert number(1.198e6) == number(1_198_000) == "1,198,000"
    assert number(1_198_000.5) == "1,198,000.5"
    assert number(0.5) == "0.5" and number(2.5e-7) == "0.00000025"
    assert number(None) == "-"
    assert all("e" not in number(x) for x in (1e20, 3.3e-9, 123456.789))
