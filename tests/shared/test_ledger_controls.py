"""Expired holds charged as unsettled spend, ceilings kept in the ledger, an operator's pause,
and exactly-once settlements by idempotency key: every backend (memory, SQLite, real Redis)."""

from __future__ import annotations

import gc
import sys
import time
from decimal import Decimal

import pytest

from ampmeter.ledgers import Ledger, Refusal, Reservation
from ampmeter.ledgers.sqlite import SqlLedger
from support.ledger_backends import MakeLedger, make_ledger_fixture, reserve  # noqa: F401
from support.redis_server import redis_server_fixture  # noqa: F401

COST = "amp:cost"


def _leak_hold(ledger: Ledger, amount: object, ceiling: object) -> Reservation:
    """A hold nobody in this process keeps alive (as if its worker died), as a bare id."""
    held = reserve(ledger, {COST: amount}, {COST: ceiling})
    assert held is not None
    orphan = Reservation(held.id, {}, None, held.scopes)
    del held
    gc.collect()  # the renewal thread keeps only a weak reference
    return orphan


def _wait_for_expiry(ledger: Ledger) -> None:
    deadline = time.monotonic() + 20
    while ledger.reserved() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ledger.reserved() == {}


# -- an expired hold is charged -------------------------------------------------------------------


def test_an_expired_hold_is_charged_as_unsettled_spend(make_ledger: MakeLedger) -> None:
    ledger = make_ledger(lease_s=0.5)
    orphan = _leak_hold(ledger, 0.3, 1.0)
    _wait_for_expiry(ledger)
    assert ledger.unsettled() == {COST: Decimal("0.3")} == ledger.spent()
    refusal = ledger.try_reserve({COST: 0.75}, {COST: 1.0})
    assert isinstance(refusal, Refusal) and not refusal.busy and refusal.spent == Decimal("0.3")
    assert reserve(ledger, {COST: 0.7}, {COST: 1.0}) is not None  # what is left still fits
    # the worker was only slow: its commit replaces the charge with what it really spent
    assert ledger.commit(orphan, {COST: 0.1}) == {COST: Decimal("0.1")}
    assert ledger.unsettled() == {} and ledger.spent() == {COST: Decimal("0.1")}
    ledger.commit(orphan, {COST: 0.1})  # once only
    assert ledger.spent() == {COST: Decimal("0.1")}
    assert reserve(ledger, {COST: 0.1}, {}, reservation_id=orphan.id) is None  # settled id


def test_an_expired_hold_counts_in_a_sliding_window(make_ledger: MakeLedger) -> None:
    """A dead worker's hold was charged to what is spent but not to the window's recent spend,
    so "$1 a minute" let $0.60 through beside the $0.60 charged. Its late commit replaces the
    charge in the window too; a release takes it out."""
    ledger = make_ledger(lease_s=0.5)
    window = [(COST, 60.0, 1.0)]
    held = reserve(ledger, {COST: 0.6}, {}, windows=window)
    assert held is not None
    orphan = Reservation(held.id, {}, None, held.scopes)
    del held
    gc.collect()
    _wait_for_expiry(ledger)
    assert ledger.recent(COST, 60.0) == Decimal("0.6")
    assert reserve(ledger, {COST: 0.6}, {}, windows=window) is None
    ledger.commit(orphan, {COST: 0.2})  # the worker was only slow
    assert ledger.recent(COST, 60.0) == Decimal("0.2") == ledger.spent()[COST]
    second = _leak_hold(ledger, 0.3, 10.0)
    _wait_for_expiry(ledger)
    assert ledger.recent(COST, 60.0) == Decimal("0.5")
    ledger.release(second)  # it was never sent
    assert ledger.recent(COST, 60.0) == Decimal("0.2")


def test_releasing_a_charged_hold_takes_the_charge_back(make_ledger: MakeLedger) -> None:
    ledger = make_ledger(lease_s=0.5)
    orphan = _leak_hold(ledger, 0.3, 1.0)
    _wait_for_expiry(ledger)
    assert ledger.show().unsettled == {COST: Decimal("0.3")}
    ledger.release(orphan)
    assert ledger.spent() == {} == ledger.unsettled()


