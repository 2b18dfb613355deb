"""Journal entries are checked before they are replayed: a planted or damaged file in the journal
directory is set aside and reported, never applied to a budget. Real SQLite ledgers, real files.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import sqlite3
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pytest

from ampmeter.ledgers import LedgerUnavailable, SqliteLedger
from support.ledger_backends import reserve

COST = "amp:cost"


def _scope() -> str:
    return f"test-{uuid.uuid4().hex}"


def _spend_all(path: Path, scope: str, journal: Path, **options: Any) -> None:
    """Spend the whole $1.00 of ``scope``."""
    with SqliteLedger(path, scope, journal=journal, **options) as ledger:
        held = reserve(ledger, {COST: 1.0}, {COST: 1.0})
        assert held is not None
        ledger.commit(held, {COST: 1.0})
    journal.mkdir(exist_ok=True)  # where an attacker puts the file (no entry was ever needed)


def _sealed(entry: dict[str, Any], key: bytes | None = None) -> bytes:
    """An entry file with a seal that matches it, as someone who read the format would write it."""
    body = {"unit": "nano", "idempotency_key": None, **entry}
    canonical = orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
    if key is None:
        seal = "sha256:" + hashlib.sha256(canonical).hexdigest()
    else:
        seal = "hmac-sha256:" + hmac.new(key, canonical, hashlib.sha256).hexdigest()
    return orjson.dumps({"entry": body, "seal": seal})


def _commit(scopes: list[str], actual: dict[str, Any], rid: str = "planted-1") -> dict[str, Any]:
    return {"op": "commit", "id": rid, "scopes": scopes, "actual": actual}


def _journaled_commit(path: Path, scope: str, journal: Path, **options: Any) -> Path:
    """Commit $0.25 while another connection holds the file's write lock: the commit goes to
    the journal. Returns the entry's file."""
    ledger = SqliteLedger(path, scope, timeout_s=0.05, journal=journal, **options)
    held = reserve(ledger, {COST: 0.5}, {})
    assert held is not None
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(LedgerUnavailable, match="kept in"):
            ledger.commit(held, {COST: 0.25})
        ledger.close()  # still locked: the entry stays for the next ledger to replay
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    (entry,) = journal.glob("commit-*.settlement.json")
    return entry


def test_a_planted_negative_commit_is_set_aside_not_applied(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The issue's attack: a commit file taking $1.00 off a spent $1.00 scope."""
    path, journal, scope = tmp_path / "ledger.db", tmp_path / "journal", _scope()
    _spend_all(path, scope, journal)
    planted = journal / "commit-planted.settlement.json"
    planted.write_bytes(orjson.dumps(_commit([scope], {COST: -1_000_000_000})))
    with (
        caplog.at_level("ERROR", logger="ampmeter.ledgers"),
        SqliteLedger(path, scope, journal=journal) as ledger,
    ):
        assert ledger.spent() == {COST: Decimal("1")}
        assert reserve(ledger, {COST: 0.01}, {COST: 1.0}) is None  # still spent
    assert [p.name for p in journal.iterdir()] == [planted.name + ".corrupt"]
    assert str(planted) in caplog.text and "no seal" in caplog.text


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        (_commit(["{scope}"], {COST: -1_000_000_000}), "is negative"),
        (_commit(["other-tree/x"], {COST: 10**18}), "outside this ledger's tree"),
        (_commit(["{scope}/a", "{scope}/b"], {COST: 5}), "does not enclose"),
        (_commit(["{scope}"], {COST: 0.5}), "not a whole number"),
        (_commit(["{scope}"], {COST: True}), "not a whole number"),
        (_commit(["{scope}"], {COST: 2**63}), "more than a ledger can count"),
        (_commit([], {COST: 5}), "at least one scope"),
        (_commit(["{scope}//x"], {COST: 5}), "non-empty printable names"),
        ({"op": "refund", "id": "x", "scopes": ["{scope}"], "actual": {}}, "unknown operation"),
        ({"op": "release", "id": "x", "scopes": ["{scope}"], "actual": {}}, "no scopes"),
        ({"op": "commit", "id": "", "scopes": ["{scope}"], "actual": {}}, "reservation id"),
        ({"op": "commit", "id": "x", "scopes": "{scope}", "actual": {}}, "must be a list"),
    ],
)
def test_a_sealed_entry_that_fails_a_check_is_set_aside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, entry: dict[str, Any], reason: str
) -> None:
    path, journal, scope = tmp_path / "ledger.db", tmp_path / "journal", _scope()
    _spend_all(path, scope, journal)
    filled = orjson.loads(orjson.dumps(entry).replace(b"{scope}", scope.encode()))
    planted = journal / "commit-planted.settlement.json"
    planted.write_bytes(_sealed(filled))
    with (
        caplog.at_level("ERROR", logger="ampmeter.ledgers"),
        SqliteLedger(path, scope, journal=journal) as ledger,
    ):
        assert ledger.spent() == {COST: Decimal("1")}
    with SqliteLedger(path, "other-tree", journal=tmp_path / "other") as other:
        assert other.spent("other-tree/x") == {}
    assert [p.name for p in journal.iterdir()] == [planted.name + ".corrupt"]
    assert str(planted) in caplog.text and reason in caplog.text
    assert "was not applied" in caplog.text


