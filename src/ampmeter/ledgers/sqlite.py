"""A ledger in a SQLite file, shared by every process and thread of one machine.

Each reserve, commit, release and renewal is one ``BEGIN IMMEDIATE`` transaction, so it is
checked and applied atomically against what every other process holds; the file is in WAL
mode, so reads never wait for writers. Each thread of each process gets its own connection.
Leases use this machine's clock. ``reserved`` is summed from the live holds on every read, so
it returns to exact zero by itself.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Literal, TypeVar

import orjson

from ampmeter.ledgers._journal import Journal, default_journal_dir
from ampmeter.ledgers.base import (
    SETTLED_ID,
    SETTLED_KEEP_S,
    Ledger,
    LedgerUnavailable,
    Limits,
    Refusal,
    Reservation,
    check_seconds,
    first_refusal,
    frozen,
)

__all__ = ["SqliteLedger"]

_T = TypeVar("_T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS ampmeter_spent (
    scope TEXT NOT NULL, key TEXT NOT NULL, value REAL NOT NULL,
    PRIMARY KEY (scope, key)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS ampmeter_holds (
    id TEXT PRIMARY KEY, expires_at REAL, scopes BLOB NOT NULL, amounts BLOB NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS ampmeter_holds_expiry ON ampmeter_holds (expires_at);
CREATE TABLE IF NOT EXISTS ampmeter_held (
    scope TEXT NOT NULL, key TEXT NOT NULL, id TEXT NOT NULL, amount REAL NOT NULL,
    PRIMARY KEY (scope, key, id)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS ampmeter_held_id ON ampmeter_held (id);
CREATE TABLE IF NOT EXISTS ampmeter_settled (
    id TEXT PRIMARY KEY, committed INTEGER NOT NULL, at REAL NOT NULL) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS ampmeter_settled_at ON ampmeter_settled (at);
"""


