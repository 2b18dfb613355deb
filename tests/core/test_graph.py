"""ExecutionGraph: the spec's examples, snapshot shape, lifecycle, ids, eviction and strictness."""

from __future__ import annotations

import dataclasses
import datetime
import gc
import json
import math
import time
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest

from ampmeter._core.views import bound
from ampmeter.graph import ExecutionGraph
from ampmeter.node import KINDS, Node

NODE_FIELDS = {
    "node_id",
    "parent_id",
    "kind",
    "name",
    "start_ts_ms",
    "end_ts_ms",
    "status",
    "model",
    "retries_used",
    "cost_usd",
    "tokens_in",
    "tokens_out",
    "stop_reason",
    "error_class",
    "metadata",
    "depth",
}
AGGREGATE_FIELDS = {
    "total_cost_usd",
    "total_llm_calls",
    "total_tool_calls",
    "total_retries",
    "total_tokens_in",
    "total_tokens_out",
    "max_depth",
    "in_flight",
    "llm_calls_per_root",
    "tool_calls_per_root",
    "retries_per_root",
}
PER_ROOT = ("llm_calls_per_root", "tool_calls_per_root", "retries_per_root")


def state(graph: ExecutionGraph) -> dict[str, Any]:
    """The snapshot without its timestamp: equal states mean nothing in the graph changed."""
    snap = graph.snapshot()
    del snap["snapshot_ts_ms"]
    return snap


def finished(graph: ExecutionGraph, parent: str, kind: str, name: str, **success: Any) -> str:
    node = graph.begin_node(parent, kind, name)
    graph.mark_running(node)
    graph.mark_success(node, **({"cost_usd": 0.0} | success))
    return node


# -- amplification-factor.md §4 and §5 -----------------------------------------------------


def test_amplification_normal_chain() -> None:
    graph = ExecutionGraph()
    root = graph.create_root("agent_run")
    for name in ("classify", "generate", "refine"):
        finished(graph, root, "llm", name, cost_usd=0.001)
    agg = graph.snapshot()["aggregates"]
    assert (agg["total_llm_calls"], agg["total_tool_calls"], agg["total_retries"]) == (3, 0, 0)
    assert (agg["llm_calls_per_root"], agg["tool_calls_per_root"], agg["retries_per_root"]) == (
        3.0,
        0.0,
        0.0,
    )
    assert all(type(agg[key]) is float for key in PER_ROOT)


def test_amplification_agent_loop_fifty_steps() -> None:
    graph = ExecutionGraph()
    root = graph.create_root("agent_run")
    for step in range(1, 51):
        llm = finished(graph, root, "llm", f"step_{step}", cost_usd=0.25)
        finished(graph, llm, "tool", "search")
    agg = graph.snapshot()["aggregates"]
    assert agg["total_llm_calls"] == 50
    assert agg["total_tool_calls"] == 50
    assert agg["llm_calls_per_root"] == 50.0
    assert agg["tool_calls_per_root"] == 50.0
    assert agg["total_cost_usd"] == 12.5
    assert agg["max_depth"] == 2


def test_amplification_halted_chain_counts_the_halted_call() -> None:
    graph = ExecutionGraph()
    root = graph.create_root("agent_run")
    for step in range(1, 8):
        llm = finished(graph, root, "llm", f"step_{step}", cost_usd=0.5)
        finished(graph, llm, "tool", "search")
    step_8 = graph.begin_node(root, "llm", "step_8")
    graph.mark_halt(step_8, stop_reason="cost_ceiling_exceeded")
    snap = graph.snapshot()
    agg = snap["aggregates"]
    assert agg["total_llm_calls"] == 8  # steps 1-7 (success) + step 8 (halt)
    assert agg["total_tool_calls"] == 7
    assert agg["llm_calls_per_root"] == 8.0
    assert agg["tool_calls_per_root"] == 7.0
    assert agg["total_cost_usd"] == 3.5
    halted = snap["nodes"][step_8]
    assert step_8 == "n000016"  # root n000001, then 7 x (llm, tool), then step 8
    assert (halted["status"], halted["stop_reason"]) == ("halt", "cost_ceiling_exceeded")