def test_an_entry_changed_after_it_was_written_is_set_aside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path, journal, scope = tmp_path / "ledger.db", tmp_path / "journal", _scope()
    entry = _journaled_commit(path, scope, journal)
    entry.write_bytes(entry.read_bytes().replace(b"250000000", b"200000000"))  # $0.25 -> $0.20
    with (
        caplog.at_level("ERROR", logger="ampmeter.ledgers"),
        SqliteLedger(path, scope, journal=journal) as ledger,
    ):
        assert ledger.spent() == {}
    assert "checksum does not match" in caplog.text and str(entry) in caplog.text


def test_entries_of_a_ledger_with_a_handoff_key_are_signed_with_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path, scope = tmp_path / "ledger.db", _scope()
    # written and replayed with the same key: applied
    _journaled_commit(path, scope, tmp_path / "a", handoff_key="k1")
    with SqliteLedger(path, scope, journal=tmp_path / "a", handoff_key="k1") as ledger:
        assert ledger.spent() == {COST: Decimal("0.25")}
    assert list((tmp_path / "a").iterdir()) == []
    # replayed with another key: set aside (without a key: test below)
    for journal, options, reason in [
        (tmp_path / "c", {"handoff_key": "k2"}, "signature does not match"),
    ]:
        _journaled_commit(path, scope, journal, handoff_key="k1")
        caplog.clear()
        with (
            caplog.at_level("ERROR", logger="ampmeter.ledgers"),
            SqliteLedger(path, scope, journal=journal, **options) as ledger,
        ):
            assert ledger.spent() == {COST: Decimal("0.25")}
        assert reason in caplog.text
        assert [p.suffix for p in journal.iterdir()] == [".corrupt"]
    # a checksummed entry (anyone can write one) is not applied by a ledger with a key
    journal = tmp_path / "d"
    journal.mkdir()
    (journal / "commit-x.settlement.json").write_bytes(_sealed(_commit([scope], {COST: 5})))
    with SqliteLedger(path, scope, journal=journal, handoff_key="k1") as ledger:
        assert ledger.spent() == {COST: Decimal("0.25")}


def test_an_entry_signed_with_a_key_waits_for_a_ledger_with_that_key(tmp_path: Path) -> None:
    """A ledger without the key (``ampmeter budget show``, a process that opens the same file
    without it) set the keyed ledger's entry aside as corrupt, where no ledger replays it any
    more: the $0.25 commit was lost. It cannot check the entry, so it now leaves it in place."""
    path, scope, journal = tmp_path / "ledger.db", _scope(), tmp_path / "journal"
    entry = _journaled_commit(path, scope, journal, handoff_key="k1")
    with SqliteLedger(path, scope, journal=journal) as keyless:
        assert keyless.spent() == {}  # not applied here
    assert list(journal.iterdir()) == [entry]
    with SqliteLedger(path, scope, journal=journal, handoff_key="k1") as keyed:
        assert keyed.spent() == {COST: Decimal("0.25")}
    assert list(journal.iterdir()) == []


def test_a_checksummed_entry_waits_for_a_ledger_without_a_key(tmp_path: Path) -> None:
    """The other way round: a ledger given a key (a service sharing the file with the
    processes of ``ampmeter run``, which have none) set their journaled commit aside, so the
    $0.25 was lost. It does not trust such an entry, and now leaves it for them."""
    path, scope, journal = tmp_path / "ledger.db", _scope(), tmp_path / "journal"
    entry = _journaled_commit(path, scope, journal)
    with SqliteLedger(path, scope, journal=journal, handoff_key="k1") as keyed:
        assert keyed.spent() == {}  # not applied here
    assert list(journal.iterdir()) == [entry]
    with SqliteLedger(path, scope, journal=journal) as keyless:
        assert keyless.spent() == {COST: Decimal("0.25")}
    assert list(journal.iterdir()) == []


def test_the_journal_directory_is_private(tmp_path: Path) -> None:
    path, journal, scope = tmp_path / "ledger.db", tmp_path / "journal", _scope()
    entry = _journaled_commit(path, scope, journal)
    assert journal.stat().st_mode & 0o777 == 0o700
    assert entry.stat().st_uid == os.getuid()
