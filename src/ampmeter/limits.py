"""Limits on stats keys, and checking them.

A limit is exceeded when a value is *strictly greater* than its ``max_value``. Limits are checked
in list order, counters before gauges, and the first match wins. A key that was never written
(nor reserved by a call in flight) cannot exceed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Final

from ampmeter.keys import (
    KEY_FORMAT_PARSE_ERROR_CONSECUTIVE,
    KEY_ITERATIONS,
    KEY_TOOLCHAIN_PARSE_ERROR_CONSECUTIVE,
)
from ampmeter.stats import ExecutionStats

__all__ = ["ExceededLimit", "Limit", "LimitType", "check_limits", "default_limits"]

_NO_PENDING: Final[Mapping[str, float]] = {}


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
    """A threshold on a stats key: exceeded when a matching value is greater than ``max_value``."""

    key: str
    max_value: float
    type: LimitType = LimitType.EXACT

    def __post_init__(self) -> None:
        if not isinstance(self.key, str):
            raise TypeError(f"Limit key must be a str, got {type(self.key).__name__}")
        if not self.key:
            raise ValueError("Limit key must not be empty")
        value = self.max_value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"Limit max_value must be a number, got {type(value).__name__}")
        if math.isnan(value):
            raise ValueError(f"Limit max_value for {self.key!r} must not be NaN")
        object.__setattr__(self, "max_value", float(value))
        try:
            object.__setattr__(self, "type", LimitType(self.type))
        except ValueError:
            raise ValueError(f"Limit type must be 'exact' or 'prefix', got {self.type!r}") from None

    def matches(self, key: str) -> bool:
        """Whether ``key`` is one this limit watches."""
        if self.type is LimitType.EXACT:
            return key == self.key
        return key.startswith(self.key)

    def describe(self) -> str:
        """``amp:cost > 1.0`` style text for messages."""
        star = "*" if self.type is LimitType.PREFIX else ""
        return f"{self.key}{star} > {_num(self.max_value)}"


@dataclass(frozen=True, slots=True)
class ExceededLimit:
    """Which limit was exceeded, by which key (the full key for a prefix limit), at what value."""

    limit: Limit
    key: str
    value: float

    def __str__(self) -> str:
        return f"limit exceeded: {self.key} = {_num(self.value)} > {_num(self.limit.max_value)}"


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def default_limits() -> list[Limit]:
    """100 iterations, 3 consecutive format parse errors, 3 consecutive toolchain parse errors."""
    return [
        Limit(KEY_ITERATIONS, 100),
        Limit(KEY_FORMAT_PARSE_ERROR_CONSECUTIVE, 3),
        Limit(KEY_TOOLCHAIN_PARSE_ERROR_CONSECUTIVE, 3),
    ]


def check_limits(
    stats: ExecutionStats,
    limits: Sequence[Limit],
    pending: Mapping[str, float] | None = None,
) -> ExceededLimit | None:
    """The first limit that ``stats`` exceeds, or None.

    Values include usage reserved by calls in flight, plus ``pending`` (the reservation of a call
    about to start), so a check before a call asks "would this call break a limit?".
    """
    with stats.lock:
        return check_limits_locked(stats, limits, pending or _NO_PENDING)


def check_limits_locked(
    stats: ExecutionStats, limits: Sequence[Limit], pending: Mapping[str, float]
) -> ExceededLimit | None:
    """:func:`check_limits` for a caller that already holds ``stats.lock``."""
    # Imported here: the compiled check imports this module's types at its own import.
    from ampmeter._limit_check import check_plan_locked, compile_limits

    return check_plan_locked(stats, compile_limits(limits), dict(pending))
