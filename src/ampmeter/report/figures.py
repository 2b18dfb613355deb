"""PNG figures of ampmeter's logs, drawn with matplotlib's Agg backend (no display needed).

Each function returns the PNG bytes; :func:`save_png` writes them to a file.
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

__all__ = [
    "amortization_figure",
    "context_growth_figure",
    "cost_tokens_by_model_figure",
    "latency_figure",
    "save_png",
]

_SIZE = (7.0, 3.6)
_DPI = 100


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI, bbox_inches="tight")
    return buf.getvalue()


def _empty(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#666")
    ax.set_xticks([])
    ax.set_yticks([])


def save_png(png: bytes, path: str | os.PathLike[str]) -> None:
    """Write PNG bytes to ``path``."""
    with open(path, "wb") as handle:
        handle.write(png)


def amortization_figure(rows: Sequence[Mapping[str, Any]]) -> bytes:
    """Cost per solved problem (left axis) and cumulative accuracy (right axis) against ``t``.

    ``rows`` are :func:`ampmeter.analysis.amortization_curve` rows; missing values are skipped.
    """
    fig = Figure(figsize=_SIZE)
    ax = fig.add_subplot()
    cps = [(r["t"], r["cost_per_solved"]) for r in rows if r.get("cost_per_solved") is not None]
    acc = [(r["t"], r["cum_accuracy"]) for r in rows if r.get("cum_accuracy") is not None]
    if not cps and not acc:
        _empty(ax, "no amortization data")
        return _png(fig)
    ax.set_title("Amortization")
    ax.set_xlabel("t (problems)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if cps and any(p[1] > 0 for p in cps):
        ax.plot([p[0] for p in cps], [p[1] for p in cps], color="#1f77b4", label="cost per solved")
        ax.set_ylabel("cost per solved (USD)", color="#1f77b4")
        ax.set_ylim(bottom=0.0)  # a cost is never negative
    else:  # a flat $0 line would read as "free"; it only means nothing was priced
        ax.set_yticks([])
        ax.text(
            0.02,
            0.96,
            "no cost recorded: every call was free or unpriced",
            transform=ax.transAxes,
            va="top",
            color="#666",
            fontsize="small",
        )
    if acc:
        ax2 = ax.twinx()
        ax2.plot([p[0] for p in acc], [p[1] for p in acc], color="#d62728", label="accuracy")
        ax2.set_ylabel("cumulative accuracy", color="#d62728")
        ax2.set_ylim(0.0, 1.05)
    return _png(fig)


def context_growth_figure(runs: Mapping[str, Sequence[int]], *, max_runs: int = 12) -> bytes:
    """Input tokens of each LLM call against the call number, one line per run (at most
    ``max_runs``, the longest ones)."""
    fig = Figure(figsize=_SIZE)
    ax = fig.add_subplot()
    shown = sorted(((k, v) for k, v in runs.items() if v), key=lambda kv: -len(kv[1]))[:max_runs]
    if not shown:
        _empty(ax, "no LLM calls")
        return _png(fig)
    for run_id, tokens in shown:
        ax.plot(range(1, len(tokens) + 1), tokens, marker="o", markersize=3, label=run_id[:32])
    ax.set_title("Context growth")
    ax.set_xlabel("LLM call")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("input tokens")
    ax.set_ylim(bottom=0)
    if len(shown) > 1:
        ax.legend(fontsize="x-small", loc="upper left")
    return _png(fig)


def cost_tokens_by_model_figure(by_model: Mapping[str, Mapping[str, float]]) -> bytes:
    """Priced cost and tokens (in + out) per model, side by side.

    ``by_model`` maps a model name to ``{"cost_usd": ..., "tokens": ...}``.
    """
    fig = Figure(figsize=_SIZE)
    models = [m for m in by_model if m]
    if not models:
        _empty(fig.add_subplot(), "no model calls")
        return _png(fig)
    names = [m[:24] for m in models]
    ax1, ax2 = fig.subplots(1, 2)
    costs = [by_model[m].get("cost_usd", 0.0) for m in models]
    if any(costs):
        ax1.barh(names, costs, color="#2ca02c")
    else:
        ax1.set_yticks(range(len(names)), names)
        ax1.text(
            0.5,
            0.5,
            "no priced cost",
            ha="center",
            va="center",
            transform=ax1.transAxes,
            color="#666",
        )
        ax1.set_xticks([])
    ax1.set_title("cost by model (USD)")
    ax2.barh(names, [by_model[m].get("tokens", 0.0) for m in models], color="#9467bd")
    ax2.set_title("tokens by model")
    ax2.set_yticks([])
    return _png(fig)


def latency_figure(latencies_ms: Sequence[float]) -> bytes:
    """Histogram of call latencies (ms) with the p50 and p95 marked."""
    from ampmeter.analysis.quantiles import percentile

    fig = Figure(figsize=_SIZE)
    ax = fig.add_subplot()
    values = sorted(latencies_ms)
    if not values:
        _empty(ax, "no latencies")
        return _png(fig)
    ax.hist(values, bins=min(50, max(5, len(values) // 4)), color="#ff7f0e")
    for q, style in ((50.0, "-"), (95.0, "--")):
        v = percentile(values, q)
        if v is not None:
            ax.axvline(v, color="black", linestyle=style, label=f"p{q:.0f} = {v:,.0f} ms")
    ax.set_title("Latency distribution")
    ax.set_xlabel("latency (ms)")
    ax.set_ylabel("calls")
    ax.legend(fontsize="small")
    return _png(fig)
