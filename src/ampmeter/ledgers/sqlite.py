"""Ledgers kept in SQLite: a file shared by every process and thread of one machine, or the
memory of one process.

Each operation is one transaction (reserve, commit, release and renewal ``BEGIN IMMEDIATE``),
so it is checked and applied atomically against what every other thread and process holds.
Leases use this machine's clock. ``reserved`` is summed from the live holds on every read, so
it returns to exact zero by itself.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable
from typing import Literal, TypeVar

import orjson

from ampmeter.ledgers._amounts import (
    HoldRequest,
    Units,
    Windows,
    check_seconds,
    scope_path,
)
from ampmeter.ledgers._journal import Settlement, default_journal_dir
from ampmeter.ledgers._notes import PAUSE
from ampmeter.ledgers._rules import (
    SETTLED_ID,
    Refusal,
    Reservation,
    first_refusal,
    held_reservation,
    kept_limits,
    tightened,
)
from ampmeter.ledgers._sqlite_file import Connections, MemoryDatabase, immediate
from ampmeter.ledgers.backend import Which
from ampmeter.ledgers.base import SETTLED_KEEP_S, ExpiredHold, Ledger, LedgerUnavailable
from ampmeter.ledgers.reach import Location, Reach, register, settings

__all__ = ["InMemoryLedger", "SqlLedger", "SqliteLedger"]

_T = TypeVar("_T")

# The tables that name scopes: a scope exists when one of them names it or a scope below it.
_SCOPED = ("spent", "unsettled", "held", "ceilings", "notes")


class SqlLedger(Ledger):
    """The :class:`Ledger` semantics kept in SQLite: in a file (:class:`SqliteLedger`) or in this
    process's memory (:class:`~ampmeter.ledgers.InMemoryLedger`), so both count alike.

    ``connections`` hands out a connection per operation (see :mod:`._sqlite_file`); the
    other arguments are :class:`Ledger`'s.
    """

    def __init__(
        self,
        scope: str,
        connections: Connections | MemoryDatabase,
        *,
        lease_s: float | None,
        journal: str | os.PathLike[str] | None,
        on_expired_hold: ExpiredHold,
        handoff_key: str | bytes | None,
    ) -> None:
        lease = None if lease_s is None else check_seconds(lease_s, "lease_s")
        super().__init__(
            scope, lease, journal, on_expired_hold=on_expired_hold, handoff_key=handoff_key
        )
        self._connections = connections
        self._query(lambda db: None)  # create the file and schema, or fail now

    def _backend_reserve(self, request: HoldRequest) -> Reservation | Refusal:
        reservation_id, amounts, limits, windows, charge = request

        def reserve(db: sqlite3.Connection, now: float) -> Reservation | Refusal:
            own = next(iter(limits))
            paused = _paused_by(db, own)
            if paused is not None:
                return Refusal(paused, None, paused=True)
            expired = db.execute("SELECT 1 FROM ampmeter_expired WHERE id = ?", (reservation_id,))
            if _settled(db, reservation_id) is not None or expired.fetchone() is not None:
                return SETTLED_ID
            row = db.execute(
                "SELECT expires_at, scopes, amounts FROM ampmeter_holds WHERE id = ?",
                (reservation_id,),
            ).fetchone()
            if row is not None:
                return held_reservation(reservation_id, _units(row[2]), row[0], _scopes(row[1]))
            checked = kept_limits(own, limits, lambda scope: _read(db, "ceilings", scope))
            refusal = first_refusal(
                checked, amounts, lambda scope: (_read(db, "spent", scope), _held(db, scope))
            )
            if refusal is None and windows:
                refusal = _window_refusal(db, now, own, amounts, windows)
            if refusal is not None:
                return refusal
            scopes = tuple(checked)
            expires_at = now + self._lease_s if self._lease_s is not None else None
            db.execute(
                "INSERT INTO ampmeter_holds VALUES (?, ?, ?, ?, ?)",
                (
                    reservation_id,
                    expires_at,
                    orjson.dumps(scopes),
                    orjson.dumps(amounts),
                    int(charge),
                ),
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
            return held_reservation(reservation_id, amounts, expires_at, scopes)

        return self._run(reserve)

    def _backend_settle(self, settlement: Settlement) -> Units | None:
        op, reservation_id, scopes, actual, idempotency_key = settlement

        def settle(db: sqlite3.Connection, now: float) -> Units | None:
            # A commit after a release still adds what was spent; anything else settles once.
            settled = _settled(db, reservation_id)
            if settled == 1 or (settled == 0 and op == "release"):
                return None
            _drop(db, reservation_id)
            _uncharge(db, reservation_id)
            db.execute(
                "INSERT OR REPLACE INTO ampmeter_settled VALUES (?, ?, ?)",
                (reservation_id, int(op == "commit"), now),
            )
            if op == "release":
                return None
            if idempotency_key is not None:
                seen = db.execute(
                    "SELECT amounts FROM ampmeter_idempotency WHERE scope = ? AND key = ?",
                    (scopes[0], idempotency_key),
                ).fetchone()
                if seen is not None:
                    return _units(seen[0])
                db.execute(
                    "INSERT INTO ampmeter_idempotency VALUES (?, ?, ?, ?)",
                    (scopes[0], idempotency_key, orjson.dumps(actual), now),
                )
            rows = [
                (scope, key, value) for scope in scopes for key, value in actual.items() if value
            ]
            _add(db, "ampmeter_spent", rows)
            _count_in_windows(db, rows, now)
            return None

        return self._run(settle)

    def _backend_renew(self, reservation_ids: list[str]) -> set[str]:
        def renew(db: sqlite3.Connection, now: float) -> set[str]:
            # Without a lease of its own the ledger keeps each hold's expiry: it only finds them.
            expires_at = None if self._lease_s is None else now + self._lease_s
            query = "UPDATE ampmeter_holds SET expires_at = COALESCE(?, expires_at) WHERE id = ?"
            return {rid for rid in reservation_ids if db.execute(query, (expires_at, rid)).rowcount}

        return self._run(renew)

    def _backend_read(self, which: Which, scope: str) -> Units:
        # A write transaction: holds whose lease ended are charged or returned first.
        if which == "reserved":
            return self._run(lambda db, now: _held(db, scope))
        return self._run(lambda db, now: _read(db, which, scope))

    def _backend_unsettled_holds(self) -> list[tuple[str, Units, tuple[str, ...]]]:
        # A write transaction: holds whose lease ended are charged or returned first.
        def read(db: sqlite3.Connection, now: float) -> list[tuple[str, Units, tuple[str, ...]]]:
            rows = db.execute("SELECT id, amounts, scopes FROM ampmeter_expired ORDER BY at")
            return [(rid, _units(amounts), _scopes(scopes)) for rid, amounts, scopes in rows]

        return self._run(read)

    def _backend_recent(self, scope: str, key: str, window_s: float) -> int:
        return self._query(lambda db: _recent(db, time.time(), scope, key, window_s))

    def _backend_set_ceilings(self, scope: str, ceilings: Units, tighten: bool) -> Units:
        def write(db: sqlite3.Connection, now: float) -> Units:
            kept = tightened(_read(db, "ceilings", scope), ceilings, tighten)
            db.executemany(
                "INSERT OR REPLACE INTO ampmeter_ceilings VALUES (?, ?, ?)",
                [(scope, key, value) for key, value in kept.items()],
            )
            return kept

        return self._run(write)

    def _backend_notes(self, scope: str) -> dict[str, str]:
        query = "SELECT name, value FROM ampmeter_notes WHERE scope = ?"
        return self._query(lambda db: dict(db.execute(query, (scope,)).fetchall()))

    def _backend_set_note(
        self, scope: str, name: str, value: str | None, *, first: bool = False
    ) -> bool:
        args: tuple[str, ...] = (scope, name)
        query = "DELETE FROM ampmeter_notes WHERE scope = ? AND name = ?"
        if value is not None:
            verb = "INSERT OR IGNORE" if first else "INSERT OR REPLACE"
            query, args = f"{verb} INTO ampmeter_notes VALUES (?, ?, ?)", (scope, name, value)
        return self._run(lambda db, now: db.execute(query, args).rowcount == 1)

    def _backend_known(self, scope: str) -> bool:
        below = scope + "/"
        union = " UNION ALL ".join(
            f"SELECT 1 FROM ampmeter_{table} WHERE scope = ? OR substr(scope, 1, ?) = ?"
            for table in _SCOPED
        )
        args = [value for _ in _SCOPED for value in (scope, len(below), below)]
        return self._query(lambda db: db.execute(f"{union} LIMIT 1", args).fetchone() is not None)

    def reservation_ids(self) -> set[str]:
        """Ids of the reservations the ledger holds now (expired ones included until reaped)."""
        rows = self._query(lambda db: db.execute("SELECT id FROM ampmeter_holds").fetchall())
        return {row[0] for row in rows}

    def _backend_close(self) -> None:
        self._connections.close()

    def _run(self, operation: Callable[[sqlite3.Connection, float], _T]) -> _T:
        """Run ``operation`` in one write transaction, after ending expired holds."""

        def transaction(db: sqlite3.Connection) -> _T:
            with immediate(db):
                now = time.time()
                _reap(db, now)
                return operation(db, now)

        return self._query(transaction)

    def _query(self, operation: Callable[[sqlite3.Connection], _T]) -> _T:
        """``operation`` on a connection; a SQLite error is :class:`LedgerUnavailable`."""
        try:
            with self._connections.use() as db:
                return operation(db)
        except sqlite3.Error as exc:
            raise LedgerUnavailable(
                f"SQLite ledger for scope {self.scope!r} at {self._connections.path} is "
                f"unavailable: {type(exc).__name__}: {exc}"
            ) from exc


class SqliteLedger(SqlLedger):
    """A :class:`Ledger` kept in the SQLite file ``path`` (created if missing).

    Every process and thread that opens the same file shares its budgets. ``lease_s`` (None =
    never) is how long an unsettled reservation holds unless renewed (this process renews its
    own every ``lease_s / 3``); ``on_expired_hold`` says whether a hold whose lease ends is
    charged as unsettled spend (default) or released. ``timeout_s`` is how long an operation
    waits for the file's write lock before raising :class:`LedgerUnavailable`. ``journal`` is
    the directory for settlements the file cannot take (default: under the user's cache
    directory, one per file and scope tree). ``handoff_key`` signs hand-off tokens (see
    :class:`Ledger`). The file is in WAL mode, so reads never wait for writers, with
    ``synchronous=NORMAL``: a committed transaction survives a crash of the process, not
    necessarily of the machine. A file removed or replaced while open fails every operation
    until it is back (see :mod:`ampmeter.ledgers._sqlite_file`): the budget never splits.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        scope: str = "default",
        *,
        lease_s: float | None = 30.0,
        timeout_s: float = 5.0,
        journal: str | os.PathLike[str] | None = None,
        on_expired_hold: ExpiredHold = "charge",
        handoff_key: str | bytes | None = None,
    ) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or path, got {type(path).__name__}")
        location = os.path.abspath(os.fspath(path))
        if os.path.isdir(location):
            raise ValueError(f"path {location!r} is a directory, not a SQLite file")
        timeout = check_seconds(timeout_s, "timeout_s")
        if journal is None:
            journal = default_journal_dir(
                "sqlite", location, scope if isinstance(scope, str) else ""
            )
        self.path = location
        super().__init__(
            scope,
            Connections(location, timeout),
            lease_s=lease_s,
            journal=journal,
            on_expired_hold=on_expired_hold,
            handoff_key=handoff_key,
        )


