"""The amortization curve as a PNG (``ampmeter amortize --plot``), drawn with matplotlib's Agg
backend (no display needed); the report draws its figures as inline SVG (:mod:`.charts`).

:func:`amortization_figure` returns the PNG bytes; :func:`save_png` writes them to a file.
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

__all__ = ["amortization_figure", "save_png"]

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
