"""The ledger interface: reservations and spend of one budget scope, shared by every backend."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType, TracebackType

from ampmeter.errors import BudgetUnavailable

__all__ = ["Ledger", "LedgerUnavailable", "Reservation"]

# How long a settled (committed or released) reservation id is remembered, so that a repeated
# commit or release of it is recognised and ignored.
SETTLED_KEEP_S = 86_400.0


LedgerUnavailable = BudgetUnavailable
"""The name ledger backends have always raised: the same class as :class:`BudgetUnavailable`."""


@dataclass(frozen=True, slots=True)
class Reservation:
    """A hold on part of a budget, returned by :meth:`Ledger.reserve`.

    ``amounts`` is a read-only copy of what was reserved. ``expires_at`` is the lease end in
    Unix seconds (the Redis server's clock for :class:`RedisLedger`), or None when the
    reservation never expires.
    """

    id: str
    amounts: Mapping[str, float]
    expires_at: float | None


class Ledger(ABC):
    """Reservations and spend for one budget scope (a run, a tenant, a day).

    Every backend has the same semantics:

    * :meth:`reserve` atomically checks, for every key ``k`` of ``ceilings``, that
      ``spent[k] + reserved[k] + amounts.get(k, 0)`` is not *strictly greater* than
      ``ceilings[k]``; if any key would be, nothing changes and None is returned.
      Otherwise the amounts are added to ``reserved``.
    * :meth:`commit` replaces a reservation by the actual spend; :meth:`release` returns it
      unused. Both are idempotent per reservation id.
    * Reservations past their lease are returned to the pool inside every reserve, commit and
      release (atomically), so a crashed worker cannot hold budget forever.
    """

    scope: str

    @abstractmethod
    def reserve(
        self, amounts: Mapping[str, float], ceilings: Mapping[str, float]
    ) -> Reservation | None:
        """Reserve ``amounts`` unless a ceiling would be exceeded (then None, nothing changed)."""

    @abstractmethod
    def commit(self, reservation: Reservation, actual: Mapping[str, float]) -> None:
        """Replace ``reservation`` by the ``actual`` spend.

        An expired or unknown reservation still adds ``actual`` (the money was spent) but is not
        subtracted from ``reserved`` a second time. A second commit of the same id does nothing.
        """

    @abstractmethod
    def release(self, reservation: Reservation) -> None:
        """Return ``reservation`` unused (the call was not made); repeated calls do nothing."""

    @abstractmethod
    def spent(self) -> dict[str, float]:
        """The committed spend per key."""

    @abstractmethod
    def reserved(self) -> dict[str, float]:
        """The amounts currently held by live reservations, per key (empty when none)."""

    def close(self) -> None:  # noqa: B027 - a no-op default is right for in-process ledgers
        """Release the backend's resources (connections); the ledger is unusable afterwards."""

    def __enter__(self) -> Ledger:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def check_amounts(values: object, what: str, *, allow_negative: bool = False) -> dict[str, float]:
    """Return ``values`` as a fresh ``{str: float}`` dict, or raise naming what is wrong.

    Values must be finite numbers (``ValueError`` otherwise) and, unless ``allow_negative``,
    ``>= 0``. Keys must be non-empty strings; values must be int or float (not bool).
    """
    if not isinstance(values, Mapping):
        raise TypeError(f"{what} must be a mapping of str to number, got {type(values).__name__}")
    checked: dict[str, float] = {}
    for key, value in values.items():
        if not isinstance(key, str) or not key:
            raise TypeError(f"{what} keys must be non-empty strings, got {key!r}")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{what}[{key!r}] must be a number, got {type(value).__name__}")
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
        raise TypeError(f"expected a Reservation, got {type(reservation).__name__}")
    return reservation


def check_scope(scope: object) -> str:
    """Return ``scope`` if it is a non-empty string, else raise."""
    if not isinstance(scope, str):
        raise TypeError(f"scope must be a str, got {type(scope).__name__}")
    if not scope:
        raise ValueError("scope must be a non-empty string")
    return scope


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
