"""What a ledger hands out (:class:`Reservation`, :class:`Refusal`, :class:`BudgetView`) and
the rules every backend applies inside its atomic reserve: which ceilings refuse first, how
kept ceilings join the caller's, how they tighten."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from ampmeter.ledgers._amounts import (
    Amount,
    Limits,
    Units,
    check_scope,
    root_of,
    scope_path,
    to_amount,
)

__all__ = [
    "SETTLED_ID",
    "BudgetView",
    "PausedCall",
    "Refusal",
    "Reservation",
    "check_reservation",
    "first_refusal",
    "held_reservation",
    "held_scopes",
    "kept_limits",
    "tightened",
]


@dataclass(frozen=True)  # no slots: the renewal thread refers to it weakly
class Reservation:
    """A hold on part of a budget, returned by :meth:`Ledger.try_reserve`.

    ``amounts`` is a read-only copy of what was reserved (Decimal dollars for money keys, ints
    for the rest). ``expires_at`` is the lease end in Unix seconds when it was granted (the
    Redis server's clock for ``RedisLedger``; renewal moves it on in the ledger, not here), or
    None when the reservation never expires. ``scopes`` are the scopes it holds at, the
    reserving one first (empty for a reservation built by hand: it then counts at the scope
    of the ledger that settles it).
    """

    id: str
    amounts: Mapping[str, Amount]
    expires_at: float | None
    scopes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why :meth:`Ledger.try_reserve` held nothing: the ceiling ``key`` of ``scope`` refused.

    ``spent`` and ``reserved`` are that scope's totals for ``key`` when the ledger refused,
    ``amount`` what was asked and ``ceiling`` the ceiling (Decimal dollars for money keys).
    When what is spent alone leaves room at *every* scope the reserve checked, the ledger
    names a ceiling broken only by reservations in flight: :attr:`busy` is then True (waiting
    for them may help); otherwise it names a scope where ``spent + amount`` is over.
    ``paused`` is True when an operator paused ``scope`` (the reserving one or one above it;
    ``key`` is then None). ``scope`` and ``key`` are None when the reservation id had been
    settled already (nothing to wait for).
    """

    scope: str | None
    key: str | None
    spent: Amount = 0
    reserved: Amount = 0
    amount: Amount = 0
    ceiling: Amount = 0
    window_s: float | None = None
    """Set when a sliding window refused (``spent`` is then what was committed in it)."""
    paused: bool = False

    @property
    def busy(self) -> bool:
        """True when only reservations in flight stand in the way (``spent + amount`` fits)."""
        return self.key is not None and self.spent + self.amount <= self.ceiling

    @property
    def value(self) -> Amount:
        """What the refused ceiling would have counted: ``spent + reserved + amount``."""
        return self.spent + self.reserved + self.amount

    @classmethod
    def of_units(cls, scope: str, key: str, *units: int, window_s: float | None = None) -> Refusal:
        """A refusal from the stored units (see :mod:`ampmeter.ledgers._amounts`) of ``spent``,
        ``reserved``, ``amount`` and ``ceiling``, in that order."""
        spent, reserved, amount, ceiling = (to_amount(key, value) for value in units)
        return cls(scope, key, spent, reserved, amount, ceiling, window_s)


SETTLED_ID = Refusal(None, None)
"""The refusal of a reserve whose reservation id was settled already."""


@dataclass(frozen=True, slots=True)
class PausedCall:
    """A call paused at a cap (``on_exhausted="pause"``), as its context notes it in the ledger
    so that an operator sees it (``ampmeter budget show``): the ``key`` whose ceiling stopped
    it, the context's own ``cap`` on it (Decimal dollars for money keys), the ``context``'s
    name, and since when (Unix seconds). The note lasts until ``until`` unless its context
    renews it, so a process that died while paused leaves none behind."""

    id: str
    key: str
    cap: Amount
    context: str
    since: float
    until: float


@dataclass(frozen=True, slots=True)
class BudgetView:
    """What :meth:`Ledger.show` reports of one scope (money in Decimal dollars).

    ``spent`` includes ``unsettled``: holds whose lease ran out unsettled, charged at their
    reserved amount because their requests may have been billed. ``paused_by`` is the scope
    whose pause stops this one (itself or one above it), else None. ``paused_calls`` are the
    calls paused at a cap on this scope now (see :class:`PausedCall`).
    """

    scope: str
    spent: Mapping[str, Amount]
    reserved: Mapping[str, Amount]
    unsettled: Mapping[str, Amount]
    ceilings: Mapping[str, Amount]
    paused_by: str | None
    paused_calls: tuple[PausedCall, ...] = ()

    @property
    def paused(self) -> bool:
        """True when this scope admits nothing (it or an enclosing scope is paused)."""
        return self.paused_by is not None


@dataclass(frozen=True, slots=True)
class UnsettledHold:
    """A hold whose lease ran out unsettled and that was charged at its reserved amount
    (money in Decimal dollars): its reservation ``id``, its ``amounts`` and the ``scopes`` it
    held (its own first). It stays one until its commit or release comes, or for a day."""

    id: str
    amounts: Mapping[str, Amount]
    scopes: tuple[str, ...]


def first_refusal(
    limits: Limits, amounts: Units, totals: Callable[[str], tuple[Units, Units]]
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
            amount = amounts.get(key, 0)
            used = spent.get(key, 0)
            held = reserved.get(key, 0)
            if used + held + amount > ceiling:
                refusal = Refusal.of_units(scope, key, used, held, amount, ceiling)
                if used + amount > ceiling:
                    return refusal
                busy = busy or refusal
    return busy


def kept_limits(own: str, limits: Limits, stored: Callable[[str], Units]) -> Limits:
    """``limits`` with the ceilings the ledger keeps (``stored(scope)``) of ``own`` and of
    every scope above it: the tighter of each pair. A scope with kept ceilings is held at even
    when the caller did not name it, so everything reserved below it counts there."""
    merged: Limits = {}
    for scope in scope_path(own):
        kept = stored(scope)
        given = limits.get(scope)
        if given is None and not kept and scope != own:
            continue
        merged[scope] = tightened(given or {}, kept, True)
    return merged


def tightened(kept: Units, ceilings: Units, tighten: bool) -> Units:
    """The ceilings kept after writing ``ceilings`` over ``kept`` (only lower when ``tighten``)."""
    result = dict(kept)
    for key, ceiling in ceilings.items():
        if not tighten or key not in result or ceiling < result[key]:
            result[key] = ceiling
    return result


def check_reservation(reservation: object) -> Reservation:
    """Return ``reservation`` if it is a :class:`Reservation`, else raise ``TypeError``."""
    if not isinstance(reservation, Reservation):
        raise TypeError(
            f"expected a Reservation or a reservation id, got {type(reservation).__name__}"
        )
    return reservation


def held_scopes(own: str, reservation: Reservation) -> tuple[str, ...]:
    """The scopes ``reservation`` holds at (``own``, a ledger's scope, for one built by hand),
    or ``ValueError`` when one is outside ``own``'s tree."""
    scopes = reservation.scopes or (own,)
    root = root_of(own)
    for scope in scopes:
        if scope != own and root_of(check_scope(scope)) != root:
            raise ValueError(
                f"reservation {reservation.id!r} holds scope {scope!r}, outside the tree "
                f"{root!r} of this ledger"
            )
    return scopes


def held_reservation(
    reservation_id: str, amounts: Units, expires_at: float | None, scopes: tuple[str, ...]
) -> Reservation:
    """The :class:`Reservation` of stored ``amounts`` (zeros kept: a held key counts)."""
    public = {key: to_amount(key, value) for key, value in amounts.items()}
    return Reservation(reservation_id, MappingProxyType(public), expires_at, scopes)
