"""Argument checks of the ledger API, and its amounts in the units the backends store.

The public API speaks dollars for money keys (:func:`ampmeter.keys.is_money`): a Decimal,
float, int or numeric string in, a :class:`~decimal.Decimal` out. Every other key counts whole
things (tokens, calls) as ints. Backends store both as integers: money in nano-dollars (see
:mod:`ampmeter.money`), counts as they are, so every backend adds exactly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import NamedTuple, TypeAlias

from ampmeter import _validate
from ampmeter.keys import is_money
from ampmeter.money import NANO_PER_USD, from_nano, to_nano, usd

__all__ = [
    "MAX_UNITS",
    "Amount",
    "AmountIn",
    "HoldRequest",
    "Limits",
    "Units",
    "Windows",
    "amounts_out",
    "check_amounts",
    "check_ancestors",
    "check_key",
    "check_reservation_id",
    "check_scope",
    "check_seconds",
    "check_segment",
    "check_windows",
    "raised_ceiling",
    "root_of",
    "scope_path",
    "to_amount",
]

Amount: TypeAlias = Decimal | int
"""An amount the ledger API returns: Decimal dollars for money keys, an int for the rest."""

AmountIn: TypeAlias = Decimal | float | int | str
"""An amount the ledger API takes: dollars for money keys (floats read as written), else a
whole number."""

Units: TypeAlias = dict[str, int]
"""Amounts as the backends keep them: nano-dollars for money keys, counts for the rest."""

Limits: TypeAlias = dict[str, Units]
"""Ceilings per scope, the reserving scope first: ``{scope: {key: max}}``, in units."""

MAX_UNITS = 2**63 - 1  # what SQLite and Redis integers hold: the most one amount may be
_MAX_CEILING_USD = Decimal(MAX_UNITS) / NANO_PER_USD

Windows: TypeAlias = tuple[tuple[str, float, int], ...]
"""Sliding-window ceilings at the reserving scope: ``((key, window_s, max), ...)``."""


class HoldRequest(NamedTuple):
    """One checked reserve as a backend takes it."""

    reservation_id: str
    amounts: Units
    """What to hold at every scope of the path, in units."""
    limits: Limits
    """The ceilings per scope, the reserving scope first."""
    windows: Windows
    """Sliding-window ceilings at the reserving scope."""
    charge: bool
    """Whether the hold's lease running out charges it (else releases it)."""


def to_units(key: str, value: object, what: str, *, ceiling: bool = False) -> int:
    """``value`` of ``key`` in stored units, or raise naming ``what``.

    Money is rounded to the nearest nano-dollar. A count must be a whole number, except a
    ceiling, which is rounded down: counts are whole, so ``n > 2.5`` and ``n > 2`` agree.
    Only a ceiling may be negative (it then refuses everything).
    """
    if is_money(key):
        if isinstance(value, str):  # (dollars as text: a note the ledger wrote, read back)
            value = usd(value, what, allow_negative=ceiling)
        if ceiling:
            # A ceiling past what can be counted (2^63 n$) is no ceiling: it never refuses.
            dollars = usd(value, what, allow_negative=True)
            if abs(dollars) > _MAX_CEILING_USD:
                return MAX_UNITS if dollars > 0 else -MAX_UNITS
        return to_nano(value, what, allow_negative=ceiling)
    if type(value) is int:  # a count as most callers give it: nothing to convert
        number = value
    elif isinstance(value, bool) or not isinstance(value, (int, float, Decimal)):
        raise TypeError(f"{what} must be a number, got {type(value).__name__}")
    elif not (value.is_finite() if isinstance(value, Decimal) else math.isfinite(value)):
        raise ValueError(f"{what} must be finite, got {value!r}")
    else:
        number = math.floor(value)  # exact for ints and Decimals
        if number != value and not ceiling:
            raise ValueError(f"{what} counts whole things, got {value!r}")
    if number < 0 and not ceiling:
        raise ValueError(f"{what} must be >= 0, got {value!r}")
    if abs(number) > MAX_UNITS:
        if not ceiling:
            raise ValueError(f"{what} is too large to count: {value!r}")
        return MAX_UNITS if number > 0 else -MAX_UNITS
    return number


