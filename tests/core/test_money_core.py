"""Exact money in the core: caps, sums, hand-offs and stop messages count in exact decimals."""

from __future__ import annotations

import math
import threading
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ampmeter import ExecutionContext, LimitExceeded, money
from ampmeter.keys import KEY_COST
from ampmeter.ledgers import SqliteLedger
from ampmeter.propagation import decode


def _spend_until_refused(ctx: ExecutionContext, price: float | Decimal) -> tuple[int, str]:
    """Calls estimated and billed at ``price`` until one is refused; how many ran, and why the
    last one stopped."""
    made = 0
    while True:
        try:
            with ctx.llm_call("work", estimate_usd=price) as call:
                call.record(10, 5, cost_usd=price)
        except LimitExceeded as stop:
            return made, str(stop)
        made += 1


@pytest.mark.parametrize(("price", "admitted"), [(0.05, 20), (0.01, 100), (0.07, 14)])
def test_a_dollar_cap_admits_exactly_the_calls_it_pays_for(price: float, admitted: int) -> None:
    with ExecutionContext("cap", max_cost_usd=1.00) as ctx:
        made, stop = _spend_until_refused(ctx, price)
    assert made == admitted
    assert ctx.stats.total_cost() == Decimal(repr(price)) * admitted
    assert ctx.graph.aggregates()["total_cost_usd"] == Decimal(repr(price)) * admitted
    assert "> $1.00" in stop and "1 > 1" not in stop


@pytest.mark.parametrize(("price", "admitted"), [(0.05, 20), (0.01, 100), (0.07, 14)])
def test_a_dollar_cap_through_a_sqlite_ledger_admits_exactly_as_many(
    tmp_path: Path, price: float, admitted: int
) -> None:
    with SqliteLedger(tmp_path / "budget.sqlite3", "team") as ledger:
        with ExecutionContext("cap", max_cost_usd=1.00, ledger=ledger) as ctx:
            made, stop = _spend_until_refused(ctx, price)
        assert made == admitted
        assert ledger.spent()[KEY_COST] == Decimal(repr(price)) * admitted
        assert ledger.reserved() == {}
    assert "1 > 1" not in stop


def test_a_float_cap_is_read_as_written() -> None:
    ctx = ExecutionContext("cap", max_cost_usd=0.3)
    (limit,) = [lim for lim in ctx.limits if lim.key == KEY_COST]
    assert limit.max_value == Decimal("0.3")
    ctx.close()


def test_a_second_handoff_child_gets_exactly_what_the_first_left(tmp_path: Path) -> None:
    # 0.30 + 14 x 0.05 is 1.0000000000000002 in binary floats: the second child made 13 calls.
    ledger = SqliteLedger(tmp_path / "budget.sqlite3", "team", handoff_key="money-test-key")
    parent = ExecutionContext("parent", max_cost_usd=1.00, ledger=ledger)
    first_token = parent.handoff("first", max_cost_usd=0.30)
    with ExecutionContext.from_handoff(first_token, ledger=ledger) as first:
        assert _spend_until_refused(first, 0.05)[0] == 6
    with ExecutionContext.from_handoff(parent.handoff("second"), ledger=ledger) as second:
        made, stop = _spend_until_refused(second, 0.05)
    assert made == 14
    assert "$1.00" in stop and "1 > 1" not in stop
    parent.close()
    assert parent.stats.total_cost() == Decimal("1.00")
    assert parent.graph.aggregates()["total_cost_usd"] == Decimal("1.00")
    ledger.close()


def test_a_handoff_token_carries_a_money_limit_exactly(tmp_path: Path) -> None:
    ledger = SqliteLedger(tmp_path / "budget.sqlite3", "team", handoff_key="money-test-key")
    with ExecutionContext("parent", max_cost_usd=0.7, ledger=ledger) as parent:
        handoff = decode(parent.handoff("child", max_cost_usd=0.1), ledger=ledger)
    (limit,) = handoff.limits
    assert limit.max_value == Decimal("0.1")
    ((_, above),) = handoff.ancestors
    assert [lim.max_value for lim in above] == [Decimal("0.7")]
    ledger.close()


