"""Ledger semantics: one suite for InMemoryLedger, SqliteLedger and RedisLedger (real Redis)."""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ampmeter.ledgers import (
    InMemoryLedger,
    Ledger,
    Refusal,
    Reservation,
)
from support.ledger_backends import MakeLedger, make_ledger_fixture, reserve  # noqa: F401
from support.redis_server import redis_server_fixture  # noqa: F401


def test_reserve_holds_amounts_until_commit(make_ledger: MakeLedger) -> None:
    ledger = make_ledger()
    held = reserve(ledger, {"amp:cost": 0.25, "tokens": 100}, {"amp:cost": 1.0})
    assert held is not None
    assert dict(held.amounts) == {"amp:cost": 0.25, "tokens": 100.0}
    assert held.expires_at is None
    assert ledger.reserved() == {"amp:cost": 0.25, "tokens": 100.0}
    assert ledger.spent() == {}
    ledger.commit(held, {"amp:cost": 0.5, "tokens": 80, "cached": 3})
    assert ledger.reserved() == {}
    assert ledger.spent() == {"amp:cost": 0.5, "tokens": 80.0, "cached": 3.0}


def test_ceiling_is_strictly_greater_and_rejection_changes_nothing(make_ledger: MakeLedger) -> None:
    ledger = make_ledger()
    first = reserve(ledger, {"amp:cost": 0.5}, {"amp:cost": 1.0})
    assert first is not None
    ledger.commit(first, {"amp:cost": 0.5})
    exact = reserve(ledger, {"amp:cost": 0.5}, {"amp:cost": 1.0})  # 0.5 + 0.5 == 1.0 is allowed
    assert exact is not None
    assert reserve(ledger, {"amp:cost": 0.125}, {"amp:cost": 1.0}) is None
    assert ledger.reserved() == {"amp:cost": 0.5}
    assert ledger.spent() == {"amp:cost": 0.5}
    ledger.release(exact)
    assert reserve(ledger, {"amp:cost": 0.125}, {"amp:cost": 1.0}) is not None


def test_every_ceiling_is_checked_and_one_failure_rejects_all(make_ledger: MakeLedger) -> None:
    ledger = make_ledger()
    held = reserve(ledger, {"amp:cost": 0.5, "tokens": 10}, {"amp:cost": 10.0, "tokens": 10})
    assert held is not None
    assert reserve(ledger, {"amp:cost": 0.5, "tokens": 1}, {"amp:cost": 10.0, "tokens": 10}) is None
    assert ledger.reserved() == {"amp:cost": 0.5, "tokens": 10.0}


def test_ceiling_on_a_key_not_reserved_still_applies(make_ledger: MakeLedger) -> None:
    ledger = make_ledger()
    held = reserve(ledger, {"tokens": 5}, {})
    assert held is not None
    ledger.commit(held, {"amp:cost": 2.0})
    assert reserve(ledger, {"tokens": 1}, {"amp:cost": 1.0}) is None  # spent cost 2.0 > 1.0 already
    assert reserve(ledger, {"tokens": 1}, {"amp:cost": 2.0}) is not None


def test_commit_is_idempotent(make_ledger: MakeLedger) -> None:
    ledger = make_ledger()
    held = reserve(ledger, {"amp:cost": 1.0}, {})
    assert held is not None
    ledger.commit(held, {"amp:cost": 0.75})
    ledger.commit(held, {"amp:cost": 0.75})
    ledger.release(held)
    assert ledger.spent() == {"amp:cost": 0.75}
    assert ledger.reserved() == {}


def test_release_is_idempotent_and_never_goes_negative(make_ledger: MakeLedger) -> None:
    ledger = make_ledger()
    kept = reserve(ledger, {"amp:cost": 1.0}, {})
    gone = reserve(ledger, {"amp:cost": 2.0}, {})
    assert kept is not None and gone is not None
    ledger.release(gone)
    ledger.release(gone)
    assert ledger.reserved() == {"amp:cost": 1.0}
    assert ledger.spent() == {}


