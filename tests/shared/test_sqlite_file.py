"""A SQLite ledger whose file is removed or replaced while it runs fails closed, rather than
keeping a budget apart from the processes that open the path afterwards. Real files."""

from __future__ import annotations

import os
import shutil
import sqlite3
import threading
import uuid
from decimal import Decimal
from pathlib import Path

import pytest

from ampmeter.errors import BudgetUnavailable
from ampmeter.ledgers import LedgerUnavailable, SqliteLedger
from support.ledger_backends import reserve

COST = "amp:cost"
CAP = {COST: 0.05}


def _spend(ledger: SqliteLedger, amount: float) -> None:
    held = reserve(ledger, {COST: amount}, CAP)
    assert held is not None
    ledger.commit(held, {COST: amount})


def _scope() -> str:
    return f"test-{uuid.uuid4().hex}"


def test_a_removed_file_splits_no_budget(tmp_path: Path) -> None:
    """The issue's run: the worker kept the deleted file and a new process started a fresh one
    ($0.10 spent on a $0.05 cap). Now the worker refuses, and its spend waits in its journal."""
    path, scope = tmp_path / "ledger.db", _scope()
    worker = SqliteLedger(path, scope, journal=tmp_path / "worker")
    _spend(worker, 0.03)
    held = reserve(worker, {COST: 0.02}, CAP)
    assert held is not None
    for name in ("ledger.db", "ledger.db-wal", "ledger.db-shm"):
        (tmp_path / name).unlink(missing_ok=True)
    with pytest.raises(BudgetUnavailable, match=r"ledger\.db was removed while this ledger"):
        reserve(worker, {COST: 0.01}, CAP)
    with pytest.raises(LedgerUnavailable, match="kept in"):  # not written to the lost file
        worker.commit(held, {COST: 0.02})
    assert not path.exists()  # refusing created no file either
    newcomer = SqliteLedger(path, scope, journal=tmp_path / "newcomer")
    _spend(newcomer, 0.05)
    with pytest.raises(BudgetUnavailable, match="was replaced by another file"):
        reserve(worker, {COST: 0.01}, CAP)
    # a thread the worker starts now opens no connection to the new file either
    errors: list[BaseException] = []

    def in_a_thread() -> None:
        try:
            worker.spent()
        except BaseException as error:
            errors.append(error)

    thread = threading.Thread(target=in_a_thread)
    thread.start()
    thread.join()
    assert [type(error) for error in errors] == [BudgetUnavailable]
    assert newcomer.spent() == {COST: Decimal("0.05")}  # the worker's commit is not in it
    assert list((tmp_path / "worker").glob("commit-*"))  # but kept, not lost
    newcomer.close()
    worker.close()


def test_a_replaced_file_fails_closed_and_the_same_file_put_back_works(tmp_path: Path) -> None:
    path, scope = tmp_path / "ledger.db", _scope()
    ledger = SqliteLedger(path, scope, journal=tmp_path / "j")
    _spend(ledger, 0.01)
    other = tmp_path / "other.db"
    SqliteLedger(other, scope, journal=tmp_path / "k").close()
    os.rename(path, tmp_path / "kept.db")
    shutil.copyfile(other, path)  # a restore from a backup, another file at the same path
    with pytest.raises(BudgetUnavailable, match="replaced by another file"):
        ledger.spent()
    os.replace(tmp_path / "kept.db", path)  # the file it opened, back in place
    assert ledger.spent() == {COST: Decimal("0.01")}
    _spend(ledger, 0.01)
    ledger.close()


def test_pauses_and_claims_of_a_file_from_before_notes_are_kept(tmp_path: Path) -> None:
    """Pauses and claims had tables of their own; a file written then keeps both on opening."""
    path, scope = tmp_path / "ledger.db", _scope()
    SqliteLedger(path, scope).close()  # a file of this schema version
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE ampmeter_paused (scope TEXT PRIMARY KEY, at REAL NOT NULL)")
        db.execute("CREATE TABLE ampmeter_claims (scope TEXT, name TEXT, at REAL)")
        db.execute("INSERT INTO ampmeter_paused VALUES (?, 1.0)", (scope,))
        db.execute("INSERT INTO ampmeter_claims VALUES (?, 'warned', 1.0)", (scope,))
    with SqliteLedger(path, scope) as ledger:
        assert ledger.show().paused_by == scope
        assert reserve(ledger, {COST: 0.01}, CAP) is None  # still paused
        assert not ledger.claim("warned") and ledger.claim("other")
        ledger.resume()
        assert reserve(ledger, {COST: 0.01}, CAP) is not None


def _writer_holding(path: Path) -> sqlite3.Connection:
    """Another process's connection in the middle of a write (making its own schema, say) on
    the file a ledger is about to open for the first time."""
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    other.execute("CREATE TABLE elsewhere (x)")
    return other


def test_a_new_file_another_connection_is_writing_is_opened_once_it_is_done(
    tmp_path: Path,
) -> None:
    """Switching a new file to WAL while another connection writes is refused by SQLite at once
    (each would wait for the other), not waited out: processes that opened one new ledger
    together failed. The ledger now waits, within its timeout, and works."""
    path = tmp_path / "ledger.db"
    other = _writer_holding(path)
    done = threading.Timer(0.3, lambda: other.execute("COMMIT"))
    done.start()
    try:
        ledger = SqliteLedger(path, _scope(), journal=tmp_path / "journal")
        _spend(ledger, 0.01)
        ledger.close()
    finally:
        done.join()
        other.close()


def test_a_new_file_locked_past_the_timeout_is_unavailable_by_name(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    other = _writer_holding(path)
    try:
        with pytest.raises(BudgetUnavailable, match=r"ledger\.db is unavailable.*locked"):
            SqliteLedger(path, _scope(), journal=tmp_path / "journal", timeout_s=0.2)
    finally:
        other.close()
