"""read_jsonl (contract §5), the shipped v0 schema, and a process killed mid-write."""

from __future__ import annotations

import gzip
import os
import signal
import subprocess
import sys
import textwrap
import time
import tracemalloc
import warnings
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ampmeter.logs import (
    EventSchemaError,
    JsonlError,
    SkippedLinesWarning,
    TruncatedLineWarning,
    event_errors,
    iter_lines,
    load_schema,
    read_jsonl,
    validate_event,
)

SRC = str(Path(__file__).resolve().parents[2] / "src")
GOOD = {
    "timestamp": "2026-01-22T08:10:00Z",
    "run_id": "run:q1",
    "event_type": "llm_completion",
    "model": "m",
    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    "cost_usd": 0.0,
}


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


# -- reading rules ---------------------------------------------------------------------------


def test_blank_lines_are_skipped_and_records_counted(tmp_path: Path) -> None:
    path = write(tmp_path / "a.jsonl", b'\n{"a":1}\n  \n\r\n{"a":2}\r\n\n')
    reader = read_jsonl(path)
    assert list(reader) == [{"a": 1}, {"a": 2}]
    assert reader.summary.records == 2
    assert reader.summary.blank == 4
    assert reader.skipped == 0


def test_invalid_json_fails_fast_naming_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path / "bad.jsonl", b'{"a":1}\n\n{"a": nope}\n{"a":3}\n')
    reader = read_jsonl(path)
    assert next(reader) == {"a": 1}
    with pytest.raises(JsonlError) as info:
        next(reader)
    assert info.value.line == 3
    assert info.value.path == str(path)
    assert f"{path}:3" in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("line", "kind"),
    # The kind as every log check names what it found (logs.events.json_kind).
    [(b"3", "got 3"), (b"[1]", "an array"), (b'"x"', "a string \\('x'\\)"), (b"null", "null")],
)
def test_non_object_lines_are_errors(tmp_path: Path, line: bytes, kind: str) -> None:
    path = write(tmp_path / "n.jsonl", line + b'\n{"a":1}\n')
    with pytest.raises(JsonlError, match=kind):
        list(read_jsonl(path))


def test_non_object_last_line_is_an_error_not_a_cut_write(tmp_path: Path) -> None:
    path = write(tmp_path / "n.jsonl", b'{"a":1}\n3\n')
    with pytest.raises(JsonlError, match=":2"):
        list(read_jsonl(path))


def test_undecodable_bytes_are_a_jsonl_error(tmp_path: Path) -> None:
    path = write(tmp_path / "u.jsonl", b'{"a":"\xff\xfe"}\n{"a":1}\n')
    with pytest.raises(JsonlError, match=":1"):
        list(read_jsonl(path))


def test_best_effort_skips_and_counts(tmp_path: Path) -> None:
    path = write(tmp_path / "b.jsonl", b'{"a":1}\nxx\n[2]\n{"a":3}\n')
    reader = read_jsonl(path, best_effort=True)
    assert list(reader) == [{"a": 1}, {"a": 3}]
    assert reader.skipped == 2
    assert reader.summary.skipped_lines == [2, 3]
    assert reader.summary.truncated_last_line is False


def test_cut_last_line_is_ignored_with_a_warning(tmp_path: Path) -> None:
    path = write(tmp_path / "cut.jsonl", b'{"a":1}\n{"a":2}\n{"a": 3, "b"')
    with pytest.warns(TruncatedLineWarning, match=":3"):
        reader = read_jsonl(path)
        assert list(reader) == [{"a": 1}, {"a": 2}]
    assert reader.summary.truncated_last_line
    # with its newline it is a complete line that does not parse: an error, not a cut write
    path = write(tmp_path / "cut2.jsonl", b'{"a":1}\n{"a\n\n  \n')
    with pytest.raises(JsonlError, match=r"cut2.jsonl:2: invalid JSON"):
        list(read_jsonl(path))
    # a multi-byte character cut in half is a cut write too
    path = write(tmp_path / "cut3.jsonl", b'{"a":1}\n{"a":"\xc3')
    with pytest.warns(TruncatedLineWarning):
        assert list(read_jsonl(path)) == [{"a": 1}]


def test_complete_file_gives_no_warning(tmp_path: Path) -> None:
    path = write(tmp_path / "ok.jsonl", b'{"a":1}\n{"a":2}')
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert list(read_jsonl(path)) == [{"a": 1}, {"a": 2}]