def raised_ceiling(key: str, value: object) -> int:
    """An operator's new ceiling of ``key`` (:meth:`~ampmeter.ledgers.Ledger.set_ceiling`) in
    units, checked as a limit's maximum is wherever one is set (the same refusals, the same
    words as ``ExecutionContext.raise_limit``); a string of dollars is read as written."""
    what = f"new maximum for {key!r}"
    if isinstance(value, str) and is_money(key):
        value = usd(value, what)
    return to_units(key, _validate.limit_max(key, value, what), what, ceiling=True)


def to_amount(key: str, units: int) -> Amount:
    """Stored ``units`` of ``key`` as the API returns them."""
    return from_nano(units) if is_money(key) else units


def amounts_out(units: Mapping[str, int]) -> dict[str, Amount]:
    """Stored amounts as the API returns them, zeros left out."""
    return {key: to_amount(key, value) for key, value in units.items() if value}


def check_amounts(values: object, what: str, *, ceiling: bool = False) -> Units:
    """``values`` (``{key: amount}``) as a fresh dict of stored units, or raise naming what
    is wrong. Keys must be non-empty printable strings; see :func:`to_units` for values."""
    if type(values) is not dict and not isinstance(values, Mapping):
        raise TypeError(f"{what} must be a mapping of str to number, got {type(values).__name__}")
    checked: Units = {}
    for key, value in values.items():
        name = check_key(key, f"{what} key")
        checked[name] = to_units(name, value, f"{what}[{name!r}]", ceiling=ceiling)
    return checked


def check_key(key: object, what: str) -> str:
    """Return ``key`` if it is a non-empty printable string, else raise naming ``what``."""
    if not isinstance(key, str) or not key:
        raise TypeError(f"{what} must be a non-empty string, got {key!r}")
    if not key.isprintable():
        raise ValueError(f"{what} {key!r} must be printable (no control characters)")
    return key


def check_windows(windows: object) -> Windows:
    """``windows`` as ``((key, window_s, max), ...)`` in units, or raise naming what is wrong."""
    if isinstance(windows, (str, bytes, Mapping)) or not isinstance(windows, Sequence):
        raise TypeError(
            f"windows must be a sequence of (key, window_s, max), got {type(windows).__name__}"
        )
    checked: list[tuple[str, float, int]] = []
    for item in windows:
        if not isinstance(item, (tuple, list)) or len(item) != 3:
            raise TypeError(f"windows must hold (key, window_s, max) triples, got {item!r}")
        key, span, top = item
        name = check_key(key, "window key")
        seconds = check_seconds(span, f"window_s of {name!r}")
        checked.append(
            (name, seconds, to_units(name, top, f"window max of {name!r}", ceiling=True))
        )
    return tuple(checked)


def check_ancestors(own: str, ancestors: object) -> Limits:
    """``ancestors`` (``{scope: {key: max}}``, each scope enclosing ``own``) in units, or raise
    naming what is wrong."""
    if not isinstance(ancestors, Mapping):
        raise TypeError(
            f"ancestors must be a mapping of scope to ceilings, got {type(ancestors).__name__}"
        )
    checked: Limits = {}
    for scope, ceilings in ancestors.items():
        name = check_scope(scope)
        if not own.startswith(name + "/"):
            raise ValueError(f"ancestors: {name!r} does not enclose this ledger's scope {own!r}")
        checked[name] = check_amounts(ceilings, f"ancestors[{name!r}]", ceiling=True)
    return checked


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


def check_seconds(value: object, what: str) -> float:
    """Return ``value`` as a finite number of seconds > 0, else raise."""
    seconds = _validate.number(value, what)
    if seconds <= 0.0:
        raise ValueError(f"{what} must be a finite number of seconds > 0, got {value!r}")
    return seconds


def root_of(scope: str) -> str:
    """The first segment of a scope path: the tree every scope below it shares."""
    return scope.partition("/")[0]


def scope_path(scope: str) -> list[str]:
    """``scope`` and every scope enclosing it, nearest first (``a/b/c``, ``a/b``, ``a``)."""
    parts = scope.split("/")
    return ["/".join(parts[:n]) for n in range(len(parts), 0, -1)]
