"""Counters and gauges of a context, propagated live to every enclosing context: the tree lives
in one accounting kernel behind one lock, so no reader ever sees a child updated and its parent
not yet, and concurrent workers cannot lose increments. Limit checks also count what calls in
flight reserved (:meth:`ExecutionStats.reserved`)."""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from ampmeter import _validate, money
from ampmeter._core.check import Guard, compile_limits
from ampmeter._core.kernel import Kernel, Level
from ampmeter._core.usage import internal_amount
from ampmeter._core.views import bind, bound
from ampmeter.keys import (
    KEY_COST,
    KEY_FORMAT_PARSE_ERROR_TOTAL,
    KEY_INPUT_TOKENS,
    KEY_OUTPUT_TOKENS,
    KEY_TOOL_CALLS,
    KEY_TOOLCHAIN_PARSE_ERROR_TOTAL,
    PROTECTED_KEYS,
    is_money,
)
from ampmeter.limits import ExceededLimit, Limit, context_limits, exceeded

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from ampmeter.graph import ExecutionGraph

__all__ = ["ExecutionStats", "check_limits"]


def _gauge_amount(key: str, value: object, what: str) -> Any:
    """A gauge amount as the kernel counts it: money as whole nano-dollars, else a float."""
    if is_money(key):
        return _validate.nano(value, what, allow_negative=True)
    return _validate.number(value, what)


def _shown(values: dict[str, Any]) -> dict[str, Any]:
    """Kernel values as users read them: money keys as Decimal dollars."""
    return {k: money.from_nano(v) if is_money(k) else v for k, v in values.items()}


def _key(key: object) -> str:
    if type(key) is not str:
        raise TypeError(f"stats key must be a str, got {type(key).__name__}")
    if not key:
        raise ValueError("stats key must not be empty")
    return key