class _Connections:
    """One connection per live thread of this process, all closed together.

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
        self.closed = False

    def get(self) -> sqlite3.Connection:
        connection: sqlite3.Connection | None = getattr(self._local, "connection", None)
        if connection is not None and self._pid == os.getpid():
            return connection
        if self.closed:
            raise LedgerUnavailable(f"SQLite ledger {self.path} is closed")
        with self._lock:
            if self._pid != os.getpid():
                # a forked child must not touch its parent's connections, only drop them
                self._pid, self._open, self._local = os.getpid(), {}, threading.local()
            for thread in [thread for thread in self._open if not thread.is_alive()]:
                self._open.pop(thread).close()
            connection = sqlite3.connect(
                self.path, timeout=self.timeout_s, isolation_level=None, check_same_thread=False
            )
            try:
                connection.execute("PRAGMA journal_mode=WAL")
                connection.execute("PRAGMA synchronous=NORMAL")
                connection.executescript(_SCHEMA)
            except BaseException:
                connection.close()
                raise
            self._open[threading.current_thread()] = connection
        self._local.connection = connection
        return connection

    def close(self) -> None:
        with self._lock:
            self.closed = True
            mine = self._pid == os.getpid()
            connections, self._open = list(self._open.values()), {}
        if mine:
            for connection in connections:
                connection.close()


class SqliteLedger(Ledger):
    """A :class:`Ledger` kept in the SQLite file ``path`` (created if missing).

    Every process and thread that opens the same file shares its budgets. ``lease_s`` (None =
    never) is how long an unsettled reservation holds its amounts unless renewed (this
    process renews its own every ``lease_s / 3`` while it lives). ``timeout_s`` is how long an
    operation waits for the file's write lock before raising :class:`LedgerUnavailable`.
    ``journal`` is the directory for settlements the file cannot take (default: under the
    user's cache directory, one per file and scope tree). WAL with ``synchronous=NORMAL``:
    a committed transaction survives a crash of the process, not necessarily of the machine.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        scope: str = "default",
        *,
        lease_s: float | None = 30.0,
        timeout_s: float = 5.0,
        journal: str | os.PathLike[str] | None = None,
    ) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or path, got {type(path).__name__}")
        location = os.path.abspath(os.fspath(path))
        if os.path.isdir(location):
            raise ValueError(f"path {location!r} is a directory, not a SQLite file")
        lease = check_seconds(lease_s, "lease_s", optional=True)
        timeout = check_seconds(timeout_s, "timeout_s", optional=False)
        assert timeout is not None
        directory = (
            journal
            if journal is not None
            else default_journal_dir("sqlite", location, scope if isinstance(scope, str) else "")
        )
        super().__init__(scope, lease, Journal(directory))
        self.path = location
        self._connections = _Connections(location, timeout)
        self._location: dict[str, object] = {"backend": "sqlite", "path": location,
                                              "lease_s": lease}  # fmt: skip
        self._guarded(self._connections.get)  # create the file and schema, or fail now

    def location(self) -> dict[str, object]:
        """The SQLite file and lease (see :meth:`Ledger.location`)."""
        return dict(self._location)

    def _backend_reserve(
        self, reservation_id: str, amounts: dict[str, float], limits: Limits
    ) -> Reservation | Refusal:
        def totals(db: sqlite3.Connection, scope: str) -> tuple[dict[str, float], dict[str, float]]:
            spent = dict(
                db.execute("SELECT key, value FROM ampmeter_spent WHERE scope = ?", (scope,))
            )
            held = dict(
                db.execute(
                    "SELECT key, SUM(amount) FROM ampmeter_held WHERE scope = ? GROUP BY key",
                    (scope,),
                )
            )
            return spent, held

        def reserve(db: sqlite3.Connection, now: float) -> Reservation | Refusal:
            if _settled(db, reservation_id) is not None:
                return SETTLED_ID
            row = db.execute(
                "SELECT expires_at, scopes, amounts FROM ampmeter_holds WHERE id = ?",
                (reservation_id,),
            ).fetchone()
            if row is not None:
                return _reservation(reservation_id, *row)
            refusal = first_refusal(limits, amounts, lambda scope: totals(db, scope))
            if refusal is not None:
                return refusal
            scopes = tuple(limits)
            expires_at = now + self._lease_s if self._lease_s is not None else None
            db.execute(
                "INSERT INTO ampmeter_holds VALUES (?, ?, ?, ?)",
                (reservation_id, expires_at, orjson.dumps(scopes), orjson.dumps(amounts)),
            )
            db.executemany(
                "INSERT INTO ampmeter_held VALUES (?, ?, ?, ?)",
                [
                    (scope, key, reservation_id, value)
                    for scope in scopes
                    for key, value in amounts.items()
                    if value
                ],
            )
            return Reservation(reservation_id, frozen(amounts), expires_at, scopes)

        return self._run(reserve)

    def _backend_commit(
        self, reservation_id: str, scopes: tuple[str, ...], actual: dict[str, float]
    ) -> None:
        def commit(db: sqlite3.Connection, now: float) -> None:
            if _settled(db, reservation_id) == 1:
                return
            _drop(db, reservation_id)
            db.executemany(
                "INSERT INTO ampmeter_spent VALUES (?, ?, ?) ON CONFLICT (scope, key) "
                "DO UPDATE SET value = value + excluded.value",
                [(scope, key, value) for scope in scopes for key, value in actual.items() if value],
            )
            db.execute(
                "INSERT OR REPLACE INTO ampmeter_settled VALUES (?, 1, ?)", (reservation_id, now)
            )

        self._run(commit)

    def _backend_release(self, reservation_id: str) -> None:
        def release(db: sqlite3.Connection, now: float) -> None:
            if _settled(db, reservation_id) is not None:
                return
            _drop(db, reservation_id)
            db.execute("INSERT INTO ampmeter_settled VALUES (?, 0, ?)", (reservation_id, now))

        self._run(release)

    def _backend_renew(self, reservation_ids: list[str]) -> set[str]:
        def renew(db: sqlite3.Connection, now: float) -> set[str]:
            live: set[str] = set()
            for reservation_id in reservation_ids:
                if self._lease_s is None:
                    found = db.execute(
                        "SELECT 1 FROM ampmeter_holds WHERE id = ?", (reservation_id,)
                    ).fetchone()
                    changed = found is not None
                else:
                    changed = (
                        db.execute(
                            "UPDATE ampmeter_holds SET expires_at = ? WHERE id = ?",
                            (now + self._lease_s, reservation_id),
                        ).rowcount
                        == 1
                    )
                if changed:
                    live.add(reservation_id)
            return live

        return self._run(renew)

    def _backend_read(self, which: Literal["spent", "reserved"], scope: str) -> dict[str, float]:
        if which == "spent":
            query = "SELECT key, value FROM ampmeter_spent WHERE scope = ?"
        else:
            query = "SELECT key, SUM(amount) FROM ampmeter_held WHERE scope = ? GROUP BY key"
        return self._guarded(
            lambda: {
                key: float(value) for key, value in self._connections.get().execute(query, (scope,))
            }
        )

    def reservation_ids(self) -> set[str]:
        """Ids of the reservations the file holds now (expired ones included until reaped)."""
        rows = self._guarded(
            lambda: self._connections.get().execute("SELECT id FROM ampmeter_holds").fetchall()
        )
        return {row[0] for row in rows}

    def _backend_close(self) -> None:
        self._connections.close()

    def _run(self, operation: Callable[[sqlite3.Connection, float], _T]) -> _T:
        """Run ``operation`` in one write transaction, after returning expired holds."""

        def transaction() -> _T:
            with _immediate(self._connections.get()) as db:
                now = time.time()
                _reap(db, now)
                return operation(db, now)

        return self._guarded(transaction)

    def _guarded(self, operation: Callable[[], _T]) -> _T:
        try:
            return operation()
        except sqlite3.Error as exc:
            raise LedgerUnavailable(
                f"SQLite ledger for scope {self.scope!r} at {self.path} is unavailable: "
                f"{type(exc).__name__}: {exc}"
            ) from exc


@contextmanager
def _immediate(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _reap(db: sqlite3.Connection, now: float) -> None:
    expired = [
        row[0] for row in db.execute("SELECT id FROM ampmeter_holds WHERE expires_at <= ?", (now,))
    ]
    for reservation_id in expired:
        _drop(db, reservation_id)
    db.execute("DELETE FROM ampmeter_settled WHERE at < ?", (now - SETTLED_KEEP_S,))


def _drop(db: sqlite3.Connection, reservation_id: str) -> None:
    db.execute("DELETE FROM ampmeter_held WHERE id = ?", (reservation_id,))
    db.execute("DELETE FROM ampmeter_holds WHERE id = ?", (reservation_id,))


def _settled(db: sqlite3.Connection, reservation_id: str) -> int | None:
    """1 if committed, 0 if released, None if never settled."""
    row = db.execute(
        "SELECT committed FROM ampmeter_settled WHERE id = ?", (reservation_id,)
    ).fetchone()
    return None if row is None else int(row[0])


def _reservation(
    reservation_id: str, expires_at: float | None, scopes: bytes, amounts: bytes
) -> Reservation:
    held: dict[str, float] = {key: float(value) for key, value in orjson.loads(amounts).items()}
    return Reservation(reservation_id, frozen(held), expires_at, tuple(orjson.loads(scopes)))
