"""ExecutionGraph under threads: exact aggregates, unique ids, each node counted once."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Callable

from ampmeter.graph import ExecutionGraph

THREADS = 16
LIFECYCLES = 5_000


def _run_threads(count: int, target: Callable[[int], None]) -> None:
    errors: list[BaseException] = []

    def guarded(index: int) -> None:
        try:
            target(index)
        except BaseException as exc:  # reported by the main thread below
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads)
    assert errors == []


def _lifecycles(graph: ExecutionGraph, parent: str, n: int, ids: list[str]) -> None:
    """n full lifecycles cycling through success, tool success, failure with retry, halt."""
    for i in range(n):
        pattern = i % 4
        if pattern == 0:
            node = graph.begin_node(parent, "llm", "call", model="m")
            graph.mark_running(node)
            graph.mark_success(node, 0.25, tokens_in=10, tokens_out=3)
        elif pattern == 1:
            node = graph.begin_node(parent, "tool", "search")
            graph.mark_running(node)
            graph.mark_success(node, 0.0)
        elif pattern == 2:
            node = graph.begin_node(parent, "llm", "flaky", model="m")
            graph.increment_retries(node)
            graph.mark_running(node)
            graph.mark_failure(node, "RateLimitError", cost_usd=0.5, tokens_in=1)
        else:
            node = graph.begin_node(parent, "llm", "stopped", model="m")
            graph.mark_halt(node, "budget")
        ids.append(node)


def test_sixteen_threads_of_full_lifecycles_leave_exact_aggregates() -> None:
    graph = ExecutionGraph()
    root = graph.create_root("agent_run")
    ids: list[list[str]] = [[] for _ in range(THREADS)]
    agents: list[str] = [""] * THREADS
    start = threading.Barrier(THREADS + 1)
    done = threading.Event()
    seen: list[dict[str, int | float]] = []

    def worker(index: int) -> None:
        agents[index] = graph.begin_node(root, "system", f"agent_{index}")
        graph.mark_running(agents[index])
        start.wait()
        _lifecycles(graph, agents[index], LIFECYCLES, ids[index])
        graph.mark_success(agents[index], 0.0)

    def watcher() -> None:
        start.wait()
        while not done.is_set() and len(seen) < 8:
            snap = graph.snapshot()
            json.dumps(snap["aggregates"])
            seen.append(snap["aggregates"])

    watch = threading.Thread(target=watcher)
    watch.start()
    try:
        _run_threads(THREADS, worker)
    finally:
        done.set()
        watch.join(timeout=120)

    per_thread = LIFECYCLES // 4
    agg = graph.aggregates()
    assert agg == {
        "total_cost_usd": THREADS * per_thread * (0.25 + 0.5),
        "total_llm_calls": THREADS * per_thread * 3,
        "total_tool_calls": THREADS * per_thread,
        "total_retries": THREADS * per_thread,
        "total_tokens_in": THREADS * per_thread * (10 + 1),
        "total_tokens_out": THREADS * per_thread * 3,
        "max_depth": 2,
        "in_flight": 0,
        "llm_calls_per_root": float(THREADS * per_thread * 3),
        "tool_calls_per_root": float(THREADS * per_thread),
        "retries_per_root": float(THREADS * per_thread),
    }

    every_id = [i for chunk in ids for i in chunk]
    assert len(every_id) == THREADS * LIFECYCLES
    assert len(set(every_id) | set(agents) | {root}) == THREADS * LIFECYCLES + THREADS + 1
    snap = graph.snapshot()
    expected_ids = [f"n{i:06d}" for i in range(1, THREADS * LIFECYCLES + THREADS + 2)]
    assert sorted(snap["nodes"]) == expected_ids
    for index, chunk in enumerate(ids):
        assert all(snap["nodes"][i]["parent_id"] == agents[index] for i in chunk)
    assert all(
        n["status"] in ("success", "fail", "halt")
        for n in snap["nodes"].values()
        if n["parent_id"] is not None
    )

    costs = [s["total_cost_usd"] for s in seen]
    calls = [s["total_llm_calls"] for s in seen]
    assert costs == sorted(costs) and calls == sorted(calls)


def test_racing_terminal_calls_count_each_node_once() -> None:
    graph = ExecutionGraph()
    root = graph.create_root("agent_run")
    nodes = [graph.begin_node(root, "llm", str(i)) for i in range(300)]
    for node in nodes[::2]:
        graph.mark_running(node)
    start = threading.Barrier(THREADS)

    def racer(index: int) -> None:
        order = nodes[:]
        random.Random(index).shuffle(order)
        start.wait()
        for node in order:
            if index % 3 == 0:
                graph.mark_success(node, 0.25, 4, 2)
            elif index % 3 == 1:
                graph.mark_failure(node, "E", cost_usd=0.25, tokens_in=4, tokens_out=2)
            else:
                graph.mark_halt(node, "stop", cost_usd=0.25, tokens_in=4, tokens_out=2)

    _run_threads(THREADS, racer)
    agg = graph.aggregates()
    assert (agg["total_llm_calls"], agg["total_cost_usd"], agg["in_flight"]) == (300, 75.0, 0)
    assert (agg["total_tokens_in"], agg["total_tokens_out"]) == (1200, 600)


def test_threads_with_eviction_keep_exact_aggregates() -> None:
    graph = ExecutionGraph(max_nodes=500)
    root = graph.create_root("agent_run")
    ids: list[list[str]] = [[] for _ in range(8)]
    _run_threads(8, lambda index: _lifecycles(graph, root, 2_000, ids[index]))
    agg = graph.aggregates()
    assert agg["total_llm_calls"] == 8 * 500 * 3
    assert agg["total_tool_calls"] == 8 * 500
    assert agg["total_cost_usd"] == 8 * 500 * 0.75
    assert agg["total_retries"] == 8 * 500
    assert len(graph) == 500
    kept = graph.snapshot()["nodes"]
    assert root in kept
    every_id = [i for chunk in ids for i in chunk]
    assert len(set(every_id)) == len(every_id) == 16_000
    # Which 499 survive depends on the order the threads ended them in; all must be finished.
    assert set(kept) - {root} <= set(every_id)
    assert all(n["status"] in ("success", "fail", "halt") for k, n in kept.items() if k != root)