def test_threads_reserving_twice_the_cost_use_up_a_dollar_and_read_as_money() -> None:
    # 64 threads reserve $0.02 for calls that cost $0.01: in binary floats the last of them
    # were refused at $0.98 spent, as "amp:cost = 1 > 1".
    ctx = ExecutionContext("cap", max_cost_usd=1.00, admission_timeout_s=60)
    stops: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(64)

    def worker() -> None:
        start.wait()
        while True:
            try:
                with ctx.llm_call("work", estimate_usd=0.02) as call:
                    call.record(1, 1, cost_usd=0.01)
            except LimitExceeded as stop:
                with lock:
                    stops.append(str(stop))
                return

    threads = [threading.Thread(target=worker) for _ in range(64)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ctx.close()
    assert len(stops) == 64
    assert not [stop for stop in stops if "1 > 1" in stop]
    assert all("$1.00" in stop for stop in stops), stops[:3]
    # What is spent refuses only once it leaves less than one estimate: $0.99 or $1.00.
    assert Decimal("0.98") < ctx.stats.total_cost() <= Decimal("1.00")
    assert ctx.stats.reserved() == {}


_cents = st.integers(min_value=0, max_value=10**12).map(lambda n: Decimal(n).scaleb(-9))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_cents, max_size=30))
def test_recorded_costs_sum_exactly(costs: list[Decimal]) -> None:
    with ExecutionContext("sum") as ctx:
        for cost in costs:
            with ctx.llm_call("work", estimate_usd=0) as call:
                call.record(1, 1, cost_usd=cost)
    assert ctx.stats.total_cost() == sum(costs, Decimal(0))
    assert ctx.stats.get_gauge(KEY_COST) == sum(costs, Decimal(0))
    assert ctx.graph.aggregates()["total_cost_usd"] == sum(costs, Decimal(0))
    assert [n.cost_usd for n in ctx.graph.nodes() if n.kind == "llm"] == costs


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cap=st.integers(min_value=1, max_value=5_000).map(lambda n: Decimal(n).scaleb(-2)),
    price=st.integers(min_value=1, max_value=10**8).map(lambda n: Decimal(n).scaleb(-9)),
)
def test_a_cap_admits_exactly_floor_of_cap_over_price(cap: Decimal, price: Decimal) -> None:
    expected = int(cap // price)
    if expected > 400:  # keep each example quick: scale the price up instead
        price = (cap / 400).quantize(Decimal("1e-9"))
        expected = int(cap // price)
    with ExecutionContext("cap", max_cost_usd=cap) as ctx:
        made, _ = _spend_until_refused(ctx, price)
    assert made == expected
    assert ctx.stats.total_cost() == price * expected


# Decimals a user or a price table may give: up to 20 significant digits, from 1e-30 dollars
# up to 1e9 (what whole nano-dollars in an int64 hold).
_AMOUNTS = st.builds(
    lambda digits, exponent: Decimal(f"{digits}E{exponent}"),
    st.integers(min_value=-(10**20) + 1, max_value=10**20 - 1),
    st.integers(min_value=-50, max_value=-11),
)


@given(_AMOUNTS)
def test_whole_nano_rounds_the_exact_amount_half_to_even_or_up(amount: Decimal) -> None:
    exact = Fraction(amount) * 10**9  # the amount in nano-dollars, as an exact fraction
    assert money.whole_nano(amount) == round(exact)  # Fraction rounds half to even
    assert money.whole_nano(amount, round_up=True) == math.ceil(exact)


@pytest.mark.parametrize(
    ("amount", "nearest", "up"),
    [
        ("0.0000000015", 2, 2),
        ("0.0000000025", 2, 3),
        ("0.0000000001", 0, 1),
        ("-0.0000000015", -2, -1),
    ],
)
def test_whole_nano_at_ties_and_below_one_nano_dollar(amount: str, nearest: int, up: int) -> None:
    assert money.whole_nano(Decimal(amount)) == nearest
    assert money.whole_nano(Decimal(amount), round_up=True) == up


@given(st.integers(min_value=-(2**63) + 1, max_value=2**63 - 1))
def test_from_nano_is_exact_written_shortest_and_comes_back(nano: int) -> None:
    dollars = money.from_nano(nano)
    assert Fraction(dollars) == Fraction(nano, 10**9)
    if nano % 10**9:
        assert dollars == dollars.normalize() and dollars.as_tuple().digits[-1] != 0
    else:
        assert dollars.as_tuple().exponent == 0  # whole dollars as an integer, not 1E+2
    assert money.whole_nano(dollars) == nano


# Floats as people write them (whole nano-dollars, the quick reading), floats with more decimals
# than a nano-dollar, and any float an int64 of nano-dollars holds, around the $1,099 edge too.
_FLOATS = st.one_of(
    st.builds(lambda nano: nano / 10**9, st.integers(min_value=-(2**41), max_value=2**41)),
    st.builds(
        lambda digits, exponent: float(f"{digits}E{exponent}"),
        st.integers(min_value=-(10**17) + 1, max_value=10**17 - 1),
        st.integers(min_value=-30, max_value=-8),
    ),
    st.floats(allow_nan=False, allow_infinity=False, min_value=-9e9, max_value=9e9),
)


@settings(max_examples=2_000)
@given(_FLOATS)
def test_a_float_converts_as_written_to_nano_dollars(value: float) -> None:
    exact = Fraction(Decimal(repr(value))) * 10**9  # the float as written, in nano-dollars
    assert money.to_nano(value, allow_negative=True) == round(exact)
    assert money.to_nano(value, allow_negative=True, round_up=True) == math.ceil(exact)


@pytest.mark.parametrize(
    ("value", "nano", "up"),
    [
        (0.002, 2_000_000, 2_000_000),
        (0.1 + 0.2, 300_000_000, 300_000_001),  # 0.30000000000000004 as written
        (1099.5116277759999, 1_099_511_627_776, 1_099_511_627_776),
        (1e-10, 0, 1),
        (2.5e-09, 2, 3),  # a tie: half to even
        (-0.0, 0, 0),
        (123456789.123456789, 123_456_789_123_456_790, 123_456_789_123_456_790),
    ],
)
def test_a_float_converts_at_the_edges_of_the_quick_reading(
    value: float, nano: int, up: int
) -> None:
    assert money.to_nano(value) == nano
    assert money.to_nano(value, round_up=True) == up


@pytest.mark.parametrize("value", [-0.5, -1e-9, float("nan"), float("inf"), -float("inf")])
def test_a_float_that_is_no_amount_is_refused_by_name(value: float) -> None:
    with pytest.raises(ValueError, match="estimate_usd must be"):
        money.to_nano(value, "estimate_usd")


def test_whole_nano_refuses_what_an_int64_cannot_count() -> None:
    assert money.whole_nano(Decimal("9223372036.854775807")) == 2**63 - 1
    with pytest.raises(ValueError, match="price is too large to count"):
        money.whole_nano(Decimal("9223372036.854775808"), "price")


@given(
    st.one_of(
        st.integers(min_value=-money.MAX_NANO, max_value=money.MAX_NANO),
        st.sampled_from([0, 1, 5, 999_999_999, 1_250_000, 2**53 + 1, money.MAX_NANO]),
    )
)
def test_float_usd_is_the_decimal_amount_rounded_once(nano: int) -> None:
    # What the JSONL lines and Node.to_dict() write: the same float the exact Decimal gives.
    assert money.float_usd(nano) == float(money.from_nano(nano))


def test_a_callers_amount_is_read_once_and_a_string_or_an_endless_exponent_is_refused_by_name() -> (
    None
):
    with pytest.raises(TypeError, match="cost_usd must be a number of dollars, got str"):
        money.to_nano("0.1", "cost_usd")  # (text is parsed by its reader, with money.usd)
    with pytest.raises(ValueError, match="cost_usd must be a finite amount of dollars"):
        money.to_nano(Decimal("9E+999999"), "cost_usd")
    ctx = ExecutionContext()
    with ctx.llm_call("a", model="gpt-4o-mini") as call:
        with pytest.raises(TypeError, match="cost_usd must be a number of dollars"):
            call.record(1, 1, cost_usd="0.1")  # type: ignore[arg-type]
        call.record(1, 1, cost_usd=0.25)
    assert call.cost_usd == Decimal("0.25")
