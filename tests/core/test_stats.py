"""ExecutionStats: counters, gauges, live propagation to ancestors, protected and local keys."""

from __future__ import annotations

import math
import threading
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ampmeter import ExecutionStats, keys
from ampmeter._core.views import bound
from ampmeter.keys import (
    KEY_COST,
    KEY_FORMAT_PARSE_ERROR_CONSECUTIVE,
    KEY_FORMAT_PARSE_ERROR_TOTAL,
    KEY_INPUT_TOKENS,
    KEY_ITERATIONS,
    KEY_OUTPUT_TOKENS,
    KEY_TOOL_CALLS,
    KEY_TOOLCHAIN_PARSE_ERROR_CONSECUTIVE,
    KEY_TOOLCHAIN_PARSE_ERROR_TOTAL,
)


def _tree() -> tuple[ExecutionStats, ExecutionStats, ExecutionStats]:
    root = ExecutionStats()
    child = ExecutionStats(root)
    grandchild = ExecutionStats(child)
    return root, child, grandchild


# -- keys ---------------------------------------------------------------------------------------


def test_standard_keys_use_the_amp_prefix_and_spec_structure() -> None:
    assert keys.KEY_PREFIX == "amp:"
    names = [n for n in dir(keys) if n.startswith("KEY_") and n != "KEY_PREFIX"]
    for name in names:
        assert getattr(keys, name).startswith("amp:"), name
    # The *_FOR / *_AT constants are prefixes: a model, tool or iteration is appended.
    for name in names:
        if name.endswith(("_FOR", "_AT")):
            assert getattr(keys, name).endswith(":"), name
    assert keys.KEY_INPUT_TOKENS_FOR == keys.KEY_INPUT_TOKENS + ":"
    assert keys.KEY_OUTPUT_TOKENS_FOR == keys.KEY_OUTPUT_TOKENS + ":"
    assert keys.KEY_COST_FOR == keys.KEY_COST + ":"
    assert keys.KEY_TOOL_CALLS_FOR == keys.KEY_TOOL_CALLS + ":"
    assert keys.KEY_CACHED_INPUT_TOKENS_FOR == keys.KEY_CACHED_INPUT_TOKENS + ":"
    assert keys.KEY_REASONING_TOKENS_FOR == keys.KEY_REASONING_TOKENS + ":"
    assert keys.KEY_ITERATIONS == "amp:iterations"
    assert keys.KEY_FORMAT_PARSE_ERROR_CONSECUTIVE == "amp:format_parse_error_consecutive"
    assert keys.KEY_TOOLCHAIN_PARSE_ERROR_AT == "amp:toolchain_parse_error:"
    for required in (
        "KEY_LLM_CALLS",
        "KEY_RETRIES",
        "KEY_FORMAT_PARSE_ERROR_TOTAL",
        "KEY_FORMAT_PARSE_ERROR_AT",
        "KEY_TOOLCHAIN_PARSE_ERROR_TOTAL",
        "KEY_TOOLCHAIN_PARSE_ERROR_CONSECUTIVE",
    ):
        assert required in names


# -- counters -----------------------------------------------------------------------------------


def test_counter_defaults_to_zero_and_increments() -> None:
    stats = ExecutionStats()
    assert stats.get_counter("myapp:x") == 0
    stats.incr_counter("myapp:x")
    stats.incr_counter("myapp:x", 4)
    assert stats.get_counter("myapp:x") == 5
    assert isinstance(stats.get_counter("myapp:x"), int)


def test_incr_counter_propagates_to_every_ancestor() -> None:
    root, child, grandchild = _tree()
    grandchild.incr_counter(KEY_INPUT_TOKENS, 100)
    child.incr_counter(KEY_INPUT_TOKENS, 10)
    root.incr_counter(KEY_INPUT_TOKENS, 1)
    assert grandchild.get_counter(KEY_INPUT_TOKENS) == 100
    assert child.get_counter(KEY_INPUT_TOKENS) == 110
    assert root.get_counter(KEY_INPUT_TOKENS) == 111


def test_set_and_reset_counter_are_local() -> None:
    root, child, grandchild = _tree()
    grandchild.incr_counter("myapp:n", 7)
    grandchild.set_counter("myapp:n", 2)
    assert grandchild.get_counter("myapp:n") == 2
    assert child.get_counter("myapp:n") == 7
    assert root.get_counter("myapp:n") == 7
    child.reset_counter("myapp:n")
    assert child.get_counter("myapp:n") == 0
    assert root.get_counter("myapp:n") == 7
    assert grandchild.get_counter("myapp:n") == 2
    # A later increment still reaches every level from their own values.
    grandchild.incr_counter("myapp:n", 1)
    assert (grandchild.get_counter("myapp:n"), child.get_counter("myapp:n")) == (3, 1)
    assert root.get_counter("myapp:n") == 8


