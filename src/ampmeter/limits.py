"""Limits on stats keys, and checking them.

A limit is exceeded when a value is *strictly greater* than its ``max_value``. Limits are checked
in list order, counters before gauges, and the first match wins. A key that was never written
(nor reserved by a call in flight) cannot exceed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from ampmeter import _validate
from ampmeter._kernel import LimitRow
from ampmeter.keys import (
    KEY_FORMAT_PARSE_ERROR_CONSECUTIVE,
    KEY_ITERATIONS,
    KEY_TOOLCHAIN_PARSE_ERROR_CONSECUTIVE,
)
from ampmeter.stats import ExecutionStats

__all__ = [
    "ExceededLimit",
    "Limit",
    "LimitType",
    "check_limits",
    "compile_limits",
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
    """A threshold on a stats key: exceeded when a matching value is greater than ``max_value``."""

    key: str
    max_value: float
    type: LimitType = LimitType.EXACT

    def __post_init__(self) -> None:
        if not isinstance(self.key, str):
            raise TypeError(f"Limit key must be a str, got {type(self.key).__name__}")
        if not self.key:
            raise ValueError("Limit key must not be empty")
        # Any finite number: a gauge can go below zero, so a negative ceiling can make sense.
        value = _validate.number(self.max_value, f"Limit max_value for {self.key!r}")
        object.__setattr__(self, "max_value", value)
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


def compile_limits(limits: Sequence[Limit]) -> tuple[LimitRow, ...]:
    """``limits`` as the rows the kernel's check reads, in list order."""
    return tuple(
        (limit.type is LimitType.PREFIX, limit.key, limit.max_value, limit) for limit in limits
    )


def check_limits(
    stats: ExecutionStats,
    limits: Sequence[Limit],
    pending: Mapping[str, float] | None = None,
) -> ExceededLimit | None:
    """The first limit that ``stats`` exceeds, or None.

    Values include usage reserved by calls in flight, plus ``pending`` (the reservation of a call
    about to start), so a check before a call asks "would this call break a limit?".
    """
    for limit in limits:
        if not isinstance(limit, Limit):
            raise TypeError(f"limits must hold Limit objects, got {type(limit).__name__}")
    found = stats.kernel.check(((stats.level, compile_limits(limits)),), pending)
    return None if found is None else exceeded(found[1])


def exceeded(hit: tuple[object, str, float]) -> ExceededLimit:
    """The kernel's answer ``(limit, key, value)`` as an :class:`ExceededLimit`."""
    limit, key, value = hit
    assert isinstance(limit, Limit)
    return ExceededLimit(limit, key, value)