def test_amplification_reading_example() -> None:
    graph = ExecutionGraph(chain_id="chain-abc-123")
    root_id = graph.create_root(name="agent_run")
    step_id = graph.begin_node(parent_id=root_id, kind="llm", name="step_1")
    graph.mark_running(step_id)
    graph.mark_success(step_id, cost_usd=0.002, tokens_in=100, tokens_out=50)
    tool_id = graph.begin_node(parent_id=step_id, kind="tool", name="web_search")
    graph.mark_running(tool_id)
    graph.mark_success(tool_id, cost_usd=0.0)
    agg = graph.snapshot()["aggregates"]
    assert agg["llm_calls_per_root"] == 1.0
    assert agg["tool_calls_per_root"] == 1.0
    assert agg["retries_per_root"] == 0.0
    assert all(type(agg[key]) is float for key in PER_ROOT)


@pytest.mark.parametrize("with_root", [False, True])
def test_per_root_fields_present_as_floats_from_the_start(with_root: bool) -> None:
    graph = ExecutionGraph()
    if with_root:
        graph.create_root("agent_run")
    agg = graph.snapshot()["aggregates"]
    assert set(agg) == AGGREGATE_FIELDS
    for key in PER_ROOT:
        assert type(agg[key]) is float and agg[key] == 0.0


def test_counting_rules_per_status() -> None:
    """created and running nodes are not counted; success, fail and halt are; root never."""
    graph = ExecutionGraph()
    root = graph.create_root("agent_run")
    graph.begin_node(root, "llm", "created_only")
    running = graph.begin_node(root, "tool", "running")
    graph.mark_running(running)
    agg = graph.aggregates()
    assert (agg["total_llm_calls"], agg["total_tool_calls"], agg["in_flight"]) == (0, 0, 1)
    failed = graph.begin_node(root, "llm", "failed")
    graph.mark_running(failed)
    graph.mark_failure(failed, "RateLimitError", "429 from provider")
    halted_tool = graph.begin_node(root, "tool", "halted_before_running")
    graph.mark_halt(halted_tool, "tool budget")
    graph.mark_halt(running, "wall time")
    graph.mark_success(root, 0.0)
    agg = graph.aggregates()
    assert (agg["total_llm_calls"], agg["total_tool_calls"], agg["in_flight"]) == (1, 2, 0)


@pytest.mark.parametrize("kind", sorted(KINDS - {"llm", "tool"}))
def test_other_kinds_cost_but_do_not_amplify(kind: str) -> None:
    graph = ExecutionGraph()
    root = graph.create_root("agent_run")
    finished(graph, root, kind, "op", cost_usd=0.75, tokens_in=10, tokens_out=2)
    agg = graph.aggregates()
    assert (agg["total_llm_calls"], agg["total_tool_calls"]) == (0, 0)
    assert (agg["total_cost_usd"], agg["total_tokens_in"], agg["total_tokens_out"]) == (0.75, 10, 2)


# -- execution-graph.md §7 ----------------------------------------------------------------


def _without_times(node: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in node.items() if k not in ("start_ts_ms", "end_ts_ms")}