class ExecutionStats:
    """Counters (ints) and gauges (floats) of one context, with live propagation upwards.

    ``incr_counter`` and ``incr_gauge`` add to this object and every ancestor at once;
    ``set_*`` and ``reset_*`` change only this object. ``amp:iterations`` is protected (user
    changes are ignored) and, like the ``*_consecutive`` parse-error keys, is never propagated.
    Counters are ints up to 2**53 in size; gauges are finite floats, except money keys
    (``amp:cost``, ``amp:cost:<model>``), which are exact Decimal dollars.

    ``graph`` (for a root) puts the stats in that graph's accounting kernel, so a context's
    calls update its graph and its stats in one step under one lock.
    """

    __slots__ = ("__weakref__", "_kernel", "_level", "parent")

    def __init__(
        self, parent: ExecutionStats | None = None, *, graph: ExecutionGraph | None = None
    ) -> None:
        if parent is not None and not isinstance(parent, ExecutionStats):
            raise TypeError(f"parent must be ExecutionStats or None, got {type(parent).__name__}")
        if parent is not None and graph is not None:
            raise ValueError("give parent or graph, not both: a child shares its parent's graph")
        self.parent = parent
        parent_level = None
        if parent is not None:
            self._kernel, parent_level = bound(parent)
        elif graph is not None:
            self._kernel = bound(graph)[0]
        else:
            self._kernel = Kernel("stats-" + uuid.uuid4().hex[:8])
        self._level = Level(parent_level)
        bind(self, self._kernel, self._level)

    # -- counters ---------------------------------------------------------------------------

    def incr_counter(self, key: str, delta: int = 1) -> None:
        """Add ``delta`` (>= 0) to ``key`` here and in every ancestor."""
        name = _key(key)
        amount = _validate.count(delta, "delta", signed=True)
        if amount < 0:
            raise ValueError(
                f"counter {name!r} only grows (delta {amount}); use set_counter or reset_counter"
            )
        if name not in PROTECTED_KEYS:
            self._kernel.add(self._level, name, amount, False)

    def set_counter(self, key: str, value: int) -> None:
        """Set ``key`` to ``value`` in this context only."""
        name = _key(key)
        number = _validate.count(value, "value", signed=True)
        if name not in PROTECTED_KEYS:
            self._kernel.set(self._level, name, number, False)

    def get_counter(self, key: str) -> int:
        """The counter's value, or 0 if it was never written."""
        value = self._kernel.value(self._level, key, False)
        return 0 if value is None else int(value)

    def reset_counter(self, key: str) -> None:
        """Set ``key`` to 0 in this context only."""
        self.set_counter(key, 0)

    # -- gauges -----------------------------------------------------------------------------

    def incr_gauge(self, key: str, delta: float | Decimal) -> None:
        """Add a finite ``delta`` (any sign) to ``key`` here and in every ancestor (money keys:
        dollars, exact)."""
        name = _key(key)
        amount = _gauge_amount(name, delta, "delta")
        if name not in PROTECTED_KEYS:
            self._kernel.add(self._level, name, amount, True)

    def set_gauge(self, key: str, value: float | Decimal) -> None:
        """Set ``key`` to a finite ``value`` in this context only (money keys: dollars)."""
        name = _key(key)
        number = _gauge_amount(name, value, "value")
        if name not in PROTECTED_KEYS:
            self._kernel.set(self._level, name, number, True)

    def get_gauge(self, key: str) -> Any:
        """The gauge's value, or 0 if it was never written: a Decimal of dollars for a money key
        (``amp:cost``, ``amp:cost:<model>``), else a float."""
        value = self._kernel.value(self._level, key, True)
        if is_money(key):
            return money.from_nano(value or 0)
        return 0.0 if value is None else float(value)

    def reset_gauge(self, key: str) -> None:
        """Set ``key`` to 0.0 in this context only."""
        self.set_gauge(key, 0.0)

    # -- bulk and convenience ---------------------------------------------------------------

    def counters(self) -> dict[str, int]:
        """A copy of all counters."""
        return self._kernel.values(self._level, False)

    def gauges(self) -> dict[str, Any]:
        """A copy of all gauges (money keys as Decimal dollars)."""
        return _shown(self._kernel.values(self._level, True))

    def reserved(self) -> dict[str, Any]:
        """A copy of the usage reserved here by calls in flight (estimates not yet settled).

        A call's reservation is held in the contexts whose limits watch it, for the keys those
        limits match; elsewhere nothing is reserved.
        """
        return _shown(self._kernel.reserved(self._level))

    def total_input_tokens(self) -> int:
        """Input tokens of all models."""
        return self.get_counter(KEY_INPUT_TOKENS)

    def total_output_tokens(self) -> int:
        """Output tokens of all models."""
        return self.get_counter(KEY_OUTPUT_TOKENS)

    def total_cost(self) -> Decimal:
        """Cost in USD of all models (exact)."""
        return money.from_nano(self._kernel.value(self._level, KEY_COST, True) or 0)

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
        counters = self._kernel.values(self._level, False, locked=False)
        gauges = _shown(self._kernel.values(self._level, True, locked=False))
        return f"ExecutionStats(counters={counters!r}, gauges={gauges!r})"


def check_limits(
    stats: ExecutionStats,
    limits: Sequence[Limit],
    pending: Mapping[str, Any] | None = None,
) -> ExceededLimit | None:
    """The first limit that ``stats`` exceeds, or None.

    Values include usage reserved by calls in flight, plus ``pending`` (the reservation of a call
    about to start; money in dollars), so a check before a call asks "would this call break a
    limit?".
    """
    checked = context_limits(limits, None, None, None)
    kernel, level = bound(stats)
    assert level is not None
    internal = None if pending is None else {k: internal_amount(k, v) for k, v in pending.items()}
    found = kernel.check((Guard(level, compile_limits(checked)),), internal)
    return None if found is None else exceeded(found[1])