def test_commit_after_release_adds_spend_once(make_ledger: MakeLedger) -> None:
    ledger = make_ledger()
    kept = reserve(ledger, {"amp:cost": 1.0}, {})
    held = reserve(ledger, {"amp:cost": 2.0}, {})
    assert kept is not None and held is not None
    ledger.release(held)
    ledger.commit(held, {"amp:cost": 0.5})  # the call was made after all: money was spent
    ledger.commit(held, {"amp:cost": 0.5})
    assert ledger.spent() == {"amp:cost": 0.5}
    assert ledger.reserved() == {"amp:cost": 1.0}


def test_unknown_reservation_adds_spend_without_subtracting(make_ledger: MakeLedger) -> None:
    ledger = make_ledger()
    kept = reserve(ledger, {"amp:cost": 1.0}, {})
    assert kept is not None
    stranger = Reservation("not-a-reservation-of-this-ledger", {"amp:cost": 1.0}, None)
    ledger.commit(stranger, {"amp:cost": 0.25})
    ledger.release(stranger)
    assert ledger.spent() == {"amp:cost": 0.25}
    assert ledger.reserved() == {"amp:cost": 1.0}


def _reap(ledger: Ledger) -> None:
    """Trigger reaping with an operation that changes nothing else."""
    probe = reserve(ledger, {}, {})
    assert probe is not None
    ledger.release(probe)


def test_expired_reservation_returns_to_the_pool(make_ledger: MakeLedger) -> None:
    ledger = make_ledger(lease_s=0.2)
    dropped = reserve(ledger, {"amp:cost": 3.0}, {"amp:cost": 3.0})
    assert dropped is not None and dropped.expires_at is not None
    # Dropped unsettled (a leak): no longer renewed, so its lease runs out like a crashed one's.
    held = Reservation(dropped.id, {"amp:cost": 3.0}, None, dropped.scopes)
    del dropped
    deadline = time.monotonic() + 30
    while ledger.reserved() and time.monotonic() < deadline:
        time.sleep(0.05)
        _reap(ledger)
    assert ledger.reserved() == {}
    ledger.commit(held, {"amp:cost": 2.5})  # late commit: spend counts, nothing subtracted twice
    assert ledger.spent() == {"amp:cost": 2.5}
    assert ledger.reserved() == {}
    assert reserve(ledger, {"amp:cost": 1.0}, {"amp:cost": 3.0}) is None


def test_reservation_is_a_frozen_copy(make_ledger: MakeLedger) -> None:
    ledger = make_ledger()
    amounts = {"amp:cost": 1.0}
    held = reserve(ledger, amounts, {})
    assert held is not None
    amounts["amp:cost"] = 99.0
    assert held.amounts["amp:cost"] == 1.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        held.id = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        held.amounts["amp:cost"] = 5.0  # type: ignore[index]


BAD_VALUES: list[tuple[Any, type[Exception]]] = [
    (math.nan, ValueError),
    (math.inf, ValueError),
    (-math.inf, ValueError),
    (-0.5, ValueError),
    ("1.0", TypeError),
    (True, TypeError),
    (None, TypeError),
]


@pytest.mark.parametrize(("value", "error"), BAD_VALUES)
def test_bad_amounts_raise_and_change_nothing(
    make_ledger: MakeLedger, value: Any, error: type[Exception]
) -> None:
    ledger = make_ledger()
    with pytest.raises(error, match="amounts"):
        reserve(ledger, {"amp:cost": 0.5, "bad": value}, {"amp:cost": 1.0})
    assert ledger.reserved() == {}


