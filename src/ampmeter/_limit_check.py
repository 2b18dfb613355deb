"""The limit check that runs before and after every call, over limits compiled per context.

Compiled with mypyc (see ``scripts/compile_core.py``), like the stats and the graph; the public
types and ``check_limits`` live in :mod:`ampmeter.limits`.
"""

from __future__ import annotations

from collections.abc import Sequence

from ampmeter.limits import ExceededLimit, Limit, LimitType
from ampmeter.stats import ExecutionStats

__all__ = ["LimitPlan", "check_plan_locked", "compile_limits"]

LimitPlan = tuple[tuple[bool, str, float, Limit], ...]
"""Limits as ``(is_prefix, key, max_value, limit)`` rows, in list order (see compile_limits)."""


def compile_limits(limits: Sequence[Limit]) -> LimitPlan:
    """``limits`` as rows the check unpacks in one step (a context compiles its limits once)."""
    prefix = LimitType.PREFIX
    return tuple((limit.type is prefix, limit.key, limit.max_value, limit) for limit in limits)


def check_plan_locked(
    stats: ExecutionStats, plan: LimitPlan, pending: dict[str, float]
) -> ExceededLimit | None:
    """:func:`check_limits_locked` over compiled limits: this runs before and after every call.

    ``pending`` is the reservation of a call about to start ({} after a call).
    """
    counters = stats._counters
    gauges = stats._gauges
    reserved = stats._reserved
    for is_prefix, key, top, limit in plan:
        if is_prefix:
            keys = stats._watched.get(key)
            if keys is not None and (not pending or _all_known(pending, stats._known)):
                # _check_prefix, inlined for the usual case: the prefix is watched already and
                # the pending call brings no key never seen (so none is missing from ``keys``).
                for k in keys:
                    extra = reserved.get(k, 0.0)
                    if pending:
                        extra += pending.get(k, 0.0)
                    count = counters.get(k)
                    if count is not None:
                        if count.value + extra > top:
                            return ExceededLimit(limit, k, count.value + extra)
                    elif extra and extra > top and k not in gauges:
                        return ExceededLimit(limit, k, extra)
                for k in keys:
                    amount = gauges.get(k)
                    if amount is not None:
                        extra = reserved.get(k, 0.0)
                        if pending:
                            extra += pending.get(k, 0.0)
                        if amount.value + extra > top:
                            return ExceededLimit(limit, k, amount.value + extra)
                continue
            hit = _check_prefix(stats, limit, pending)
            if hit is not None:
                return hit
            continue
        # One key: the counter, then the gauge.
        extra = reserved.get(key, 0.0)
        if pending:
            extra += pending.get(key, 0.0)
        count = counters.get(key)
        if count is not None:
            if count.value + extra > top:
                return ExceededLimit(limit, key, count.value + extra)
            amount = gauges.get(key)
            if amount is not None and amount.value + extra > top:
                return ExceededLimit(limit, key, amount.value + extra)
            continue
        amount = gauges.get(key)
        if amount is not None:
            if amount.value + extra > top:
                return ExceededLimit(limit, key, amount.value + extra)
        elif extra and extra > top:
            return ExceededLimit(limit, key, extra)
    return None


def _all_known(pending: dict[str, float], known: dict[str, None]) -> bool:
    return all(key in known for key in pending)


def _candidate_keys(stats: ExecutionStats, limit: Limit, pending: dict[str, float]) -> list[str]:
    prefix = limit.key
    keys = stats._watched_keys_locked(prefix)
    new = [key for key in pending if key not in stats._known and key.startswith(prefix)]
    return keys + new if new else keys


def _check_prefix(
    stats: ExecutionStats, limit: Limit, pending: dict[str, float]
) -> ExceededLimit | None:
    """A prefix limit's check: counters first, then gauges (check_plan_locked inlines the
    usual case, where the prefix is watched already and no pending key is new)."""
    keys = _candidate_keys(stats, limit, pending)
    if not keys:
        return None
    counters = stats._counters
    gauges = stats._gauges
    reserved = stats._reserved
    top = limit.max_value
    for key in keys:
        extra = reserved.get(key, 0.0)
        if pending:
            extra += pending.get(key, 0.0)
        count = counters.get(key)
        if count is None:
            # Never written as a counter: a reserved or pending amount counts here only if the
            # key is no gauge either (else the gauge pass counts it).
            if extra and extra > top and key not in gauges:
                return ExceededLimit(limit, key, extra)
        elif count.value + extra > top:
            return ExceededLimit(limit, key, count.value + extra)
    for key in keys:
        amount = gauges.get(key)
        if amount is not None:
            extra = reserved.get(key, 0.0)
            if pending:
                extra += pending.get(key, 0.0)
            if amount.value + extra > top:
                return ExceededLimit(limit, key, amount.value + extra)
    return None
