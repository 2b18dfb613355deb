"""The ledger interface: reservations and spend of hierarchical budget scopes, for every backend.

:class:`Ledger` holds what every backend shares: argument checks, the idempotence rules, lease
renewal of this process's reservations and the journal of settlements the backend could not
take. A backend implements the few ``_backend_*`` methods, each one atomic step.
"""

from __future__ import annotations

import copy
import logging
import math
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType, TracebackType
from typing import Literal

from ampmeter.errors import BudgetUnavailable
from ampmeter.ledgers._journal import Journal, Settlement
from ampmeter.ledgers._renewal import Renewer

__all__ = ["Ledger", "LedgerUnavailable", "Refusal", "Reservation"]

# How long a settled (committed or released) reservation id is remembered, so that a repeated
# commit or release of it, or a reserve with it arriving late, is recognised and ignored.
SETTLED_KEEP_S = 86_400.0

# Pauses between the tries of a commit or release before it goes to the journal.
SETTLE_RETRY_PAUSES_S = (0.05, 0.2)

_log = logging.getLogger("ampmeter.ledgers")

LedgerUnavailable = BudgetUnavailable
"""The name ledger backends have always raised: the same class as :class:`BudgetUnavailable`."""

Limits = dict[str, dict[str, float]]
"""Ceilings per scope, the reserving scope first: ``{scope: {key: max}}``."""