@pytest.mark.parametrize(("value", "error"), BAD_VALUES)
def test_bad_actual_raises_and_keeps_the_reservation(
    make_ledger: MakeLedger, value: Any, error: type[Exception]
) -> None:
    ledger = make_ledger()
    held = reserve(ledger, {"amp:cost": 0.5}, {})
    assert held is not None
    with pytest.raises(error, match="actual"):
        ledger.commit(held, {"amp:cost": 0.5, "bad": value})
    assert ledger.spent() == {}
    assert ledger.reserved() == {"amp:cost": 0.5}
    ledger.commit(held, {"amp:cost": 0.5})
    assert ledger.spent() == {"amp:cost": 0.5}


@pytest.mark.parametrize("value", [math.nan, math.inf, "three", None])
def test_bad_ceiling_raises(make_ledger: MakeLedger, value: Any) -> None:
    ledger = make_ledger()
    with pytest.raises((ValueError, TypeError), match="ceilings"):
        reserve(ledger, {"amp:cost": 0.5}, {"amp:cost": value})
    assert ledger.reserved() == {}


def test_negative_ceiling_rejects_everything(make_ledger: MakeLedger) -> None:
    ledger = make_ledger()
    assert reserve(ledger, {}, {"amp:cost": -1.0}) is None


@pytest.mark.parametrize("bad", [[("amp:cost", 1.0)], {1: 1.0}, {"": 1.0}])
def test_non_mapping_or_bad_keys_raise_type_error(make_ledger: MakeLedger, bad: Any) -> None:
    ledger = make_ledger()
    with pytest.raises(TypeError, match="amounts"):
        reserve(ledger, bad, {})


def test_commit_and_release_need_a_reservation(make_ledger: MakeLedger) -> None:
    ledger = make_ledger()
    with pytest.raises(TypeError, match="Reservation"):
        ledger.commit("abc", {"amp:cost": 1.0})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Reservation"):
        ledger.release(None)  # type: ignore[arg-type]
    assert ledger.spent() == {}


def test_context_manager_returns_the_ledger(make_ledger: MakeLedger) -> None:
    ledger = make_ledger()
    with ledger as entered:
        assert entered is ledger
        assert reserve(entered, {"amp:cost": 1.0}, {"amp:cost": 1.0}) is not None


@pytest.mark.parametrize("lease", [0, -1.0, math.nan, math.inf, "1"])
def test_memory_ledger_rejects_bad_lease(lease: Any) -> None:
    with pytest.raises((ValueError, TypeError), match="lease_s"):
        InMemoryLedger(lease_s=lease)


@pytest.mark.parametrize("scope", ["", 3, None])
def test_memory_ledger_rejects_bad_scope(scope: Any) -> None:
    with pytest.raises((ValueError, TypeError), match="scope"):
        InMemoryLedger(scope)


def test_threads_never_overshoot_when_actual_is_at_most_the_estimate(
    make_ledger: MakeLedger,
) -> None:
    ledger = make_ledger()
    ceiling = 50.0
    admitted = [0] * 8

    def worker(index: int) -> None:
        for step in range(60):
            estimate = 0.5 + (step * 7 + index) % 5 * 0.25
            held = reserve(ledger, {"amp:cost": estimate}, {"amp:cost": ceiling})
            if held is None:
                continue
            admitted[index] += 1
            ledger.commit(held, {"amp:cost": estimate * 0.75})

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    spent = ledger.spent()["amp:cost"]
    assert spent <= ceiling
    assert spent > ceiling - 1.5 * 0.75  # the ceiling was really reached
    assert ledger.reserved() == {}
    assert sum(admitted) < 8 * 60


