"""The five invariants of execution-graph.md §3, checked after every step of random runs.

A hypothesis state machine drives random begin / running / success / failure / halt / retry
calls (plus rejected bad calls) against one graph and, after each step, checks: unique ids,
parent discipline, one-way lifecycle, a total cost that never decreases, and aggregates equal
to a recount from the nodes. A small model of the expected status of every node is kept too,
so a call that silently does the wrong thing is caught, not only one that breaks a rule.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, rule

from ampmeter.graph import ExecutionGraph
from ampmeter.node import KINDS, TERMINAL_STATUSES

NEXT = {
    "created": {"created", "running", "fail", "halt", "success"},
    "running": {"running", "success", "fail", "halt"},
}
FROZEN_WHEN_TERMINAL = (
    "status",
    "end_ts_ms",
    "cost_usd",
    "tokens_in",
    "tokens_out",
    "retries_used",
    "stop_reason",
    "error_class",
    "metadata",
)

costs = st.one_of(
    st.integers(0, 40).map(lambda q: q * 0.25),
    st.floats(0.0, 5.0, allow_nan=False, allow_infinity=False),
)
tokens = st.none() | st.integers(0, 10_000)
reasons = st.none() | st.text(max_size=8)


class GraphMachine(RuleBasedStateMachine):
    """Random call sequences against one ExecutionGraph and a model of what it should hold."""

    nodes = Bundle("nodes")

    def __init__(self) -> None:
        super().__init__()
        self.graph = ExecutionGraph(chain_id="machine")
        self.expected: dict[str, str] = {}  # node id -> status the model expects
        self.created_order: list[str] = []
        self.previous: dict[str, dict[str, Any]] = {}
        self.last_total_cost = 0.0

    @initialize(target=nodes)
    def root(self) -> str:
        root = self.graph.create_root("agent_run", metadata={"request_id": "r-1"})
        self._created(root, "running")
        return root

    def _created(self, node_id: str, status: str) -> None:
        assert node_id not in self.expected
        self.expected[node_id] = status
        self.created_order.append(node_id)

    def _is_root(self, node_id: str) -> bool:
        return node_id == self.graph.root_id

    def _open(self, node_id: str) -> bool:
        return self.expected[node_id] not in TERMINAL_STATUSES

    @rule(target=nodes, parent=nodes, kind=st.sampled_from(sorted(KINDS)), name=st.text(max_size=6))
    def begin(self, parent: str, kind: str, name: str) -> str:
        node_id = self.graph.begin_node(parent, kind, name, model="m" if kind == "llm" else None)
        self._created(node_id, "created")
        return node_id

    @rule(node=nodes)
    def running(self, node: str) -> None:
        self.graph.mark_running(node)
        if self.expected[node] == "created":
            self.expected[node] = "running"

    @rule(node=nodes, cost=costs, tokens_in=tokens, tokens_out=tokens)
    def success(
        self, node: str, cost: float, tokens_in: int | None, tokens_out: int | None
    ) -> None:
        if self._is_root(node):
            cost, tokens_in, tokens_out = 0.0, None, None
        self.graph.mark_success(node, cost, tokens_in, tokens_out)
        if self._open(node):
            self.expected[node] = "success"

    @rule(node=nodes, cost=costs, reason=reasons, tokens_in=tokens)
    def failure(self, node: str, cost: float, reason: str | None, tokens_in: int | None) -> None:
        if self._is_root(node):
            cost, tokens_in = 0.0, None
        self.graph.mark_failure(node, "SomeError", reason, cost_usd=cost, tokens_in=tokens_in)
        if self._open(node):
            self.expected[node] = "fail"

    @rule(node=nodes, cost=costs, reason=reasons)
    def halt(self, node: str, cost: float, reason: str | None) -> None:
        self.graph.mark_halt(node, reason, cost_usd=0.0 if self._is_root(node) else cost)
        if self._open(node):
            self.expected[node] = "halt"

    @rule(node=nodes)
    def retry(self, node: str) -> None:
        before = self.graph.node(node).retries_used
        self.graph.increment_retries(node)
        assert self.graph.node(node).retries_used == before + (1 if self._open(node) else 0)

    @rule(
        node=nodes,
        bad=st.sampled_from(
            [
                ("cost", math.nan),
                ("cost", -0.25),
                ("cost", math.inf),
                ("tokens", -1),
                ("type", "0.5"),
                ("unknown", None),
            ]
        ),
    )
    def rejected(self, node: str, bad: tuple[str, Any]) -> None:
        before = self.graph.snapshot()
        del before["snapshot_ts_ms"]
        what, value = bad
        exc: type[Exception] = {
            "cost": ValueError,
            "tokens": ValueError,
            "type": TypeError,
            "unknown": KeyError,
        }[what]
        with pytest.raises(exc):
            if what == "cost":
                self.graph.mark_success(node, value)
            elif what == "tokens":
                self.graph.mark_failure(node, "E", tokens_out=value)
            elif what == "type":
                self.graph.mark_halt(node, cost_usd=value)
            else:
                self.graph.begin_node("n999999", "llm", "orphan")
        after = self.graph.snapshot()
        del after["snapshot_ts_ms"]
        assert after == before

    # -- the invariants, after every step ---------------------------------------------------

    @invariant()
    def all_invariants(self) -> None:
        snap = self.graph.snapshot()
        nodes = snap["nodes"]
        json.dumps(snap, allow_nan=False)

        # 1. unique ids, handed out in creation order and never reused
        ids = list(nodes)
        assert ids == self.created_order
        assert [n["node_id"] for n in nodes.values()] == ids
        numbers = [int(i[1:]) for i in ids]
        assert numbers == list(range(1, len(ids) + 1))
        assert snap["root_id"] == ids[0] == "n000001"

        # 2. parent discipline: one root, every other parent exists and came first
        for index, (node_id, node) in enumerate(nodes.items()):
            if node_id == snap["root_id"]:
                assert node["parent_id"] is None and node["depth"] == 0
                assert node["kind"] == "system"
            else:
                parent = nodes[node["parent_id"]]
                assert ids.index(node["parent_id"]) < index
                assert node["depth"] == parent["depth"] + 1

        # 3. lifecycle one way: allowed moves only, terminal nodes frozen, model agrees
        for node_id, node in nodes.items():
            assert node["status"] == self.expected[node_id]
            old = self.previous.get(node_id)
            if old is None:
                continue
            if old["status"] in TERMINAL_STATUSES:
                assert all(node[k] == old[k] for k in FROZEN_WHEN_TERMINAL)
            else:
                assert node["status"] in NEXT[old["status"]]
            assert (node["end_ts_ms"] is None) == (node["status"] not in TERMINAL_STATUSES)
        self.previous = nodes

        # 4. total cost never decreases
        agg = snap["aggregates"]
        assert agg["total_cost_usd"] >= self.last_total_cost
        self.last_total_cost = agg["total_cost_usd"]

        # 5. aggregates equal a recount from the nodes
        counted = [n for n in nodes.values() if n["parent_id"] is not None]
        ended = [n for n in counted if n["status"] in TERMINAL_STATUSES]
        assert math.isclose(
            agg["total_cost_usd"], math.fsum(n["cost_usd"] for n in ended), rel_tol=0, abs_tol=1e-9
        )
        recount = {
            "total_llm_calls": sum(n["kind"] == "llm" for n in ended),
            "total_tool_calls": sum(n["kind"] == "tool" for n in ended),
            "total_retries": sum(n["retries_used"] for n in ended),
            "total_tokens_in": sum(n["tokens_in"] or 0 for n in ended),
            "total_tokens_out": sum(n["tokens_out"] or 0 for n in ended),
            "max_depth": max(n["depth"] for n in nodes.values()),
            "in_flight": sum(n["status"] == "running" for n in counted),
        }
        assert {k: agg[k] for k in recount} == recount
        assert agg["llm_calls_per_root"] == float(recount["total_llm_calls"])
        assert agg["tool_calls_per_root"] == float(recount["total_tool_calls"])
        assert agg["retries_per_root"] == float(recount["total_retries"])
        assert all(type(agg[k]) is float for k in ("llm_calls_per_root", "retries_per_root"))


GraphMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestGraphMachine = GraphMachine.TestCase
