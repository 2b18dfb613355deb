"""The self-contained HTML report: summary table, figures and each run's call tree.

One file, no network: CSS and JavaScript are inlined, figures are base64 PNG ``data:`` URLs,
and a Content-Security-Policy forbids fetching anything. Log data travels in one inline JSON
blob whose ``<``, ``>`` and ``&`` are escaped, so no log text can close the script element;
the script builds the tree with ``textContent`` only, so text such as ``<script>`` in a node
name or metadata value is displayed, never run. Children are rendered when a node is opened
(and long lists in chunks), so a run with 10,000 nodes stays quick to load.

Each run shows how much of each limit it used (the ceilings given, and those its stops name),
a timeline of its calls with the stops marked, and a filter over its calls. The summary table
wraps to the page, keeps its header in view and sorts by any column.
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from importlib import resources
from typing import Any, Final

from ampmeter import redact
from ampmeter._files import replaced_when_complete, require_file
from ampmeter.analysis.amortization import amortization_curve
from ampmeter.analysis.ceilings import ceilings_from_stops, usage_for_key
from ampmeter.analysis.quantiles import percentile
from ampmeter.analysis.runs import Run, load_runs
from ampmeter.analysis.summary import NUMERIC_COLUMNS, RunSummary, SummaryTable, summarize_run
from ampmeter.keys import KEY_COST, KEY_COST_FOR
from ampmeter.metrics import was_sent
from ampmeter.report import figures
from ampmeter.report.limit_events import limit_events_html

__all__ = ["build_report", "embed_json", "write_report"]

_STREAM: Final = ".stream.jsonl"
_PROBLEMS: Final = ".problems.jsonl"
_EVENTS: Final = ".token_events.jsonl"
_CALLS: Final = ".calls.jsonl"
_CSP: Final = (
    "default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'"
)
# The amplification factors per root are left out: with one root per run they equal the totals.
_TABLE_COLUMNS: Final = (
    ("run_id", "run"), ("llm_calls", "LLM calls"), ("tool_calls", "tool calls"),
    ("retries", "retries"), ("tokens_in", "tokens in"), ("tokens_out", "tokens out"),
    ("cost_usd", "cost $ (priced)"), ("unpriced_calls", "unpriced calls"),
    ("base_context", "base ctx"),
    ("context_growth_avg", "ctx growth"), ("max_depth", "max depth"), ("halted", "halted"),
    ("failed", "failed"), ("termination", "termination"), ("stop_reason", "stop reason"),
)  # fmt: skip


def embed_json(value: Any) -> str:
    """JSON text safe inside an HTML ``<script>`` element (``<``, ``>``, ``&`` escaped)."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return (
        text.replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


def _asset(name: str) -> str:
    return resources.files("ampmeter.report").joinpath("assets").joinpath(name).read_text("utf-8")


