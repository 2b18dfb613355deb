"""Exact k-th smallest of many prefixes of one array at once, with a wavelet matrix in numpy.

``codes`` are small non-negative ints (dense ranks of the values). The matrix has one level per
bit of the largest code; each level stably splits the codes by that bit and keeps, for every
position, how many zeros precede it. A query "k-th smallest of ``codes[:end]``" then descends one
level per bit, narrowing the range to the codes that share the answer's high bits. All queries
descend together, so the cost is a few vectorised passes per bit: O((n + queries) * bits), with
no Python loop over the values and no approximation.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["WaveletMatrix"]

IntArray = npt.NDArray[np.integer[Any]]


class WaveletMatrix:
    """The levels of ``codes`` (ints in ``[0, 2**bits)``), ready for prefix k-th queries."""

    __slots__ = ("_dtype", "_levels")

    def __init__(self, codes: IntArray, bits: int) -> None:
        self._dtype: type[np.signedinteger[Any]] = np.int32 if len(codes) < 2**31 - 1 else np.int64
        cur = codes.astype(self._dtype, copy=True)
        self._levels: list[tuple[int, npt.NDArray[Any], int]] = []
        for bit in range(bits - 1, -1, -1):
            zero = ((cur >> bit) & 1) == 0
            zeros_before = np.zeros(len(cur) + 1, dtype=self._dtype)
            np.cumsum(zero, out=zeros_before[1:])
            self._levels.append((bit, zeros_before, int(zeros_before[-1])))
            cur = np.concatenate((cur[zero], cur[~zero]))

    def kth(self, ends: IntArray, ks: IntArray) -> npt.NDArray[Any]:
        """For each ``i``, the ``ks[i]``-th smallest (0-based) code of ``codes[:ends[i]]``.

        Requires ``0 <= ks[i] < ends[i] <= len(codes)``.
        """
        dtype = self._dtype
        lo = np.zeros(len(ends), dtype=dtype)
        hi = ends.astype(dtype, copy=True)
        k = ks.astype(dtype, copy=True)
        result = np.zeros(len(ends), dtype=dtype)
        for bit, zeros_before, n_zeros in self._levels:
            z_lo = zeros_before[lo]
            z_hi = zeros_before[hi]
            zeros = z_hi - z_lo
            one = k >= zeros
            k -= np.where(one, zeros, 0).astype(dtype, copy=False)
            lo = np.where(one, lo - z_lo + n_zeros, z_lo).astype(dtype, copy=False)
            hi = np.where(one, hi - z_hi + n_zeros, z_hi).astype(dtype, copy=False)
            result |= one.astype(dtype) << bit
        return result
