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
    return check_plan_locked(stats, compile_limits(limits), pending)


LimitPlan = tuple[tuple[bool, str, float, Limit], ...]
"""Limits as ``(is_prefix, key, max_value, limit)`` rows, in list order (see compile_limits)."""


def compile_limits(limits: Sequence[Limit]) -> LimitPlan:
    """``limits`` as rows the check unpacks in one step (a context compiles its limits once)."""
    prefix = LimitType.PREFIX
    return tuple((limit.type is prefix, limit.key, limit.max_value, limit) for limit in limits)


def check_plan_locked(
    stats: ExecutionStats, plan: LimitPlan, pending: Mapping[str, float]
) -> ExceededLimit | None:
    """:func:`check_limits_locked` over compiled limits: this runs before and after every call."""
    counters = stats._counters
    gauges = stats._gauges
    reserved = stats._reserved
    for is_prefix, key, top, limit in plan:
        if is_prefix:
            keys = stats._watched.get(key)
            if keys is not None and (not pending or pending.keys() <= stats._known.keys()):
                # _check_prefix, inlined for the usual case: the prefix is watched already and
                # the pending call brings no key never seen (so none is missing from ``keys``).
                for k in keys:
                    extra = reserved.get(k, 0.0)
                    if pending:
                        extra += pending.get(k, 0.0)
                    written = counters.get(k)
                    if written is not None:
                        if written + extra > top:
                            return ExceededLimit(limit, k, written + extra)
                    elif extra and extra > top and k not in gauges:
                        return ExceededLimit(limit, k, extra)
                for k in keys:
                    value = gauges.get(k)
                    if value is not None:
                        extra = reserved.get(k, 0.0)
                        if pending:
                            extra += pending.get(k, 0.0)
                        if value + extra > top:
                            return ExceededLimit(limit, k, value + extra)
                continue
            hit = _check_prefix(stats, limit, pending)
            if hit is not None:
                return hit
            continue
        # _check_key for the counter, then the gauge, inlined.
        extra = reserved.get(key, 0.0)
        if pending:
            extra += pending.get(key, 0.0)
        written = counters.get(key)
        if written is not None:
            if written + extra > top:
                return ExceededLimit(limit, key, written + extra)
            value = gauges.get(key)
            if value is not None and value + extra > top:
                return ExceededLimit(limit, key, value + extra)
            continue
        value = gauges.get(key)
        if value is not None:
            if value + extra > top:
                return ExceededLimit(limit, key, value + extra)
        elif extra and extra > top:
            return ExceededLimit(limit, key, extra)
    return None


def _check_key(
    stats: ExecutionStats,
    limit: Limit,
    key: str,
    pending: Mapping[str, float],
    *,
    counter: bool,
) -> ExceededLimit | None:
    extra = stats._reserved.get(key, 0.0) + pending.get(key, 0.0)
    written: float | None = stats._counters.get(key) if counter else stats._gauges.get(key)
    if written is None:
        # Never written: only a pending or reserved amount can exceed, counted once (as a counter
        # when the key has no gauge either).
        if not extra or (not counter) or key in stats._gauges:
            return None
        value = extra
    else:
        value = written + extra
    if value > limit.max_value:
        return ExceededLimit(limit, key, value)
    return None


def _candidate_keys(stats: ExecutionStats, limit: Limit, pending: Mapping[str, float]) -> list[str]:
    prefix = limit.key
    keys = stats._watched_keys_locked(prefix)
    new = [key for key in pending if key not in stats._known and key.startswith(prefix)]
    return keys + new if new else keys


def _check_prefix(
    stats: ExecutionStats, limit: Limit, pending: Mapping[str, float]
) -> ExceededLimit | None:
    """A prefix limit's check: counters first, then gauges (check_plan_locked inlines the
    usual case, where the prefix is watched already and no pending key is new)."""
    keys = _candidate_keys(stats, limit, pending)
    if not keys:
        return None
    # _check_key over the keys, counters first, then gauges, inlined.
    counters = stats._counters
    gauges = stats._gauges
    reserved = stats._reserved
    top = limit.max_value
    for key in keys:
        extra = reserved.get(key, 0.0)
        if pending:
            extra += pending.get(key, 0.0)
        written = counters.get(key)
        if written is None:
            # Never written as a counter: a reserved or pending amount counts here only if the
            # key is no gauge either (else the gauge pass counts it).
            if extra and extra > top and key not in gauges:
                return ExceededLimit(limit, key, extra)
        elif written + extra > top:
            return ExceededLimit(limit, key, written + extra)
    for key in keys:
        value = gauges.get(key)
        if value is not None:
            extra = reserved.get(key, 0.0)
            if pending:
                extra += pending.get(key, 0.0)
            if value + extra > top:
                return ExceededLimit(limit, key, value + extra)
    return None
