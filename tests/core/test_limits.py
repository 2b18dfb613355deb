"""Limits: construction, strictly-greater semantics, order, prefix matching, default_limits."""

from __future__ import annotations

import math
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ampmeter import ExceededLimit, ExecutionStats, Limit, LimitType, check_limits, default_limits
from ampmeter._core.cells import Level
from ampmeter._core.check import Guard
from ampmeter._core.ticket import Ticket
from ampmeter._core.usage import internal_amount
from ampmeter._core.views import bound
from ampmeter.keys import (
    KEY_COST,
    KEY_FORMAT_PARSE_ERROR_CONSECUTIVE,
    KEY_INPUT_TOKENS,
    KEY_INPUT_TOKENS_FOR,
    KEY_ITERATIONS,
    KEY_TOOLCHAIN_PARSE_ERROR_CONSECUTIVE,
)
from ampmeter.node import Node

# -- construction -------------------------------------------------------------------------------


def test_limit_type_values() -> None:
    assert LimitType.EXACT.value == "exact" and LimitType("exact") is LimitType.EXACT
    assert LimitType.PREFIX.value == "prefix" and str(LimitType.PREFIX) == "prefix"
    assert Limit("k", 1).type is LimitType.EXACT
    assert Limit("k", 1, "prefix").type is LimitType.PREFIX  # type: ignore[arg-type]
    assert Limit("k", 3).max_value == 3.0 and isinstance(Limit("k", 3).max_value, float)


def test_nan_max_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="nan"):
        Limit(KEY_COST, math.nan)


def test_empty_key_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="empty"):
        Limit("", 1)


@pytest.mark.parametrize(
    ("key", "max_value", "match"),
    [
        (1, 1.0, "key"),
        (None, 1.0, "key"),
        ("k", "1", "max_value"),
        ("k", None, "max_value"),
        ("k", True, "max_value"),
    ],
)
def test_wrong_types_are_type_errors(key: object, max_value: object, match: str) -> None:
    with pytest.raises(TypeError, match=match):
        Limit(key, max_value)  # type: ignore[arg-type]


def test_unknown_limit_type_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"exact.*prefix"):
        Limit("k", 1, "fuzzy")  # type: ignore[arg-type]


def test_limits_are_immutable() -> None:
    limit = Limit("k", 1)
    with pytest.raises(AttributeError):
        limit.max_value = 2.0  # type: ignore[misc]


def test_default_limits() -> None:
    assert default_limits() == [
        Limit(KEY_ITERATIONS, 100, LimitType.EXACT),
        Limit(KEY_FORMAT_PARSE_ERROR_CONSECUTIVE, 3, LimitType.EXACT),
        Limit(KEY_TOOLCHAIN_PARSE_ERROR_CONSECUTIVE, 3, LimitType.EXACT),
    ]
    # A fresh list each time: changing one does not change the next.
    first = default_limits()
    first.clear()
    assert len(default_limits()) == 3


# -- checking -----------------------------------------------------------------------------------


def test_strictly_greater_exceeds_equal_does_not() -> None:
    stats = ExecutionStats()
    limits = [Limit(KEY_INPUT_TOKENS, 100)]
    stats.incr_counter(KEY_INPUT_TOKENS, 100)
    assert check_limits(stats, limits) is None
    stats.incr_counter(KEY_INPUT_TOKENS, 1)
    hit = check_limits(stats, limits)
    assert hit == ExceededLimit(limits[0], KEY_INPUT_TOKENS, 101)
    assert (hit.limit, hit.key, hit.value) == (limits[0], KEY_INPUT_TOKENS, 101.0)


def test_gauge_limit_strictly_greater() -> None:
    stats = ExecutionStats()
    limits = [Limit(KEY_COST, 1.0)]
    stats.set_gauge(KEY_COST, 1.0)
    assert check_limits(stats, limits) is None
    stats.incr_gauge(KEY_COST, 0.01)
    hit = check_limits(stats, limits)
    assert hit is not None and hit.key == KEY_COST and hit.value == Decimal("1.01")


def test_never_written_keys_cannot_exceed() -> None:
    stats = ExecutionStats()
    limits = [Limit("myapp:a", -1), Limit("myapp:", -1, LimitType.PREFIX)]
    assert check_limits(stats, limits) is None
    stats.incr_counter("other:b", 5)
    assert check_limits(stats, limits) is None