# Amounts are multiples of 1/4, exact in binary and decimal, so both backends agree bit for bit.
_QUARTERS = st.integers(min_value=0, max_value=12).map(lambda n: n / 4)
_OPS = st.lists(
    st.tuples(st.sampled_from(["reserve", "commit", "release"]), _QUARTERS, st.integers(0, 9)),
    max_size=25,
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=_OPS, ceiling=_QUARTERS)
def test_ledger_matches_a_plain_model(
    make_ledger: MakeLedger, ops: list[tuple[str, float, int]], ceiling: float
) -> None:
    ledger = make_ledger()
    live: dict[str, tuple[Reservation, float]] = {}
    known: dict[str, Reservation] = {}
    committed: set[str] = set()
    spent = reserved = 0.0
    order: list[str] = []
    for op, amount, pick in ops:
        if op == "reserve":
            held = reserve(ledger, {"amp:cost": amount}, {"amp:cost": ceiling})
            assert (held is None) == (spent + reserved + amount > ceiling)
            if held is not None:
                live[held.id] = (held, amount)
                known[held.id] = held
                order.append(held.id)
                reserved += amount
        elif order:
            rid = order[pick % len(order)]
            if op == "commit":
                ledger.commit(known[rid], {"amp:cost": amount})
                if rid not in committed:
                    spent += amount
                    committed.add(rid)
            else:
                ledger.release(known[rid])
            if rid in live:
                reserved -= live.pop(rid)[1]
        assert ledger.spent().get("amp:cost", 0.0) == spent
        assert ledger.reserved().get("amp:cost", 0.0) == reserved


# -- hierarchical scopes -----------------------------------------------------------------------


def test_child_reserves_against_its_own_and_every_ancestor_ceiling(make_ledger: MakeLedger) -> None:
    root = make_ledger()
    run = root.child("run-7")
    researcher, writer = run.child("researcher"), run.child("writer")
    assert researcher.scope == f"{root.scope}/run-7/researcher"
    ancestors = {root.scope: {"amp:cost": 10.0}, run.scope: {"amp:cost": 1.0}}
    first = reserve(researcher, {"amp:cost": 0.75}, {"amp:cost": 5.0}, ancestors=ancestors)
    assert first is not None
    assert first.scopes == (researcher.scope, run.scope, root.scope)  # nearest first
    for scope in (researcher.scope, run.scope, root.scope):
        assert root.reserved(scope) == {"amp:cost": 0.75}
    assert writer.reserved() == {}
    # the sibling fits its own ceiling but not the run's, which the researcher holds
    assert reserve(writer, {"amp:cost": 0.5}, {"amp:cost": 5.0}, ancestors=ancestors) is None
    assert writer.reserved() == {} and run.reserved() == {"amp:cost": 0.75}
    researcher.commit(first, {"amp:cost": 0.5, "calls": 1})
    for scope in (researcher.scope, run.scope, root.scope):
        assert root.spent(scope) == {"amp:cost": 0.5, "calls": 1.0}
        assert root.reserved(scope) == {}
    second = reserve(writer, {"amp:cost": 0.5}, {"amp:cost": 5.0}, ancestors=ancestors)
    assert second is not None
    writer.release(second)
    assert run.reserved() == {} and writer.spent() == {}
    assert run.spent() == {"amp:cost": 0.5, "calls": 1.0}


def test_an_ancestor_without_ceilings_counts_but_never_refuses(make_ledger: MakeLedger) -> None:
    parent = make_ledger()
    child = parent.child("worker")
    held = reserve(child, {"amp:cost": 3.0}, {"amp:cost": 3.0}, ancestors={parent.scope: {}})
    assert held is not None
    assert parent.reserved() == {"amp:cost": 3.0}
    child.commit(held, {"amp:cost": 2.0})
    assert parent.spent() == {"amp:cost": 2.0} == child.spent()
    assert reserve(child, {"amp:cost": 1.5}, {"amp:cost": 3.0}) is None  # the child's own ceiling


def test_a_parent_may_settle_its_childs_reservation(make_ledger: MakeLedger) -> None:
    parent = make_ledger()
    child = parent.child("a")
    held = reserve(child, {"amp:cost": 1.0}, {}, ancestors={parent.scope: {"amp:cost": 1.0}})
    assert held is not None
    parent.commit(held, {"amp:cost": 0.25})  # counted at the reservation's scopes, not the parent's
    assert child.spent() == {"amp:cost": 0.25} == parent.spent()
    assert parent.reserved() == {} == child.reserved()