def test_gzip_files_are_read(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl.gz"
    with gzip.open(path, "wb") as f:
        f.write(b'{"a":1}\n\n{"a":2}\n')
    assert list(read_jsonl(path)) == [{"a": 1}, {"a": 2}]
    # gzip content is recognised without the suffix too
    plain_name = write(tmp_path / "e.jsonl", path.read_bytes())
    assert list(read_jsonl(plain_name)) == [{"a": 1}, {"a": 2}]


def test_broken_gzip_is_a_jsonl_error_and_a_cut_one_warns(tmp_path: Path) -> None:
    fake = write(tmp_path / "fake.jsonl.gz", b'{"a":1}\n')
    with pytest.raises(JsonlError, match="gzip"):
        list(read_jsonl(fake))
    data = gzip.compress(b"".join(b'{"n":%d}\n' % i for i in range(2000)))
    cut = write(tmp_path / "cut.jsonl.gz", data[: len(data) // 2])
    with pytest.warns(TruncatedLineWarning, match="compressed"):
        records = list(read_jsonl(cut))
    assert records == [{"n": i} for i in range(len(records))]


def test_missing_file_raises_at_once(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_jsonl(tmp_path / "nope.jsonl")


def test_reader_closes_its_file(tmp_path: Path) -> None:
    path = write(tmp_path / "c.jsonl", b'{"a":1}\n{"a":2}\n')
    with read_jsonl(path) as reader:
        assert next(reader) == {"a": 1}
    handle = reader._handles[0]
    assert handle.closed
    exhausted = read_jsonl(path)
    list(exhausted)
    assert exhausted._handles[0].closed


def test_memory_does_not_grow_with_file_size(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    line = orjson.dumps(GOOD) + b"\n"
    with open(path, "wb") as f:
        for _ in range(20):
            f.write(line * 5000)  # 100k lines, ~17 MB
    tracemalloc.start()
    count = sum(1 for _ in read_jsonl(path))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert count == 100_000
    assert peak < path.stat().st_size / 20


def test_iter_lines_applies_the_same_rules() -> None:
    assert list(iter_lines(['{"a":1}', "", b'{"a":2}'])) == [{"a": 1}, {"a": 2}]
    with pytest.raises(JsonlError, match="<lines>:1"):
        list(iter_lines(["x", '{"a":1}']))


# -- property tests --------------------------------------------------------------------------


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.binary(max_size=400), best_effort=st.booleans(), gz_name=st.booleans())
def test_arbitrary_bytes_only_raise_jsonl_error(
    tmp_path: Path, data: bytes, best_effort: bool, gz_name: bool
) -> None:
    path = write(tmp_path / ("x.jsonl.gz" if gz_name else "x.jsonl"), data)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any other warning would be a failure
        warnings.simplefilter("ignore", TruncatedLineWarning)
        warnings.simplefilter("ignore", SkippedLinesWarning)
        try:
            for record in read_jsonl(path, best_effort=best_effort):
                assert isinstance(record, dict)
        except JsonlError:
            assert not best_effort or gz_name or data[:2] == b"\x1f\x8b"


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    records=st.lists(st.dictionaries(st.text(max_size=8), json_values, max_size=5), max_size=20),
    gz=st.booleans(),
)
def test_valid_files_round_trip_exactly(
    tmp_path: Path, records: list[dict[str, Any]], gz: bool
) -> None:
    data = b"".join(orjson.dumps(r) + b"\n" for r in records)
    path = tmp_path / ("r.jsonl.gz" if gz else "r.jsonl")
    write(path, gzip.compress(data) if gz else data)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert list(read_jsonl(path)) == records


# -- schema ----------------------------------------------------------------------------------


def test_shipped_schema_is_the_spec_schema() -> None:
    spec = Path("/work/shared/spec/token_tracker_schema_v0.json")
    shipped = Path(SRC) / "ampmeter" / "logs" / "token_tracker_schema_v0.json"
    assert orjson.loads(shipped.read_bytes()) == load_schema()
    if spec.exists():
        assert orjson.loads(spec.read_bytes()) == load_schema()


def test_validate_event_names_the_failing_field() -> None:
    validate_event(GOOD)
    assert event_errors(GOOD) == []
    bad = {**GOOD, "usage": {**GOOD["usage"], "completion_tokens": "1"}}  # type: ignore[dict-item]
    with pytest.raises(EventSchemaError, match=r"usage\.completion_tokens"):
        validate_event(bad)
    errors = event_errors({k: v for k, v in GOOD.items() if k != "model"} | {"latency_ms": 1.5})
    assert any("'model' is a required property" in e for e in errors)
    assert any("latency_ms" in e for e in errors)
    assert any("timestamp" in e for e in event_errors({**GOOD, "timestamp": "yesterday"}))
    assert any("timestamp" in e for e in event_errors({**GOOD, "timestamp": "2026-01-22T08:10:00"}))
    assert any("event_type" in e for e in event_errors({**GOOD, "event_type": "llm"}))
    assert any("component" in e for e in event_errors({**GOOD, "component": "ui"}))
    assert event_errors(3) == ["3 is not of type 'object'"]
    assert isinstance(EventSchemaError(["x"]), ValueError)


# -- a killed writer -------------------------------------------------------------------------


def test_sigkill_mid_run_leaves_only_valid_lines(tmp_path: Path) -> None:
    path = tmp_path / "killed.jsonl"
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {SRC!r})
        from ampmeter.graph import ExecutionGraph
        from ampmeter.sinks.jsonl import JsonlSink
        sink = JsonlSink({str(path)!r}, flush="line")
        g = ExecutionGraph("killed-run")
        root = g.create_root("agent")
        i = 0
        while True:
            i += 1
            n = g.begin_node(root, "llm", "chat", model="m", metadata={{"i": i, "pad": "x" * 300}})
            g.mark_success(n, 0.001, 100 + i, 7)
            sink.emit(g.node(n), g.chain_id)
    """)
    child = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if path.exists() and path.stat().st_size > 200_000:
                break
            time.sleep(0.02)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert child.returncode == -signal.SIGKILL
    data = path.read_bytes()
    complete = data[: data.rfind(b"\n") + 1]
    events = [orjson.loads(line) for line in complete.splitlines()]
    assert len(events) > 100
    for event in events:
        validate_event(event)
    assert [e["metadata"]["i"] for e in events] == list(range(1, len(events) + 1))
    # The kill may land between two writes; cut the last line as a mid-write kill would.
    os.truncate(path, len(complete) - 40)
    with pytest.warns(TruncatedLineWarning):
        read_back = list(read_jsonl(path))
    assert read_back == events[:-1]


# -- one reading for every tool ----------------------------------------------------------------

GOOD_LINE = orjson.dumps({**GOOD, "span_id": "s1"}).decode()
# Each hostile last line (complete, with its newline), and the field the error must name.
HOSTILE = {
    "cost 1e400": (GOOD_LINE.replace('"cost_usd":0.0', '"cost_usd":1e400'), "cost_usd"),
    "cost NaN": (GOOD_LINE.replace('"cost_usd":0.0', '"cost_usd":NaN'), "cost_usd"),
    "cost Infinity": (GOOD_LINE.replace('"cost_usd":0.0', '"cost_usd":Infinity'), "cost_usd"),
    "tokens -5": (
        GOOD_LINE.replace('"prompt_tokens":5', '"prompt_tokens":-5'),
        "usage.prompt_tokens",
    ),
    "tokens 10**30": (
        GOOD_LINE.replace('"prompt_tokens":5', f'"prompt_tokens":{10**30}'),
        "usage.prompt_tokens",
    ),
    "cost negative": (GOOD_LINE.replace('"cost_usd":0.0', '"cost_usd":-0.5'), "cost_usd"),
}


def _cli(args: list[str]) -> Any:
    from typer.testing import CliRunner

    from ampmeter.cli import app

    return CliRunner().invoke(app, args, env={"COLUMNS": "200"})


@pytest.mark.parametrize("hostile", list(HOSTILE))
def test_every_tool_refuses_a_hostile_complete_last_line_naming_file_line_field(
    tmp_path: Path, hostile: str
) -> None:
    line, field = HOSTILE[hostile]
    assert hostile != "tokens 10**30" or str(10**30) in line
    log = tmp_path / "run.jsonl"
    log.write_text(GOOD_LINE + "\n" + line + "\n")
    where = f"{log}:2: field '{field}'"
    validate = _cli(["validate", str(log)])
    assert validate.exit_code == 1 and where in validate.stdout, validate.output
    for command in (["summary", str(log)], ["report", str(log), "-o", str(tmp_path / "r.html")]):
        strict = _cli(command)
        assert strict.exit_code == 2, strict.output
        assert where in strict.stderr and "--best-effort" in strict.stderr
        tolerant = _cli([*command, "--best-effort"])
        assert tolerant.exit_code == 0, tolerant.output
        assert f"{log}: skipped 1 bad line(s), the first at line 2" in tolerant.stderr
    watch = _cli(["watch", "--once", str(log)])
    assert watch.exit_code == 0, watch.output
    assert "1 bad line(s) skipped" in watch.stdout


def test_every_tool_ignores_only_a_last_line_without_its_newline(tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    log.write_text(GOOD_LINE + "\n" + GOOD_LINE[:40])  # a writer killed mid-line
    validate = _cli(["validate", str(log)])
    assert validate.exit_code == 0 and f"{log}:2: warning: incomplete last line" in validate.stderr
    summary = _cli(["summary", str(log)])
    assert summary.exit_code == 0 and "incomplete last line" in summary.stderr
    report = _cli(["report", str(log), "-o", str(tmp_path / "r.html")])
    assert report.exit_code == 0 and "incomplete last line" in report.stderr
    watch = _cli(["watch", "--once", str(log)])
    assert watch.exit_code == 0 and "bad line" not in watch.stdout
    assert "byte(s) of a line still being written" in watch.stdout
