"""The in-process ledger: one lock, plain dicts of integers. The default for a single process."""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Literal, TypeVar

from ampmeter.ledgers._amounts import (
    HoldRequest,
    Units,
    Windows,
    check_seconds,
    scope_path,
)
from ampmeter.ledgers._journal import Settlement
from ampmeter.ledgers.base import (
    SETTLED_ID,
    SETTLED_KEEP_S,
    ExpiredHold,
    Ledger,
    Refusal,
    Reservation,
    first_refusal,
    held_reservation,
    kept_limits,
    tightened,
)

__all__ = ["InMemoryLedger"]

_K = TypeVar("_K")
_V = TypeVar("_V")


class _Lease:
    __slots__ = ("amounts", "charge", "expiry", "scopes")

    def __init__(
        self, amounts: Units, scopes: tuple[str, ...], expiry: float, charge: bool
    ) -> None:
        self.amounts = amounts
        self.scopes = scopes
        self.expiry = expiry  # math.inf for leases that never end
        self.charge = charge  # an expiry charges it as unsettled spend


class _State:
    """Everything a tree of scopes holds; shared by an InMemoryLedger and its children."""

    __slots__ = (
        "ceilings",
        "claims",
        "committed",
        "events",
        "expired",
        "idempotent",
        "leases",
        "lock",
        "notes",
        "paused",
        "released",
        "reserved",
        "spent",
        "unsettled",
        "windowed",
    )

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.spent: dict[str, Units] = {}
        self.reserved: dict[str, Units] = {}
        self.unsettled: dict[str, Units] = {}
        # id -> lease, in expiry order (one lease length for all; a renewal moves it last)
        self.leases: dict[str, _Lease] = {}
        # settled ids -> time settled, in insertion (= time) order, pruned after SETTLED_KEEP_S
        self.committed: dict[str, float] = {}
        self.released: dict[str, float] = {}
        # ids of holds charged when their lease ended -> (the lease, when), pruned likewise
        self.expired: dict[str, tuple[_Lease, float]] = {}
        # (scope, idempotency key) -> (the first settlement's amounts, when), pruned likewise
        self.idempotent: dict[tuple[str, str], tuple[Units, float]] = {}
        # (scope, key) -> the longest window asked for; their commits, as (time, amount)
        self.windowed: dict[tuple[str, str], float] = {}
        self.events: dict[tuple[str, str], deque[tuple[float, int]]] = {}
        self.claims: set[tuple[str, str]] = set()
        self.ceilings: dict[str, Units] = {}
        self.paused: set[str] = set()
        self.notes: dict[str, dict[str, str]] = {}  # scope -> name -> value