class InMemoryLedger(SqlLedger):
    """A thread-safe ledger kept in this process: the SQLite ledger's own tables and statements
    in this process's memory, so it counts exactly as the shared ledgers do. No other process
    can reach it, so it has no journal and no hand-off.

    ``lease_s`` (None = reservations never expire) is how long a reservation holds its amounts
    before its lease ends (renewed while unsettled, see :class:`Ledger`); ``on_expired_hold``
    says whether an ended hold is charged as unsettled spend (default) or released.
    Semantics are those of :class:`Ledger`, identical to the SQLite and Redis ledgers.
    """

    def __init__(
        self,
        scope: str = "default",
        *,
        lease_s: float | None = None,
        on_expired_hold: ExpiredHold = "charge",
        handoff_key: str | bytes | None = None,
    ) -> None:
        super().__init__(
            scope,
            MemoryDatabase(),
            lease_s=lease_s,
            journal=None,
            on_expired_hold=on_expired_hold,
            handoff_key=handoff_key,
        )


def _reap(db: sqlite3.Connection, now: float) -> None:
    """End the holds whose lease ran out (charging those that ask for it) and forget settled
    ids, expired holds and idempotency keys older than :data:`SETTLED_KEEP_S`."""
    expired = db.execute(
        "SELECT id, scopes, amounts, charge FROM ampmeter_holds WHERE expires_at <= ?", (now,)
    ).fetchall()
    for reservation_id, scopes, amounts, charge in expired:
        _drop(db, reservation_id)
        if charge:
            _charge(db, scopes, amounts, 1, now)
            db.execute(
                "INSERT OR REPLACE INTO ampmeter_expired VALUES (?, ?, ?, ?)",
                (reservation_id, scopes, amounts, now),
            )
    horizon = now - SETTLED_KEEP_S
    for table in ("ampmeter_settled", "ampmeter_expired", "ampmeter_idempotency"):
        db.execute(f"DELETE FROM {table} WHERE at < ?", (horizon,))


