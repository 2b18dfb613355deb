"""The in-process ledger: one lock, plain dicts. The default for a single process."""

from __future__ import annotations

import threading
import time
from typing import Literal

from ampmeter.ledgers.base import (
    SETTLED_ID,
    SETTLED_KEEP_S,
    Ledger,
    Limits,
    Refusal,
    Reservation,
    check_seconds,
    first_refusal,
    frozen,
)

__all__ = ["InMemoryLedger"]


class _Lease:
    __slots__ = ("amounts", "expiry", "scopes")

    def __init__(self, amounts: dict[str, float], scopes: tuple[str, ...], expiry: float) -> None:
        self.amounts = amounts
        self.scopes = scopes
        self.expiry = expiry  # math.inf for leases that never end


class _State:
    """Everything a tree of scopes holds; shared by an InMemoryLedger and its children."""

    __slots__ = ("committed", "leases", "lock", "released", "reserved", "spent")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.spent: dict[str, dict[str, float]] = {}
        self.reserved: dict[str, dict[str, float]] = {}
        # id -> lease, in expiry order (one lease length for all; a renewal moves it last)
        self.leases: dict[str, _Lease] = {}
        # settled ids -> time settled, in insertion (= time) order, pruned after SETTLED_KEEP_S
        self.committed: dict[str, float] = {}
        self.released: dict[str, float] = {}


class InMemoryLedger(Ledger):
    """A thread-safe ledger kept in this process.

    ``lease_s`` (None = reservations never expire) is how long a reservation holds its amounts
    before it is returned to the pool (renewed while unsettled, see :class:`Ledger`).
    Semantics are those of :class:`Ledger`, identical to the SQLite and Redis ledgers.
    """

    def __init__(self, scope: str = "default", *, lease_s: float | None = None) -> None:
        lease = check_seconds(lease_s, "lease_s", optional=True)
        super().__init__(scope, lease, None)
        self._state = _State()

    def _backend_reserve(
        self, reservation_id: str, amounts: dict[str, float], limits: Limits
    ) -> Reservation | Refusal:
        state = self._state
        with state.lock:
            now = time.time()
            self._reap(now)
            if reservation_id in state.committed or reservation_id in state.released:
                return SETTLED_ID
            lease = state.leases.get(reservation_id)
            if lease is not None:
                return self._reservation(reservation_id, lease)
            refusal = first_refusal(
                limits,
                amounts,
                lambda scope: (state.spent.get(scope, {}), state.reserved.get(scope, {})),
            )
            if refusal is not None:
                return refusal
            scopes = tuple(limits)
            for scope in scopes:
                reserved = state.reserved.setdefault(scope, {})
                for key, value in amounts.items():
                    if value:
                        reserved[key] = reserved.get(key, 0.0) + value
            expiry = now + self._lease_s if self._lease_s is not None else float("inf")
            lease = state.leases[reservation_id] = _Lease(amounts, scopes, expiry)
            return self._reservation(reservation_id, lease)

    def _backend_commit(
        self, reservation_id: str, scopes: tuple[str, ...], actual: dict[str, float]
    ) -> None:
        state = self._state
        with state.lock:
            now = time.time()
            self._reap(now)
            if reservation_id in state.committed:
                return
            self._drop(reservation_id)
            for scope in scopes:
                spent = state.spent.setdefault(scope, {})
                for key, value in actual.items():
                    if value:
                        spent[key] = spent.get(key, 0.0) + value
            state.released.pop(reservation_id, None)
            state.committed[reservation_id] = now

    def _backend_release(self, reservation_id: str) -> None:
        state = self._state
        with state.lock:
            now = time.time()
            self._reap(now)
            if reservation_id in state.committed or reservation_id in state.released:
                return
            self._drop(reservation_id)
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

    def _backend_read(self, which: Literal["spent", "reserved"], scope: str) -> dict[str, float]:
        state = self._state
        with state.lock:
            table = state.spent if which == "spent" else state.reserved
            return dict(table.get(scope, {}))

    def _reservation(self, reservation_id: str, lease: _Lease) -> Reservation:
        expires_at = None if lease.expiry == float("inf") else lease.expiry
        return Reservation(reservation_id, frozen(dict(lease.amounts)), expires_at, lease.scopes)

    def _drop(self, reservation_id: str) -> None:
        state = self._state
        lease = state.leases.pop(reservation_id, None)
        if lease is None:
            return
        if not state.leases:
            # no reservation left: return to exact zero instead of float residue
            state.reserved.clear()
            return
        for scope in lease.scopes:
            reserved = state.reserved.get(scope)
            if reserved is None:
                continue
            for key, value in lease.amounts.items():
                if value:
                    left = reserved[key] - value
                    if left == 0.0:
                        del reserved[key]
                    else:
                        reserved[key] = left
            if not reserved:
                del state.reserved[scope]

    def _reap(self, now: float) -> None:
        state = self._state
        leases = state.leases
        while leases:
            rid, lease = next(iter(leases.items()))
            if lease.expiry > now:
                break
            self._drop(rid)
        horizon = now - SETTLED_KEEP_S
        for settled in (state.committed, state.released):
            while settled:
                rid, when = next(iter(settled.items()))
                if when > horizon:
                    break
                del settled[rid]
