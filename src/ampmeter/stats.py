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


class _Count:
    """One counter's value. Dicts map keys to cells, so a settle plan can hold the cells of its
    keys and add to them without looking anything up (keys are never removed)."""

    __slots__ = ("value",)

    def __init__(self, value: int) -> None:
        self.value = value


class _Amount:
    """One gauge's value (see :class:`_Count`)."""

    __slots__ = ("value",)

    def __init__(self, value: float) -> None:
        self.value = value


# The cells one successful LLM call adds to at one level: input, output, llm calls, steps,
# cost, and (for a call with a model) the model's input, output and cost.
_LevelCells = tuple[_Count, _Count, _Count, _Count, _Amount, _Count, _Count, _Amount]
_TotalCells = tuple[_Count, _Count, _Count, _Count, _Amount]


class _LlmPlan:
    """The cells one successful LLM call of a model adds to, at every level.

    Made on the model's first call, once its keys exist at every level: from then on settling a
    call is straight-line ``+=`` on cells, with no lookups and no dicts to build.
    """

    __slots__ = ("levels", "totals")

    def __init__(self, chain: tuple[ExecutionStats, ...], model: str) -> None:
        key_in = KEY_INPUT_TOKENS_FOR + model
        key_out = KEY_OUTPUT_TOKENS_FOR + model
        key_cost = KEY_COST_FOR + model
        levels: list[_LevelCells] = []
        totals: list[_TotalCells] = []
        for stats in chain:
            ints = stats._counters
            floats = stats._gauges
            common = (ints[KEY_INPUT_TOKENS], ints[KEY_OUTPUT_TOKENS], ints[KEY_LLM_CALLS],
                      ints[KEY_STEPS], floats[KEY_COST])  # fmt: skip
            totals.append(common)
            if model:
                levels.append((*common, ints[key_in], ints[key_out], floats[key_cost]))
        # With model "" only the totals are added.
        self.levels: tuple[_LevelCells, ...] = tuple(levels)
        self.totals: tuple[_TotalCells, ...] = tuple(totals)


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
        self.parent: ExecutionStats | None = parent
        self._lock: threading.Lock = parent._lock if parent is not None else threading.Lock()
        # This object followed by its ancestors, nearest first: the propagation path.
        self._chain: tuple[ExecutionStats, ...] = (self,) + (
            parent._chain if parent is not None else ()
        )
        self._counters: dict[str, _Count] = {}
        self._gauges: dict[str, _Amount] = {}
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
        name = _check_key(key)
        amount = _check_int(delta, "delta")
        if amount < 0:
            raise ValueError(
                f"counter {name!r} only grows (delta {amount}); use set_counter or reset_counter"
            )
        if name in PROTECTED_KEYS:
            return
        with self._lock:
            self._add_counter_locked(name, amount)

    def set_counter(self, key: str, value: int) -> None:
        """Set ``key`` to ``value`` in this context only."""
        name = _check_key(key)
        number = _check_int(value, "value")
        if name in PROTECTED_KEYS:
            return
        with self._lock:
            self._set_counter_locked(name, number)

    def get_counter(self, key: str) -> int:
        """The counter's value, or 0 if it was never written."""
        cell = self._counters.get(key)
        return 0 if cell is None else cell.value

    def reset_counter(self, key: str) -> None:
        """Set ``key`` to 0 in this context only."""
        self.set_counter(key, 0)

    # -- gauges -----------------------------------------------------------------------------

    def incr_gauge(self, key: str, delta: float) -> None:
        """Add a finite ``delta`` (any sign) to ``key`` here and in every ancestor."""
        name = _check_key(key)
        amount = _check_float(delta, "delta")
        if name in PROTECTED_KEYS:
            return
        with self._lock:
            self._add_gauge_locked(name, amount)

    def set_gauge(self, key: str, value: float) -> None:
        """Set ``key`` to a finite ``value`` in this context only."""
        name = _check_key(key)
        number = _check_float(value, "value")
        if name in PROTECTED_KEYS:
            return
        with self._lock:
            cell = self._gauges.get(name)
            if cell is None:
                self._note_key(name)
                self._gauges[name] = _Amount(number)
            else:
                cell.value = number

    def get_gauge(self, key: str) -> float:
        """The gauge's value, or 0.0 if it was never written."""
        cell = self._gauges.get(key)
        return 0.0 if cell is None else cell.value

    def reset_gauge(self, key: str) -> None:
        """Set ``key`` to 0.0 in this context only."""
        self.set_gauge(key, 0.0)

    # -- bulk and convenience ---------------------------------------------------------------

    def counters(self) -> dict[str, int]:
        """A copy of all counters."""
        with self._lock:
            return {key: cell.value for key, cell in self._counters.items()}

    def gauges(self) -> dict[str, float]:
        """A copy of all gauges."""
        with self._lock:
            return {key: cell.value for key, cell in self._gauges.items()}

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
        # No lock: a repr may be asked for while the (non-reentrant) lock is held.
        counters = {key: cell.value for key, cell in list(self._counters.items())}
        gauges = {key: cell.value for key, cell in list(self._gauges.items())}
        return f"ExecutionStats(counters={counters!r}, gauges={gauges!r})"

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
            cell = stats._counters.get(key)
            if cell is None:
                stats._note_key(key)
                stats._counters[key] = _Count(delta)
            else:
                cell.value += delta

    def _set_counter_locked(self, key: str, value: int) -> None:
        cell = self._counters.get(key)
        if cell is None:
            self._note_key(key)
            self._counters[key] = _Count(value)
        else:
            cell.value = value

    def _add_gauge_locked(self, key: str, delta: float) -> None:
        chain = (self,) if key in LOCAL_KEYS else self._chain
        for stats in chain:
            cell = stats._gauges.get(key)
            if cell is None:
                stats._note_key(key)
                stats._gauges[key] = _Amount(delta)
            else:
                cell.value += delta

    def _bump_iterations_locked(self) -> int:
        value = self.get_counter(KEY_ITERATIONS) + 1
        self._set_counter_locked(KEY_ITERATIONS, value)
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

    def _hold_locked(self, keys: tuple[str, ...], amounts: dict[str, float]) -> None:
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

    def _unhold_locked(self, keys: tuple[str, ...], amounts: dict[str, float]) -> None:
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
        # at most once per level, so the branch that makes a cell is the rare one.
        for stats in self._chain:
            if release:
                reserved = stats._reserved
                for key, amount in release.items():
                    left = reserved.get(key, 0.0) - amount
                    reserved[key] = left if left > 1e-12 else 0.0
            ints = stats._counters
            for key, delta in counters.items():
                count = ints.get(key)
                if count is None:
                    stats._note_key(key)
                    ints[key] = _Count(delta)
                else:
                    count.value += delta
            floats = stats._gauges
            for key, gdelta in gauges.items():
                amount_cell = floats.get(key)
                if amount_cell is None:
                    stats._note_key(key)
                    floats[key] = _Amount(gdelta)
                else:
                    amount_cell.value += gdelta

    def _settle_llm_locked(self, model: str, tokens_in: int, tokens_out: int, cost: float) -> None:
        """Add one successful LLM call's standard usage at every level (tokens, cost, calls,
        steps; per model when ``model`` is not empty), as ``_apply_locked`` would."""
        plan = self._plans.get(model)
        if plan is not None:
            # The hot path: the plan holds the cells, so this is ``+=`` and nothing else.
            if model:
                for c_in, c_out, c_calls, c_steps, a_cost, m_in, m_out, m_cost in plan.levels:
                    c_in.value += tokens_in
                    c_out.value += tokens_out
                    c_calls.value += 1
                    c_steps.value += 1
                    a_cost.value += cost
                    m_in.value += tokens_in
                    m_out.value += tokens_out
                    m_cost.value += cost
            else:
                for c_in, c_out, c_calls, c_steps, a_cost in plan.totals:
                    c_in.value += tokens_in
                    c_out.value += tokens_out
                    c_calls.value += 1
                    c_steps.value += 1
                    a_cost.value += cost
            return
        counters = {KEY_INPUT_TOKENS: tokens_in, KEY_OUTPUT_TOKENS: tokens_out}
        gauges = {KEY_COST: cost}
        if model:
            counters[KEY_INPUT_TOKENS_FOR + model] = tokens_in
            counters[KEY_OUTPUT_TOKENS_FOR + model] = tokens_out
            gauges[KEY_COST_FOR + model] = cost
        counters[KEY_LLM_CALLS] = 1
        counters[KEY_STEPS] = 1
        self._apply_locked(counters, gauges)
        if len(self._plans) < _PLANS_MAX:
            # Every one of these keys now has a cell at every level.
            self._plans[model] = _LlmPlan(self._chain, model)