def test_the_refusing_ancestor_is_any_of_them_and_nothing_is_held(make_ledger: MakeLedger) -> None:
    top = make_ledger()
    middle = top.child("m")
    leaf = middle.child("l")
    spend = reserve(leaf, {"tokens": 90}, {}, ancestors={top.scope: {}, middle.scope: {}})
    assert spend is not None
    leaf.commit(spend, {"tokens": 90})
    ancestors = {middle.scope: {"tokens": 1000}, top.scope: {"tokens": 100}}
    assert reserve(leaf, {"tokens": 11}, {"tokens": 1000}, ancestors=ancestors) is None
    assert reserve(leaf, {"tokens": 10}, {"tokens": 1000}, ancestors=ancestors) is not None
    assert top.reserved() == middle.reserved() == leaf.reserved() == {"tokens": 10.0}


@pytest.mark.parametrize(
    ("ancestors", "error", "match"),
    [
        ({"elsewhere": {"amp:cost": 1.0}}, ValueError, "does not enclose"),
        ("scope", TypeError, "ancestors must be a mapping"),
        ({"": {"amp:cost": 1.0}}, ValueError, "scope"),
        (None, None, None),
    ],
)
def test_bad_ancestors_raise_and_change_nothing(
    make_ledger: MakeLedger, ancestors: Any, error: type[Exception] | None, match: str | None
) -> None:
    ledger = make_ledger().child("c")
    if error is None:  # the ledger's own scope is not its ancestor either
        ancestors, error, match = {ledger.scope: {"amp:cost": 1.0}}, ValueError, "does not enclose"
    with pytest.raises(error, match=match):
        reserve(ledger, {"amp:cost": 0.5}, {"amp:cost": 1.0}, ancestors=ancestors)
    parent = ledger.scope.rsplit("/", 1)[0]
    with pytest.raises(ValueError, match=r"ancestors\["):
        reserve(ledger, {"amp:cost": 0.5}, {}, ancestors={parent: {"amp:cost": math.nan}})
    assert ledger.reserved() == {} and ledger.reserved(parent) == {}


@pytest.mark.parametrize(
    ("name", "error"), [("a/b", ValueError), ("", ValueError), ("x\ny", ValueError), (7, TypeError)]
)
def test_bad_child_names_raise(make_ledger: MakeLedger, name: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match="child scope name"):
        make_ledger().child(name)


def test_scopes_outside_the_tree_cannot_be_read_or_settled(make_ledger: MakeLedger) -> None:
    ledger = make_ledger()
    with pytest.raises(ValueError, match="outside the tree"):
        ledger.spent("another-tree/x")
    held = reserve(ledger, {"amp:cost": 1.0}, {})
    assert held is not None
    stranger = dataclasses.replace(held, scopes=("another-tree",))
    with pytest.raises(ValueError, match="outside the tree"):
        ledger.commit(stranger, {"amp:cost": 1.0})
    assert ledger.spent() == {} and ledger.reserved() == {"amp:cost": 1.0}


# -- idempotence by reservation id -------------------------------------------------------------


def test_reserving_one_id_twice_holds_once(make_ledger: MakeLedger) -> None:
    ledger = make_ledger()
    first = reserve(
        ledger, {"amp:cost": 0.5, "tokens": 0}, {"amp:cost": 1.0}, reservation_id="call-1"
    )
    again = reserve(
        ledger, {"amp:cost": 0.5, "tokens": 0}, {"amp:cost": 1.0}, reservation_id="call-1"
    )
    assert first is not None and again is not None
    assert first.id == again.id == "call-1"
    assert dict(again.amounts) == {"amp:cost": 0.5, "tokens": 0.0} and again.scopes == first.scopes
    assert ledger.reserved() == {"amp:cost": 0.5}
    ledger.commit(again, {"amp:cost": 0.5})
    ledger.commit(first, {"amp:cost": 0.5})
    assert ledger.spent() == {"amp:cost": 0.5}
    # a settled id is never held again: a late duplicate does nothing
    assert reserve(ledger, {"amp:cost": 0.25}, {"amp:cost": 1.0}, reservation_id="call-1") is None
    assert ledger.reserved() == {}


