"""Percentiles with linear interpolation, on a sorted list or over a growing set.

Both use the arithmetic of the stream logger's latency lines
(:func:`ampmeter.logs.stream_totals.percentile`): for
``n`` values and percentile ``q`` (0-100) the rank is ``(n - 1) * q / 100``; the result is
``v[lo] + (v[hi] - v[lo]) * (rank - lo)`` with ``lo = floor(rank)`` and ``hi = min(lo + 1,
n - 1)``. :class:`RunningPercentile` keeps the values split in two heaps at ``lo``, so adding a
value costs O(log n) and reading the percentile O(1): a curve with a percentile at every
``t`` costs O(n log n), not O(n²).

:func:`running_percentiles` gives :class:`RunningPercentile`'s value after each value of a
sequence.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence

from ampmeter.logs import stream_totals

__all__ = ["RunningPercentile", "percentile", "running_percentiles"]


def _check_q(q: float) -> float:
    if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q must be a number in [0, 100], got {q!r}")
    return float(q)


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) of ascending ``sorted_values``; None when empty."""
    q = _check_q(q)
    return stream_totals.percentile(sorted_values, q) if sorted_values else None


class RunningPercentile:
    """The ``q``-th percentile of every value added so far, kept up to date in O(log n).

    ``low`` holds the ``floor(rank) + 1`` smallest values (as a max-heap of negated values),
    ``high`` the rest; the interpolation needs only the top of each.
    """

    __slots__ = ("_high", "_low", "_n", "_q")

    def __init__(self, q: float) -> None:
        self._q = _check_q(q)
        self._low: list[float] = []
        self._high: list[float] = []
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def add(self, value: float) -> None:
        """Add one value (a finite int or float)."""
        low, high = self._low, self._high
        if low and value <= -low[0]:
            heapq.heappush(low, -value)
        else:
            heapq.heappush(high, value)
        self._n = n = self._n + 1
        want = math.floor((n - 1) * self._q / 100.0) + 1
        size = len(low)
        if size > want:
            heapq.heappush(high, -heapq.heappop(low))
        elif size < want:
            heapq.heappush(low, -heapq.heappop(high))

    def value(self) -> float | None:
        """The current percentile, or None before the first value."""
        n = self._n
        if n == 0:
            return None
        rank = (n - 1) * self._q / 100.0
        lo = math.floor(rank)
        low = -self._low[0]
        high = self._high[0] if lo + 1 <= n - 1 else low
        return low + (high - low) * (rank - lo)


def running_percentiles(values: Iterable[float | None], q: float) -> list[float | None]:
    """The ``q``-th percentile of the non-null values among the first ``i + 1`` values, for
    every ``i``: what :class:`RunningPercentile` gives after each value (None values are left
    out; None while there is no value yet). Values must be finite ints or floats."""
    running = RunningPercentile(q)
    out: list[float | None] = []
    for value in values:
        if value is not None:
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
            ):
                raise ValueError(f"running_percentiles needs finite numbers or None, got {value!r}")
            running.add(value)
        out.append(running.value())
    return out