def test_list_order_decides_which_limit_is_reported() -> None:
    stats = ExecutionStats()
    stats.incr_counter("myapp:a", 10)
    stats.incr_counter("myapp:b", 10)
    a, b = Limit("myapp:a", 1), Limit("myapp:b", 1)
    hit_ab = check_limits(stats, [a, b])
    hit_ba = check_limits(stats, [b, a])
    assert hit_ab is not None and hit_ab.limit is a and hit_ab.key == "myapp:a"
    assert hit_ba is not None and hit_ba.limit is b and hit_ba.key == "myapp:b"


def test_counters_are_checked_before_gauges() -> None:
    stats = ExecutionStats()
    stats.incr_counter("myapp:x", 5)
    stats.incr_gauge("myapp:x", 50.0)
    hit = check_limits(stats, [Limit("myapp:x", 1)])
    assert hit is not None and hit.value == 5.0
    # A prefix limit too: the counter is reported even though the gauge key sorts first.
    stats2 = ExecutionStats()
    stats2.incr_gauge("myapp:a", 50.0)
    stats2.incr_counter("myapp:b", 5)
    hit2 = check_limits(stats2, [Limit("myapp:", 1, LimitType.PREFIX)])
    assert hit2 is not None and (hit2.key, hit2.value) == ("myapp:b", 5.0)


def test_gauge_exceeds_when_counter_does_not() -> None:
    stats = ExecutionStats()
    stats.incr_counter("myapp:x", 1)
    stats.incr_gauge("myapp:x", 50.0)
    hit = check_limits(stats, [Limit("myapp:x", 10)])
    assert hit is not None and hit.value == 50.0


def test_first_match_wins_among_several_exceeded() -> None:
    stats = ExecutionStats()
    stats.incr_counter(KEY_INPUT_TOKENS, 1_000)
    stats.incr_counter(KEY_INPUT_TOKENS_FOR + "gpt-4o", 1_000)
    stats.incr_gauge(KEY_COST, 99.0)
    limits = [
        Limit(KEY_ITERATIONS, 100),
        Limit(KEY_COST, 10.0),
        Limit(KEY_INPUT_TOKENS, 500),
        Limit(KEY_INPUT_TOKENS_FOR, 500, LimitType.PREFIX),
    ]
    hit = check_limits(stats, limits)
    assert hit is not None and hit.limit is limits[1] and hit.key == KEY_COST


def test_prefix_limit_reports_the_full_key() -> None:
    stats = ExecutionStats()
    stats.incr_counter(KEY_INPUT_TOKENS, 90_000)  # the total starts with the prefix's stem only
    stats.incr_counter(KEY_INPUT_TOKENS_FOR + "gpt-4o-mini", 20_000)
    stats.incr_counter(KEY_INPUT_TOKENS_FOR + "gpt-4o", 70_000)
    limit = Limit(KEY_INPUT_TOKENS_FOR, 50_000, LimitType.PREFIX)
    hit = check_limits(stats, [limit])
    assert hit == ExceededLimit(limit, "amp:input_tokens:gpt-4o", 70_000)


def test_prefix_limit_without_colon_matches_the_total_too() -> None:
    stats = ExecutionStats()
    stats.incr_counter(KEY_INPUT_TOKENS, 10)
    limit = Limit(KEY_INPUT_TOKENS, 5, LimitType.PREFIX)
    hit = check_limits(stats, [limit])
    assert hit is not None and hit.key == KEY_INPUT_TOKENS


def test_prefix_limit_sees_keys_that_appear_after_the_first_check() -> None:
    stats = ExecutionStats()
    limit = Limit("amp:tool_calls:", 2, LimitType.PREFIX)
    stats.incr_counter("amp:tool_calls:search", 1)
    assert check_limits(stats, [limit]) is None
    stats.incr_counter("amp:tool_calls:shell", 3)
    stats.incr_counter("amp:tool_calls:nested:tool", 9)
    hit = check_limits(stats, [limit])
    assert hit is not None and hit.key == "amp:tool_calls:shell"
    stats.set_counter("amp:tool_calls:shell", 0)
    hit = check_limits(stats, [limit])
    assert hit is not None and hit.key == "amp:tool_calls:nested:tool"