@dataclass(frozen=True)  # no slots: the renewal thread refers to it weakly
class Reservation:
    """A hold on part of a budget, returned by :meth:`Ledger.reserve`.

    ``amounts`` is a read-only copy of what was reserved. ``expires_at`` is the lease end in
    Unix seconds when it was granted (the Redis server's clock for ``RedisLedger``; renewal
    moves it on in the ledger, not here), or None when the reservation never expires.
    ``scopes`` are the scopes it holds at, the reserving one first (empty for a reservation
    built by hand: it then counts at the scope of the ledger that settles it).
    """

    id: str
    amounts: Mapping[str, float]
    expires_at: float | None
    scopes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why :meth:`Ledger.try_reserve` held nothing: the ceiling ``key`` of ``scope`` refused.

    ``spent`` and ``reserved`` are that scope's totals for ``key`` when the ledger refused,
    ``amount`` what was asked and ``ceiling`` the ceiling. When what is spent alone leaves
    room at *every* scope the reserve checked, the ledger names a ceiling broken only by
    reservations in flight: :attr:`busy` is then True (waiting for them may help); otherwise
    it names a scope where ``spent + amount`` is over. ``scope`` and ``key`` are None when the
    reservation id had been settled already (nothing to wait for).
    """

    scope: str | None
    key: str | None
    spent: float = 0.0
    reserved: float = 0.0
    amount: float = 0.0
    ceiling: float = 0.0

    @property
    def busy(self) -> bool:
        """True when only reservations in flight stand in the way (``spent + amount`` fits)."""
        return self.key is not None and self.spent + self.amount <= self.ceiling

    @property
    def value(self) -> float:
        """What the refused ceiling would have counted: ``spent + reserved + amount``."""
        return self.spent + self.reserved + self.amount


SETTLED_ID = Refusal(None, None)
"""The refusal of a reserve whose reservation id was settled already."""


def first_refusal(
    limits: Limits,
    amounts: Mapping[str, float],
    totals: Callable[[str], tuple[Mapping[str, float], Mapping[str, float]]],
) -> Refusal | None:
    """The ceiling of ``limits`` a reserve of ``amounts`` breaks, or None if every one fits.

    ``totals(scope)`` gives that scope's ``(spent, reserved)``. A ceiling broken by what is
    spent alone is named before any broken only by reservations (see :class:`Refusal`).
    """
    busy: Refusal | None = None
    for scope, ceilings in limits.items():
        if not ceilings:
            continue
        spent, reserved = totals(scope)
        for key, ceiling in ceilings.items():
            amount = amounts.get(key, 0.0)
            used = spent.get(key, 0.0)
            held = reserved.get(key, 0.0)
            if used + held + amount > ceiling:
                refusal = Refusal(scope, key, used, held, amount, ceiling)
                if not refusal.busy:
                    return refusal
                busy = busy or refusal
    return busy


class Ledger(ABC):
    """Reservations and spend for a tree of budget scopes (``tenant-42/run-7/researcher``).

    A ledger is bound to one scope; :meth:`child` gives a ledger on the same backend for a
    scope below it. Every backend has the same semantics:

    * :meth:`reserve` atomically checks, for every scope it names (its own and ``ancestors``)
      and every key ``k`` of that scope's ceilings, that ``spent[k] + reserved[k] + amount``
      is not *strictly greater* than the ceiling; if any would be, nothing changes and None is
      returned. Otherwise the amounts are added to ``reserved`` at every one of those scopes.
      :meth:`try_reserve` is the same step, but a refusal says which ceiling refused and
      whether only reservations in flight were in the way (:class:`Refusal`).
    * :meth:`commit` replaces a reservation by the actual spend at each of its scopes;
      :meth:`release` returns it unused. Both are idempotent per reservation id, and a
      reservation id once settled can never be reserved again (a late reserve returns None).
    * Reservations carry a lease: past it they return to the pool inside every reserve,
      commit and release (atomically), so a crashed worker cannot hold budget forever. A
      daemon thread renews every third of the lease each unsettled reservation whose
      :class:`Reservation` this process still holds, so a call longer than the lease keeps
      its hold, while one dropped unsettled (leaked) comes back like a crashed worker's.
    * A commit or release the backend cannot take is retried briefly, then kept in a local
      journal and replayed (idempotent by id) at the next operation, :meth:`flush` or
      :meth:`close`: spend is never dropped, while new reservations fail closed.
    """

    scope: str
    _root_ledger: Ledger | None = None  # the ledger that owns the backend (None: this one)

    def __init__(self, scope: str, lease_s: float | None, journal: Journal | None) -> None:
        self.scope = check_scope(scope)
        self._lease_s = lease_s
        self._journal = journal
        self._renewer = Renewer(self._renew_ids, lease_s) if lease_s is not None else None

    # -- the public operations --------------------------------------------------------------

    def child(self, name: str) -> Ledger:
        """A ledger on the same backend (connection, journal, renewal) for ``scope/name``."""
        child = copy.copy(self)  # shares the backend, journal and renewer by reference
        child.scope = self.scope + "/" + check_segment(name)
        child._root_ledger = self._root_ledger or self
        return child

    def location(self) -> dict[str, object]:
        """Where another process finds this ledger's backend, without any secret (a hand-off
        token carries it). A ledger kept in this process has no such place: ``TypeError``."""
        raise TypeError(
            f"{type(self).__name__} lives in this process and cannot be shared with another; "
            "use SqliteLedger (one machine) or RedisLedger (many)"
        )

    def reserve(
        self,
        amounts: Mapping[str, float],
        ceilings: Mapping[str, float],
        *,
        ancestors: Mapping[str, Mapping[str, float]] | None = None,
        reservation_id: str | None = None,
    ) -> Reservation | None:
        """Reserve ``amounts`` at this scope and every scope in ``ancestors``, or return None.

        ``ceilings`` are this scope's (``{key: max}``), ``ancestors`` the ceilings of enclosing
        scopes (``{scope: {key: max}}``; an empty mapping holds and counts there unchecked).
        None means a ceiling would be exceeded, or ``reservation_id`` was already settled
        (committed, or released - also before it was ever reserved); nothing changed then.
        Reserving a live ``reservation_id`` again returns that reservation, holding once.
        Raises :class:`LedgerUnavailable` when the backend cannot be reached (fail closed); the
        request may still land later, so a caller that gave ``reservation_id`` should
        :meth:`release` it (without one, the ledger journals that release itself).
        """
        held = self.try_reserve(
            amounts, ceilings, ancestors=ancestors, reservation_id=reservation_id
        )
        return held if isinstance(held, Reservation) else None

    def try_reserve(
        self,
        amounts: Mapping[str, float],
        ceilings: Mapping[str, float],
        *,
        ancestors: Mapping[str, Mapping[str, float]] | None = None,
        reservation_id: str | None = None,
    ) -> Reservation | Refusal:
        """:meth:`reserve`, but a refusal comes back as a :class:`Refusal` naming the ceiling
        that refused and whether what is spent alone would have left room (``busy``)."""
        wanted = check_amounts(amounts, "amounts")
        limits: Limits = {self.scope: check_amounts(ceilings, "ceilings", allow_negative=True)}
        if ancestors is not None:
            limits.update(self._check_ancestors(ancestors))
        rid = uuid.uuid4().hex if reservation_id is None else check_reservation_id(reservation_id)
        if self._journal is not None and self._journal.pending:
            self._replay_journal(strict=True)
        try:
            held = self._backend_reserve(rid, wanted, limits)
        except LedgerUnavailable:
            if reservation_id is None:
                # The request may still reach the backend and hold what nobody could settle:
                # the caller never learns this id, so the ledger releases it itself.
                self._journal_release(rid)
            raise
        if (
            isinstance(held, Reservation)
            and held.expires_at is not None
            and self._renewer is not None
        ):
            self._renewer.track(held)
        return held

    def commit(self, reservation: Reservation, actual: Mapping[str, float]) -> None:
        """Replace ``reservation`` by the ``actual`` spend, added at each of its scopes.

        An expired or unknown reservation still adds ``actual`` (the money was spent) but is not
        subtracted from ``reserved`` a second time. A second commit of the same id does nothing.
        When the backend cannot be reached the commit is kept in the journal, replayed later,
        and :class:`LedgerUnavailable` says so.
        """
        held = check_reservation(reservation)
        cost = check_amounts(actual, "actual")
        scopes = self._scopes_of(held)
        self._settle(Settlement("commit", held.id, scopes, cost))

    def release(self, reservation: Reservation | str) -> None:
        """Return a reservation (or the id one was, or might have been, reserved with) unused.

        Repeated calls do nothing. Releasing an id never reserved leaves a tombstone: a reserve
        with that id that arrives later (one that timed out on the way) does nothing. When the
        backend cannot be reached the release is journaled like a commit.
        """
        if isinstance(reservation, str):
            rid = check_reservation_id(reservation)
        else:
            rid = check_reservation(reservation).id
        self._settle(Settlement("release", rid, (), {}))

    def renew(self, reservation: Reservation | str) -> bool:
        """Extend a live reservation's lease by the lease length from now; False if not live.

        A reservation without a lease is just checked for being live. This process's own
        reservations are renewed by a daemon thread; call this for one reserved elsewhere.
        """
        if isinstance(reservation, str):
            rid = check_reservation_id(reservation)
        else:
            rid = check_reservation(reservation).id
        self._replay_journal(strict=False)
        return rid in self._backend_renew([rid])

    def spent(self, scope: str | None = None) -> dict[str, float]:
        """The committed spend per key at ``scope`` (default: this ledger's)."""
        name = self._readable(scope)
        self._replay_journal(strict=False)  # journaled spend first, when the backend is back
        return self._backend_read("spent", name)

    def reserved(self, scope: str | None = None) -> dict[str, float]:
        """The amounts live reservations hold at ``scope`` (default: this ledger's), per key."""
        name = self._readable(scope)
        self._replay_journal(strict=False)
        return self._backend_read("reserved", name)

    def flush(self) -> None:
        """Replay the journal now; raises :class:`LedgerUnavailable` if the backend is down."""
        if self._journal is not None:
            self._journal.replay(self._apply_settlement)

    def close(self) -> None:
        """Replay what the journal holds if possible, stop renewing, release the backend.

        A child ledger shares its parent's backend and leaves it open. Whatever the journal
        cannot replay now stays on disk for the next ledger of this scope and backend.
        """
        if self._journal is not None:
            try:
                self.flush()
            except LedgerUnavailable as error:
                _log.warning("ledger %r closed with journaled settlements: %s", self.scope, error)
        if self._root_ledger is None:
            if self._renewer is not None:
                self._renewer.stop()
            self._backend_close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- what a backend implements ----------------------------------------------------------

    @abstractmethod
    def _backend_reserve(
        self, reservation_id: str, amounts: dict[str, float], limits: Limits
    ) -> Reservation | Refusal:
        """One atomic reserve (see :meth:`try_reserve`); ``limits`` lists the own scope first.
        A settled id is refused with :data:`SETTLED_ID`; a ceiling as :func:`first_refusal`
        names it."""

    @abstractmethod
    def _backend_commit(
        self, reservation_id: str, scopes: tuple[str, ...], actual: dict[str, float]
    ) -> None:
        """One atomic commit of ``actual`` at ``scopes`` (see :meth:`commit`)."""

    @abstractmethod
    def _backend_release(self, reservation_id: str) -> None:
        """One atomic release, leaving a tombstone for an id never reserved."""

    @abstractmethod
    def _backend_renew(self, reservation_ids: list[str]) -> set[str]:
        """Renew the live ones of ``reservation_ids``; return those that were live."""

    @abstractmethod
    def _backend_read(self, which: Literal["spent", "reserved"], scope: str) -> dict[str, float]:
        """The ``spent`` or ``reserved`` amounts of ``scope``."""

    def _backend_close(self) -> None:  # noqa: B027 - a no-op default is right in-process
        """Release connections; the ledger is unusable afterwards."""

    # -- shared machinery -------------------------------------------------------------------

    def _check_ancestors(self, ancestors: object) -> Limits:
        if not isinstance(ancestors, Mapping):
            raise TypeError(
                f"ancestors must be a mapping of scope to ceilings, got {type(ancestors).__name__}"
            )
        checked: Limits = {}
        for scope, ceilings in ancestors.items():
            name = check_scope(scope)
            if not self.scope.startswith(name + "/"):
                raise ValueError(
                    f"ancestors: {name!r} does not enclose this ledger's scope {self.scope!r}"
                )
            checked[name] = check_amounts(ceilings, f"ancestors[{name!r}]", allow_negative=True)
        return checked

    def _scopes_of(self, reservation: Reservation) -> tuple[str, ...]:
        scopes = reservation.scopes or (self.scope,)
        root = root_of(self.scope)
        for scope in scopes:
            if scope != self.scope and root_of(check_scope(scope)) != root:
                raise ValueError(
                    f"reservation {reservation.id!r} holds scope {scope!r}, outside the tree "
                    f"{root!r} of this ledger"
                )
        return scopes

    def _readable(self, scope: str | None) -> str:
        if scope is None:
            return self.scope
        name = check_scope(scope)
        if root_of(name) != root_of(self.scope):
            raise ValueError(f"scope {name!r} is outside the tree {root_of(self.scope)!r}")
        return name

    def _settle(self, settlement: Settlement) -> None:
        """Apply a commit or release with a few quick retries, else journal it and say so."""
        if self._renewer is not None:
            self._renewer.forget(settlement.reservation_id)
        journal = self._journal
        if journal is None:
            self._apply_settlement(settlement)
            return
        try:
            self._replay_journal(strict=True)  # fails fast while the backend is down
            for pause in (*SETTLE_RETRY_PAUSES_S, None):
                try:
                    self._apply_settlement(settlement)
                    return
                except LedgerUnavailable:
                    if pause is None:
                        raise
                    time.sleep(pause)
        except LedgerUnavailable as error:
            try:
                path = journal.append(settlement)
            except OSError as failed:
                raise LedgerUnavailable(
                    f"{error}; the {settlement.op} of reservation {settlement.reservation_id!r} "
                    f"could not be journaled in {journal.directory} either ({failed}): it is lost"
                ) from error
            if self._renewer is not None:
                self._renewer.ensure_running()  # replays it soon after the backend is back
            raise LedgerUnavailable(
                f"{error}; the {settlement.op} of reservation {settlement.reservation_id!r} is "
                f"kept in {path} and applied when the ledger is back"
            ) from error

    def _journal_release(self, reservation_id: str) -> None:
        if self._journal is None:
            return
        try:
            self._journal.append(Settlement("release", reservation_id, (), {}))
        except OSError as error:
            _log.warning("cannot journal the release of %r: %s", reservation_id, error)
            return
        if self._renewer is not None:
            self._renewer.ensure_running()

    def _apply_settlement(self, settlement: Settlement) -> None:
        if settlement.op == "commit":
            self._backend_commit(settlement.reservation_id, settlement.scopes, settlement.actual)
        else:
            self._backend_release(settlement.reservation_id)

    def _replay_journal(self, *, strict: bool) -> None:
        journal = self._journal
        if journal is None or not journal.pending:
            return
        try:
            journal.replay(self._apply_settlement)
        except LedgerUnavailable:
            if strict:
                raise

    def _renew_ids(self, reservation_ids: list[str]) -> set[str]:
        """The renewal thread's tick: replay a waiting journal, then renew (if any to renew)."""
        self._replay_journal(strict=False)
        return self._backend_renew(reservation_ids) if reservation_ids else set()


def root_of(scope: str) -> str:
    """The first segment of a scope path: the tree every scope below it shares."""
    return scope.partition("/")[0]


def check_amounts(values: object, what: str, *, allow_negative: bool = False) -> dict[str, float]:
    """Return ``values`` as a fresh ``{str: float}`` dict, or raise naming what is wrong.

    Values must be finite numbers (``ValueError`` otherwise) and, unless ``allow_negative``,
    ``>= 0``. Keys must be non-empty printable strings; values must be int or float (not bool).
    """
    # type() fast paths first: this runs on every reserve and commit
    if type(values) is not dict and not isinstance(values, Mapping):
        raise TypeError(f"{what} must be a mapping of str to number, got {type(values).__name__}")
    checked: dict[str, float] = {}
    for key, value in values.items():
        if not isinstance(key, str) or not key:
            raise TypeError(f"{what} keys must be non-empty strings, got {key!r}")
        if not key.isprintable():
            raise ValueError(f"{what} key {key!r} must be printable (no control characters)")
        kind = type(value)
        if (
            kind is not float
            and kind is not int
            and (isinstance(value, bool) or not isinstance(value, (int, float)))
        ):
            raise TypeError(f"{what}[{key!r}] must be a number, got {kind.__name__}")
        number = float(value)
        if not math.isfinite(number):
            raise ValueError(f"{what}[{key!r}] must be finite, got {number!r}")
        if number < 0.0 and not allow_negative:
            raise ValueError(f"{what}[{key!r}] must be >= 0, got {number!r}")
        checked[key] = number
    return checked


def check_reservation(reservation: object) -> Reservation:
    """Return ``reservation`` if it is a :class:`Reservation`, else raise ``TypeError``."""
    if not isinstance(reservation, Reservation):
        raise TypeError(
            f"expected a Reservation or a reservation id, got {type(reservation).__name__}"
        )
    return reservation


def check_reservation_id(reservation_id: object) -> str:
    """Return ``reservation_id`` if it is a usable id (1-200 printable characters), else raise."""
    if not isinstance(reservation_id, str):
        raise TypeError(
            f"expected a Reservation or a reservation id, got {type(reservation_id).__name__}"
        )
    if not 0 < len(reservation_id) <= 200 or not reservation_id.isprintable():
        raise ValueError(
            f"reservation id must be 1 to 200 printable characters, got {reservation_id!r}"
        )
    return reservation_id


def check_scope(scope: object) -> str:
    """Return ``scope`` if it is a scope path (``a/b/c``: non-empty segments), else raise."""
    if not isinstance(scope, str):
        raise TypeError(f"scope must be a str, got {type(scope).__name__}")
    if not scope:
        raise ValueError("scope must be a non-empty string")
    if not scope.isprintable() or "" in scope.split("/"):
        raise ValueError(f"scope {scope!r} must be '/'-separated non-empty printable names")
    return scope


def check_segment(name: object) -> str:
    """Return ``name`` if it can name a child scope (a non-empty name without '/'), else raise."""
    if not isinstance(name, str):
        raise TypeError(f"child scope name must be a str, got {type(name).__name__}")
    if not name or "/" in name or not name.isprintable():
        raise ValueError(
            f"child scope name must be non-empty and printable, without '/', got {name!r}"
        )
    return name


def check_seconds(value: object, what: str, *, optional: bool) -> float | None:
    """Return ``value`` as positive finite seconds (or None when ``optional``), else raise."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        allowed = "a number or None" if optional else "a number"
        raise TypeError(f"{what} must be {allowed}, got {type(value).__name__}")
    seconds = float(value)
    if not (0.0 < seconds < math.inf):
        raise ValueError(f"{what} must be a finite number of seconds > 0, got {value!r}")
    return seconds


def frozen(amounts: dict[str, float]) -> Mapping[str, float]:
    """A read-only view of ``amounts`` (which the caller must not change afterwards)."""
    return MappingProxyType(amounts)
