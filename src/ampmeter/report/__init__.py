"""The self-contained HTML report of ampmeter's logs (inline SVG charts) and PNG figures."""

from ampmeter.report.figures import (
    amortization_figure,
    context_growth_figure,
    cost_tokens_by_model_figure,
    latency_figure,
    save_png,
)
from ampmeter.report.html import build_report, embed_json, write_report

__all__ = [
    "amortization_figure",
    "build_report",
    "context_growth_figure",
    "cost_tokens_by_model_figure",
    "embed_json",
    "latency_figure",
    "save_png",
    "write_report",
]
