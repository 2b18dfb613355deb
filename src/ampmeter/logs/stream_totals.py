"""The stream logger's running totals: per problem, and over the whole stream."""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from typing import Any

__all__ = ["StreamCumulativeMetrics", "StreamTotals", "Tally", "percentile"]


@dataclass(slots=True)
class StreamCumulativeMetrics:
    """One line of ``*.stream.jsonl``: the stream's totals after problem ``t``."""

    t: int
    cumulative_solved: int
    cumulative_api_cost_usd: float
    cost_per_solved: float
    contamination_rate: float | None
    p50_latency_ms: float
    p95_latency_ms: float

    def to_dict(self) -> dict[str, Any]:
        """The line as a dict (the stream line's keys plus the two latency percentiles)."""
        return asdict(self)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of sorted values, linear interpolation; 0.0 if empty."""
    if not sorted_values:
        return 0.0
    rank = (len(sorted_values) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(sorted_values) - 1)
    fraction = rank - low
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * fraction


@dataclass(frozen=True, slots=True)
class StreamTotals:
    """The stream's totals after the problems logged so far. :meth:`after` gives the totals
    with one more problem and leaves these unchanged, so a failed write changes nothing."""

    solved: int = 0
    cost: Decimal = Decimal(0)  # summed exactly; a number only where it is written
    latencies_ms: tuple[float, ...] = field(default=())  # sorted
    contamination_sum: float = 0.0
    contamination_n: int = 0

    def after(
        self, solved: bool, cost: Decimal, latency_ms: float, contamination_rate: float | None
    ) -> StreamTotals:
        """These totals with one more problem."""
        latencies = list(self.latencies_ms)
        bisect.insort(latencies, latency_ms)
        seen = contamination_rate is not None
        return StreamTotals(
            solved=self.solved + solved,
            cost=self.cost + cost,
            latencies_ms=tuple(latencies),
            contamination_sum=self.contamination_sum + (contamination_rate or 0.0),
            contamination_n=self.contamination_n + seen,
        )

    def line(self, t: int) -> StreamCumulativeMetrics:
        """The ``stream.jsonl`` line of these totals, after problem ``t``."""
        n = self.contamination_n
        return StreamCumulativeMetrics(
            t=t,
            cumulative_solved=self.solved,
            cumulative_api_cost_usd=float(self.cost),
            cost_per_solved=float(self.cost / max(1, self.solved)),
            contamination_rate=self.contamination_sum / n if n else None,
            p50_latency_ms=percentile(self.latencies_ms, 50.0),
            p95_latency_ms=percentile(self.latencies_ms, 95.0),
        )


@dataclass(slots=True)
class Tally:
    """What was seen of one problem's calls, to fill its problems line."""

    llm_calls: int = 0
    tokens: int = 0
    latency_ms: float = 0.0
    root_latency_ms: float | None = None
    cost: Decimal = Decimal(0)  # summed exactly; a number only where it is written
