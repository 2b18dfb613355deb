"""Percentiles with linear interpolation, on a sorted list or over a growing set.

Both use the same arithmetic as :func:`ampmeter.logs.stream` does for its latency lines: for
``n`` values and percentile ``q`` (0-100) the rank is ``(n - 1) * q / 100``; the result is
``v[lo] + (v[hi] - v[lo]) * (rank - lo)`` with ``lo = floor(rank)`` and ``hi = min(lo + 1,
n - 1)``. :class:`RunningPercentile` keeps the values split in two heaps at ``lo``, so adding a
value costs O(log n) and reading the percentile O(1): a curve with a percentile at every
``t`` costs O(n log n), not O(n²).

:func:`running_percentiles` and :func:`prefix_percentiles` give the same numbers for many
prefixes of a sequence at once with numpy (see :mod:`ampmeter.analysis._kth`): all values are
known up front, so each prefix's two order statistics come from one vectorised wavelet-matrix
descent instead of a heap operation per value in Python.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = ["RunningPercentile", "percentile", "prefix_percentiles", "running_percentiles"]

_INT64_SPAN = 2**63


def _check_q(q: float) -> float:
    if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q must be a number in [0, 100], got {q!r}")
    return float(q)


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) of ascending ``sorted_values``; None when empty."""
    q = _check_q(q)
    n = len(sorted_values)
    if n == 0:
        return None
    rank = (n - 1) * q / 100.0
    lo = math.floor(rank)
    hi = min(lo + 1, n - 1)
    low = sorted_values[lo]
    return low + (sorted_values[hi] - low) * (rank - lo)


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
    every ``i``: what :class:`RunningPercentile` would give after each value (None values are
    left out; None while there is no value yet). Needs numpy.

    Values must be finite ints or floats; when they are all ints they are compared exactly,
    otherwise as floats. ``-0.0`` counts as ``0.0``.
    """
    import numpy as np

    q = _check_q(q)
    items = list(values)
    present = [v for v in items if v is not None]
    for v in present:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"running_percentiles needs finite numbers or None, got {v!r}")
    valid = np.fromiter((v is not None for v in items), dtype=bool, count=len(items))
    ends = np.cumsum(valid, dtype=np.int64)
    out: list[float | None] = [None] * len(items)
    if not present:
        return out
    first = int(np.argmax(ends > 0))
    (column,) = prefix_percentiles(number_array(present), ends[first:], (q,))
    out[first:] = column.tolist()
    return out


def number_array(values: Sequence[float]) -> npt.NDArray[Any]:
    """``values`` as a numpy array that keeps them exact: int64 (object for ints beyond it)
    when all are ints, float64 otherwise."""
    import numpy as np

    if all(type(v) is int for v in values):
        try:
            return np.array(values, dtype=np.int64)
        except OverflowError:
            return np.array(values, dtype=object)
    return np.array(values, dtype=np.float64)


def prefix_percentiles(
    values: npt.NDArray[Any], ends: npt.NDArray[Any], qs: Sequence[float]
) -> list[npt.NDArray[Any]]:
    """For each ``q`` of ``qs``, a float64 array: the ``q``-th percentile of ``values[:e]`` for
    each ``e`` of ``ends`` (every ``e`` in ``[1, len(values)]``), with :func:`percentile`'s
    arithmetic, bit for bit.

    ``values`` is float64, int64 or (for ints beyond int64) an object array of ints.
    """
    import numpy as np

    checked = [_check_q(q) for q in qs]
    if values.dtype.kind == "f":
        values = values + 0.0  # -0.0 and 0.0 are one value: make them one bit pattern too
    with np.errstate(over="ignore", invalid="ignore"):
        return _prefix_percentiles(np, values, ends, checked)


def _prefix_percentiles(
    np: Any, values: npt.NDArray[Any], ends: npt.NDArray[Any], qs: list[float]
) -> list[npt.NDArray[Any]]:
    from ampmeter.analysis._kth import WaveletMatrix

    uniq, codes = np.unique(values, return_inverse=True)
    matrix = WaveletMatrix(codes.ravel(), max(1, (len(uniq) - 1).bit_length()))
    # The formula's (high - low) must not overflow for high == low to be skipped safely (and,
    # for ints, for int64 to be exact); otherwise every high is looked up / Python ints used.
    if uniq.dtype.kind == "f":
        tame = bool(np.isfinite(uniq[-1] - uniq[0]))
    else:
        tame = int(uniq[-1]) - int(uniq[0]) < _INT64_SPAN
    exact_ints = uniq.dtype.kind == "O" or (not tame and uniq.dtype.kind in "iu")
    if len(ends) and bool(np.all(ends[1:] >= ends[:-1])):  # the usual case: no sort needed
        step = np.empty(len(ends), dtype=bool)
        step[0] = True
        np.not_equal(ends[1:], ends[:-1], out=step[1:])
        distinct_ends = ends[step]
        back = np.cumsum(step) - 1
    else:
        distinct_ends, back = np.unique(ends, return_inverse=True)
        back = back.ravel()
    results: list[npt.NDArray[Any]] = []
    for q in qs:
        rank = (distinct_ends - 1).astype(np.float64) * q / 100.0
        lo = np.floor(rank).astype(np.int64)
        hi = np.minimum(lo + 1, distinct_ends - 1)
        frac = rank - lo
        lo_code = matrix.kth(distinct_ends, lo)
        if tame:
            hi_code = lo_code.copy()
            need = np.flatnonzero(frac != 0.0)  # elsewhere low + (high - low) * 0.0 == low
            hi_code[need] = matrix.kth(distinct_ends[need], hi[need])
        else:
            hi_code = matrix.kth(distinct_ends, hi)
        low = uniq[lo_code]
        high = uniq[hi_code]
        if exact_ints:
            column = np.array(
                [
                    lv + (hv - lv) * f
                    for lv, hv, f in zip(low.tolist(), high.tolist(), frac.tolist(), strict=True)
                ],
                dtype=np.float64,
            )
        else:
            column = low + (high - low) * frac
        results.append(column.astype(np.float64, copy=False)[back])
    return results