def test_release_of_an_id_never_reserved_stops_a_late_reserve(make_ledger: MakeLedger) -> None:
    ledger = make_ledger()
    ledger.release("timed-out")  # the reserve's reply never came; give back whatever it got
    assert reserve(ledger, {"amp:cost": 0.5}, {"amp:cost": 1.0}, reservation_id="timed-out") is None
    assert ledger.reserved() == {} and ledger.spent() == {}
    ledger.release("timed-out")
    assert (
        reserve(ledger, {"amp:cost": 1.0}, {"amp:cost": 1.0}) is not None
    )  # nothing was left held


@pytest.mark.parametrize(
    ("bad", "error"),
    [("", ValueError), ("a\x00b", ValueError), ("x" * 201, ValueError), (5, TypeError)],
)
def test_bad_reservation_ids_raise(
    make_ledger: MakeLedger, bad: Any, error: type[Exception]
) -> None:
    ledger = make_ledger()
    with pytest.raises(error, match="reservation id"):
        reserve(ledger, {"amp:cost": 1.0}, {}, reservation_id=bad)
    with pytest.raises(error, match="reservation id"):
        ledger.release(bad)
    assert ledger.reserved() == {}


# -- leases and their renewal ------------------------------------------------------------------


def test_renew_says_whether_a_reservation_is_live(make_ledger: MakeLedger) -> None:
    ledger = make_ledger(lease_s=30.0)
    held = reserve(ledger, {"amp:cost": 1.0}, {})
    assert held is not None
    assert ledger.renew(held) is True
    assert ledger.renew(held.id) is True
    ledger.commit(held, {"amp:cost": 1.0})
    assert ledger.renew(held) is False
    assert ledger.renew("never-reserved") is False
    with pytest.raises(TypeError, match="Reservation"):
        ledger.renew(None)  # type: ignore[arg-type]


def test_a_held_reservation_outlives_its_lease_while_this_process_holds_it(
    make_ledger: MakeLedger,
) -> None:
    ledger = make_ledger(lease_s=1.0)
    held = reserve(ledger, {"amp:cost": 1.0}, {"amp:cost": 1.0})
    assert held is not None and held.expires_at is not None
    stop = time.monotonic() + 3.0  # three leases; the daemon thread renews every third of one
    while time.monotonic() < stop:
        assert (
            reserve(ledger, {"amp:cost": 0.5}, {"amp:cost": 1.0}) is None
        )  # reaps; the hold stays
        time.sleep(0.2)
    assert ledger.reserved() == {"amp:cost": 1.0}
    ledger.commit(held, {"amp:cost": 1.0})
    assert ledger.spent() == {"amp:cost": 1.0} and ledger.reserved() == {}


# -- sliding windows and claims ------------------------------------------------------------------


def test_a_window_counts_holds_and_recent_commits_only(make_ledger: MakeLedger) -> None:
    ledger = make_ledger()
    window = (("calls", 1.0, 3.0),)
    first = reserve(ledger, {"calls": 1.0}, {}, windows=window)
    assert first is not None
    held = [reserve(ledger, {"calls": 1.0}, {}, windows=window) for _ in range(2)]
    assert None not in held
    assert reserve(ledger, {"calls": 1.0}, {}, windows=window) is None  # 3 held: full
    ledger.commit(first, {"calls": 1.0})
    for reservation in held:
        assert reservation is not None
        ledger.release(reservation)  # returned unused: only the commit stays in the window
    assert ledger.recent("calls", 1.0) == 1.0
    assert ledger.spent() == {"calls": 1.0}
    again = [reserve(ledger, {"calls": 1.0}, {}, windows=window) for _ in range(3)]
    assert again[:2] != [None, None] and again[2] is None
    for reservation in again[:2]:
        assert reservation is not None
        ledger.commit(reservation, {"calls": 1.0})
    deadline = time.monotonic() + 30
    while ledger.recent("calls", 1.0) and time.monotonic() < deadline:
        time.sleep(0.1)  # the window slides past the commits
    assert ledger.recent("calls", 1.0) == 0.0
    assert ledger.spent() == {"calls": 3.0}  # the running total keeps everything
    assert reserve(ledger, {"calls": 1.0}, {}, windows=window) is not None