def _uncharge(db: sqlite3.Connection, reservation_id: str) -> None:
    """Take back the unsettled charge of a hold whose lease ended (its settlement came)."""
    row = db.execute(
        "SELECT scopes, amounts, at FROM ampmeter_expired WHERE id = ?", (reservation_id,)
    ).fetchone()
    if row is None:
        return
    _charge(db, row[0], row[1], -1, row[2])
    db.execute("DELETE FROM ampmeter_expired WHERE id = ?", (reservation_id,))


def _charge(db: sqlite3.Connection, scopes: bytes, amounts: bytes, sign: int, at: float) -> None:
    """Charge a hold (its JSON ``scopes`` and ``amounts``) as unsettled spend at time ``at``
    (``sign`` 1), also in the sliding windows its keys are in, or take that charge back (-1;
    ``at``: when it was charged)."""
    held = _units(amounts)
    rows = [(scope, k, sign * v) for scope in orjson.loads(scopes) for k, v in held.items() if v]
    _add(db, "ampmeter_spent", rows)
    _add(db, "ampmeter_unsettled", rows)
    if sign > 0:
        _count_in_windows(db, rows, at)
        return
    db.executemany(
        "DELETE FROM ampmeter_window_events WHERE rowid = (SELECT rowid FROM "
        "ampmeter_window_events WHERE scope = ? AND key = ? AND at = ? AND amount = ? LIMIT 1)",
        [(scope, key, at, -value) for scope, key, value in rows],
    )


