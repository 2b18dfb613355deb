"""Errors that used to be tracebacks are one line with the fix in it: ``run --out`` that cannot
take the log is refused before the program starts; a command whose optional module is missing
names the extra that installs it (the module is blocked in the subprocess, not uninstalled)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from support.event_logs import make_stream_logs

# Runs the command line with one module made unimportable, as if it were not installed.
WITHOUT = (
    "import sys; sys.modules[sys.argv[1]] = None; "
    "from ampmeter.cli.application import main; main(sys.argv[2:])"
)


def ampmeter(*args: str, without: str | None = None, cwd: Path | None = None) -> tuple[int, str]:
    if without is None:
        argv = [sys.executable, "-m", "ampmeter", *args]
    else:
        argv = [sys.executable, "-c", WITHOUT, without, *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=cwd)
    return done.returncode, done.stdout + done.stderr


def assert_one_line(output: str, expected: str) -> None:
    assert output.strip().splitlines() == [expected], output


@pytest.mark.parametrize("out", ["a-directory", "no-such-folder/events.jsonl"])
def test_run_checks_out_before_the_program_starts(tmp_path: Path, out: str) -> None:
    (tmp_path / "a-directory").mkdir()
    started = tmp_path / "started"
    program = f"open({str(started)!r}, 'w').close()"
    status, output = ampmeter(
        "run", "--out", out, "--", sys.executable, "-c", program, cwd=tmp_path
    )
    assert status == 2
    reason = (
        "is a directory, not a file"
        if out == "a-directory"
        else "the folder no-such-folder does not exist"
    )
    assert_one_line(output, f"ampmeter run: error: --out {out}: {reason}")
    assert not started.exists()  # the program never ran: nothing was spent, no log was lost


def test_amortize_needs_no_numpy_and_its_duckdb_engine_names_the_extra(tmp_path: Path) -> None:
    logs = make_stream_logs(tmp_path, problems=2)
    csv = tmp_path / "curve.csv"
    status, output = ampmeter("amortize", str(logs["stream"]), "-o", str(csv), without="numpy")
    assert status == 0 and csv.read_text().startswith("t,"), output
    status, output = ampmeter(
        "amortize", str(logs["stream"]), "-o", str(csv), "--engine", "duckdb", without="duckdb"
    )
    assert status == 2
    expected = "duckdb is not installed: pip install 'ampmeter[analysis]'"
    assert_one_line(output, f"ampmeter amortize: error: {expected}")


def test_budget_show_on_redis_without_the_redis_extra_names_it() -> None:
    status, output = ampmeter("budget", "show", "redis://127.0.0.1:1/0", "team", without="redis")
    assert status == 2
    expected = "RedisLedger needs the redis package: pip install 'ampmeter[redis]'"
    assert_one_line(output, f"ampmeter budget: error: {expected}")