def test_exact_limit_ignores_keys_that_only_share_a_prefix() -> None:
    stats = ExecutionStats()
    stats.incr_counter(KEY_INPUT_TOKENS_FOR + "gpt-4o", 1_000)
    assert check_limits(stats, [Limit(KEY_INPUT_TOKENS, 10)]) is None
    assert Limit(KEY_INPUT_TOKENS, 10).matches(KEY_INPUT_TOKENS)
    assert not Limit(KEY_INPUT_TOKENS, 10).matches(KEY_INPUT_TOKENS_FOR + "x")
    assert Limit(KEY_INPUT_TOKENS_FOR, 10, LimitType.PREFIX).matches(KEY_INPUT_TOKENS_FOR + "x")


def test_check_limits_counts_pending_amounts() -> None:
    stats = ExecutionStats()
    stats.incr_gauge(KEY_COST, 0.6)
    limits = [Limit(KEY_COST, 1.0)]
    assert check_limits(stats, limits, {KEY_COST: 0.4}) is None
    hit = check_limits(stats, limits, {KEY_COST: 0.5})
    assert hit is not None and hit.value == Decimal("1.1")
    # A pending amount on a key never written counts too (a limit of 0 stops the first call).
    hit0 = check_limits(ExecutionStats(), [Limit("myapp:calls", 0)], {"myapp:calls": 1})
    assert hit0 is not None and hit0.value == 1.0


def test_exceeded_limit_str_names_key_value_and_max() -> None:
    hit = ExceededLimit(Limit(KEY_COST, 1.0), KEY_COST, Decimal("1.5"))
    assert str(hit) == "limit exceeded: amp:cost = $1.50 > $1.00"  # money as people write it
    assert Limit(KEY_INPUT_TOKENS_FOR, 5, LimitType.PREFIX).describe() == "amp:input_tokens:* > 5"


@given(
    st.lists(st.integers(0, 50), min_size=1, max_size=8),
    st.lists(st.integers(0, 60), min_size=1, max_size=5),
)
def test_check_limits_matches_a_reference_model(values: list[int], maxima: list[int]) -> None:
    stats = ExecutionStats()
    for i, v in enumerate(values):
        stats.incr_counter(f"myapp:k{i}", v)
    limits = [Limit(f"myapp:k{i % len(values)}", m) for i, m in enumerate(maxima)]
    expected = next(
        (
            (lim, lim.key, float(values[i % len(values)]))
            for i, lim in enumerate(limits)
            if values[i % len(values)] > lim.max_value
        ),
        None,
    )
    hit = check_limits(stats, limits)
    assert (None if hit is None else (hit.limit, hit.key, hit.value)) == expected


_KEYS = ["a:x", "a:y", "a:y:z", "b", "a:"]


def _reference_hit(
    counters: dict[str, int],
    gauges: dict[str, float],
    reserved: dict[str, float],
    pending: dict[str, float],
    limit: Limit,
) -> tuple[set[tuple[str, float]], set[tuple[str, float]]]:
    """All (key, value) pairs exceeding ``limit``: those of the counter pass and the gauge pass."""
    known = set(counters) | set(gauges) | set(reserved) | set(pending)
    keys = [k for k in known if limit.matches(k)]
    first: set[tuple[str, float]] = set()
    second: set[tuple[str, float]] = set()
    for key in keys:
        extra = reserved.get(key, 0.0) + pending.get(key, 0.0)
        if key in counters:
            value: float | None = counters[key] + extra
        elif extra and key not in gauges:
            value = extra
        else:
            value = None
        if value is not None and value > limit.max_value:
            first.add((key, value))
        if key in gauges and gauges[key] + extra > limit.max_value:
            second.add((key, gauges[key] + extra))
    return first, second