def _count_in_windows(db: sqlite3.Connection, rows: list[tuple[str, str, int]], at: float) -> None:
    """Remember each ``(scope, key, amount)`` added at ``at`` whose key a sliding window
    watches at that scope."""
    db.executemany(
        "INSERT INTO ampmeter_window_events SELECT scope, key, ?, ? "
        "FROM ampmeter_windowed WHERE scope = ? AND key = ?",
        [(at, value, scope, key) for scope, key, value in rows],
    )


def _add(db: sqlite3.Connection, table: str, rows: list[tuple[str, str, int]]) -> None:
    """Add each ``(scope, key, amount)`` to ``table`` (spent or unsettled), dropping zeros."""
    db.executemany(
        f"INSERT INTO {table} VALUES (?, ?, ?) ON CONFLICT (scope, key) "
        "DO UPDATE SET value = value + excluded.value",
        rows,
    )
    db.execute(f"DELETE FROM {table} WHERE value = 0")


def _read(
    db: sqlite3.Connection, which: Literal["spent", "unsettled", "ceilings"], scope: str
) -> Units:
    """The amounts a table of ``(scope, key, value)`` rows keeps for ``scope``."""
    query = f"SELECT key, value FROM ampmeter_{which} WHERE scope = ?"
    return {key: int(value) for key, value in db.execute(query, (scope,))}