def test_spec_normal_chain_snapshot() -> None:
    before = time.time_ns() // 1_000_000
    graph = ExecutionGraph(chain_id="chain-abc-123")
    root = graph.create_root(name="agent_run", metadata={"request_id": "req-001"})
    plan = graph.begin_node(root, "llm", "plan_step", model="claude-sonnet-4-6")
    graph.mark_running(plan)
    graph.mark_success(plan, cost_usd=0.0042, tokens_in=120, tokens_out=80)
    search = graph.begin_node(plan, "tool", "web_search", metadata={"query": "VERONICA"})
    graph.mark_running(search)
    graph.mark_success(search, cost_usd=0.0)
    snap = graph.snapshot()
    after = time.time_ns() // 1_000_000

    assert (snap["chain_id"], snap["root_id"]) == ("chain-abc-123", "n000001")
    assert list(snap["nodes"]) == ["n000001", "n000002", "n000003"]
    empty = {"retries_used": 0, "stop_reason": None, "error_class": None}
    assert _without_times(snap["nodes"]["n000001"]) == empty | {
        "node_id": "n000001",
        "parent_id": None,
        "kind": "system",
        "name": "agent_run",
        "status": "running",
        "model": None,
        "cost_usd": 0.0,
        "tokens_in": None,
        "tokens_out": None,
        "metadata": {"request_id": "req-001"},
        "depth": 0,
    }
    assert _without_times(snap["nodes"]["n000002"]) == empty | {
        "node_id": "n000002",
        "parent_id": "n000001",
        "kind": "llm",
        "name": "plan_step",
        "status": "success",
        "model": "claude-sonnet-4-6",
        "cost_usd": 0.0042,
        "tokens_in": 120,
        "tokens_out": 80,
        "metadata": {},
        "depth": 1,
    }
    assert _without_times(snap["nodes"]["n000003"]) == empty | {
        "node_id": "n000003",
        "parent_id": "n000002",
        "kind": "tool",
        "name": "web_search",
        "status": "success",
        "model": None,
        "cost_usd": 0.0,
        "tokens_in": None,
        "tokens_out": None,
        "metadata": {"query": "VERONICA"},
        "depth": 2,
    }
    assert snap["nodes"]["n000001"]["end_ts_ms"] is None
    for node in snap["nodes"].values():
        assert before <= node["start_ts_ms"] <= after
        if node["end_ts_ms"] is not None:
            assert node["start_ts_ms"] <= node["end_ts_ms"] <= after
    assert before <= snap["snapshot_ts_ms"] <= after
    assert snap["aggregates"] == {
        "total_cost_usd": 0.0042,
        "total_llm_calls": 1,
        "total_tool_calls": 1,
        "total_retries": 0,
        "total_tokens_in": 120,
        "total_tokens_out": 80,
        "max_depth": 2,
        "in_flight": 0,
        "llm_calls_per_root": 1.0,
        "tool_calls_per_root": 1.0,
        "retries_per_root": 0.0,
    }


def test_spec_halted_chain_snapshot_counts_two_llm_calls() -> None:
    graph = ExecutionGraph(chain_id="chain-xyz-456")
    root = graph.create_root(name="agent_run")
    step_1 = graph.begin_node(root, "llm", "step_1", model="claude-sonnet-4-6")
    graph.mark_running(step_1)
    graph.mark_success(step_1, cost_usd=0.95, tokens_in=5000, tokens_out=3000)
    step_2 = graph.begin_node(root, "llm", "step_2", model="claude-sonnet-4-6")
    graph.mark_halt(step_2, stop_reason="cost ceiling exceeded")
    snap = graph.snapshot()
    halted = snap["nodes"][step_2]
    assert _without_times(halted) == {
        "node_id": "n000003",
        "parent_id": "n000001",
        "kind": "llm",
        "name": "step_2",
        "status": "halt",
        "model": "claude-sonnet-4-6",
        "retries_used": 0,
        "cost_usd": 0.0,
        "tokens_in": None,
        "tokens_out": None,
        "stop_reason": "cost ceiling exceeded",
        "error_class": None,
        "metadata": {},
        "depth": 1,
    }
    assert halted["end_ts_ms"] is not None
    assert snap["aggregates"] == {
        "total_cost_usd": 0.95,
        "total_llm_calls": 2,
        "total_tool_calls": 0,
        "total_retries": 0,
        "total_tokens_in": 5000,
        "total_tokens_out": 3000,
        "max_depth": 1,
        "in_flight": 0,
        "llm_calls_per_root": 2.0,
        "tool_calls_per_root": 0.0,
        "retries_per_root": 0.0,
    }


# -- snapshot shape and isolation ---------------------------------------------------------


def _busy_graph() -> ExecutionGraph:
    graph = ExecutionGraph(chain_id="shape")
    root = graph.create_root("agent_run", metadata={"tags": ["a", "b"], "cfg": {"k": [1, 2]}})
    llm = graph.begin_node(root, "llm", "plan", "m", metadata={"nested": {"list": [1, {"x": 2}]}})
    graph.increment_retries(llm)
    graph.mark_running(llm)
    graph.mark_failure(llm, "TimeoutError", "read timeout", cost_usd=0.5, tokens_in=7)
    tool = graph.begin_node(root, "tool", "search")
    graph.mark_running(tool)
    graph.begin_node(tool, "system", "open")
    return graph