@given(
    st.dictionaries(st.sampled_from(_KEYS), st.integers(0, 20), max_size=4),
    st.dictionaries(st.sampled_from(_KEYS), st.floats(-5, 20), max_size=4),
    st.dictionaries(st.sampled_from(_KEYS), st.floats(0, 5), max_size=3),
    st.dictionaries(st.sampled_from(_KEYS), st.floats(0, 5), max_size=3),
    st.lists(
        st.tuples(
            st.sampled_from(["a:x", "a:y", "a:", "b", "a"]),
            st.integers(0, 20),
            st.sampled_from(list(LimitType)),
        ),
        min_size=1,
        max_size=4,
    ),
)
def test_check_limits_with_reservations_matches_the_rules(
    counters: dict[str, int],
    gauges: dict[str, float],
    reserved: dict[str, float],
    pending: dict[str, float],
    specs: list[tuple[str, int, LimitType]],
) -> None:
    stats = ExecutionStats()
    for key, c in counters.items():
        stats.set_counter(key, c)
    for key, g in gauges.items():
        stats.set_gauge(key, g)
    hold_forever(stats, reserved)
    limits = [Limit(key, top, kind) for key, top, kind in specs]
    hit = check_limits(stats, limits, pending)
    for limit in limits:
        first, second = _reference_hit(counters, gauges, reserved, pending, limit)
        if not first and not second:
            continue  # this limit holds: the hit (if any) is a later one
        # The first limit that is exceeded is reported, with a key the counter pass found if any.
        assert hit is not None and hit.limit is limit
        expected = first or second
        assert any(hit.key == k and hit.value == pytest.approx(v) for k, v in expected)
        return
    assert hit is None


@given(
    st.dictionaries(st.sampled_from(_KEYS), st.integers(0, 20), max_size=4),
    st.dictionaries(st.sampled_from(_KEYS), st.floats(-5, 20), max_size=4),
    st.dictionaries(st.sampled_from(_KEYS), st.floats(0, 5), max_size=3),
    st.dictionaries(st.sampled_from(_KEYS), st.floats(0, 5), max_size=3),
    st.lists(
        st.tuples(
            st.sampled_from(["a:x", "a:y", "a:", "b", "a"]),
            st.integers(0, 20),
            st.sampled_from(list(LimitType)),
        ),
        min_size=1,
        max_size=4,
    ),
    st.booleans(),
)
def test_watched_prefixes_give_the_reference_answer_before_and_after_watching(
    counters: dict[str, int],
    gauges: dict[str, float],
    reserved: dict[str, float],
    pending: dict[str, float],
    specs: list[tuple[str, int, LimitType]],
    prime: bool,
) -> None:
    """A prefix limit's watch list (kept as keys appear) answers like a scan of every key."""
    stats = ExecutionStats()
    for key, count in counters.items():
        stats.set_counter(key, count)
    for key, value in gauges.items():
        stats.set_gauge(key, value)
    hold_forever(stats, reserved)
    limits = [Limit(key, top, kind) for key, top, kind in specs]
    if prime:
        check_limits(stats, limits, pending)  # starts watching the prefixes
    for pend in (pending, {}):
        hit = check_limits(stats, limits, pend)
        for limit in limits:
            first, second = _reference_hit(counters, gauges, reserved, pend, limit)
            if first or second:
                assert hit is not None and hit.limit is limit
                assert any(
                    hit.key == key and abs(hit.value - value) < 1e-9
                    for key, value in (first or second)
                )
                break
        else:
            assert hit is None


class _HeldPlan:
    """Stands for a call's plan: its reservation holds ``keys`` at ``level``, in order."""

    def __init__(self, level: Level, keys: tuple[str, ...]) -> None:
        self.level, self.keys, self.hold = level, keys, None

    def hold_plan(self) -> tuple[object, ...]:
        for key in self.keys:
            self.level.note(key)
        return ((self.level, self.keys),), tuple((key, at) for at, key in enumerate(self.keys))


_HELD: list[Ticket] = []  # the kernel refers to a call weakly: kept here, each holds for good


def hold_forever(stats: ExecutionStats, amounts: dict[str, float]) -> None:
    """Hold ``amounts`` (money in dollars) in ``stats`` as a call in flight would, for good."""
    kernel, level = bound(stats)
    assert level is not None
    held = Ticket()
    held.plan = _HeldPlan(level, tuple(amounts))
    held._reserved = tuple(internal_amount(key, v) for key, v in amounts.items())  # type: ignore[assignment]
    held.kernel_node = Node(f"held-{len(_HELD)}", None, "system", "held", 0)
    assert kernel.admit(held, held.reserved, (Guard(level, ()),), False) is None
    _HELD.append(held)
