"""Counters and gauges of a context, propagated live to every enclosing context.

A tree of :class:`ExecutionStats` (one per context) shares one lock, so an increment reaches
the context and all of its ancestors in a single atomic step: no reader ever sees a child
updated and its parent not yet, and concurrent workers cannot lose increments.

Besides committed values, each stats object holds *reservations*: usage that calls in flight
have announced (estimated cost, ``max_tokens``, one step) and not yet replaced by their actual
usage. Limit checks count them, which is what keeps concurrent calls from jointly overshooting.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from typing import Final

from ampmeter.keys import (
    KEY_COST,
    KEY_COST_FOR,
    KEY_FORMAT_PARSE_ERROR_TOTAL,
    KEY_INPUT_TOKENS,
    KEY_INPUT_TOKENS_FOR,
    KEY_ITERATIONS,
    KEY_LLM_CALLS,
    KEY_OUTPUT_TOKENS,
    KEY_OUTPUT_TOKENS_FOR,
    KEY_STEPS,
    KEY_TOOL_CALLS,
    KEY_TOOLCHAIN_PARSE_ERROR_TOTAL,
    LOCAL_KEYS,
    PROTECTED_KEYS,
)

__all__ = ["ExecutionStats"]

_EMPTY: Final[Mapping[str, float]] = {}
_PLANS_MAX: Final = 4_096  # per stats object: models with a precomputed key plan


class _LlmPlan:
    """The keys one successful LLM call of a model adds to, and the dicts of every level.

    Once every key exists at every level (keys are never removed, so this stays true), settling a
    call is straight-line ``+=`` per level: no usage dicts to build, no lookups that can miss.
    """

    __slots__ = ("key_cost", "key_in", "key_out", "levels", "ready")

    def __init__(self, chain: tuple[ExecutionStats, ...], model: str) -> None:
        self.levels = tuple((stats._counters, stats._gauges) for stats in chain)
        # With model "" these keys go unused: _settle_llm_locked then adds the totals only.
        self.key_in = KEY_INPUT_TOKENS_FOR + model
        self.key_out = KEY_OUTPUT_TOKENS_FOR + model
        self.key_cost = KEY_COST_FOR + model
        self.ready = False


def _check_key(key: object) -> str:
    if type(key) is not str:
        raise TypeError(f"stats key must be a str, got {type(key).__name__}")
    if not key:
        raise ValueError("stats key must not be empty")
    return key


def _check_int(value: object, what: str) -> int:
    if type(value) is not int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{what} must be an int, got {type(value).__name__}")
        value = int(value)
    return value


def _check_float(value: object, what: str) -> float:
    if type(value) is not float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{what} must be a number, got {type(value).__name__}")
        value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{what} must be finite, got {value!r}")
    return value


class ExecutionStats:
    """Counters (ints) and gauges (floats) of one context, with live propagation upwards.

    ``incr_counter`` and ``incr_gauge`` add to this object and every ancestor at once;
    ``set_*`` and ``reset_*`` change only this object. ``amp:iterations`` is protected (user
    changes are ignored) and, like the ``*_consecutive`` parse-error keys, is never propagated.
    """

    __slots__ = (
        "_chain",
        "_counters",
        "_gauges",
        "_known",
        "_lock",
        "_plans",
        "_reserved",
        "_watched",
        "parent",
    )

    def __init__(self, parent: ExecutionStats | None = None) -> None:
        if parent is not None and not isinstance(parent, ExecutionStats):
            raise TypeError(f"parent must be ExecutionStats or None, got {type(parent).__name__}")
        self.parent = parent
        self._lock: threading.Lock = parent._lock if parent is not None else threading.Lock()
        # This object followed by its ancestors, nearest first: the propagation path.
        self._chain: tuple[ExecutionStats, ...] = (self,) + (
            parent._chain if parent is not None else ()
        )
        self._counters: dict[str, int] = {}
        self._gauges: dict[str, float] = {}
        self._reserved: dict[str, float] = {}
        # Every key ever written or reserved, in first-seen order.
        self._known: dict[str, None] = {}
        # For each prefix a limit watches, the keys that start with it: kept up to date as keys
        # appear, so checking a prefix limit looks at its few keys, never at all of them.
        self._watched: dict[str, list[str]] = {}
        self._plans: dict[str, _LlmPlan] = {}  # model ("" for none) -> its key plan

    @property
    def lock(self) -> threading.Lock:
        """The lock shared by the whole stats tree (for callers that update several keys)."""
        return self._lock

    @property
    def chain(self) -> tuple[ExecutionStats, ...]:
        """This stats object and its ancestors, nearest first."""
        return self._chain

    # -- counters ---------------------------------------------------------------------------

    def incr_counter(self, key: str, delta: int = 1) -> None:
        """Add ``delta`` (>= 0) to ``key`` here and in every ancestor."""
        _check_key(key)
        delta = _check_int(delta, "delta")
        if delta < 0:
            raise ValueError(
                f"counter {key!r} only grows (delta {delta}); use set_counter or reset_counter"
            )
        if key in PROTECTED_KEYS:
            return
        with self._lock:
            self._add_counter_locked(key, delta)

    def set_counter(self, key: str, value: int) -> None:
        """Set ``key`` to ``value`` in this context only."""
        _check_key(key)
        value = _check_int(value, "value")
        if key in PROTECTED_KEYS:
            return
        with self._lock:
            self._set_counter_locked(key, value)

    def get_counter(self, key: str) -> int:
        """The counter's value, or 0 if it was never written."""
        return self._counters.get(key, 0)

    def reset_counter(self, key: str) -> None:
        """Set ``key`` to 0 in this context only."""
        self.set_counter(key, 0)

    # -- gauges -----------------------------------------------------------------------------

    def incr_gauge(self, key: str, delta: float) -> None:
        """Add a finite ``delta`` (any sign) to ``key`` here and in every ancestor."""
        _check_key(key)
        delta = _check_float(delta, "delta")
        if key in PROTECTED_KEYS:
            return
        with self._lock:
            self._add_gauge_locked(key, delta)

    def set_gauge(self, key: str, value: float) -> None:
        """Set ``key`` to a finite ``value`` in this context only."""
        _check_key(key)
        value = _check_float(value, "value")
        if key in PROTECTED_KEYS:
            return
        with self._lock:
            if key not in self._gauges:
                self._note_key(key)
            self._gauges[key] = value

    def get_gauge(self, key: str) -> float:
        """The gauge's value, or 0.0 if it was never written."""
        return self._gauges.get(key, 0.0)

    def reset_gauge(self, key: str) -> None:
        """Set ``key`` to 0.0 in this context only."""
        self.set_gauge(key, 0.0)

    # -- bulk and convenience ---------------------------------------------------------------

    def counters(self) -> dict[str, int]:
        """A copy of all counters."""
        with self._lock:
            return dict(self._counters)

    def gauges(self) -> dict[str, float]:
        """A copy of all gauges."""
        with self._lock:
            return dict(self._gauges)

    def reserved(self) -> dict[str, float]:
        """A copy of the usage reserved by calls in flight (estimates not yet settled).

        Contexts hold a reservation only where a limit watches it: the keys their own limits
        match, in the contexts that have limits.
        """
        with self._lock:
            return {k: v for k, v in self._reserved.items() if v}

    def total_input_tokens(self) -> int:
        """Input tokens of all models."""
        return self.get_counter(KEY_INPUT_TOKENS)

    def total_output_tokens(self) -> int:
        """Output tokens of all models."""
        return self.get_counter(KEY_OUTPUT_TOKENS)

    def total_cost(self) -> float:
        """Cost in USD of all models."""
        return self.get_gauge(KEY_COST)

    def tool_call_count(self) -> int:
        """Tool calls of all tools."""
        return self.get_counter(KEY_TOOL_CALLS)

    def format_parse_error_total(self) -> int:
        """Format parse errors (LLM output that did not parse)."""
        return self.get_counter(KEY_FORMAT_PARSE_ERROR_TOTAL)

    def toolchain_parse_error_total(self) -> int:
        """Toolchain parse errors (tool-call payloads that did not parse)."""
        return self.get_counter(KEY_TOOLCHAIN_PARSE_ERROR_TOTAL)

    def __repr__(self) -> str:
        return f"ExecutionStats(counters={self._counters!r}, gauges={self._gauges!r})"

    # -- internals used by contexts and limit checks (caller holds the lock) -----------------

    def _note_key(self, key: str) -> None:
        if key in self._known:
            return
        self._known[key] = None
        for prefix, keys in self._watched.items():
            if key.startswith(prefix):
                keys.append(key)

    def _watched_keys_locked(self, prefix: str) -> list[str]:
        """The known keys starting with ``prefix``; the first call starts watching it."""
        keys = self._watched.get(prefix)
        if keys is None:
            keys = [key for key in self._known if key.startswith(prefix)]
            self._watched[prefix] = keys
        return keys

    def _add_counter_locked(self, key: str, delta: int) -> None:
        chain = (self,) if key in LOCAL_KEYS else self._chain
        for stats in chain:
            counters = stats._counters
            if key in counters:
                counters[key] += delta
            else:
                stats._note_key(key)
                counters[key] = delta

    def _set_counter_locked(self, key: str, value: int) -> None:
        if key not in self._counters:
            self._note_key(key)
        self._counters[key] = value

    def _add_gauge_locked(self, key: str, delta: float) -> None:
        chain = (self,) if key in LOCAL_KEYS else self._chain
        for stats in chain:
            gauges = stats._gauges
            if key in gauges:
                gauges[key] += delta
            else:
                stats._note_key(key)
                gauges[key] = delta

    def _bump_iterations_locked(self) -> int:
        value = self._counters.get(KEY_ITERATIONS, 0) + 1
        self._note_key(KEY_ITERATIONS)
        self._counters[KEY_ITERATIONS] = value
        return value

    def _reserve_locked(self, amounts: Mapping[str, float]) -> None:
        for stats in self._chain:
            reserved = stats._reserved
            for key, amount in amounts.items():
                try:
                    reserved[key] += amount
                except KeyError:
                    stats._note_key(key)  # a pending write is a key limits must see
                    reserved[key] = amount

    def _hold_locked(self, keys: tuple[str, ...], amounts: Mapping[str, float]) -> None:
        """Reserve ``amounts[key]`` for each of ``keys`` at this level only (the levels whose
        limits watch those keys)."""
        reserved = self._reserved
        for key in keys:
            amount = amounts[key]
            try:
                reserved[key] += amount
            except KeyError:
                self._note_key(key)
                reserved[key] = amount

    def _unhold_locked(self, keys: tuple[str, ...], amounts: Mapping[str, float]) -> None:
        """Drop a reservation made with :meth:`_hold_locked`."""
        reserved = self._reserved
        for key in keys:
            left = reserved.get(key, 0.0) - amounts[key]
            # Float dust from many add/subtract pairs must not look like a pending call.
            reserved[key] = left if left > 1e-12 else 0.0

    def _release_locked(self, amounts: Mapping[str, float]) -> None:
        for stats in self._chain:
            reserved = stats._reserved
            for key, amount in amounts.items():
                left = reserved.get(key, 0.0) - amount
                # Float dust from many add/subtract pairs must not look like a pending call.
                reserved[key] = left if left > 1e-12 else 0.0

    def _apply_locked(
        self,
        counters: Mapping[str, int],
        gauges: Mapping[str, float] = _EMPTY,
        release: Mapping[str, float] = _EMPTY,
    ) -> None:
        """Settle a call: drop its reservation and add its actual usage, at every level."""
        if not (LOCAL_KEYS.isdisjoint(counters) and LOCAL_KEYS.isdisjoint(gauges)):
            # Rare (trace records of parse errors): local keys go to this level only.
            if release:
                self._release_locked(release)
            for key, delta in counters.items():
                self._add_counter_locked(key, delta)
            for key, gdelta in gauges.items():
                self._add_gauge_locked(key, gdelta)
            return
        # The hot path of every call: one pass per level, release and add fused; a key is new
        # at most once per level, so the KeyError branch is the rare one.
        for stats in self._chain:
            if release:
                reserved = stats._reserved
                for key, amount in release.items():
                    try:
                        left = reserved[key] - amount
                    except KeyError:
                        left = -amount
                    reserved[key] = left if left > 1e-12 else 0.0
            ints = stats._counters
            for key, delta in counters.items():
                try:
                    ints[key] += delta
                except KeyError:
                    stats._note_key(key)
                    ints[key] = delta
            floats = stats._gauges
            for key, gdelta in gauges.items():
                try:
                    floats[key] += gdelta
                except KeyError:
                    stats._note_key(key)
                    floats[key] = gdelta

    def _settle_llm_locked(self, model: str, tokens_in: int, tokens_out: int, cost: float) -> None:
        """Add one successful LLM call's standard usage at every level (tokens, cost, calls,
        steps; per model when ``model`` is not empty), as ``_apply_locked`` would."""
        plan = self._plans.get(model)
        if plan is None:
            plan = _LlmPlan(self._chain, model)
            if len(self._plans) < _PLANS_MAX:
                self._plans[model] = plan
        if plan.ready:
            # The hot path: every key exists at every level, so ``+=`` never misses.
            if model:
                key_in, key_out, key_cost = plan.key_in, plan.key_out, plan.key_cost
                for ints, floats in plan.levels:
                    ints[KEY_INPUT_TOKENS] += tokens_in
                    ints[KEY_OUTPUT_TOKENS] += tokens_out
                    ints[key_in] += tokens_in
                    ints[key_out] += tokens_out
                    ints[KEY_LLM_CALLS] += 1
                    ints[KEY_STEPS] += 1
                    floats[KEY_COST] += cost
                    floats[key_cost] += cost
            else:
                for ints, floats in plan.levels:
                    ints[KEY_INPUT_TOKENS] += tokens_in
                    ints[KEY_OUTPUT_TOKENS] += tokens_out
                    ints[KEY_LLM_CALLS] += 1
                    ints[KEY_STEPS] += 1
                    floats[KEY_COST] += cost
            return
        counters = {KEY_INPUT_TOKENS: tokens_in, KEY_OUTPUT_TOKENS: tokens_out}
        gauges = {KEY_COST: cost}
        if model:
            counters[plan.key_in] = tokens_in
            counters[plan.key_out] = tokens_out
            gauges[plan.key_cost] = cost
        counters[KEY_LLM_CALLS] = 1
        counters[KEY_STEPS] = 1
        self._apply_locked(counters, gauges)
        plan.ready = True  # every one of these keys now exists at every level
