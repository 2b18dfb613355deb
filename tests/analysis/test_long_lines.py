"""A line longer than the maximum line size is refused by name, without being held in memory.

The limit is made small here (``AMPMETER_MAX_LINE_BYTES``) so the files stay small; the code
path is the one a 1 GiB line takes under the 64 MiB default.
"""

from __future__ import annotations

import gzip
import tracemalloc
from pathlib import Path

import orjson
import pytest

from ampmeter.analysis import amortization_curve, summarize
from ampmeter.analysis.validate import validate_file
from ampmeter.logs import JsonlError, read_jsonl
from ampmeter.logs.reader import DEFAULT_MAX_LINE_BYTES, MAX_LINE_ENV, max_line_bytes

LIMIT = 64 * 1024
HUGE = 3 * 1024 * 1024  # 48 times the limit


def event(span: str, pad: str = "") -> bytes:
    return (
        orjson.dumps(
            {
                "timestamp": "2026-01-01T00:00:00.000Z",
                "run_id": "r",
                "span_id": span,
                "event_type": "llm_completion",
                "operation": "chat",
                "component": "pipeline",
                "model": "m",
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                "cost_usd": 0.5,
                "latency_ms": 3,
                "metadata": {"pad": pad},
            }
        )
        + b"\n"
    )


@pytest.fixture(autouse=True)
def small_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MAX_LINE_ENV, str(LIMIT))


@pytest.fixture
def log(tmp_path: Path) -> Path:
    path = tmp_path / "big.jsonl"
    path.write_bytes(event("s1") + event("s2", "x" * HUGE) + event("s3"))
    return path


def test_the_limit_is_64_mib_unless_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MAX_LINE_ENV)
    assert max_line_bytes() == DEFAULT_MAX_LINE_BYTES == 64 * 1024 * 1024
    monkeypatch.setenv(MAX_LINE_ENV, "lots")
    with pytest.raises(ValueError, match=MAX_LINE_ENV):
        max_line_bytes()


def test_strict_reading_names_the_line_and_its_size(log: Path) -> None:
    with pytest.raises(JsonlError) as info:
        list(read_jsonl(log))
    size = len(event("s2", "x" * HUGE)) - 1
    assert str(info.value).startswith(f"{log}:2: line is {size:,} bytes, over the {LIMIT:,}-byte")
    assert MAX_LINE_ENV in str(info.value)


def test_best_effort_skips_the_line_and_reads_on(log: Path) -> None:
    with read_jsonl(log, best_effort=True) as reader:
        spans = [e["span_id"] for e in reader]
    assert spans == ["s1", "s3"] and reader.summary.skipped_lines == [2]


def test_a_line_of_exactly_the_limit_is_read(tmp_path: Path) -> None:
    line = event("s1")
    line = line[:-3] + b" " * (LIMIT - len(line) + 1) + line[-3:]  # pad inside the JSON
    assert len(line) == LIMIT + 1  # the limit plus the line break
    path = tmp_path / "edge.jsonl"
    path.write_bytes(line + line[:-1] + b" \n")
    with pytest.raises(JsonlError, match=":2: line is"):
        list(read_jsonl(path))
    path.write_bytes(line)
    assert [e["span_id"] for e in read_jsonl(path)] == ["s1"]


def test_reading_past_a_huge_line_holds_a_bounded_amount(log: Path) -> None:
    tracemalloc.start()
    try:
        with read_jsonl(log, best_effort=True) as reader:
            assert len(list(reader)) == 2
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1024 * 1024  # a few times the limit, not the 3 MiB line


def test_gzip_logs_have_the_same_limit(tmp_path: Path, log: Path) -> None:
    packed = tmp_path / "big.jsonl.gz"
    packed.write_bytes(gzip.compress(log.read_bytes()))
    with pytest.raises(JsonlError, match=r"big\.jsonl\.gz:2: line is"):
        list(read_jsonl(packed))


def test_validate_reports_the_line_and_goes_on(log: Path) -> None:
    problems = [str(p) for p in validate_file(log)]
    assert len(problems) == 1
    assert problems[0].startswith(f"{log}:2: line is ")


@pytest.mark.parametrize("engine", ["python", "duckdb"])
def test_summary_refuses_the_line_with_both_engines(log: Path, engine: str) -> None:
    with pytest.raises(JsonlError) as info:
        summarize([log], engine=engine)  # type: ignore[arg-type]
    assert str(info.value).startswith(f"{log}:2: line is ")


@pytest.mark.parametrize("engine", ["python", "duckdb"])
def test_amortization_refuses_the_line_with_both_engines(tmp_path: Path, engine: str) -> None:
    stream = tmp_path / "r.stream.jsonl"
    row = {"t": 1, "cumulative_api_cost_usd": 0.5, "cumulative_solved": 1, "cost_per_solved": 0.5}
    stream.write_bytes(
        orjson.dumps(row) + b"\n" + orjson.dumps({**row, "t": 2, "pad": "x" * HUGE}) + b"\n"
    )
    with pytest.raises(JsonlError) as info:
        amortization_curve(stream, engine=engine)  # type: ignore[arg-type]
    assert str(info.value).startswith(f"{stream}:2: line is ")
