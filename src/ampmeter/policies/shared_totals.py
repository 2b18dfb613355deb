"""A shared ledger's totals, read at most every :data:`SHARED_READ_S`, for the policies that
count every process sharing a scope (warnings, soft limits, budget pressure)."""

from __future__ import annotations

import threading
import time
import weakref
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from ampmeter.ledgers import Ledger
    from ampmeter.ledgers.base import Amount

__all__ = ["SHARED_READ_S", "SharedTotals", "shared_totals"]

SHARED_READ_S: Final = 0.5
"""How long a shared ledger's totals, once read, stand for the budget pressure and
``wrap_up`` (a settlement always reads them afresh)."""


class SharedTotals:
    """A shared ledger's spend at its own scope, read at most every :data:`SHARED_READ_S`
    unless asked afresh. A read that fails gives None (the caller uses its local totals).

    It refers to the ledger weakly: the cache of all of them is keyed by ledger, and must not
    keep a ledger (and its connections) alive once its contexts are gone."""

    __slots__ = ("ledger", "read_at", "totals")

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = weakref.ref(ledger)
        self.read_at = -SHARED_READ_S
        self.totals: dict[str, Amount] | None = None

    def read(self, *, fresh: bool = False) -> dict[str, Amount] | None:
        """The ledger's spend per key (cached unless ``fresh``; money as exact Decimal dollars),
        or None if it cannot be read."""
        now = time.monotonic()
        if fresh or now - self.read_at >= SHARED_READ_S:
            ledger = self.ledger()
            try:
                totals = None if ledger is None else ledger.spent()
            except Exception:  # the ledger's own errors, or a backend gone: local totals then
                totals = None
            self.totals, self.read_at = totals, now
        return self.totals

    def claim(self, name: str) -> bool:
        """Whether this process is the first to report ``name`` (True if the ledger cannot say)."""
        ledger = self.ledger()
        try:
            return True if ledger is None else ledger.claim(name)
        except Exception:
            return True


_TOTALS: weakref.WeakKeyDictionary[Ledger, SharedTotals] = weakref.WeakKeyDictionary()
_TOTALS_LOCK = threading.Lock()


def shared_totals(ledger: Ledger) -> SharedTotals:
    """The one :class:`SharedTotals` of ``ledger`` in this process."""
    with _TOTALS_LOCK:
        found = _TOTALS.get(ledger)
        if found is None:
            found = _TOTALS[ledger] = SharedTotals(ledger)
        return found
