"""Limits on stats keys, and checking them.

A limit is exceeded when a value is *strictly greater* than its ``max_value``. Limits are checked
in list order, counters before gauges, and the first match wins. A key that was never written
(nor reserved by a call in flight) cannot exceed. Warnings, soft limits and windows are done
by :mod:`ampmeter.policies`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from ampmeter import _validate, money
from ampmeter.keys import (
    KEY_COST,
    KEY_FORMAT_PARSE_ERROR_CONSECUTIVE,
    KEY_ITERATIONS,
    KEY_RETRIES,
    KEY_STEPS,
    KEY_TOOLCHAIN_PARSE_ERROR_CONSECUTIVE,
    is_money,
)

__all__ = [
    "DerivedCeiling",
    "ExceededLimit",
    "Limit",
    "LimitType",
    "context_limits",
    "default_limits",
]


class LimitType(str, Enum):
    """How a limit's key matches stats keys."""

    EXACT = "exact"
    """Only the key itself."""
    PREFIX = "prefix"
    """Every key that starts with it (``amp:input_tokens:`` = each model on its own)."""

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class Limit:
    """A threshold on a stats key: exceeded when a matching value is greater than ``max_value``.

    ``warn_at`` (fractions of ``max_value`` in (0, 1]) reports each fraction once as it is
    reached, to the context's ``on_limit_event``. A ``soft`` limit refuses nothing: once
    exceeded it sets ``ctx.wrap_up``. With ``window_s`` only what was used in the last
    ``window_s`` seconds counts (an exact key; shared through the context's ledger when it has
    one, so processes on one budget share the window).
    """

    key: str
    max_value: Any
    type: LimitType = LimitType.EXACT
    warn_at: tuple[float, ...] = ()
    soft: bool = False
    window_s: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.key, str):
            raise TypeError(f"Limit key must be a str, got {type(self.key).__name__}")
        if not self.key:
            raise ValueError("Limit key must not be empty")
        # The one check of a limit's maximum (money, whole counts, or any finite number for
        # the caller's own keys, whose gauges may go below zero).
        what = f"Limit max_value for {self.key!r}"
        value = _validate.limit_max(self.key, self.max_value, what)
        object.__setattr__(self, "max_value", value)
        try:
            object.__setattr__(self, "type", LimitType(self.type))
        except ValueError:
            raise ValueError(f"Limit type must be 'exact' or 'prefix', got {self.type!r}") from None
        object.__setattr__(
            self, "warn_at", warn_fractions(self.warn_at, f"warn_at of {self.key!r}")
        )
        if not isinstance(self.soft, bool):
            raise TypeError(f"Limit soft must be a bool, got {type(self.soft).__name__}")
        if self.window_s is not None:
            window = _validate.number(self.window_s, f"Limit window_s for {self.key!r}")
            if window <= 0:
                raise ValueError(f"Limit window_s for {self.key!r} must be > 0, got {window}")
            if self.type is LimitType.PREFIX:
                raise ValueError(f"a windowed limit watches one exact key, not prefix {self.key!r}")
            if self.soft:
                raise ValueError(f"Limit {self.key!r}: a windowed limit cannot also be soft")
            object.__setattr__(self, "window_s", window)

    @property
    def internal_max(self) -> Any:
        """``max_value`` as the kernel counts the key: whole nano-dollars for money."""
        if is_money(self.key):
            return money.to_nano(self.max_value, allow_negative=True)
        return self.max_value

    @property
    def is_ceiling(self) -> bool:
        """Whether this is a plain hard ceiling on the running total (not soft, not windowed):
        the kind the check before each call and the shared ledgers enforce."""
        return not self.soft and self.window_s is None

    def matches(self, key: str) -> bool:
        """Whether ``key`` is one this limit watches."""
        if self.type is LimitType.EXACT:
            return key == self.key
        return key.startswith(self.key)

    def describe(self) -> str:
        """``amp:cost > 1.0`` style text for messages."""
        star = "*" if self.type is LimitType.PREFIX else ""
        window = "" if self.window_s is None else f" per {_num(self.window_s)}s"
        soft = " (soft)" if self.soft else ""
        top = _shown(self.key, self.max_value)
        return f"{self.key}{star} > {top}{window}{soft}"


