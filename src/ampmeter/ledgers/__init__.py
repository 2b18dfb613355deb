"""Budget ledgers: reservations and spend of a budget scope, in-process or shared via Redis.

``RedisLedger`` is imported lazily, so the package works without the ``redis`` extra.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ampmeter.ledgers.base import Ledger, LedgerUnavailable, Reservation
from ampmeter.ledgers.memory import InMemoryLedger

if TYPE_CHECKING:
    from ampmeter.ledgers.redis import RedisLedger

__all__ = ["InMemoryLedger", "Ledger", "LedgerUnavailable", "RedisLedger", "Reservation"]


def __getattr__(name: str) -> Any:
    if name == "RedisLedger":
        from ampmeter.ledgers.redis import RedisLedger

        return RedisLedger
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