def test_on_expired_hold_release_returns_the_hold(make_ledger: MakeLedger) -> None:
    ledger = make_ledger(lease_s=0.5, on_expired_hold="release")
    _leak_hold(ledger, 0.3, 1.0)
    _wait_for_expiry(ledger)
    assert ledger.spent() == {} == ledger.unsettled()
    assert reserve(ledger, {COST: 1.0}, {COST: 1.0}) is not None


def test_on_expired_hold_must_be_charge_or_release(make_ledger: MakeLedger) -> None:
    with pytest.raises(ValueError, match="on_expired_hold"):
        make_ledger(on_expired_hold="forget")
    ledger = make_ledger()
    with pytest.raises(ValueError, match="on_expired_hold"):
        reserve(ledger, {COST: 0.1}, {}, on_expired_hold="forget")  # type: ignore[arg-type]
    assert ledger.reserved() == {}  # nothing held by the refused call


@pytest.mark.parametrize("default", ["charge", "release"])
def test_a_reserve_names_its_own_expired_hold_rule(make_ledger: MakeLedger, default: str) -> None:
    """Each hold keeps the rule it was reserved with, whatever the ledger's default."""
    ledger = make_ledger(lease_s=0.5, on_expired_hold=default)
    assert ledger.on_expired_hold == default
    charged = reserve(ledger, {COST: 0.25}, {COST: 1.0}, on_expired_hold="charge")
    released = reserve(ledger, {COST: 0.5}, {COST: 1.0}, on_expired_hold="release")
    assert charged is not None and released is not None
    charged_id = charged.id
    del charged, released
    gc.collect()
    _wait_for_expiry(ledger)
    assert ledger.unsettled() == {COST: Decimal("0.25")} == ledger.spent()
    holds = ledger.unsettled_holds()
    assert [(h.id, dict(h.amounts), h.scopes) for h in holds] == [
        (charged_id, {COST: Decimal("0.25")}, (ledger.scope,))
    ]


def test_each_unsettled_hold_is_claimed_once(make_ledger: MakeLedger) -> None:
    root = make_ledger(lease_s=0.5)
    child = root.child("worker")
    held = reserve(child, {COST: 0.25}, {}, ancestors={root.scope: {COST: 1.0}})
    assert held is not None
    del held
    gc.collect()
    _wait_for_expiry(child)
    (hold,) = root.unsettled_holds()  # a hold below the scope counts there too
    assert child.unsettled_holds() == [hold]
    assert root.unsettled_holds(child.scope + "-other") == []
    assert child.claim_unsettled(hold) is True
    assert root.claim_unsettled(hold.id) is False  # already reported, by any reader
    live = reserve(root, {COST: 0.1}, {})
    assert live is not None
    assert root.claim_unsettled(live.id) is False  # a hold this process renews is its own


def test_a_charge_counts_at_every_scope_of_the_hold(make_ledger: MakeLedger) -> None:
    root = make_ledger(lease_s=0.5)
    child = root.child("worker")
    held = reserve(child, {COST: 0.25}, {}, ancestors={root.scope: {COST: 1.0}})
    assert held is not None
    del held
    gc.collect()
    _wait_for_expiry(child)
    assert root.unsettled() == {COST: Decimal("0.25")} == child.unsettled()
    assert root.spent() == {COST: Decimal("0.25")}


# -- ceilings kept in the ledger ------------------------------------------------------------------


def test_kept_ceilings_bind_every_reserve_below_them(make_ledger: MakeLedger) -> None:
    root = make_ledger()
    run = root.child("run")
    child = run.child("researcher")
    assert root.set_ceilings(run.scope, {COST: 0.10}) == {COST: Decimal("0.1")}
    assert child.set_ceilings(child.scope, {COST: 1.0, "amp:llm_calls": 5}) == {
        COST: Decimal("1"),
        "amp:llm_calls": 5,
    }
    # the child names no ancestor and passes a generous ceiling: the ledger's still hold
    first = child.try_reserve({COST: 0.06}, {COST: 5.0})
    assert isinstance(first, Reservation) and first.scopes == (child.scope, run.scope)
    child.commit(first, {COST: 0.06})
    refusal = child.try_reserve({COST: 0.06}, {COST: 5.0})
    assert isinstance(refusal, Refusal)
    assert (refusal.scope, refusal.key, refusal.ceiling) == (run.scope, COST, Decimal("0.1"))
    assert run.spent() == {COST: Decimal("0.06")}  # counted where the ceiling is kept
    assert child.ceilings() == {COST: Decimal("1"), "amp:llm_calls": 5}
    assert root.ceilings(run.scope) == {COST: Decimal("0.1")}