def test_snapshot_shape() -> None:
    snap = _busy_graph().snapshot()
    assert set(snap) == {"chain_id", "root_id", "nodes", "aggregates", "snapshot_ts_ms"}
    assert type(snap["snapshot_ts_ms"]) is int
    assert set(snap["aggregates"]) == AGGREGATE_FIELDS
    for node_id, node in snap["nodes"].items():
        assert set(node) == NODE_FIELDS
        assert node["node_id"] == node_id
    types = {k: type(v) for k, v in snap["aggregates"].items()}
    assert types == {
        k: float if k.endswith("_per_root") or k == "total_cost_usd" else int
        for k in AGGREGATE_FIELDS
    }
    assert snap["aggregates"]["in_flight"] == 1
    assert snap["aggregates"]["total_retries"] == 1
    assert json.loads(json.dumps(snap, allow_nan=False)) == snap


def test_mutating_a_snapshot_never_changes_the_graph() -> None:
    graph = _busy_graph()
    before = state(graph)
    snap = graph.snapshot()
    root = snap["nodes"]["n000001"]
    root["metadata"]["tags"].append("c")
    root["metadata"]["cfg"]["k"].append(3)
    root["metadata"]["new"] = 1
    snap["nodes"]["n000002"]["metadata"]["nested"]["list"][1]["x"] = 99
    snap["nodes"]["n000002"]["status"] = "running"
    snap["aggregates"]["total_cost_usd"] = 1e9
    del snap["nodes"]["n000003"]
    snap["nodes"]["n999999"] = {}
    assert state(graph) == before
    assert before["nodes"]["n000001"]["metadata"] == {"tags": ["a", "b"], "cfg": {"k": [1, 2]}}


def test_node_returns_a_copy() -> None:
    graph = _busy_graph()
    before = state(graph)
    node = graph.node("n000002")
    assert isinstance(node, Node)
    assert (node.status, node.error_class, node.retries_used, node.depth) == (
        "fail",
        "TimeoutError",
        1,
        1,
    )
    assert node.latency_ms is not None and node.latency_ms >= 0 and node.is_terminal
    node.status = "success"
    node.metadata["nested"]["list"].append(5)
    for copy_ in graph.nodes():
        copy_.metadata["added"] = True
    assert state(graph) == before
    assert [n.node_id for n in graph.nodes()] == list(before["nodes"])


def test_caller_metadata_dict_is_not_kept() -> None:
    graph = ExecutionGraph()
    meta: dict[str, Any] = {"a": 1}
    root = graph.create_root("r", metadata=meta)
    child = graph.begin_node(root, "llm", "x", metadata=meta)
    meta["b"] = 2
    assert graph.node(root).metadata == {"a": 1}
    assert graph.node(child).metadata == {"a": 1}


@pytest.mark.parametrize("enabled", [True, False])
def test_big_snapshot_leaves_the_garbage_collector_as_it_was(enabled: bool) -> None:
    graph = ExecutionGraph()
    root = graph.create_root("r")
    for i in range(3_000):  # past the size where snapshot() pauses the collector
        finished(graph, root, "tool", str(i))
    was = gc.isenabled()
    try:
        if not enabled:
            gc.disable()
        assert len(graph.snapshot()["nodes"]) == 3_001
        assert gc.isenabled() is enabled
    finally:
        if was:
            gc.enable()


def test_snapshot_serializes_values_json_cannot() -> None:
    graph = ExecutionGraph()
    when = datetime.datetime(2025, 1, 2, tzinfo=datetime.timezone.utc)
    meta = {"when": when, "ratio": math.nan, "pair": (1, 2), 3: "int key", "err": ValueError("x")}
    graph.create_root("r", metadata=meta)
    node = graph.snapshot()["nodes"]["n000001"]
    assert node["metadata"] == {
        "when": str(when),
        "ratio": "nan",
        "pair": [1, 2],
        "3": "int key",
        "err": "x",
    }
    json.dumps(node, allow_nan=False)


