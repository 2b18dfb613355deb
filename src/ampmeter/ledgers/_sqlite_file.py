"""The SQLite file of a :class:`~ampmeter.ledgers.SqliteLedger`: its schema, one connection per
thread, and the check that the file at the path is still the file the ledger opened.

A process keeps using a file it has open after the file is deleted or replaced, while the next
process to open the path gets another file: the budget would split in two, each half obeying
its own ceiling. So every operation first compares the path's device and inode with the ones
the ledger first opened (one ``stat``, about a microsecond) and fails closed with
:class:`~ampmeter.errors.BudgetUnavailable` while they differ. Putting the file back (the same
inode) lets the ledger go on.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from ampmeter.errors import BudgetUnavailable

__all__ = ["Connections", "MemoryDatabase", "immediate"]

# Version 2 keeps amounts as integers (nano-dollars for money keys); version 1 (no user_version)
# kept float dollars, which this code cannot read.
_SCHEMA_VERSION = 2
# The notes of a scope (an operator's raise, a call paused at its cap): added to files of this
# version written before it had them, so it is created whenever a file is opened.
_NOTES = """CREATE TABLE IF NOT EXISTS ampmeter_notes (
    scope TEXT NOT NULL, name TEXT NOT NULL, value TEXT NOT NULL,
    PRIMARY KEY (scope, name)) WITHOUT ROWID"""
# The amounts per (scope, key): spent, charged as unsettled, and the ceilings kept.
_AMOUNTS = """CREATE TABLE IF NOT EXISTS ampmeter_{} (
    scope TEXT NOT NULL, key TEXT NOT NULL, value INTEGER NOT NULL,
    PRIMARY KEY (scope, key)) WITHOUT ROWID"""
_SCHEMA = (
    *(_AMOUNTS.format(table) for table in ("spent", "unsettled", "ceilings")),
    """CREATE TABLE IF NOT EXISTS ampmeter_holds (
    id TEXT PRIMARY KEY, expires_at REAL, scopes BLOB NOT NULL, amounts BLOB NOT NULL,
    charge INTEGER NOT NULL) WITHOUT ROWID""",
    "CREATE INDEX IF NOT EXISTS ampmeter_holds_expiry ON ampmeter_holds (expires_at)",
    """CREATE TABLE IF NOT EXISTS ampmeter_held (
    scope TEXT NOT NULL, key TEXT NOT NULL, id TEXT NOT NULL, amount INTEGER NOT NULL,
    PRIMARY KEY (scope, key, id)) WITHOUT ROWID""",
    "CREATE INDEX IF NOT EXISTS ampmeter_held_id ON ampmeter_held (id)",
    """CREATE TABLE IF NOT EXISTS ampmeter_settled (
    id TEXT PRIMARY KEY, committed INTEGER NOT NULL, at REAL NOT NULL) WITHOUT ROWID""",
    "CREATE INDEX IF NOT EXISTS ampmeter_settled_at ON ampmeter_settled (at)",
    """CREATE TABLE IF NOT EXISTS ampmeter_expired (
    id TEXT PRIMARY KEY, scopes BLOB NOT NULL, amounts BLOB NOT NULL, at REAL NOT NULL
    ) WITHOUT ROWID""",
    "CREATE INDEX IF NOT EXISTS ampmeter_expired_at ON ampmeter_expired (at)",
    """CREATE TABLE IF NOT EXISTS ampmeter_idempotency (
    scope TEXT NOT NULL, key TEXT NOT NULL, amounts BLOB NOT NULL, at REAL NOT NULL,
    PRIMARY KEY (scope, key)) WITHOUT ROWID""",
    "CREATE INDEX IF NOT EXISTS ampmeter_idempotency_at ON ampmeter_idempotency (at)",
    """CREATE TABLE IF NOT EXISTS ampmeter_windowed (
    scope TEXT NOT NULL, key TEXT NOT NULL, keep REAL NOT NULL,
    PRIMARY KEY (scope, key)) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS ampmeter_window_events (
    scope TEXT NOT NULL, key TEXT NOT NULL, at REAL NOT NULL, amount INTEGER NOT NULL)""",
    """CREATE INDEX IF NOT EXISTS ampmeter_window_events_at
    ON ampmeter_window_events (scope, key, at)""",
    _NOTES,
)


def _create_schema(db: sqlite3.Connection, path: str) -> None:
    """Create the tables in a new file, or check that an existing file has this version."""
    with immediate(db):
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version == _SCHEMA_VERSION:
            db.execute(_NOTES)
            _move_into_notes(db)
            return
        old = db.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'ampmeter_spent'"
        ).fetchone()
        if version != 0 or old is not None:
            raise sqlite3.DatabaseError(
                f"{path} holds a ledger of another ampmeter version (schema {version or 1}, "
                f"this one reads {_SCHEMA_VERSION}: amounts are now whole nano-dollars); "
                "settle it with the version that wrote it, or use a new file"
            )
        for statement in _SCHEMA:
            db.execute(statement)
        db.execute(f"PRAGMA user_version = {_SCHEMA_VERSION}")


_BUSY_CODES = (5, 6)  # SQLITE_BUSY, SQLITE_LOCKED (named in the sqlite3 module from 3.11 on)


def _prepare(db: sqlite3.Connection, path: str, timeout_s: float) -> None:
    """Put a new connection's file in WAL mode and make or check its schema, waiting up to
    ``timeout_s`` for other connections doing the same.

    Switching a file to WAL takes a read lock and then the whole file. When another process
    holds a write lock meanwhile (it is making the schema, or switching too), SQLite answers
    "database is locked" at once rather than wait: each would wait for the other. Processes that
    open a new ledger together meet exactly that, so it is retried here until the timeout."""
    db.execute("PRAGMA synchronous=NORMAL")
    deadline = time.monotonic() + timeout_s
    pause = 0.002
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            _create_schema(db, path)
            return
        except sqlite3.OperationalError as exc:
            if not _is_busy(exc) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    """Whether ``exc`` says another connection holds the lock wanted (before Python 3.11 the
    error carries no code: its message says so)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None:
        return str(exc).startswith("database is locked")
    return code & 0xFF in _BUSY_CODES