def test_set_ceilings_only_tightens_and_set_ceiling_raises(make_ledger: MakeLedger) -> None:
    root = make_ledger()
    child = root.child("child")
    root.set_ceilings(child.scope, {COST: 0.10})
    # a child handed these cannot raise them
    assert child.set_ceilings(child.scope, {COST: 100}) == {COST: Decimal("0.1")}
    assert reserve(child, {COST: 0.2}, {}) is None
    root.set_ceiling(child.scope, COST, "0.50")  # the operator's raise
    assert child.ceilings() == {COST: Decimal("0.5")}
    assert reserve(child, {COST: 0.2}, {}) is not None


def test_kept_ceilings_need_scopes_of_the_tree(make_ledger: MakeLedger) -> None:
    ledger = make_ledger()
    with pytest.raises(ValueError, match="outside the tree"):
        ledger.set_ceilings("elsewhere/x", {COST: 1})
    with pytest.raises(ValueError, match="ceilings"):
        ledger.set_ceilings(ledger.scope, {COST: "lots"})
    assert ledger.ceilings() == {}


def test_only_an_operators_raise_moves_the_raise_mark(make_ledger: MakeLedger) -> None:
    root = make_ledger()
    run = root.child("run")
    assert run.raise_mark(COST) is None
    root.set_ceilings(run.scope, {COST: 5})  # a hand-off's ceiling is no raise
    assert run.raise_mark(COST) is None
    root.set_ceiling(run.scope, COST, 5)
    first = run.raise_mark(COST)
    assert first is not None and root.raise_mark(COST, run.scope) == first
    root.set_ceiling(run.scope, COST, 5)  # the same value again is a new raise
    second = run.raise_mark(COST)
    assert second not in (None, first)
    root.set_ceiling(run.scope, "amp:llm_calls", 3)  # another key's raise leaves it alone
    assert run.raise_mark(COST) == second and root.raise_mark(COST) is None


def test_paused_calls_are_noted_listed_and_lapse(make_ledger: MakeLedger) -> None:
    from ampmeter.ledgers import PausedCall

    ledger = make_ledger()
    now = time.time()
    dead = ledger.note_paused("n000009-c", COST, 1, "crashed", now - 90, -60)
    live = ledger.note_paused("n000002-a", COST, "0.1", "nightly", now - 3, 30)
    steps = ledger.note_paused("n000003-b", "amp:steps", 20, "nightly", now - 1, 30)
    assert isinstance(live, PausedCall) and live.cap == Decimal("0.1") and live.until > now + 29
    assert dead.until < now
    assert sorted(ledger.paused_calls(), key=lambda c: c.id) == [live, steps]
    assert ledger.show().paused_calls == ledger.paused_calls()
    assert ledger.child("below").paused_calls() == ()
    ledger.forget_paused(live.id)
    ledger.forget_paused("never-noted")
    assert ledger.paused_calls() == (steps,)


def test_a_scope_exists_once_anything_is_kept_there_or_below(make_ledger: MakeLedger) -> None:
    root = make_ledger()
    run = root.child("run")
    worker = run.child("worker")
    assert not root.exists() and not run.exists()
    held = reserve(worker, {COST: 0.01}, {})
    assert held is not None
    assert root.exists() and run.exists() and worker.exists()
    assert not root.child("ru").exists() and not worker.child("x").exists()
    root.pause(root.scope + "/paused-only")
    assert root.exists(root.scope + "/paused-only")


# -- the operator's pause -------------------------------------------------------------------------