def _fmt(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _split(paths: Sequence[str]) -> tuple[list[str], list[str], set[str]]:
    """(event logs, stream files, every given path); calls files are not needed."""
    events, streams = [], []
    for path in paths:
        if path.endswith(_STREAM):
            streams.append(path)
        elif path.endswith(_PROBLEMS) or path.endswith(_CALLS):
            continue
        else:
            events.append(path)
    return events, streams, set(paths)


def _curves(streams: list[str], given: set[str]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for stream in streams:
        prefix = stream[: -len(_STREAM)]
        problems = prefix + _PROBLEMS
        events = prefix + _EVENTS
        rows.extend(
            amortization_curve(
                stream,
                problems_jsonl=problems if problems in given else None,
                token_events_jsonl=events if events in given else None,
            )
        )
    return rows


def _nodes(run: Run) -> list[list[Any]]:
    index = {c.span_id: i for i, c in enumerate(run.calls)}
    return [
        [
            c.span_id,
            index.get(c.parent_id, -1) if c.parent_id is not None else -1,
            c.kind,
            c.name,
            c.status,
            c.model,
            c.tokens_in,
            c.tokens_out,
            c.cost_usd,
            c.unpriced,
            c.latency_ms,
            c.retries,
            _scrubbed(c.stop_reason),
            c.error_class,
            c.end_ms,
            c.depth,
        ]
        for c in run.calls
    ]


def _scrubbed(stop_reason: str | None) -> str | None:
    # Logs written elsewhere (or by an older version) may hold unscrubbed error text.
    return None if stop_reason is None else redact.scrub(stop_reason)


def _cell(key: str, value: object) -> str:
    if key == "cost_usd" and isinstance(value, float):
        return _dollars(value)
    return _fmt(value)


def _table(table: SummaryTable) -> str:
    esc = html.escape
    texts = ("run_id", "termination", "stop_reason")
    head = "".join(
        f'<th scope="col" data-sort="{"text" if k in texts else "num"}" tabindex="0" '
        f'title="sort by {esc(label)}">{esc(label)}</th>'
        for k, label in _TABLE_COLUMNS
    )
    body = []
    for r in table.runs:
        d = r.to_dict()
        d["stop_reason"] = _scrubbed(d["stop_reason"])
        cells = "".join(
            # <wbr>: "limit_exceeded" may break after its underscore in a narrow column
            f'<td class="text">{esc(_fmt(d[k])).replace("_", "_<wbr>")}</td>' if k in texts
            else f'<td data-v="{d[k]!r}">{esc(_cell(k, d[k]))}</td>'
            for k, _ in _TABLE_COLUMNS
        )  # fmt: skip
        body.append(f"<tr>{cells}</tr>")
    foot = []
    for q in ("p50", "p95"):
        cells = "".join(
            f"<td>{esc(_cell(k, table.across[k][q]))}</td>" if k in NUMERIC_COLUMNS
            else f'<td class="text">{q if k == "run_id" else ""}</td>'
            for k, _ in _TABLE_COLUMNS
        )  # fmt: skip
        foot.append(f'<tr class="across">{cells}</tr>')
    return (
        f'<table class="summary"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody>'
        f"<tfoot>{''.join(foot)}</tfoot></table>"
    )


def _dollars(value: float) -> str:
    """Fixed-point dollars with the digits small amounts need (never ``7.26e-05``)."""
    return f"{value:,.2f}" if value >= 1 else f"{value:.4f}" if value >= 0.01 else f"{value:.6f}"


def _amount(key: str, value: float) -> str:
    if key == KEY_COST or key.startswith(KEY_COST_FOR):
        return f"${_dollars(value)}"
    return f"{value:,.0f}" if value == int(value) else f"{value:,.4g}"


def _limit_row(key: str, used: float | None, cap: float, origin: str) -> str:
    esc = html.escape
    name = f'<span class="key">{esc(key)}</span>'
    if used is None:
        return (f'<div class="limit">{name}<span class="muted">not in the log; ceiling '
                f"{esc(_amount(key, cap))} ({origin})</span></div>")  # fmt: skip
    share = used / cap if cap > 0 else (1.0 if used > 0 else 0.0)
    level = "over" if share >= 1 else "near" if share >= 0.8 else "ok"
    return (
        f'<div class="limit {level}">{name}<span class="bar" role="meter" '
        f'aria-valuenow="{share:.4f}" aria-valuemin="0" aria-valuemax="1">'
        f'<span style="width:{min(share, 1.0) * 100:.1f}%"></span></span>'
        f'<span class="used">{esc(_amount(key, used))} of {esc(_amount(key, cap))} '
        f"({share:.0%}; ceiling {origin})</span></div>"
    )


def _limits(run: Run, given: Mapping[str, float]) -> str:
    """Bars of the run's use of each limit whose ceiling is known."""
    ceilings = {**ceilings_from_stops(run.calls), **given}
    if not ceilings:
        return '<p class="muted">No ceiling known for this run (none given, no stop).</p>'
    rows = "".join(
        _limit_row(key, usage_for_key(run.calls, key), cap,
                   "given" if key in given else "named by a stop")
        for key, cap in ceilings.items()
    )  # fmt: skip
    return f'<div class="limits">{rows}</div>'


def _run_item(i: int, run: Run, s: RunSummary, given: Mapping[str, float]) -> str:
    esc = html.escape
    marks = []
    if s.halted:
        marks.append(f'<span class="badge halt">{s.halted} halted</span>')
    if s.failed:
        marks.append(f'<span class="badge fail">{s.failed} failed</span>')
    badge, limit_events = limit_events_html(run)  # warnings & co. (ampmeter.policies)
    marks.append(badge)
    return (
        f'<details class="run" data-run="{i}"><summary>{esc(run.run_id)} '
        f'<span class="muted">({len(run.calls)} nodes, {esc(s.termination)})</span> '
        f"{' '.join(marks)}</summary>{limit_events}"
        f"<h3>Limits</h3>{_limits(run, given)}"
        f'<h3>Timeline</h3><div class="timeline"></div>'
        f"<h3>Calls</h3>"
        f'<div class="filters"><input type="search" class="filter-text" '
        f'placeholder="filter by name or model" aria-label="filter by name or model">'
        f'<select class="filter-status" aria-label="status"><option value="">any status</option>'
        f"<option>success</option><option>fail</option><option>halt</option></select>"
        f'<select class="filter-model" aria-label="model"><option value="">any model</option>'
        f'</select><span class="filter-count muted"></span></div>'
        f"</details>"
    )


def _img(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return (
        f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'
        f"<figcaption>{html.escape(alt)}</figcaption></figure>"
    )


def build_report(
    logs: Iterable[str | os.PathLike[str]],
    *,
    title: str = "ampmeter report",
    best_effort: bool = False,
    ceilings: Mapping[str, float] | None = None,
    notes: Sequence[str] = (),
) -> str:
    """The report's HTML for ``logs``: TokenTracker event logs (any name), plus optionally
    ``*.stream.jsonl`` files, whose ``.problems.jsonl`` and ``.token_events.jsonl`` siblings
    are used for the amortization figure when they are among ``logs`` too.

    ``ceilings`` maps stats keys (``amp:cost``, ``amp:llm_calls``, ...) to the limits every
    run had; ceilings named by a run's stops are shown too. ``notes`` are shown under the
    title (e.g. how the calls were priced).
    """
    paths = [os.fspath(p) for p in logs]
    if not paths:
        raise ValueError("no log files given")
    for path in paths:
        require_file(path)
    event_paths, streams, given = _split(paths)
    runs = list(load_runs(event_paths, best_effort=best_effort).values())
    summaries = [summarize_run(r) for r in runs]
    across: dict[str, dict[str, float | None]] = {}
    for name in NUMERIC_COLUMNS:
        values = sorted(float(getattr(s, name)) for s in summaries)
        across[name] = {"p50": percentile(values, 50.0), "p95": percentile(values, 95.0)}
    table = SummaryTable(summaries, across)

    growth: dict[str, list[int]] = {}
    by_model: dict[str, dict[str, float]] = {}
    latencies: list[float] = []
    for run in runs:
        growth[run.run_id] = [
            c.tokens_in for c in run.calls
            if c.kind == "llm" and was_sent(c.status, c.tokens_in, c.tokens_out)
        ]  # fmt: skip
        for c in run.calls:
            if c.kind == "llm":
                if c.latency_ms is not None:
                    latencies.append(c.latency_ms)
                slot = by_model.setdefault(c.model or "(none)", {"cost_usd": 0.0, "tokens": 0.0})
                if not c.unpriced:
                    slot["cost_usd"] += c.cost_usd
                slot["tokens"] += c.tokens_in + c.tokens_out
    figs = [
        _img(figures.context_growth_figure(growth), "Context growth: input tokens per LLM call"),
        _img(figures.cost_tokens_by_model_figure(by_model), "Cost and tokens by model"),
        _img(figures.latency_figure(latencies), "LLM call latency distribution"),
    ]
    if streams:
        curve = _curves(streams, given)
        figs.insert(0, _img(figures.amortization_figure(curve), "Amortization"))

    data = {"runs": [{"id": r.run_id, "nodes": _nodes(r)} for r in runs]}
    esc = html.escape
    limits_given = dict(ceilings or {})
    run_items = [_run_item(i, run, s, limits_given)
                 for i, (run, s) in enumerate(zip(runs, summaries, strict=True))]  # fmt: skip
    note_html = "".join(f'<p class="note">{esc(n)}</p>' for n in notes)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    sources = ", ".join(os.path.basename(p) for p in paths)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{_CSP}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{esc(title)}</title>
<style>{_asset("report.css")}</style>
</head><body>
<h1>{esc(title)}</h1>
<p class="muted">{len(runs)} run(s) from {esc(sources)}; generated {stamp}.</p>
{note_html}
<h2>Summary</h2>
{_table(table)}
<h2>Figures</h2>
<div class="figures">{"".join(figs)}</div>
<h2>Runs</h2>
<p class="muted">Open a run to see its limits, the timeline of its calls and its call tree;
+ opens a node. Stopped (halted) calls are marked in red, failed ones in orange.</p>
<div id="runs">{"".join(run_items) or '<p class="muted">no runs</p>'}</div>
<script type="application/json" id="amp-data">{embed_json(data)}</script>
<script>{_asset("report.js")}</script>
</body></html>
"""


def write_report(
    logs: Iterable[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    title: str = "ampmeter report",
    best_effort: bool = False,
    ceilings: Mapping[str, float] | None = None,
    notes: Sequence[str] = (),
) -> str:
    """Build the report (see :func:`build_report`) and write it to ``out`` (replaced only
    when complete); returns the path written."""
    text = build_report(logs, title=title, best_effort=best_effort, ceilings=ceilings,
                        notes=notes)  # fmt: skip
    target = os.fspath(out)
    with replaced_when_complete(target) as tmp, open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
    return target