def test_success_and_failure_merge_metadata() -> None:
    graph = ExecutionGraph()
    root = graph.create_root("r")
    ok = graph.begin_node(root, "llm", "ok", metadata={"provider": "openai"})
    graph.update_metadata(ok, {"cached_tokens": 5})
    graph.mark_success(ok, 0.1, 10, 2, metadata={"cost_status": "priced"})
    bad = graph.begin_node(root, "llm", "bad")
    graph.mark_failure(bad, "APIError", metadata={"cost_status": "unpriced"})
    assert graph.node(ok).metadata == {
        "provider": "openai",
        "cached_tokens": 5,
        "cost_status": "priced",
    }
    assert graph.node(bad).metadata == {"cost_status": "unpriced"}


# -- lifecycle ----------------------------------------------------------------------------


def test_lifecycle_and_in_flight() -> None:
    graph = ExecutionGraph()
    root = graph.create_root("r")
    assert graph.node(root).status == "running"
    node = graph.begin_node(root, "llm", "call", model="m")
    assert graph.node(node).status == "created"
    assert graph.aggregates()["in_flight"] == 0
    graph.mark_running(node)
    graph.mark_running(node)  # idempotent: counted in flight once
    assert graph.node(node).status == "running"
    assert graph.aggregates()["in_flight"] == 1
    graph.increment_retries(node)
    graph.increment_retries(node)
    assert graph.aggregates()["total_retries"] == 0  # folded in only when the node ends
    graph.mark_success(node, 0.25, tokens_in=3, tokens_out=4)
    agg = graph.aggregates()
    assert (agg["in_flight"], agg["total_retries"], agg["retries_per_root"]) == (0, 2, 2.0)
    done = graph.node(node)
    assert (done.status, done.retries_used, done.cost_usd) == ("success", 2, 0.25)
    assert done.end_ts_ms is not None and done.end_ts_ms >= done.start_ts_ms


@pytest.mark.parametrize("run_first", [False, True])
def test_failure_can_carry_billed_cost(run_first: bool) -> None:
    graph = ExecutionGraph()
    root = graph.create_root("r")
    node = graph.begin_node(root, "llm", "stream")
    if run_first:
        graph.mark_running(node)
    graph.mark_failure(node, "StreamCut", cost_usd=0.5, tokens_in=100, tokens_out=7)
    agg = graph.aggregates()
    assert (agg["total_cost_usd"], agg["total_tokens_in"], agg["total_tokens_out"]) == (0.5, 100, 7)
    assert (agg["total_llm_calls"], agg["in_flight"]) == (1, 0)
    assert graph.node(node).error_class == "StreamCut"


def test_halt_can_carry_billed_cost() -> None:
    graph = ExecutionGraph()
    root = graph.create_root("r")
    node = graph.begin_node(root, "tool", "slow")
    graph.mark_running(node)
    graph.mark_halt(node, "timeout", cost_usd=1)
    assert graph.aggregates()["total_cost_usd"] == 1.0
    assert type(graph.node(node).cost_usd) is Decimal


def test_a_node_keeps_its_cost_in_whole_nano_dollars_and_reads_it_as_exact_dollars() -> None:
    graph = ExecutionGraph()
    root = graph.create_root("r")
    node_id = graph.begin_node(root, "llm", "call")
    graph.mark_success(node_id, 0.00125, 10, 2)
    node = graph.node(node_id)
    assert node.cost_nano == 1_250_000 and node.cost_usd == Decimal("0.00125")
    assert str(node.cost_usd) == "0.00125"  # normalized, as the aggregates show it
    assert dataclasses.replace(node, metadata={"a": 1}).cost_usd == Decimal("0.00125")
    assert "cost_nano" not in node.to_dict() and node.to_dict()["cost_usd"] == 0.00125
    huge = Node("n9", root, "llm", "x", 0, cost_nano=2**63 - 1)
    assert huge.to_dict()["cost_usd"] == float(huge.cost_usd)  # rounded once, as float() does
    assert huge.cost_usd == Decimal("9223372036.854775807")


