"""The in-process ledger: one lock, plain dicts. The default for a single process."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Mapping

from ampmeter.ledgers.base import (
    SETTLED_KEEP_S,
    Ledger,
    Reservation,
    check_amounts,
    check_reservation,
    check_scope,
    check_seconds,
    frozen,
)

__all__ = ["InMemoryLedger"]


class InMemoryLedger(Ledger):
    """A thread-safe ledger kept in this process.

    ``lease_s`` (None = reservations never expire) is how long a reservation holds its amounts
    before it is returned to the pool. Semantics are those of :class:`Ledger`, identical to
    :class:`~ampmeter.ledgers.RedisLedger`.
    """

    __slots__ = (
        "_committed",
        "_lease_s",
        "_leases",
        "_lock",
        "_released",
        "_reserved",
        "_spent",
        "scope",
    )

    def __init__(self, scope: str = "default", *, lease_s: float | None = None) -> None:
        self.scope = check_scope(scope)
        self._lease_s = check_seconds(lease_s, "lease_s", optional=True)
        self._lock = threading.Lock()
        self._spent: dict[str, float] = {}
        self._reserved: dict[str, float] = {}
        # id -> (amounts, expiry); expiry is math.inf for leases that never end
        self._leases: dict[str, tuple[dict[str, float], float]] = {}
        # settled ids -> time settled, in insertion (= time) order, pruned after SETTLED_KEEP_S
        self._committed: dict[str, float] = {}
        self._released: dict[str, float] = {}

    def reserve(
        self, amounts: Mapping[str, float], ceilings: Mapping[str, float]
    ) -> Reservation | None:
        """See :meth:`Ledger.reserve`."""
        wanted = check_amounts(amounts, "amounts")
        limits = check_amounts(ceilings, "ceilings", allow_negative=True)
        with self._lock:
            now = time.time()
            self._reap(now)
            spent, reserved = self._spent, self._reserved
            for key, ceiling in limits.items():
                total = spent.get(key, 0.0) + reserved.get(key, 0.0) + wanted.get(key, 0.0)
                if total > ceiling:
                    return None
            for key, value in wanted.items():
                if value:
                    reserved[key] = reserved.get(key, 0.0) + value
            expiry = now + self._lease_s if self._lease_s is not None else None
            reservation_id = uuid.uuid4().hex
            self._leases[reservation_id] = (wanted, expiry if expiry is not None else float("inf"))
        return Reservation(reservation_id, frozen(dict(wanted)), expiry)

    def commit(self, reservation: Reservation, actual: Mapping[str, float]) -> None:
        """See :meth:`Ledger.commit`."""
        held = check_reservation(reservation)
        cost = check_amounts(actual, "actual")
        with self._lock:
            now = time.time()
            self._reap(now)
            if held.id in self._committed:
                return
            self._drop(held.id)
            spent = self._spent
            for key, value in cost.items():
                if value:
                    spent[key] = spent.get(key, 0.0) + value
            self._released.pop(held.id, None)
            self._committed[held.id] = now

    def release(self, reservation: Reservation) -> None:
        """See :meth:`Ledger.release`."""
        held = check_reservation(reservation)
        with self._lock:
            now = time.time()
            self._reap(now)
            if held.id in self._committed or held.id in self._released:
                return
            self._drop(held.id)
            self._released[held.id] = now

    def spent(self) -> dict[str, float]:
        """See :meth:`Ledger.spent`."""
        with self._lock:
            return dict(self._spent)

    def reserved(self) -> dict[str, float]:
        """See :meth:`Ledger.reserved`."""
        with self._lock:
            return dict(self._reserved)

    def _drop(self, reservation_id: str) -> None:
        lease = self._leases.pop(reservation_id, None)
        if lease is None:
            return
        reserved = self._reserved
        for key, value in lease[0].items():
            if value:
                reserved[key] = reserved.get(key, 0.0) - value
        if not self._leases:
            # no reservation left: return to exact zero instead of float residue
            reserved.clear()

    def _reap(self, now: float) -> None:
        leases = self._leases
        if self._lease_s is not None:
            # one lease length for all, so insertion order is expiry order
            while leases:
                rid, (_, expiry) = next(iter(leases.items()))
                if expiry > now:
                    break
                self._drop(rid)
        horizon = now - SETTLED_KEEP_S
        for settled in (self._committed, self._released):
            while settled:
                rid, when = next(iter(settled.items()))
                if when > horizon:
                    break
                del settled[rid]
