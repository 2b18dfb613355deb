"""What ``ampmeter summary`` prints: a table that fits 80 columns (``--wide``: every column),
or every field as JSON or CSV."""

from __future__ import annotations

import csv
import io
from dataclasses import fields
from typing import TYPE_CHECKING, Any, Final

import orjson

from ampmeter.analysis.lineage import run_labels
from ampmeter.analysis.summary import RunSummary, SummaryTable
from ampmeter.cli.output import number, printable
from ampmeter.report.charts import dollars

if TYPE_CHECKING:
    from rich.table import Table
    from rich.text import Text

__all__ = ["as_csv", "as_json", "as_table"]

_MONEY: Final = frozenset({"cost_usd", "unsettled_cost_usd", "estimated_cost_usd"})

WIDE: Final = (
    ("label", "run"),
    ("run_id", "run id"),
    ("llm_sent", "LLM sent"),
    ("refused_calls", "refused"),
    ("tool_calls", "tools"),
    ("retries", "retries"),
    ("tokens_in", "tok in"),
    ("tokens_out", "tok out"),
    ("cost_usd", "cost"),
    ("unpriced_calls", "unpriced"),
    ("unsettled_cost_usd", "unsettled"),
    ("estimated_cost_usd", "estimated"),
    ("llm_calls_per_root", "LLM amp"),
    ("tool_calls_per_root", "tool amp"),
    ("base_context", "base ctx"),
    ("context_growth_avg", "growth"),
    ("max_depth", "depth"),
    ("termination", "termination"),
)
NARROW: Final = tuple(
    column
    for column in WIDE
    if column[0] in ("label", "llm_sent", "refused_calls", "tokens_in", "cost_usd", "termination")
)
"""The columns that fit 80: the run, what was sent and refused, the context, cost, the end."""


def _cell(key: str, value: object) -> Text:
    """A cell: money and numbers in the one format, text plain (never markup), escaped."""
    from rich.text import Text

    if key in _MONEY and isinstance(value, (int, float)):
        return Text(dollars(value))
    if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return Text(number(value))
    return Text(printable(str(value)))


def _plain(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with money to the nano-dollar (a float sum's binary noise left out)."""
    return {k: round(v, 9) if k in _MONEY and isinstance(v, float) else v for k, v in row.items()}


def _rows(table: SummaryTable) -> list[dict[str, Any]]:
    """Every field of every run, and its label."""
    labels = run_labels((run.run_id, run.name) for run in table.runs)
    return [{**run.to_dict(), "label": labels[run.run_id]} for run in table.runs]


def as_table(table: SummaryTable, wide: bool) -> Table:
    """The runs as a rich table, then the p50 and p95 of each numeric column across them."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    columns = WIDE if wide else NARROW
    out = Table(
        title=f"{len(table.runs)} run(s)",
        header_style="bold",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    for key, label in columns:
        text = key in ("label", "run_id", "termination")
        run_column = key == "label" and not wide
        out.add_column(
            label,
            justify="left" if text else "right",
            overflow="ellipsis" if run_column else "fold",
            max_width=28 if run_column else None,
            no_wrap=run_column or key == "termination",
        )
    for row in _rows(table):
        out.add_row(*(_cell(key, row[key]) for key, _ in columns))
    if table.runs:
        for q in ("p50", "p95"):
            cells = [Text(q)]  # under the label; a column with no figures across runs is blank
            for key, _ in columns[1:]:
                across = table.across.get(key)
                cells.append(Text("") if across is None else _cell(key, across.get(q)))
            out.add_row(*cells, style="italic dim")
    return out


def as_json(table: SummaryTable) -> str:
    """Every field of every run (with its label), and the p50/p95 across runs, as JSON."""
    runs = [_plain(row) for row in _rows(table)]
    across = {
        key: {q: round(v, 9) if key in _MONEY and v is not None else v for q, v in qs.items()}
        for key, qs in table.across.items()
    }
    return orjson.dumps({"runs": runs, "across": across}, option=orjson.OPT_INDENT_2).decode()


def as_csv(table: SummaryTable) -> str:
    """Every field of every run (with its label), one row per run, as CSV."""
    names = ["label", *(f.name for f in fields(RunSummary))]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=names, lineterminator="\n")
    writer.writeheader()
    writer.writerows(_plain(row) for row in _rows(table))
    return buffer.getvalue()