def test_a_window_key_is_held_even_without_an_amount(make_ledger: MakeLedger) -> None:
    ledger = make_ledger()
    held = reserve(ledger, {}, {}, windows=(("tokens", 60.0, 100.0),))
    assert held is not None and dict(held.amounts) == {"tokens": 0.0}
    ledger.commit(held, {"tokens": 150.0})  # the actual is known only at the end
    assert ledger.recent("tokens", 60.0) == 150.0
    assert reserve(ledger, {}, {}, windows=(("tokens", 60.0, 100.0),)) is None
    assert reserve(ledger, {}, {}, windows=(("tokens", 60.0, 200.0),)) is not None


def test_windows_and_ceilings_refuse_together(make_ledger: MakeLedger) -> None:
    ledger = make_ledger()
    child = ledger.child("run")
    window = (("amp:cost", 60.0, 1.0),)
    held = reserve(
        child, {"amp:cost": 0.6}, {"amp:cost": 5.0}, ancestors={ledger.scope: {}}, windows=window
    )
    assert held is not None
    child.commit(held, {"amp:cost": 0.6})
    assert reserve(child, {"amp:cost": 0.6}, {"amp:cost": 5.0}, windows=window) is None
    assert child.reserved() == {} and ledger.recent("amp:cost", 60.0, child.scope) == Decimal("0.6")
    assert ledger.recent("amp:cost", 60.0) == 0.0  # windows are kept where they were asked for
    assert (
        reserve(child, {"amp:cost": 0.3}, {"amp:cost": 0.8}, windows=window) is None
    )  # the ceiling


@pytest.mark.parametrize(
    ("windows", "error"),
    [
        ({"calls": (1.0, 2.0)}, TypeError),
        ([("calls", 1.0)], TypeError),
        ([("", 1.0, 2.0)], TypeError),
        ([("calls", 0, 2.0)], ValueError),
        ([("calls", 1.0, math.nan)], ValueError),
        ([("calls", "1", 2.0)], TypeError),
    ],
)
def test_bad_windows_raise_and_change_nothing(
    make_ledger: MakeLedger, windows: Any, error: type[Exception]
) -> None:
    ledger = make_ledger()
    with pytest.raises(error):
        reserve(ledger, {"calls": 1.0}, {}, windows=windows)
    assert ledger.reserved() == {}


def test_a_name_is_claimed_once_across_ledgers_of_one_scope(make_ledger: MakeLedger) -> None:
    ledger = make_ledger()
    other = ledger.child("a")
    assert ledger.claim("warn:cost:0.5") is True
    assert ledger.claim("warn:cost:0.5") is False
    assert other.claim("warn:cost:0.5") is True  # another scope claims on its own
    assert ledger.claim("warn:cost:0.8") is True
    with pytest.raises(TypeError):
        ledger.claim("")


# -- try_reserve: a refusal that says which ceiling refused and whether waiting can help --------