def _held(db: sqlite3.Connection, scope: str) -> Units:
    rows = db.execute(
        "SELECT key, SUM(amount) FROM ampmeter_held WHERE scope = ? GROUP BY key", (scope,)
    )
    return {key: int(value) for key, value in rows if value}


def _paused_by(db: sqlite3.Connection, scope: str) -> str | None:
    """The nearest scope of ``scope``'s path (itself first) that an operator paused."""
    path = scope_path(scope)
    marks = ",".join("?" * len(path))
    query = f"SELECT scope FROM ampmeter_notes WHERE name = ? AND scope IN ({marks})"
    found = {row[0] for row in db.execute(query, (PAUSE, *path))}
    return next((name for name in path if name in found), None)


def _window_refusal(
    db: sqlite3.Connection, now: float, scope: str, amounts: Units, windows: Windows
) -> Refusal | None:
    """Register the windows' keys at ``scope`` (their commits are kept from now on), forget
    commits older than each key's longest window, and check every window's ceiling."""
    db.executemany(
        "INSERT INTO ampmeter_windowed VALUES (?, ?, ?) ON CONFLICT (scope, key) "
        "DO UPDATE SET keep = MAX(keep, excluded.keep)",
        [(scope, key, span) for key, span, _ in windows],
    )
    db.executemany(
        "DELETE FROM ampmeter_window_events WHERE scope = ? AND key = ? AND at <= ? - "
        "(SELECT keep FROM ampmeter_windowed WHERE scope = ? AND key = ?)",
        [(scope, key, now, scope, key) for key in dict.fromkeys(k for k, _, _ in windows)],
    )
    held = _held(db, scope)
    for key, span, ceiling in windows:
        used = _recent(db, now, scope, key, span)
        amount = amounts.get(key, 0)
        if used + held.get(key, 0) + amount > ceiling:
            return Refusal.of_units(
                scope, key, used, held.get(key, 0), amount, ceiling, window_s=span
            )
    return None


def _recent(db: sqlite3.Connection, now: float, scope: str, key: str, window_s: float) -> int:
    row = db.execute(
        "SELECT COALESCE(SUM(amount), 0) FROM ampmeter_window_events "
        "WHERE scope = ? AND key = ? AND at > ?",
        (scope, key, now - window_s),
    ).fetchone()
    return int(row[0])


def _drop(db: sqlite3.Connection, reservation_id: str) -> None:
    db.execute("DELETE FROM ampmeter_held WHERE id = ?", (reservation_id,))
    db.execute("DELETE FROM ampmeter_holds WHERE id = ?", (reservation_id,))


def _settled(db: sqlite3.Connection, reservation_id: str) -> int | None:
    """1 if committed, 0 if released, None if never settled."""
    row = db.execute(
        "SELECT committed FROM ampmeter_settled WHERE id = ?", (reservation_id,)
    ).fetchone()
    return None if row is None else int(row[0])


def _units(raw: bytes) -> Units:
    return {str(key): int(value) for key, value in orjson.loads(raw).items()}


def _scopes(raw: bytes) -> tuple[str, ...]:
    return tuple(orjson.loads(raw))


def _reopen(location: Location, scope: str) -> SqliteLedger:
    path = str(location["path"])
    if location.get("create") is False and not os.path.isfile(path):
        raise ValueError(f"no ledger file at {path!r} (give a SQLite ledger file or a server URL)")
    return SqliteLedger(path, scope, **settings(location, "lease_s", "timeout_s"))


register(
    Reach(
        name="sqlite",
        kind=SqliteLedger,
        describe=lambda ledger: {"path": ledger.path, "lease_s": ledger.lease_s},
        reopen=_reopen,
        place=lambda location: os.path.realpath(str(location["path"])),
        # Any address that is not a URL is a file's path.
        address=lambda text: None if "://" in text else {"path": os.path.abspath(text)},
    )
)
