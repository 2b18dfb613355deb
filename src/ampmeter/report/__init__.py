"""The self-contained HTML report of ampmeter's logs (inline SVG charts) and PNG figures.

The HTML report needs nothing beyond the core; the PNG figure needs matplotlib (the
``analysis`` extra) and loads on first use, so ``make demo`` renders the report without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ampmeter._lazy import lazy_names
from ampmeter.report.html import build_report, embed_json, write_report

if TYPE_CHECKING:
    from ampmeter.report.figures import amortization_figure, save_png

__all__ = ["amortization_figure", "build_report", "embed_json", "save_png", "write_report"]


# The figure needs matplotlib (the ``analysis`` extra): imported on first use.
__getattr__ = lazy_names(
    __name__, dict.fromkeys(("amortization_figure", "save_png"), "ampmeter.report.figures")
)