class InMemoryLedger(Ledger):
    """A thread-safe ledger kept in this process.

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
        lease = check_seconds(lease_s, "lease_s", optional=True)
        super().__init__(
            scope, lease, None, on_expired_hold=on_expired_hold, handoff_key=handoff_key
        )
        self._state = _State()

    def _backend_reserve(self, request: HoldRequest) -> Reservation | Refusal:
        reservation_id, amounts, limits, windows, charge = request
        state = self._state
        with state.lock:
            now = time.time()
            self._reap(now)
            own = next(iter(limits))
            paused = self._paused_by(own)
            if paused is not None:
                return Refusal(paused, None, paused=True)
            if (
                reservation_id in state.committed
                or reservation_id in state.released
                or reservation_id in state.expired
            ):
                return SETTLED_ID
            lease = state.leases.get(reservation_id)
            if lease is not None:
                return self._reservation(reservation_id, lease)
            limits = kept_limits(own, limits, lambda scope: state.ceilings.get(scope, {}))
            refusal = first_refusal(
                limits,
                amounts,
                lambda scope: (state.spent.get(scope, {}), state.reserved.get(scope, {})),
            )
            if refusal is None and windows:
                refusal = self._window_refusal(now, own, amounts, windows)
            if refusal is not None:
                return refusal
            scopes = tuple(limits)
            _add(state.reserved, scopes, amounts, 1)
            expiry = now + self._lease_s if self._lease_s is not None else float("inf")
            lease = _Lease(amounts, scopes, expiry, charge)
            state.leases[reservation_id] = lease
            return self._reservation(reservation_id, lease)

    def _backend_commit(self, settlement: Settlement) -> Units | None:
        _, reservation_id, scopes, actual, idempotency_key = settlement
        state = self._state
        with state.lock:
            now = time.time()
            self._reap(now)
            if reservation_id in state.committed:
                return None
            self._drop(reservation_id)
            self._uncharge(reservation_id)
            state.released.pop(reservation_id, None)
            state.committed[reservation_id] = now
            if idempotency_key is not None:
                seen = state.idempotent.get((scopes[0], idempotency_key))
                if seen is not None:
                    return dict(seen[0])
                state.idempotent[scopes[0], idempotency_key] = (dict(actual), now)
            _add(state.spent, scopes, actual, 1)
            for scope in scopes:
                for key, value in actual.items():
                    if value and (scope, key) in state.windowed:
                        state.events.setdefault((scope, key), deque()).append((now, value))
            return None

    def _backend_release(self, reservation_id: str) -> None:
        state = self._state
        with state.lock:
            now = time.time()
            self._reap(now)
            if reservation_id in state.committed or reservation_id in state.released:
                return
            self._drop(reservation_id)
            self._uncharge(reservation_id)
            state.released[reservation_id] = now

    def _backend_renew(self, reservation_ids: list[str]) -> set[str]:
        state = self._state
        live: set[str] = set()
        with state.lock:
            now = time.time()
            self._reap(now)
            for reservation_id in reservation_ids:
                lease = state.leases.pop(reservation_id, None)
                if lease is None:
                    continue
                if self._lease_s is not None:
                    lease.expiry = now + self._lease_s
                state.leases[reservation_id] = lease  # last again: expiry order is kept
                live.add(reservation_id)
        return live

    def _backend_read(self, which: Literal["spent", "reserved", "unsettled"], scope: str) -> Units:
        state = self._state
        with state.lock:
            self._reap(time.time())
            return dict(getattr(state, which).get(scope, {}))

    def _backend_unsettled_holds(self) -> list[tuple[str, Units, tuple[str, ...]]]:
        state = self._state
        with state.lock:
            self._reap(time.time())
            return [
                (rid, dict(lease.amounts), lease.scopes)
                for rid, (lease, _) in state.expired.items()
            ]

    def _backend_recent(self, scope: str, key: str, window_s: float) -> int:
        with self._state.lock:
            return self._recent(time.time(), scope, key, window_s)

    def _backend_claim(self, scope: str, name: str) -> bool:
        claims = self._state.claims
        with self._state.lock:
            if (scope, name) in claims:
                return False
            claims.add((scope, name))
            return True

    def _backend_ceilings(self, scope: str) -> Units:
        with self._state.lock:
            return dict(self._state.ceilings.get(scope, {}))

    def _backend_set_ceilings(self, scope: str, ceilings: Units, tighten: bool) -> Units:
        state = self._state
        with state.lock:
            kept = state.ceilings[scope] = tightened(
                state.ceilings.get(scope, {}), ceilings, tighten
            )
            return dict(kept)

    def _backend_set_paused(self, scope: str, paused: bool) -> None:
        with self._state.lock:
            if paused:
                self._state.paused.add(scope)
            else:
                self._state.paused.discard(scope)

    def _backend_paused_by(self, scope: str) -> str | None:
        with self._state.lock:
            return self._paused_by(scope)

    def _backend_notes(self, scope: str) -> dict[str, str]:
        with self._state.lock:
            return dict(self._state.notes.get(scope, {}))

    def _backend_set_note(self, scope: str, name: str, value: str | None) -> None:
        notes = self._state.notes
        with self._state.lock:
            if value is not None:
                notes.setdefault(scope, {})[name] = value
            elif scope in notes:
                notes[scope].pop(name, None)

    def _backend_known(self, scope: str) -> bool:
        state = self._state
        below = scope + "/"
        with state.lock:
            tables = (state.spent, state.reserved, state.unsettled, state.ceilings, state.notes)
            names = {name for table in tables for name in table} | state.paused
            return any(name == scope or name.startswith(below) for name in names)

    def _paused_by(self, scope: str) -> str | None:
        paused = self._state.paused
        if not paused:
            return None
        return next((name for name in scope_path(scope) if name in paused), None)

    def _window_refusal(
        self, now: float, scope: str, amounts: Units, windows: Windows
    ) -> Refusal | None:
        state = self._state
        held = state.reserved.get(scope, {})
        for key, span, _ in windows:
            state.windowed[scope, key] = max(state.windowed.get((scope, key), 0.0), span)
        for key, span, ceiling in windows:
            used = self._recent(now, scope, key, span)
            amount = amounts.get(key, 0)
            if used + held.get(key, 0) + amount > ceiling:
                return Refusal.of_units(scope, key, used, held.get(key, 0), amount, ceiling, span)
        return None

    def _recent(self, now: float, scope: str, key: str, window_s: float) -> int:
        events = self._state.events.get((scope, key))
        if not events:
            return 0
        keep = self._state.windowed.get((scope, key), window_s)
        while events and events[0][0] <= now - keep:
            events.popleft()
        start = now - window_s
        return sum(amount for at, amount in events if at > start)

    def _reservation(self, reservation_id: str, lease: _Lease) -> Reservation:
        expires_at = None if lease.expiry == float("inf") else lease.expiry
        return held_reservation(reservation_id, lease.amounts, expires_at, lease.scopes)

    def _drop(self, reservation_id: str) -> _Lease | None:
        lease = self._state.leases.pop(reservation_id, None)
        if lease is not None:
            _add(self._state.reserved, lease.scopes, lease.amounts, -1)
        return lease

    def _uncharge(self, reservation_id: str) -> None:
        """Take back the unsettled charge of a hold whose lease ended (its settlement came)."""
        found = self._state.expired.pop(reservation_id, None)
        if found is not None:
            lease = found[0]
            _add(self._state.spent, lease.scopes, lease.amounts, -1)
            _add(self._state.unsettled, lease.scopes, lease.amounts, -1)

    def _reap(self, now: float) -> None:
        state = self._state
        leases = state.leases
        while leases:
            rid, lease = next(iter(leases.items()))
            if lease.expiry > now:
                break
            self._drop(rid)
            if lease.charge:
                _add(state.spent, lease.scopes, lease.amounts, 1)
                _add(state.unsettled, lease.scopes, lease.amounts, 1)
                state.expired[rid] = (lease, now)
        horizon = now - SETTLED_KEEP_S
        for settled in (state.committed, state.released):
            while settled:
                rid, when = next(iter(settled.items()))
                if when > horizon:
                    break
                del settled[rid]
        _prune(state.expired, horizon)
        _prune(state.idempotent, horizon)


def _prune(kept: dict[_K, tuple[_V, float]], horizon: float) -> None:
    """Forget the entries of ``kept`` (in time order) made before ``horizon``."""
    while kept:
        first, (_, when) = next(iter(kept.items()))
        if when > horizon:
            break
        del kept[first]


def _add(table: dict[str, Units], scopes: tuple[str, ...], amounts: Units, sign: int) -> None:
    """Add (``sign`` 1) or subtract (-1) ``amounts`` at each of ``scopes``; zeros are dropped."""
    for scope in scopes:
        row = table.setdefault(scope, {})
        for key, value in amounts.items():
            if value:
                left = row.get(key, 0) + sign * value
                if left:
                    row[key] = left
                else:
                    row.pop(key, None)
        if not row:
            del table[scope]
