"""Exact money in every ledger: dollars at the API, integer nano-dollars in the backends."""

from __future__ import annotations

import sqlite3
import uuid
from decimal import Decimal
from pathlib import Path

import orjson
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ampmeter.ledgers import LedgerUnavailable, RedisLedger, Refusal, SqliteLedger
from support.ledger_backends import MakeLedger, make_ledger_fixture, reserve  # noqa: F401
from support.redis_server import RedisServer, redis_server_fixture  # noqa: F401

COST = "amp:cost"


def calls_admitted(make_ledger: MakeLedger, cap: object, price: object) -> int:
    """How many calls of ``price`` a fresh ledger with ceiling ``cap`` admits, each committed
    at its price."""
    ledger = make_ledger()
    admitted = 0
    while (held := reserve(ledger, {COST: price}, {COST: cap})) is not None:
        ledger.commit(held, {COST: price})
        admitted += 1
        assert admitted <= 10_000
    return admitted


@pytest.mark.parametrize(
    ("cap", "price", "calls"),
    [(1.00, 0.05, 20), (1.0, 0.01, 100), (1.0, 0.07, 14), ("0.30", 0.1, 3)],
)
def test_a_cap_admits_exactly_what_fits(
    make_ledger: MakeLedger, cap: object, price: object, calls: int
) -> None:
    assert calls_admitted(make_ledger, cap, price) == calls


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    cap_cents=st.integers(min_value=1, max_value=300),
    price_mills=st.integers(min_value=10, max_value=400),
)
def test_a_cap_admits_floor_of_cap_over_price(
    make_ledger: MakeLedger, cap_cents: int, price_mills: int
) -> None:
    cap = Decimal(cap_cents) / 100
    price = Decimal(price_mills) / 1000
    # floats as a user writes them: read as written, so the count is the exact quotient
    assert calls_admitted(make_ledger, float(cap), float(price)) == int(cap // price)


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(costs=st.lists(st.decimals(min_value=0, max_value=5, places=9), min_size=1, max_size=12))
def test_spend_is_the_exact_decimal_sum(make_ledger: MakeLedger, costs: list[Decimal]) -> None:
    ledger = make_ledger()
    for cost in costs:
        held = reserve(ledger, {COST: cost}, {})
        assert held is not None
        ledger.commit(held, {COST: cost})
    total = sum(costs, Decimal(0))
    assert ledger.spent().get(COST, Decimal(0)) == total


def test_money_comes_back_as_decimal_and_counts_as_int(make_ledger: MakeLedger) -> None:
    ledger = make_ledger()
    held = reserve(ledger, {COST: 0.3, "amp:input_tokens": 120.0}, {COST: "1.00"})
    assert held is not None
    assert dict(held.amounts) == {COST: Decimal("0.3"), "amp:input_tokens": 120}
    assert type(held.amounts[COST]) is Decimal and type(held.amounts["amp:input_tokens"]) is int
    reserved = ledger.reserved()
    assert reserved == {COST: Decimal("0.3"), "amp:input_tokens": 120}
    assert type(reserved["amp:input_tokens"]) is int
    assert ledger.commit(held, {COST: Decimal("0.1"), "amp:input_tokens": 100}) == {
        COST: Decimal("0.1"),
        "amp:input_tokens": 100,
    }
    assert ledger.spent() == {COST: Decimal("0.1"), "amp:input_tokens": 100}
    assert str(ledger.spent()[COST]) == "0.1"


def test_a_refusal_speaks_exact_dollars(make_ledger: MakeLedger) -> None:
    ledger = make_ledger()
    for _ in range(20):
        held = reserve(ledger, {COST: 0.05}, {COST: 1.0})
        assert held is not None
        ledger.commit(held, {COST: 0.05})
    refusal = ledger.try_reserve({COST: 0.05}, {COST: 1.0})
    assert isinstance(refusal, Refusal)
    assert (refusal.spent, refusal.amount, refusal.ceiling) == (
        Decimal("1"),
        Decimal("0.05"),
        Decimal("1"),
    )
    assert refusal.value == Decimal("1.05") and not refusal.busy


def test_counts_must_be_whole_and_count_ceilings_round_down(make_ledger: MakeLedger) -> None:
    ledger = make_ledger()
    with pytest.raises(ValueError, match="whole"):
        reserve(ledger, {"amp:input_tokens": 2.5}, {})
    assert ledger.reserved() == {}
    assert reserve(ledger, {"amp:input_tokens": 3}, {"amp:input_tokens": 2.9}) is None
    assert reserve(ledger, {"amp:input_tokens": 2}, {"amp:input_tokens": 2.9}) is not None


def test_redis_keeps_integer_nano_dollars(redis_server: RedisServer) -> None:
    scope = f"money-{uuid.uuid4().hex}"
    with RedisLedger(redis_server.url, scope) as ledger:
        held = reserve(ledger, {COST: 0.05}, {COST: 1})
        assert held is not None
        ledger.commit(held, {COST: 0.05})
    raw = redis.Redis.from_url(redis_server.url, decode_responses=True)
    assert raw.hget(f"ampmeter:{{{scope}}}:spent", COST) == "50000000"
    raw.close()


def test_sqlite_keeps_integer_nano_dollars(tmp_path: Path) -> None:
    with SqliteLedger(tmp_path / "l.db", "money") as ledger:
        held = reserve(ledger, {COST: 0.05}, {COST: 1})
        assert held is not None
        ledger.commit(held, {COST: 0.05})
    db = sqlite3.connect(tmp_path / "l.db")
    row = db.execute("SELECT value, typeof(value) FROM ampmeter_spent").fetchone()
    db.close()
    assert row == (50_000_000, "integer")


def test_a_sqlite_file_of_the_float_era_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE ampmeter_spent (scope TEXT, key TEXT, value REAL)")
    db.execute("INSERT INTO ampmeter_spent VALUES ('s', 'amp:cost', 0.25)")
    db.commit()
    db.close()
    with pytest.raises(LedgerUnavailable, match="another ampmeter version"):
        SqliteLedger(path, "s")
    db = sqlite3.connect(path)
    tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert tables == {"ampmeter_spent"}
    assert db.execute("SELECT value FROM ampmeter_spent").fetchone() == (0.25,)
    db.close()


def test_a_journal_entry_of_the_float_era_is_kept_aside_unapplied(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """It carries no seal, so nothing tells it from a planted file (tests/shared/
    test_journal_entries.py): it is kept for a person to look at, not replayed."""
    journal = tmp_path / "journal"
    journal.mkdir()
    entry = {
        "op": "commit",
        "id": "old-1",
        "scopes": ["s"],
        "actual": {COST: 0.1, "amp:input_tokens": 12.0},
    }
    (journal / "commit-old.settlement.json").write_bytes(orjson.dumps(entry))
    with (
        caplog.at_level("ERROR", logger="ampmeter.ledgers"),
        SqliteLedger(tmp_path / "l.db", "s", journal=journal) as ledger,
    ):
        assert ledger.spent() == {}
    assert [p.name for p in journal.iterdir()] == ["commit-old.settlement.json.corrupt"]
    assert "has no seal" in caplog.text


def test_a_ceiling_past_what_can_be_counted_never_refuses(make_ledger: MakeLedger) -> None:
    ledger = make_ledger()
    held = reserve(ledger, {COST: 5, "amp:llm_calls": 1}, {COST: 1e12, "amp:llm_calls": 1e30})
    assert held is not None
    with pytest.raises(ValueError, match="too large"):
        reserve(ledger, {COST: 1e12}, {})  # an amount that large is a mistake
