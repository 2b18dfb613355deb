"""What a ledger implements to keep budgets somewhere: a few atomic steps on stored units.

:class:`~ampmeter.ledgers.Ledger` does the rest (argument checks, dollars, idempotence, leases,
the journal); ``docs/shared-budgets.md`` says how a new ledger is added. Each step is atomic
against every other process sharing the store. Notes (:mod:`ampmeter.ledgers._notes`) carry
pauses, raise marks, paused calls and claims, so a backend keeps them as plain text by name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Literal

from ampmeter.ledgers._amounts import HoldRequest, Units, check_scope, root_of

if TYPE_CHECKING:
    from ampmeter.ledgers._journal import Settlement
    from ampmeter.ledgers._rules import Refusal, Reservation

__all__ = ["Backend", "Which"]

Which = Literal["spent", "reserved", "unsettled", "ceilings"]
"""What :meth:`Backend._backend_read` reads of a scope."""


class Backend(ABC):
    """The steps a ledger's store takes; ``scope`` is the scope the ledger is bound to."""

    scope: str

    @abstractmethod
    def _backend_reserve(self, request: HoldRequest) -> Reservation | Refusal:
        """One atomic reserve (see :meth:`Ledger.try_reserve`). ``request.limits`` lists the own
        scope first, and the backend adds the kept ceilings with :func:`kept_limits`; the windows
        apply at the own scope. A scope of the path with the note ``_notes.PAUSE`` refuses
        first, then a settled id with :data:`SETTLED_ID`, a ceiling as :func:`first_refusal`
        names it, a window after every ceiling fits. A taken hold remembers ``request.charge``:
        whether its expiry charges it."""

    @abstractmethod
    def _backend_recent(self, scope: str, key: str, window_s: float) -> int:
        """What was committed of ``key`` at ``scope`` in the last ``window_s`` seconds."""

    @abstractmethod
    def _backend_settle(self, settlement: Settlement) -> Units | None:
        """One atomic commit of ``settlement.actual`` at its scopes (see :meth:`Ledger.commit`),
        or release (a tombstone for an id never reserved: see :meth:`Ledger.release`). A commit
        whose idempotency key was seen at its own scope (the first) returns the first
        settlement's amounts; otherwise None."""

    @abstractmethod
    def _backend_renew(self, reservation_ids: list[str]) -> set[str]:
        """Renew the live ones of ``reservation_ids``; return those that were live."""

    @abstractmethod
    def _backend_read(self, which: Which, scope: str) -> Units:
        """The ``spent``, ``reserved`` or ``unsettled`` amounts of ``scope``, or the
        ``ceilings`` kept for it."""

    @abstractmethod
    def _backend_unsettled_holds(self) -> list[tuple[str, Units, tuple[str, ...]]]:
        """Every hold of this scope tree charged as unsettled now (after ending the holds
        whose lease ran out), as ``(id, amounts, scopes)``."""

    @abstractmethod
    def _backend_set_ceilings(self, scope: str, ceilings: Units, tighten: bool) -> Units:
        """Atomically write ``ceilings`` for ``scope`` (see :func:`tightened`); all kept now."""

    @abstractmethod
    def _backend_notes(self, scope: str) -> dict[str, str]:
        """The notes kept for ``scope``: name -> text."""

    @abstractmethod
    def _backend_set_note(
        self, scope: str, name: str, value: str | None, *, first: bool = False
    ) -> bool:
        """Atomically keep the note ``name`` of ``scope`` as ``value`` (a non-empty text; None
        drops it); with ``first``, only if there is no such note yet. True if it was written."""

    @abstractmethod
    def _backend_known(self, scope: str) -> bool:
        """Whether anything is kept for ``scope`` or a scope below it."""

    def _backend_close(self) -> None:  # noqa: B027 - a no-op default is right in-process
        """Release connections; the ledger is unusable afterwards."""

    def _readable(self, scope: str | None) -> str:
        """``scope`` checked and in this ledger's tree (None: the ledger's own)."""
        if scope is None:
            return self.scope
        name = check_scope(scope)
        if root_of(name) != root_of(self.scope):
            raise ValueError(f"scope {name!r} is outside the tree {root_of(self.scope)!r}")
        return name