def warn_fractions(value: object, name: str) -> tuple[float, ...]:
    """``value`` as sorted, distinct warning fractions, each in (0, 1]; errors name ``name``."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (tuple, list)):
        raise TypeError(f"{name} must be a tuple of fractions, got {type(value).__name__}")
    fractions = []
    for item in value:
        fraction = _validate.number(item, name)
        if not 0 < fraction <= 1 or math.isnan(fraction):
            raise ValueError(f"{name} fractions must be in (0, 1], got {item!r}")
        fractions.append(fraction)
    return tuple(sorted(set(fractions)))


@dataclass(frozen=True, slots=True)
class ExceededLimit:
    """Which limit was exceeded, by which key (the full key for a prefix limit), at what value.

    ``note`` says which policy stopped the call when it was not the plain limit (``"loop
    detected"``, ``"final-answer reserve"``, ...).
    """

    limit: Limit
    key: str
    value: Any
    note: str = ""

    def __str__(self) -> str:
        head = self.note or "limit exceeded"
        value, top = _shown(self.key, self.value), _shown(self.key, self.limit.max_value)
        return f"{head}: {self.key} = {value} > {top}"


@dataclass(frozen=True, slots=True)
class DerivedCeiling:
    """A ceiling a policy derives from a limit for one check (a final-answer reserve lowers it,
    a window raises it by what has left the window): a refusal names ``limit``, with the
    kernel's value less ``offset``, and ``note``."""

    limit: Limit
    offset: Any
    note: str


def _shown(key: str, value: Any) -> str:
    """A limit's value as a person writes it: money as dollars (``$0.05``), counts plainly."""
    return money.format_usd(value) if is_money(key) else _num(value)


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def default_limits() -> list[Limit]:
    """100 iterations, 3 consecutive format parse errors, 3 consecutive toolchain parse errors."""
    return [
        Limit(KEY_ITERATIONS, 100),
        Limit(KEY_FORMAT_PARSE_ERROR_CONSECUTIVE, 3),
        Limit(KEY_TOOLCHAIN_PARSE_ERROR_CONSECUTIVE, 3),
    ]


def exceeded(hit: tuple[object, str, Any]) -> ExceededLimit:
    """The kernel's answer ``(limit, key, value)`` as an :class:`ExceededLimit` (money back in
    dollars)."""
    found, key, value = hit
    note = ""
    if isinstance(found, DerivedCeiling):
        value, note = value - found.offset, found.note
        found = found.limit
    assert isinstance(found, Limit)
    if is_money(key):
        value = money.from_nano(value)
    return ExceededLimit(found, key, value, note)


def context_limits(
    limits: Sequence[Limit] | None,
    max_cost_usd: object,
    max_steps: object,
    max_retries: object,
) -> tuple[Limit, ...]:
    """A context's own limits: ``limits`` and the shortcuts, checked."""
    built: list[Limit] = []
    if limits is not None:
        if isinstance(limits, Limit) or not isinstance(limits, Iterable):
            raise TypeError("limits must be a list of Limit")
        for limit in limits:
            if not isinstance(limit, Limit):
                raise TypeError(f"limits must hold Limit objects, got {type(limit).__name__}")
            built.append(limit)
    for key, value, what in (
        (KEY_COST, max_cost_usd, "max_cost_usd"),
        (KEY_STEPS, max_steps, "max_steps"),
        (KEY_RETRIES, max_retries, "max_retries"),
    ):
        if value is not None:
            built.append(Limit(key, _validate.limit_max(key, value, what)))
    return tuple(built)