def test_root_ends_without_being_counted() -> None:
    graph = ExecutionGraph()
    root = graph.create_root("r")
    graph.mark_halt(root, "limit amp:cost exceeded")
    node = graph.node(root)
    assert (node.status, node.stop_reason) == ("halt", "limit amp:cost exceeded")
    agg = graph.aggregates()
    assert agg["total_cost_usd"] == 0.0 and agg["in_flight"] == 0 and agg["total_llm_calls"] == 0


def test_begin_node_builds_the_same_node_as_the_constructor() -> None:
    graph = ExecutionGraph()
    root = graph.create_root("r")
    node_id = graph.begin_node(root, "llm", "call", "m", {"k": "v"})
    built = graph.node(node_id)
    expected = Node(
        node_id, root, "llm", "call", built.start_ts_ms, model="m", metadata={"k": "v"}, depth=1
    )
    assert built == expected
    assert dataclasses.asdict(built) == dataclasses.asdict(expected)


def test_depth_and_max_depth() -> None:
    graph = ExecutionGraph()
    parent = graph.create_root("r")
    for depth in range(1, 6):
        parent = graph.begin_node(parent, "system", f"level_{depth}")
        assert graph.node(parent).depth == depth
    assert graph.aggregates()["max_depth"] == 5


def test_chain_id() -> None:
    assert ExecutionGraph("given").snapshot()["chain_id"] == "given"
    a, b = ExecutionGraph(), ExecutionGraph()
    assert a.chain_id != b.chain_id and len(a.chain_id) == 36


# -- ids ----------------------------------------------------------------------------------


def test_ids_are_sequential_root_first() -> None:
    graph = ExecutionGraph()
    assert graph.root_id is None and graph.snapshot()["root_id"] is None
    root = graph.create_root("r")
    ids = [graph.begin_node(root, "llm", str(i)) for i in range(12)]
    assert root == graph.root_id == "n000001"
    assert ids == [f"n{i:06d}" for i in range(2, 14)]
    assert len(graph) == 13


def test_ids_grow_past_six_digits() -> None:
    graph = ExecutionGraph()
    root = graph.create_root("r")
    bound(graph)[0].number_from(999_999)  # reaching it honestly would take a million nodes
    ids = [graph.begin_node(root, "llm", str(i)) for i in range(3)]
    assert ids == ["n999999", "n1000000", "n1000001"]
    assert graph.node("n1000000").parent_id == root


# -- max_nodes ----------------------------------------------------------------------------


def test_eviction_keeps_aggregates_root_and_open_nodes() -> None:
    graph = ExecutionGraph(max_nodes=6)
    root = graph.create_root("r")
    created = graph.begin_node(root, "llm", "waiting")
    running = graph.begin_node(root, "tool", "busy")
    graph.mark_running(running)
    done = [finished(graph, root, "llm", f"s{i}", cost_usd=0.25, tokens_in=2) for i in range(40)]
    assert len(graph) == 6
    kept = set(graph.snapshot()["nodes"])
    assert {root, created, running} <= kept
    assert kept - {root, created, running} == set(done[-3:])  # the newest finished survive
    agg = graph.aggregates()
    assert (agg["total_llm_calls"], agg["total_cost_usd"], agg["total_tokens_in"]) == (40, 10.0, 80)
    assert agg["in_flight"] == 1
    with pytest.raises(KeyError, match="evicted"):
        graph.node(done[0])
    graph.mark_success(running, 0.0)
    graph.mark_success(created, 0.0)
    assert graph.aggregates()["total_tool_calls"] == 1
    assert len(graph) == 6 and root in graph.snapshot()["nodes"]


def test_open_nodes_are_kept_past_the_cap() -> None:
    graph = ExecutionGraph(max_nodes=2)
    root = graph.create_root("r")
    opened = [graph.begin_node(root, "llm", str(i)) for i in range(5)]
    finished(graph, root, "tool", "t")
    assert set(graph.snapshot()["nodes"]) == {root, *opened}


# -- strictness: each bad call raises and leaves the graph as it was -----------------------


@pytest.fixture
def graph() -> ExecutionGraph:
    graph = ExecutionGraph(chain_id="strict")
    root = graph.create_root("r", metadata={"m": [1]})
    graph.begin_node(root, "llm", "created")  # n000002
    running = graph.begin_node(root, "tool", "running")  # n000003
    graph.mark_running(running)
    finished(graph, root, "llm", "done", cost_usd=0.5, tokens_in=10, tokens_out=5)  # n000004
    graph.increment_retries("n000002")
    return graph


