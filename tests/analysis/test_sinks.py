"""MemorySink and JsonlSink: the node -> TokenTracker v0 mapping, flush modes, faults."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ampmeter.graph import ExecutionGraph
from ampmeter.logs import read_jsonl, validate_event
from ampmeter.node import Node
from ampmeter.sinks.jsonl import (
    CUT_SUFFIX,
    CutTailWarning,
    JsonlSink,
    SinkClosedError,
    SinkWriteError,
    _Writer,
    encode_event,
    iso_utc,
    node_to_event,
)
from ampmeter.sinks.memory import MemorySink

SRC = str(Path(__file__).resolve().parents[2] / "src")


def run_graph(chain_id: str = "chain-1") -> tuple[ExecutionGraph, list[Node]]:
    """A finished run with every kind, nesting, failures and the special metadata."""
    g = ExecutionGraph(chain_id)
    root = g.create_root("agent")
    llm = g.begin_node(root, "llm", "chat", model="gpt-4o-mini", metadata={"user": "u1"})
    g.mark_running(llm)
    g.increment_retries(llm)
    g.mark_success(
        llm,
        0.002,
        120,
        30,
        metadata={
            "cached_tokens": 100,
            "pricing_version": "p1",
            "cost_status": "priced",
            "tool_calls_made": 2,
        },
    )
    tool = g.begin_node(llm, "tool", "search", metadata={"component": "rag_infra"})
    g.mark_running(tool)
    g.mark_failure(tool, "TimeoutError", "timeout")
    emb = g.begin_node(root, "embedding", "embed", model="text-embedding-3-small")
    g.mark_success(emb, 0.0, 40, None, metadata={"cost_status": "unpriced"})
    ret = g.begin_node(root, "retrieval", "retrieve", metadata={"component": "not-a-component"})
    g.mark_success(ret, 0.0)
    mem = g.begin_node(root, "memory", "remember")
    g.mark_halt(mem, "budget")
    sysn = g.begin_node(root, "system", "parse")
    g.mark_success(sysn, 0.0)
    g.mark_success(root, 0.0)
    return g, g.nodes()


def lines_of(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def valid_lines(path: Path) -> list[dict[str, Any]]:
    events = lines_of(path)
    for event in events:
        validate_event(event)
    return events


# -- MemorySink ------------------------------------------------------------------------------


def test_memory_sink_keeps_copies_in_order() -> None:
    g, nodes = run_graph()
    sink = MemorySink()
    original = nodes[1]
    for n in nodes:
        sink.emit(n, g.chain_id)
    sink.emit(nodes[2], "other")
    original.metadata["user"] = "changed"
    assert [n.node_id for n in sink.nodes] == [n.node_id for n in nodes] + [nodes[2].node_id]
    assert sink.nodes[1].metadata["user"] == "u1"
    assert sink.nodes[1] is not original
    assert [n.node_id for n in sink.nodes_for("other")] == [nodes[2].node_id]
    assert len(sink) == len(nodes) + 1
    sink.clear()
    assert sink.nodes == []


def test_memory_sink_refuses_after_close_and_bad_input() -> None:
    _, nodes = run_graph()
    with MemorySink() as sink:
        sink.emit(nodes[1], "c")
        with pytest.raises(TypeError, match="Node"):
            sink.emit("not a node", "c")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="chain_id"):
            sink.emit(nodes[1], 5)  # type: ignore[arg-type]
    with pytest.raises(SinkClosedError):
        sink.emit(nodes[1], "c")
    assert len(sink.nodes) == 1


# -- mapping ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["batch", "line", "fsync"])
def test_jsonl_sink_maps_nodes_to_valid_v0_lines(tmp_path: Path, mode: str) -> None:
    g, nodes = run_graph()
    path = tmp_path / "events.jsonl"
    with JsonlSink(path, flush=mode) as sink:
        for n in nodes:
            sink.emit(n, g.chain_id)
    events = valid_lines(path)
    by_id = {n.node_id: n for n in nodes}
    root_id = g.root_id
    assert root_id not in {e["span_id"] for e in events}
    assert [e["span_id"] for e in events] == [n.node_id for n in nodes if n.node_id != root_id]
    kinds = {by_id[e["span_id"]].kind: e["event_type"] for e in events}
    assert kinds == {
        "llm": "llm_completion",
        "tool": "tool_call",
        "embedding": "embedding",
        "retrieval": "rag_retrieval",
        "memory": "memory_update",
        "system": "cpu_op",
    }
    for e in events:
        node = by_id[e["span_id"]]
        assert e["run_id"] == "chain-1"
        assert e["timestamp"] == iso_utc(node.end_ts_ms or 0)
        assert e["latency_ms"] == node.latency_ms
        assert e["operation"] == node.name
        assert e["model"] == (node.model or "")
        assert (
            e["usage"]["total_tokens"]
            == e["usage"]["prompt_tokens"] + e["usage"]["completion_tokens"]
        )
        assert e["metadata"]["status"] == node.status
        assert e["metadata"]["retries_used"] == node.retries_used
        assert e["metadata"]["error_class"] == node.error_class
        assert e["metadata"]["stop_reason"] == node.stop_reason
        if node.depth == 1:
            assert "parent_id" not in e
        else:
            assert e["parent_id"] == node.parent_id
    llm, tool, emb, ret, mem, _ = events
    assert llm["usage"] == {
        "prompt_tokens": 120,
        "completion_tokens": 30,
        "total_tokens": 150,
        "tokens_saved": 100,
    }
    assert llm["cost_usd"] == 0.002
    assert llm["metadata"]["pricing_version"] == "p1"
    assert llm["metadata"]["cost_status"] == "priced"
    assert llm["metadata"]["user"] == "u1"
    assert llm["metadata"]["tool_calls_made"] == 2
    assert llm["metadata"]["retries_used"] == 1
    assert tool["component"] == "rag_infra"
    assert tool["metadata"]["status"] == "fail"
    assert tool["metadata"]["error_class"] == "TimeoutError"
    assert emb["usage"] == {"prompt_tokens": 40, "completion_tokens": 0, "total_tokens": 40}
    assert emb["metadata"]["cost_status"] == "unpriced"
    assert ret["component"] == "pipeline"  # unknown component falls back to the default
    assert mem["metadata"]["stop_reason"] == "budget"
    assert mem["model"] == ""


def test_run_id_and_component_options(tmp_path: Path) -> None:
    g, nodes = run_graph()
    path = tmp_path / "e.jsonl"
    with JsonlSink(path, run_id="stream:q1", component="evaluator") as sink:
        for n in nodes:
            sink.emit(n, g.chain_id)
    events = valid_lines(path)
    assert {e["run_id"] for e in events} == {"stream:q1"}
    assert events[1]["component"] == "rag_infra"
    assert {e["component"] for e in events if e["span_id"] != events[1]["span_id"]} == {"evaluator"}


def test_unpriced_cost_is_written_as_zero() -> None:
    node = Node(
        "n000002",
        "n000001",
        "llm",
        "chat",
        1000,
        1500,
        "success",
        None,
        0,
        500_000_000,
        metadata={"cost_status": "unpriced"},
        depth=1,
    )
    event = node_to_event(node, "r")
    assert event["cost_usd"] == 0.0
    assert event["metadata"]["cost_status"] == "unpriced"
    validate_event(event)


def test_odd_metadata_is_still_written(tmp_path: Path) -> None:
    class Thing:
        def __str__(self) -> str:
            return "thing!"

    meta: dict[Any, Any] = {"obj": Thing(), "huge": 2**70, 3: "int-key"}
    node = Node("n000002", "n000001", "llm", "chat", 0, 5, "success", metadata=meta, depth=1)
    path = tmp_path / "odd.jsonl"
    for mode in ("batch", "line"):
        with JsonlSink(path, flush=mode) as sink:
            sink.emit(node, "c")
    events = valid_lines(path)
    assert len(events) == 2
    for e in events:
        assert e["metadata"]["obj"] == "thing!"
        assert e["metadata"]["huge"] == str(2**70)
        assert e["metadata"]["3"] == "int-key"
        assert "encode_error" in e["metadata"]


node_strategy = st.builds(
    Node,
    node_id=st.from_regex(r"n[0-9]{6}", fullmatch=True),
    parent_id=st.one_of(st.none(), st.from_regex(r"n[0-9]{6}", fullmatch=True)),
    kind=st.sampled_from(["llm", "tool", "system", "embedding", "retrieval", "memory"]),
    name=st.text(max_size=20),
    start_ts_ms=st.integers(0, 4_000_000_000_000),
    end_ts_ms=st.integers(0, 10_000_000),
    status=st.sampled_from(["success", "fail", "halt"]),
    model=st.one_of(st.none(), st.text(max_size=10)),
    retries_used=st.integers(0, 5),
    cost_nano=st.integers(0, 10**15),
    tokens_in=st.one_of(st.none(), st.integers(0, 10**9)),
    tokens_out=st.one_of(st.none(), st.integers(0, 10**9)),
    stop_reason=st.one_of(st.none(), st.text(max_size=10)),
    error_class=st.one_of(st.none(), st.text(max_size=10)),
    metadata=st.dictionaries(
        st.sampled_from(["cached_tokens", "component", "cost_status", "x", "pricing_version"]),
        st.one_of(
            st.integers(-5, 10**6),
            st.text(max_size=8),
            st.none(),
            st.sampled_from(["pipeline", "auxiliary", "unpriced"]),
        ),
    ),
    depth=st.integers(0, 5),
)


@settings(max_examples=150, deadline=None)
@given(node=node_strategy)
def test_every_node_maps_to_a_valid_event(node: Node) -> None:
    node.end_ts_ms = node.start_ts_ms + (node.end_ts_ms or 0)
    event = orjson.loads(encode_event(node_to_event(node, "chain")))
    validate_event(event)
    assert event["span_id"] == node.node_id
    assert event["latency_ms"] == node.latency_ms
    assert ("parent_id" in event) == (node.parent_id is not None and node.depth != 1)
    if event["metadata"].get("cost_status") != "unpriced":
        assert event["cost_usd"] == float(node.cost_usd)


# -- batch mode ------------------------------------------------------------------------------


def many_nodes(count: int) -> Iterator[Node]:
    for i in range(count):
        yield Node(
            f"n{i + 2:06d}",
            "n000001",
            "llm",
            "chat",
            1_700_000_000_000 + i,
            1_700_000_000_100 + i,
            "success",
            "m",
            0,
            1_000_000,
            10 + i,
            5,
            depth=1,
        )


def test_batch_mode_writes_everything_in_order_and_flush_waits(tmp_path: Path) -> None:
    path = tmp_path / "b.jsonl"
    sink = JsonlSink(path)
    for n in many_nodes(3000):
        sink.emit(n, "c")
    sink.flush()
    assert len(lines_of(path)) == 3000
    assert sink.events_written == 3000
    for n in many_nodes(10):
        sink.emit(n, "d")
    sink.close()
    events = valid_lines(path)
    assert [e["usage"]["prompt_tokens"] for e in events] == [10 + i for i in range(3000)] + [
        10 + i for i in range(10)
    ]
    assert sink.events_lost == 0
    sink.close()  # twice is fine
    with pytest.raises(SinkClosedError, match="closed"):
        sink.emit(next(many_nodes(1)), "c")


def test_batch_mode_applies_back_pressure_instead_of_growing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = threading.Event()
    real_write = _Writer.write

    def slow_write(self: _Writer, items: list[tuple[Node, str]]) -> None:
        gate.wait()
        real_write(self, items)

    monkeypatch.setattr(_Writer, "write", slow_write)
    path = tmp_path / "bp.jsonl"
    sink = JsonlSink(path, flush="batch")
    total = 1024 * 80  # more than the queue can hold
    emitter = threading.Thread(target=lambda: [sink.emit(n, "c") for n in many_nodes(total)])
    emitter.start()
    deadline = time.monotonic() + 60
    while not sink._w.queue.full() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sink._w.queue.full()
    time.sleep(0.05)
    assert emitter.is_alive()  # blocked, not dropping and not buffering without bound
    assert sink._w.queue.qsize() <= sink._w.queue.maxsize
    gate.set()
    emitter.join(60)
    sink.close()
    assert len(lines_of(path)) == total
    assert sink.events_written == total


def test_batch_sink_is_flushed_at_interpreter_exit(tmp_path: Path) -> None:
    path = tmp_path / "exit.jsonl"
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {SRC!r})
        from ampmeter.node import Node
        from ampmeter.sinks.jsonl import JsonlSink
        sink = JsonlSink({str(path)!r}, flush="batch")
        for i in range(2500):
            sink.emit(Node(f"n{{i:06d}}", "n000000", "tool", "t", 0, 5, "success", depth=1), "c")
        # no close(): the exit handler must write the buffered events
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    assert len(valid_lines(path)) == 2500


# -- faults ----------------------------------------------------------------------------------


@contextlib.contextmanager
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs when mounting is allowed, else /dev/full (always ENOSPC)."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        yield Path("/dev/full")
        return
    try:
        yield mount / "events.jsonl"
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.parametrize("mode", ["batch", "line"])
def test_disk_full_surfaces_as_oserror_and_leaves_whole_lines(tmp_path: Path, mode: str) -> None:
    with full_disk(tmp_path) as path:
        sink = JsonlSink(path, flush=mode)
        accepted = 0
        error: OSError | None = None
        for n in many_nodes(5000):
            try:
                sink.emit(n, "c")
            except OSError as exc:
                error = exc
                break
            accepted += 1
        if error is None:
            with pytest.raises(SinkWriteError) as info:
                sink.flush()
            error = info.value
        assert isinstance(error, SinkWriteError)
        assert error.errno == errno.ENOSPC
        assert "not written" in str(error)
        assert sink.events_lost > 0
        with pytest.raises(SinkWriteError):
            sink.emit(next(many_nodes(1)), "c")
        with pytest.raises(SinkWriteError):
            sink.close()
        sink.close()  # the error is reported once by close
        # every accepted event is accounted for: written, or counted as lost
        assert sink.events_written + sink.events_lost >= accepted + 1
        if path != Path("/dev/full"):
            data = path.read_bytes()
            assert data.endswith(b"\n") or data == b""
            assert len(valid_lines(path)) == sink.events_written


def test_closed_descriptor_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "closed.jsonl"
    sink = JsonlSink(path, flush="line")
    os.close(sink._w.fd)
    with pytest.raises(SinkWriteError) as info:
        sink.emit(next(many_nodes(1)), "c")
    assert info.value.errno == errno.EBADF
    sink._w.fd = os.open(os.devnull, os.O_WRONLY)  # let close() release something real
    with pytest.raises(SinkWriteError):
        sink.close()


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="flush"):
        JsonlSink(tmp_path / "x.jsonl", flush="sometimes")
    with pytest.raises(ValueError, match="component"):
        JsonlSink(tmp_path / "x.jsonl", component="frontend")
    with pytest.raises(ValueError, match="run_id"):
        JsonlSink(tmp_path / "x.jsonl", run_id="")
    with pytest.raises(FileNotFoundError):
        JsonlSink(tmp_path / "missing-dir" / "x.jsonl")
    assert not (tmp_path / "x.jsonl").exists()
    with JsonlSink(tmp_path / "y.jsonl") as sink:
        open_node = Node("n000002", "n000001", "llm", "chat", 0, depth=1)
        with pytest.raises(ValueError, match="finished"):
            sink.emit(open_node, "c")
        odd = Node("n000002", "n000001", "gpu", "k", 0, 1, "success", depth=1)
        with pytest.raises(ValueError, match="kind"):
            sink.emit(odd, "c")
    assert (tmp_path / "y.jsonl").read_bytes() == b""
    with pytest.raises(ValueError, match="not finished"):
        node_to_event(open_node, "r")


def test_sink_appends_to_an_existing_log(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    for _ in range(2):
        with JsonlSink(path, flush="line") as sink:
            for n in many_nodes(3):
                sink.emit(n, "c")
    assert len(valid_lines(path)) == 6
    assert sum(1 for _ in read_jsonl(path)) == 6


# -- any node, however odd, becomes one line -------------------------------------------------

_odd_text = st.text(
    st.one_of(
        st.characters(codec="utf-8"),
        st.sampled_from(['"', "\\", "\n", "\t", "\x00", "\x1f", "\x7f", "\u2028", "é", "😀"]),
    ),
    max_size=12,
)
_json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**64), 2**64),
    st.floats(allow_nan=True, allow_infinity=True),
    _odd_text,
)
_meta_value = st.recursive(
    _json_leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(_odd_text, inner, max_size=3)
    ),
    max_leaves=8,
)
_meta_key = st.one_of(
    st.sampled_from(
        [
            "cached_tokens",
            "component",
            "cost_status",
            "pricing_version",
            "status",
            "retries_used",
            "error_class",
            "stop_reason",
            "provider",
            "tool_calls_made",
        ]
    ),
    _odd_text,
)
_meta_special = st.one_of(
    _meta_value,
    st.sampled_from(["pipeline", "auxiliary", "rag_infra", "unpriced", "priced"]),
    st.integers(0, 10**6),
)
_opt_text = st.one_of(st.none(), _odd_text, st.sampled_from(["stop", "length", "gpt-4o"]))
wide_node_strategy = st.builds(
    Node,
    node_id=st.one_of(st.from_regex(r"n[0-9]{6}", fullmatch=True), _odd_text),
    parent_id=st.one_of(st.none(), st.sampled_from(["n000001", "n000002"]), _odd_text),
    kind=st.sampled_from(["llm", "tool", "system", "embedding", "retrieval", "memory"]),
    name=st.one_of(st.sampled_from(["chat", "search"]), _odd_text),
    start_ts_ms=st.integers(-(10**12), 4_000_000_000_000),
    end_ts_ms=st.one_of(st.integers(0, 3000), st.integers(0, 10**7)),
    status=st.sampled_from(["success", "fail", "halt"]),
    model=_opt_text,
    retries_used=st.one_of(st.integers(0, 5), st.booleans()),
    cost_nano=st.one_of(st.integers(0, 3), st.integers(-(2**70), 2**70)),
    tokens_in=st.one_of(st.none(), st.integers(0, 10**9), st.just(2**63), st.booleans()),
    tokens_out=st.one_of(st.none(), st.integers(-5, 10**9), st.just(0.5)),
    stop_reason=_opt_text,
    error_class=_opt_text,
    metadata=st.dictionaries(_meta_key, _meta_special, max_size=6),
    depth=st.integers(0, 3),
)


@settings(max_examples=400, deadline=None)
@given(
    node=wide_node_strategy,
    chain_id=st.one_of(st.sampled_from(["chain-1", "chain-2"]), _odd_text),
    mode=st.sampled_from(["line", "batch"]),
)
def test_any_node_becomes_exactly_its_event_on_one_line(
    tmp_path_factory: pytest.TempPathFactory, node: Node, chain_id: str, mode: str
) -> None:
    """Odd text, huge or NaN numbers, odd metadata: one whole line, equal to the event dict."""
    node.end_ts_ms = node.start_ts_ms + (node.end_ts_ms or 0)
    if node.parent_id is None:
        node.parent_id = "n000001"  # the sink skips roots
    try:
        event = node_to_event(node, chain_id)
    except Exception as exc:  # e.g. an unhashable "component": the sink refuses it the same way
        path = tmp_path_factory.mktemp("odd") / "e.jsonl"
        with JsonlSink(path, flush="line") as sink, pytest.raises(type(exc)):
            sink.emit(node, chain_id)
        return
    path = tmp_path_factory.mktemp("odd") / "e.jsonl"
    with JsonlSink(path, flush=mode) as sink:  # type: ignore[arg-type]
        sink.emit(node, chain_id)
    data = path.read_bytes()
    assert data == encode_event(event)
    assert data.count(b"\n") == 1 and data.endswith(b"\n")
    assert orjson.loads(data)["span_id"] == _text_of(node.node_id)


def _text_of(value: object) -> object:
    return value if isinstance(value, str) else orjson.loads(orjson.dumps(value, default=str))


def test_odd_fields_are_written_not_dropped(tmp_path: Path) -> None:
    path = tmp_path / "odd.jsonl"
    odd = [
        Node("n000003", "n000001", "llm", "chat", 0, 5, "success", metadata={"status": "x"}),
        Node("n000004", "n000001", "llm", "chat", 0, 5, "success", metadata={"o": object()}),
        Node("n000005", "n000001", "llm", "chat", 0, 5, "success", tokens_in=True),
        Node("n000006", "n000001", "llm", "chat", 0, 5, "success", retries_used=True),
        Node("n000007", "n000001", "llm", 1, 0, 5, "success"),  # type: ignore[arg-type]
        Node("n000008", "n000001", "llm", "chat", 0, 5, "success", tokens_in=2**70),
    ]
    with JsonlSink(path) as sink:
        for node in odd:
            sink.emit(node, "c")
    events = lines_of(path)
    assert [e["span_id"] for e in events] == [n.node_id for n in odd]
    assert events[0]["metadata"]["status"] == "success"  # ampmeter's status field wins
    assert events[1]["metadata"]["o"].startswith("<object object")


def test_an_unhashable_component_falls_back_to_the_default(tmp_path: Path) -> None:
    """A component that is not a schema value (even a list) never stops the log."""
    graph = ExecutionGraph("c")
    root = graph.create_root("run")
    node_id = graph.begin_node(root, "llm", "x", metadata={"component": ["pipeline"]})
    graph.mark_success(node_id, 0.0, 1, 1)
    path = tmp_path / "events.jsonl"
    with JsonlSink(path, component="auxiliary") as sink:
        sink.emit(graph.node(node_id), "c")
    (event,) = list(read_jsonl(path))
    assert event["component"] == "auxiliary"
    validate_event(event)


# -- crashes ---------------------------------------------------------------------------------


def _two_good_lines(path: Path) -> list[dict[str, Any]]:
    with JsonlSink(path) as sink:
        for n in many_nodes(2):
            sink.emit(n, "c")
    return lines_of(path)


@pytest.mark.parametrize("tail_bytes", [37, 200_000], ids=["short-tail", "tail-over-a-chunk"])
def test_a_cut_last_line_is_moved_aside_before_appending(tmp_path: Path, tail_bytes: int) -> None:
    path = tmp_path / "crashed.jsonl"
    before = _two_good_lines(path)
    cut = b'{"timestamp":"2026-01-01T00:00:00.000Z","metadata":{"pad":"' + b"x" * tail_bytes
    with path.open("ab") as f:
        f.write(cut)  # a crash mid-write: no line break, not JSON
    with pytest.warns(CutTailWarning, match=r"crashed\.jsonl\.cut"):
        sink = JsonlSink(path)
    with sink:
        sink.emit(next(many_nodes(1)), "after")
    events = list(read_jsonl(path))  # strict: every line is whole
    assert events[:2] == before and events[2]["run_id"] == "after"
    assert (tmp_path / ("crashed.jsonl" + CUT_SUFFIX)).read_bytes() == cut + b"\n"


def test_a_whole_last_event_without_line_break_is_kept_in_place(tmp_path: Path) -> None:
    path = tmp_path / "no-newline.jsonl"
    before = _two_good_lines(path)
    path.write_bytes(path.read_bytes().rstrip(b"\n"))  # e.g. written by another tool
    with JsonlSink(path) as sink:
        sink.emit(next(many_nodes(1)), "after")
    events = list(read_jsonl(path))
    assert events[:2] == before and events[2]["run_id"] == "after"
    assert not (tmp_path / ("no-newline.jsonl" + CUT_SUFFIX)).exists()


def test_a_file_that_is_only_a_cut_line_becomes_empty_then_grows(tmp_path: Path) -> None:
    path = tmp_path / "only-cut.jsonl"
    path.write_bytes(b'{"timest')
    with pytest.warns(CutTailWarning), JsonlSink(path) as sink:
        sink.emit(next(many_nodes(1)), "c")
    assert len(valid_lines(path)) == 1
    assert (tmp_path / "only-cut.jsonl.cut").read_bytes() == b'{"timest\n'


def test_sigkill_loses_no_event_whose_emit_returned_in_the_default_mode(tmp_path: Path) -> None:
    """The child acknowledges each event on stdout after emit() returned; every acknowledged
    event must be in the file after a SIGKILL, and the file must take appends afterwards."""
    path = tmp_path / "killed.jsonl"
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {SRC!r})
        from ampmeter.graph import ExecutionGraph
        from ampmeter.sinks.jsonl import JsonlSink
        sink = JsonlSink({str(path)!r})  # the default flush mode
        g = ExecutionGraph("killed-run")
        root = g.create_root("agent")
        i = 0
        while True:
            i += 1
            n = g.begin_node(root, "llm", "chat", metadata={{"i": i}})
            g.mark_success(n, 0.001, 100, 7)
            sink.emit(g.node(n), g.chain_id)
            sys.stdout.write(f"{{i}}\\n")
            sys.stdout.flush()
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    assert child.stdout is not None
    acknowledged = 0
    try:
        for line in child.stdout:
            acknowledged = int(line)
            if acknowledged >= 3000:
                break
    finally:
        child.send_signal(signal.SIGKILL)
        rest = child.stdout.read()
        child.wait()
    acknowledged = max([acknowledged, *map(int, rest.split())])
    assert child.returncode == -signal.SIGKILL
    data = path.read_bytes()
    whole = data[: data.rfind(b"\n") + 1]
    numbers = [orjson.loads(line)["metadata"]["i"] for line in whole.splitlines()]
    assert numbers[:acknowledged] == list(range(1, acknowledged + 1))
    # Whatever the kill left, a new sink appends on a line of its own.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CutTailWarning)
        with JsonlSink(path) as sink:
            sink.emit(next(many_nodes(1)), "after")
    events = list(read_jsonl(path))
    assert events[-1]["run_id"] == "after" and len(events) >= acknowledged + 1