# Pauses and claims had tables of their own before they were notes (see ledgers/_notes.py).
_MOVED = {
    "ampmeter_paused": "'pause', CAST(at AS TEXT)",
    "ampmeter_claims": "'claim:' || name, '1'",
}


def _move_into_notes(db: sqlite3.Connection) -> None:
    """Move the pauses and claims a file of this version kept in their old tables into notes."""
    for table, columns in _MOVED.items():
        found = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"
        if db.execute(found, (table,)).fetchone() is not None:
            db.execute(f"INSERT OR IGNORE INTO ampmeter_notes SELECT scope, {columns} FROM {table}")
            db.execute(f"DROP TABLE {table}")


class Connections:
    """One connection per live thread of this process, all closed together, to the file that
    was at ``path`` when the first one opened.

    A thread's connection is closed once the thread has ended (noticed when another thread
    opens its first), so a program that starts many short threads holds few connections.
    """

    def __init__(self, path: str, timeout_s: float) -> None:
        self.path = path
        self.timeout_s = timeout_s
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open: dict[threading.Thread, sqlite3.Connection] = {}
        self._pid = os.getpid()
        self._identity: tuple[int, int] | None = None  # (device, inode) of the file opened
        self.closed = False

    def get(self) -> sqlite3.Connection:
        """This thread's connection, after checking that the file is still the one opened."""
        connection: sqlite3.Connection | None = getattr(self._local, "connection", None)
        if connection is not None and self._pid == os.getpid():
            self._check_identity()
            return connection
        if self.closed:
            raise BudgetUnavailable(f"SQLite ledger {self.path} is closed")
        with self._lock:
            if self._pid != os.getpid():
                # a forked child must not touch its parent's connections, only drop them
                self._pid, self._open, self._local = os.getpid(), {}, threading.local()
            for thread in [thread for thread in self._open if not thread.is_alive()]:
                self._open.pop(thread).close()
            if self._identity is not None:
                self._check_identity()  # before connecting, which would create a new file
            connection = sqlite3.connect(
                self.path, timeout=self.timeout_s, isolation_level=None, check_same_thread=False
            )
            try:
                _prepare(connection, self.path, self.timeout_s)
                if self._identity is None:
                    self._identity = _identity(self.path)
                self._check_identity()
            except BaseException:
                connection.close()
                raise
            self._open[threading.current_thread()] = connection
        self._local.connection = connection
        return connection

    @contextmanager
    def use(self) -> Iterator[sqlite3.Connection]:
        """This thread's connection (see :meth:`get`) for one operation."""
        yield self.get()

    def close(self) -> None:
        with self._lock:
            self.closed = True
            mine = self._pid == os.getpid()
            connections, self._open = list(self._open.values()), {}
        if mine:
            for connection in connections:
                connection.close()

    def _check_identity(self) -> None:
        try:
            now = _identity(self.path)
        except FileNotFoundError:
            now = None
        if now == self._identity:
            return
        what = "removed" if now is None else "replaced by another file"
        raise BudgetUnavailable(
            f"SQLite ledger file {self.path} was {what} while this ledger had it open: "
            "processes opening the path now would keep a budget apart from this one, so this "
            "ledger refuses every operation (settlements go to its journal). Put the file back, "
            "or stop every process using it and start over with one file"
        )


class MemoryDatabase:
    """A database in this process's memory (an :class:`~ampmeter.ledgers.InMemoryLedger`'s):
    one connection, which the threads take in turn, one operation at a time."""

    path = ":memory:"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._db = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        _create_schema(self._db, self.path)

    @contextmanager
    def use(self) -> Iterator[sqlite3.Connection]:
        """The connection, for this thread alone until the operation ends."""
        with self._lock:
            yield self._db

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _identity(path: str) -> tuple[int, int]:
    found = os.stat(path)
    return found.st_dev, found.st_ino


@contextmanager
def immediate(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One write transaction: taken at once, rolled back if the block raises."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
