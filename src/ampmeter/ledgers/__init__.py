"""Budget ledgers: reservations and spend of budget scopes, in-process, in SQLite or in Redis.

``RedisLedger`` is imported lazily, so the package works without the ``redis`` extra. A ledger
another process can reach declares how in a :class:`Reach` given to :func:`register` (see
:mod:`ampmeter.ledgers.reach`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ampmeter._lazy import lazy_names
from ampmeter.ledgers.base import (
    BudgetView,
    Committed,
    Ledger,
    LedgerUnavailable,
    PausedCall,
    Refusal,
    Reservation,
    UnsettledHold,
)
from ampmeter.ledgers.reach import Reach, register
from ampmeter.ledgers.sqlite import InMemoryLedger, SqliteLedger

if TYPE_CHECKING:
    from ampmeter.ledgers.redis import RedisLedger

__all__ = [
    "BudgetView",
    "Committed",
    "InMemoryLedger",
    "Ledger",
    "LedgerUnavailable",
    "PausedCall",
    "Reach",
    "RedisLedger",
    "Refusal",
    "Reservation",
    "SqliteLedger",
    "UnsettledHold",
    "register",
]

__getattr__ = lazy_names(__name__, {"RedisLedger": "ampmeter.ledgers.redis"})