def test_negative_counter_delta_is_a_value_error_and_changes_nothing() -> None:
    root, _, grandchild = _tree()
    grandchild.incr_counter("myapp:n", 3)
    with pytest.raises(ValueError, match="only grows"):
        grandchild.incr_counter("myapp:n", -1)
    assert grandchild.get_counter("myapp:n") == 3
    assert root.get_counter("myapp:n") == 3


def test_zero_delta_is_allowed() -> None:
    stats = ExecutionStats()
    stats.incr_counter("myapp:n", 0)
    assert stats.get_counter("myapp:n") == 0
    assert "myapp:n" in stats.counters()


@pytest.mark.parametrize("bad", [1.0, "1", None, True, [1]])
def test_counter_delta_of_wrong_type_is_a_type_error(bad: object) -> None:
    stats = ExecutionStats()
    with pytest.raises(TypeError, match="delta"):
        stats.incr_counter("myapp:n", bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="value"):
        stats.set_counter("myapp:n", bad)  # type: ignore[arg-type]
    assert stats.counters() == {}


@pytest.mark.parametrize("bad", [1, None, b"k", ("k",)])
def test_key_of_wrong_type_is_a_type_error(bad: object) -> None:
    stats = ExecutionStats()
    methods: list[Any] = [stats.incr_counter, stats.set_counter, stats.incr_gauge, stats.set_gauge]
    for method in methods:
        with pytest.raises(TypeError, match="key"):
            method(bad, 1)
    assert stats.counters() == {} and stats.gauges() == {}


def test_empty_key_is_a_value_error() -> None:
    stats = ExecutionStats()
    with pytest.raises(ValueError, match="empty"):
        stats.incr_counter("", 1)
    with pytest.raises(ValueError, match="empty"):
        stats.incr_gauge("", 1.0)


def test_parent_must_be_execution_stats() -> None:
    with pytest.raises(TypeError, match="parent"):
        ExecutionStats({})  # type: ignore[arg-type]


# -- gauges -------------------------------------------------------------------------------------


def test_gauge_defaults_to_zero_and_takes_any_finite_delta() -> None:
    stats = ExecutionStats()
    assert stats.get_gauge("myapp:g") == 0.0
    stats.incr_gauge("myapp:g", 1.5)
    stats.incr_gauge("myapp:g", -0.25)
    stats.incr_gauge("myapp:g", 2)  # an int is a number
    assert stats.get_gauge("myapp:g") == pytest.approx(3.25)
    assert isinstance(stats.get_gauge("myapp:g"), float)


def test_incr_gauge_propagates_and_set_reset_are_local() -> None:
    root, child, grandchild = _tree()
    grandchild.incr_gauge(KEY_COST, 0.5)
    child.incr_gauge(KEY_COST, -0.125)
    assert grandchild.get_gauge(KEY_COST) == 0.5
    assert child.get_gauge(KEY_COST) == 0.375
    assert root.get_gauge(KEY_COST) == 0.375
    grandchild.set_gauge(KEY_COST, 9.0)
    child.reset_gauge(KEY_COST)
    assert grandchild.get_gauge(KEY_COST) == 9.0
    assert child.get_gauge(KEY_COST) == 0.0
    assert root.get_gauge(KEY_COST) == 0.375


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_gauge_values_are_value_errors(bad: float) -> None:
    root, _, grandchild = _tree()
    grandchild.incr_gauge("myapp:g", 1.0)
    with pytest.raises(ValueError, match="finite"):
        grandchild.incr_gauge("myapp:g", bad)
    with pytest.raises(ValueError, match="finite"):
        grandchild.set_gauge("myapp:g", bad)
    assert grandchild.get_gauge("myapp:g") == 1.0
    assert root.get_gauge("myapp:g") == 1.0


@pytest.mark.parametrize("bad", ["1.0", None, True, [1.0]])
def test_gauge_delta_of_wrong_type_is_a_type_error(bad: object) -> None:
    stats = ExecutionStats()
    with pytest.raises(TypeError, match="delta"):
        stats.incr_gauge("myapp:g", bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="value"):
        stats.set_gauge("myapp:g", bad)  # type: ignore[arg-type]
    assert stats.gauges() == {}


# -- protected and local keys -------------------------------------------------------------------


def test_iterations_is_protected_from_user_code() -> None:
    root, _, grandchild = _tree()
    for stats in (root, grandchild):
        stats.incr_counter(KEY_ITERATIONS, 5)
        stats.set_counter(KEY_ITERATIONS, 42)
        stats.reset_counter(KEY_ITERATIONS)
        stats.incr_gauge(KEY_ITERATIONS, 1.0)
        stats.set_gauge(KEY_ITERATIONS, 3.0)
        assert stats.get_counter(KEY_ITERATIONS) == 0
        assert stats.get_gauge(KEY_ITERATIONS) == 0.0
        assert KEY_ITERATIONS not in stats.counters()
        assert KEY_ITERATIONS not in stats.gauges()