def test_a_refusal_by_holds_alone_is_busy(make_ledger: MakeLedger) -> None:
    ledger = make_ledger()
    spent = reserve(ledger, {"amp:cost": 0.25}, {"amp:cost": 1.0})
    assert spent is not None
    ledger.commit(spent, {"amp:cost": 0.25})
    held = reserve(ledger, {"amp:cost": 0.5}, {"amp:cost": 1.0})
    assert held is not None
    refusal = ledger.try_reserve({"amp:cost": 0.5, "tokens": 3}, {"amp:cost": 1.0})
    assert isinstance(refusal, Refusal)
    assert (refusal.scope, refusal.key) == (ledger.scope, "amp:cost")
    assert (refusal.spent, refusal.reserved, refusal.amount, refusal.ceiling) == (
        0.25,
        0.5,
        0.5,
        1.0,
    )
    assert refusal.busy and refusal.value == 1.25
    assert ledger.reserved() == {"amp:cost": 0.5}  # the refusal held nothing
    ledger.release(held)
    taken = ledger.try_reserve({"amp:cost": 0.5}, {"amp:cost": 1.0})
    assert isinstance(taken, Reservation)


def test_a_refusal_by_spend_is_not_busy_and_wins_over_a_busy_one(
    make_ledger: MakeLedger,
) -> None:
    parent = make_ledger()
    child = parent.child("worker")
    first = reserve(child, {"amp:cost": 0.5, "steps": 1}, {}, ancestors={parent.scope: {}})
    assert first is not None
    child.commit(first, {"amp:cost": 0.5, "steps": 1})
    in_flight = reserve(child, {"steps": 1}, {"steps": 3}, ancestors={parent.scope: {}})
    assert in_flight is not None
    # The child's steps ceiling is busy (1 spent + 1 held + 1 > 2), the parent's cost is
    # spent (0.5 + 0.75 > 1.0): the spent one is named, whatever the order of the scopes.
    refusal = child.try_reserve(
        {"amp:cost": 0.75, "steps": 1}, {"steps": 2}, ancestors={parent.scope: {"amp:cost": 1.0}}
    )
    assert isinstance(refusal, Refusal)
    assert (refusal.scope, refusal.key, refusal.busy) == (parent.scope, "amp:cost", False)
    assert (refusal.spent, refusal.amount, refusal.ceiling) == (0.5, 0.75, 1.0)
    busy = child.try_reserve(
        {"amp:cost": 0.25, "steps": 1}, {"steps": 2}, ancestors={parent.scope: {"amp:cost": 1.0}}
    )
    assert isinstance(busy, Refusal)
    assert (busy.scope, busy.key, busy.busy) == (child.scope, "steps", True)
    assert (busy.spent, busy.reserved, busy.amount) == (1.0, 1.0, 1.0)
    assert (
        reserve(child, {"amp:cost": 0.25}, {}, ancestors={parent.scope: {"amp:cost": 1.0}})
        is not None
    )


def test_a_settled_id_is_refused_without_a_ceiling(make_ledger: MakeLedger) -> None:
    ledger = make_ledger()
    ledger.release("gone")
    refusal = ledger.try_reserve({"amp:cost": 0.1}, {"amp:cost": 1.0}, reservation_id="gone")
    assert isinstance(refusal, Refusal)
    assert (refusal.scope, refusal.key, refusal.busy) == (None, None, False)


def test_a_window_refusal_names_its_window(make_ledger: MakeLedger) -> None:
    ledger = make_ledger()
    window = (("calls", 3600.0, 2.0),)
    committed = ledger.try_reserve({"calls": 1.0}, {}, windows=window)
    assert isinstance(committed, Reservation)
    ledger.commit(committed, {"calls": 1.0})
    held = ledger.try_reserve({"calls": 1.0}, {}, windows=window)
    assert isinstance(held, Reservation)
    refusal = ledger.try_reserve({"calls": 1.0}, {"calls": 10.0}, windows=window)
    assert isinstance(refusal, Refusal)
    assert (refusal.scope, refusal.key, refusal.window_s) == (ledger.scope, "calls", 3600.0)
    assert (refusal.spent, refusal.reserved, refusal.amount) == (1.0, 1.0, 1.0)
    assert refusal.busy  # the hold in flight is what is in the way
    ledger.commit(held, {"calls": 1.0})
    over = ledger.try_reserve({"calls": 1.0}, {"calls": 10.0}, windows=window)
    assert isinstance(over, Refusal) and not over.busy and over.spent == 2.0