def test_a_paused_scope_admits_nothing_below_it_until_resumed(make_ledger: MakeLedger) -> None:
    root = make_ledger()
    child = root.child("run").child("worker")
    held = reserve(child, {COST: 0.1}, {COST: 1})
    assert held is not None
    root.pause(root.scope + "/run")
    refusal = child.try_reserve({COST: 0.1}, {COST: 1})
    assert isinstance(refusal, Refusal) and refusal.paused and not refusal.busy
    assert refusal.scope == root.scope + "/run"
    assert reserve(child, {}, {}) is None  # fails closed, whatever is asked
    child.commit(held, {COST: 0.1})  # a call already running still settles
    view = child.show()
    assert view.paused and view.paused_by == root.scope + "/run"
    assert view.spent == {COST: Decimal("0.1")} and view.reserved == {}
    assert root.show().paused is False  # above the pause, work goes on
    assert reserve(root, {COST: 0.1}, {}) is not None
    root.resume(root.scope + "/run")
    assert reserve(child, {COST: 0.1}, {COST: 1}) is not None
    assert child.show().paused_by is None


# -- exactly once by idempotency key --------------------------------------------------------------


def test_a_replayed_settlement_counts_once(make_ledger: MakeLedger) -> None:
    ledger = make_ledger()
    first = reserve(ledger, {COST: 0.5}, {COST: 1})
    assert first is not None
    counted = ledger.commit(first, {COST: 0.2, "amp:llm_calls": 1}, idempotency_key="step-3")
    assert counted == {COST: Decimal("0.2"), "amp:llm_calls": 1} and not counted.duplicate
    # the step is re-executed after a crash: a new reservation, the same key
    again = reserve(ledger, {COST: 0.5}, {COST: 1})
    assert again is not None
    replayed = ledger.commit(again, {COST: 0.3, "amp:llm_calls": 1}, idempotency_key="step-3")
    assert replayed == {COST: Decimal("0.2"), "amp:llm_calls": 1}  # the first settlement's
    assert replayed.duplicate  # so the caller's own stats can leave it out too
    assert ledger.spent() == {COST: Decimal("0.2"), "amp:llm_calls": 1}
    assert ledger.reserved() == {}  # the replay's hold ended
    other = ledger.child("other")  # keys are per scope
    held = reserve(other, {}, {})
    assert held is not None
    assert not other.commit(held, {COST: 0.3}, idempotency_key="step-3").duplicate
    assert other.spent() == {COST: Decimal("0.3")}


def test_idempotency_keys_are_forgotten_after_the_settled_horizon(
    make_ledger: MakeLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = make_ledger()
    # the module that keeps commits: the in-memory ledger is the SQLite ledger's code
    backend = SqlLedger.__module__ if isinstance(ledger, SqlLedger) else type(ledger).__module__
    monkeypatch.setattr(sys.modules[backend], "SETTLED_KEEP_S", 0.3)
    for _ in range(2):
        held = reserve(ledger, {}, {})
        assert held is not None
        ledger.commit(held, {COST: 0.1}, idempotency_key="step-1")
        time.sleep(0.5)
    assert ledger.spent() == {COST: Decimal("0.2")}  # kept for a bounded time only


def test_a_bad_idempotency_key_raises_and_keeps_the_hold(make_ledger: MakeLedger) -> None:
    ledger = make_ledger()
    held = reserve(ledger, {COST: 0.1}, {})
    assert held is not None
    with pytest.raises(TypeError, match="idempotency_key"):
        ledger.commit(held, {COST: 0.1}, idempotency_key="")
    assert ledger.reserved() == {COST: Decimal("0.1")} and ledger.spent() == {}


def test_a_context_under_a_paused_scope_is_stopped_before_its_call(make_ledger: MakeLedger) -> None:
    from ampmeter import ExecutionContext, LimitExceeded

    ledger = make_ledger()
    ctx = ExecutionContext("agent", max_cost_usd=1.0, ledger=ledger.child("agent"))
    ledger.pause()
    ran = []
    with (
        pytest.raises(LimitExceeded, match="paused") as caught,
        ctx.llm_call("call", estimate_usd=0.1),
    ):
        ran.append(True)
    assert ran == [] and caught.value.node_id is not None
    assert ctx.graph.node(caught.value.node_id).status == "halt"
    ledger.resume()
    with ctx.llm_call("call", model="m", estimate_usd=0.1) as call:
        call.record(1, 1, cost_usd=0.1)
    ctx.close()
    assert ledger.spent(ledger.scope + "/agent")[COST] == Decimal("0.1")
