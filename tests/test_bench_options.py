"""The benchmarks' shared command line: ``--help`` describes the benchmark, and an option it
does not know stops it with an error instead of starting a long timed run."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _options() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_options", BENCH / "_options.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_switches_read_as_given() -> None:
    parse = _options().parse
    assert parse("doc", []).quick is False
    assert parse("doc", ["--quick"]).quick is True
    options = parse("doc", ["--phases"], phases="time each phase", add_up="x")
    assert options.phases is True and options.add_up is False and options.quick is False


def test_an_unknown_option_is_an_error_that_names_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        _options().parse("doc", ["--quik"])
    assert stopped.value.code == 2
    assert "unrecognized arguments: --quik" in capsys.readouterr().err


def test_every_benchmark_reads_its_options_through_the_shared_parser() -> None:
    scripts = sorted(BENCH.glob("*_bench.py"))
    assert scripts
    for script in scripts:
        source = script.read_text("utf-8")
        assert "from _options import" in source, f"{script.name} parses its own command line"
        assert '"--quick" in' not in source, f"{script.name} looks for --quick by hand"


def test_help_prints_the_benchmarks_description_and_runs_nothing() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / "sdk_bench.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: sdk_bench.py [-h] [--quick] [--instructions]")
    assert "Instructions and time ampmeter adds to a real ``openai`` chat call" in done.stdout
    # the options' help ends the output: no row was measured after it
    assert done.stdout.rstrip().endswith("exactly")


def test_two_different_counts_at_once_are_refused_before_anything_runs() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / "sdk_bench.py"), "--opcodes", "--instructions"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1 and done.stdout == ""
    assert "--opcodes and --instructions are two different counts" in done.stderr
