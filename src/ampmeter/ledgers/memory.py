"""The in-process ledger: the SQLite ledger's own tables and statements, in this process's memory.

It keeps the same semantics as a shared ledger by being the same code (see
:class:`~ampmeter.ledgers.sqlite.SqlLedger`); only where the tables live differs. No other
process can reach it, so it has no journal and no hand-off.
"""

from __future__ import annotations

from ampmeter.ledgers._sqlite_file import MemoryDatabase
from ampmeter.ledgers.base import ExpiredHold
from ampmeter.ledgers.sqlite import SqlLedger

__all__ = ["InMemoryLedger"]


class InMemoryLedger(SqlLedger):
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
        super().__init__(
            scope,
            MemoryDatabase(),
            lease_s=lease_s,
            journal=None,
            on_expired_hold=on_expired_hold,
            handoff_key=handoff_key,
        )