def _unchanged(graph: ExecutionGraph, exc: type[Exception], call: Callable[[], object]) -> None:
    before = state(graph)
    with pytest.raises(exc):
        call()
    assert state(graph) == before


UNKNOWN: list[Callable[[ExecutionGraph], object]] = [
    lambda g: g.begin_node("n000099", "llm", "x"),
    lambda g: g.mark_running("n000099"),
    lambda g: g.mark_success("n000099", 0.1),
    lambda g: g.mark_failure("nope", "E"),
    lambda g: g.mark_halt("", "r"),
    lambda g: g.increment_retries("n000099"),
    lambda g: g.update_metadata("n000099", {}),
    lambda g: g.node("n000099"),
]


@pytest.mark.parametrize("call", UNKNOWN)
def test_unknown_id_is_a_key_error(graph: ExecutionGraph, call: Callable[..., object]) -> None:
    _unchanged(graph, KeyError, lambda: call(graph))


def test_unknown_parent_before_root() -> None:
    graph = ExecutionGraph()
    _unchanged(graph, KeyError, lambda: graph.begin_node("n000001", "llm", "x"))


def test_second_root_is_a_runtime_error(graph: ExecutionGraph) -> None:
    _unchanged(graph, RuntimeError, lambda: graph.create_root("again"))


BAD_COSTS = [-0.01, -1, math.nan, math.inf, -math.inf, 10**400]
BAD_VALUES: list[Callable[[ExecutionGraph, Any], object]] = [
    lambda g, c: g.mark_success("n000002", c, 1, 1),
    lambda g, c: g.mark_success("n000003", cost_usd=c),
    lambda g, c: g.mark_failure("n000003", "E", cost_usd=c),
    lambda g, c: g.mark_halt("n000002", "r", cost_usd=c),
]


@pytest.mark.parametrize("cost", BAD_COSTS)
@pytest.mark.parametrize("call", BAD_VALUES)
def test_bad_cost_is_a_value_error(graph: ExecutionGraph, call: Any, cost: object) -> None:
    _unchanged(graph, ValueError, lambda: call(graph, cost))


@pytest.mark.parametrize(
    "call",
    [
        lambda g: g.mark_success("n000002", 0.1, -1, 5),
        lambda g: g.mark_success("n000002", 0.1, 5, -1),
        lambda g: g.mark_failure("n000003", "E", tokens_in=-3),
        lambda g: g.mark_halt("n000003", tokens_out=-3),
    ],
)
def test_negative_tokens_are_a_value_error(graph: ExecutionGraph, call: Any) -> None:
    _unchanged(graph, ValueError, lambda: call(graph))


@pytest.mark.parametrize("kind", ["LLM", "agent", "", "cpu_op"])
def test_unknown_kind_is_a_value_error(graph: ExecutionGraph, kind: str) -> None:
    _unchanged(graph, ValueError, lambda: graph.begin_node("n000001", kind, "x"))


def test_root_cannot_carry_cost(graph: ExecutionGraph) -> None:
    _unchanged(graph, ValueError, lambda: graph.mark_success("n000001", 0.5))
    _unchanged(graph, ValueError, lambda: graph.mark_halt("n000001", tokens_in=3))