def test_iterations_move_only_through_the_context_and_stay_local() -> None:
    from ampmeter import ExecutionContext

    with ExecutionContext("root") as ctx:
        child = ctx.spawn_child("child")
        child.start_iteration()
        child.start_iteration()
        child.stats.set_counter(KEY_ITERATIONS, 100)  # ignored
        assert child.stats.get_counter(KEY_ITERATIONS) == 2
        assert child.iteration == 2
        assert ctx.stats.get_counter(KEY_ITERATIONS) == 0
        child.close()


@pytest.mark.parametrize(
    "key", [KEY_FORMAT_PARSE_ERROR_CONSECUTIVE, KEY_TOOLCHAIN_PARSE_ERROR_CONSECUTIVE]
)
def test_consecutive_keys_are_not_propagated(key: str) -> None:
    root, child, grandchild = _tree()
    grandchild.incr_counter(key, 2)
    child.incr_counter(key, 1)
    assert grandchild.get_counter(key) == 2
    assert child.get_counter(key) == 1
    assert root.get_counter(key) == 0
    assert key not in root.counters()


# -- bulk and convenience -----------------------------------------------------------------------


def test_counters_and_gauges_return_copies() -> None:
    stats = ExecutionStats()
    stats.incr_counter("myapp:c", 2)
    stats.set_gauge("myapp:g", 0.5)
    counters = stats.counters()
    gauges = stats.gauges()
    assert counters == {"myapp:c": 2}
    assert gauges == {"myapp:g": 0.5}
    counters["myapp:c"] = 99
    gauges["myapp:other"] = 1.0
    assert stats.get_counter("myapp:c") == 2
    assert stats.gauges() == {"myapp:g": 0.5}


def test_convenience_getters_read_the_standard_keys() -> None:
    root, _, grandchild = _tree()
    grandchild.incr_counter(KEY_INPUT_TOKENS, 11)
    grandchild.incr_counter(KEY_OUTPUT_TOKENS, 7)
    grandchild.incr_gauge(KEY_COST, 0.25)
    grandchild.incr_counter(KEY_TOOL_CALLS, 3)
    grandchild.incr_counter(KEY_FORMAT_PARSE_ERROR_TOTAL, 2)
    grandchild.incr_counter(KEY_TOOLCHAIN_PARSE_ERROR_TOTAL, 5)
    for stats in (root, grandchild):
        assert stats.total_input_tokens() == 11
        assert stats.total_output_tokens() == 7
        assert stats.total_cost() == 0.25
        assert stats.tool_call_count() == 3
        assert stats.format_parse_error_total() == 2
        assert stats.toolchain_parse_error_total() == 5


def test_fresh_stats_are_empty() -> None:
    stats = ExecutionStats()
    assert stats.counters() == {} and stats.gauges() == {}
    assert stats.total_cost() == 0.0 and stats.total_input_tokens() == 0
    assert stats.parent is None
    assert ExecutionStats(stats).parent is stats


@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 1000)), max_size=60))
def test_every_ancestor_holds_the_sum_of_its_subtree(ops: list[tuple[int, int]]) -> None:
    tree = _tree()
    for level, delta in ops:
        tree[level].incr_counter("myapp:n", delta)
    sums = [sum(d for lvl, d in ops if lvl >= level) for level in range(3)]
    assert [s.get_counter("myapp:n") for s in tree] == sums


# -- threads ------------------------------------------------------------------------------------


def test_sixteen_threads_lose_no_increments_in_a_three_level_tree() -> None:
    root = ExecutionStats()
    children = [ExecutionStats(root) for _ in range(2)]
    leaves = [ExecutionStats(children[i % 2]) for i in range(4)]
    nodes = [root, *children, *leaves]
    per_thread = 2_000
    barrier = threading.Barrier(16)

    def work(i: int) -> None:
        stats = nodes[i % len(nodes)]
        barrier.wait()
        for _ in range(per_thread):
            stats.incr_counter("myapp:n")
            stats.incr_gauge("myapp:g", 0.5)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert root.get_counter("myapp:n") == 16 * per_thread
    assert root.get_gauge("myapp:g") == 16 * per_thread * 0.5
    # Each inner node holds exactly the increments made at it and below it.
    writers = [i % len(nodes) for i in range(16)]
    for index, stats in enumerate(nodes):
        below = {index}
        if stats in children:
            below |= {3 + j for j in range(4) if j % 2 == children.index(stats)}
        expected = sum(per_thread for w in writers if w in below)
        if stats is not root:
            assert stats.get_counter("myapp:n") == expected


def test_repr_works_while_the_lock_is_held() -> None:
    """A repr (a debugger, an error message) must not wait for the non-reentrant lock."""
    stats = ExecutionStats()
    stats.incr_counter("k", 2)
    stats.incr_gauge("g", 0.5)
    out: list[str] = []
    kernel, _ = bound(stats)
    with kernel._lock:
        worker = threading.Thread(target=lambda: out.append(repr(stats)), daemon=True)
        worker.start()
        worker.join(timeout=10)
    assert out == ["ExecutionStats(counters={'k': 2}, gauges={'g': 0.5})"]