WRONG_TYPES: list[Callable[[ExecutionGraph], object]] = [
    lambda g: g.begin_node("n000001", 5, "x"),  # type: ignore[arg-type]
    lambda g: g.begin_node("n000001", ["llm"], "x"),  # type: ignore[arg-type]
    lambda g: g.begin_node("n000001", "llm", 5),  # type: ignore[arg-type]
    lambda g: g.begin_node("n000001", "llm", "x", model=5),  # type: ignore[arg-type]
    lambda g: g.begin_node("n000001", "llm", "x", metadata=[("a", 1)]),  # type: ignore[arg-type]
    lambda g: g.begin_node(1, "llm", "x"),  # type: ignore[arg-type]
    lambda g: g.mark_running(2),  # type: ignore[arg-type]
    lambda g: g.mark_success("n000002", "0.1"),  # type: ignore[arg-type]
    lambda g: g.mark_success("n000002", None),  # type: ignore[arg-type]
    lambda g: g.mark_success("n000002", True),
    lambda g: g.mark_success("n000002", 0.1, 1.5),  # type: ignore[arg-type]
    lambda g: g.mark_success("n000002", 0.1, "10"),  # type: ignore[arg-type]
    lambda g: g.mark_success("n000002", 0.1, 1, True),
    lambda g: g.mark_success("n000002", 0.1, metadata="x"),  # type: ignore[arg-type]
    lambda g: g.mark_failure("n000002", None),  # type: ignore[arg-type]
    lambda g: g.mark_failure("n000002", "E", 404),  # type: ignore[arg-type]
    lambda g: g.mark_halt("n000002", stop_reason=3),  # type: ignore[arg-type]
    lambda g: g.mark_halt("n000002", cost_usd="1"),  # type: ignore[arg-type]
    lambda g: g.increment_retries(7),  # type: ignore[arg-type]
    lambda g: g.update_metadata("n000002", ["x"]),  # type: ignore[arg-type]
    lambda g: g.node(None),  # type: ignore[arg-type]
]


@pytest.mark.parametrize("call", WRONG_TYPES)
def test_wrong_types_are_type_errors(graph: ExecutionGraph, call: Any) -> None:
    _unchanged(graph, TypeError, lambda: call(graph))


def test_create_root_wrong_types() -> None:
    graph = ExecutionGraph()
    _unchanged(graph, TypeError, lambda: graph.create_root(5))  # type: ignore[arg-type]
    _unchanged(graph, TypeError, lambda: graph.create_root("r", metadata=[1]))  # type: ignore[arg-type]
    assert graph.root_id is None


@pytest.mark.parametrize(
    ("kwargs", "exc"),
    [
        ({"chain_id": 5}, TypeError),
        ({"max_nodes": "3"}, TypeError),
        ({"max_nodes": True}, TypeError),
        ({"max_nodes": -1}, ValueError),
    ],
)
def test_constructor_checks(kwargs: dict[str, Any], exc: type[Exception]) -> None:
    with pytest.raises(exc):
        ExecutionGraph(**kwargs)


TERMINAL_CALLS: list[Callable[[ExecutionGraph, str], object]] = [
    lambda g, n: g.mark_running(n),
    lambda g, n: g.mark_success(n, 9.0, 100, 100),
    lambda g, n: g.mark_failure(n, "Late", "late", cost_usd=9.0),
    lambda g, n: g.mark_halt(n, "late", cost_usd=9.0),
    lambda g, n: g.increment_retries(n),
    lambda g, n: g.update_metadata(n, {"late": True}),
]


@pytest.mark.parametrize("end", ["success", "fail", "halt", "halt_from_created"])
@pytest.mark.parametrize("call", TERMINAL_CALLS)
def test_terminal_nodes_do_not_change(end: str, call: Any) -> None:
    graph = ExecutionGraph()
    root = graph.create_root("r")
    node = graph.begin_node(root, "llm", "x")
    if end != "halt_from_created":
        graph.mark_running(node)
    {
        "success": lambda: graph.mark_success(node, 0.5, 1, 2),
        "fail": lambda: graph.mark_failure(node, "E", "boom", cost_usd=0.5),
        "halt": lambda: graph.mark_halt(node, "limit", cost_usd=0.5),
        "halt_from_created": lambda: graph.mark_halt(node, "limit"),
    }[end]()
    before = state(graph)
    call(graph, node)
    assert state(graph) == before


def test_int_subclasses_and_ints_are_accepted() -> None:
    class Tokens(int):
        pass

    graph = ExecutionGraph()
    root = graph.create_root("r")
    node = graph.begin_node(root, "llm", "x")
    graph.mark_success(node, 2, Tokens(3), 4)
    copy_ = graph.node(node)
    assert (copy_.cost_usd, copy_.tokens_in, copy_.tokens_out) == (2.0, 3, 4)
    assert type(copy_.cost_usd) is Decimal and type(copy_.tokens_in) is int
