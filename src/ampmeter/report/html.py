"""The self-contained HTML report: a run at a glance, all runs, figures and each run's calls.

The first screen shows one run open (the first run with a stop, else the first run): its spend
against each limit, its stops and its timeline. Below come all runs in one table (a totals row,
pages of 50, sortable), the figures (inline SVG sized to their data, with a tooltip on every
mark), and a panel per run.

One file, no network: CSS and JavaScript are inlined, figures are inline SVG, and a
Content-Security-Policy forbids fetching anything. Log data travels in one inline JSON blob
whose ``<``, ``>`` and ``&`` are escaped, so no log text can close the script element; the
script builds trees with ``textContent`` only, so text such as ``<script>`` in a node name is
displayed, never run. The logs are read in one streaming pass
(:func:`ampmeter.analysis.digest.digest_logs`), so memory stays bounded on large logs: beyond
a node budget, runs are reported by their totals, limits and stops without their call trees.
"""

from __future__ import annotations

import datetime as _dt
import html
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from importlib import resources
from typing import Any, Final

from ampmeter._files import replaced_when_complete, require_file
from ampmeter.analysis.amortization import amortization_curve
from ampmeter.analysis.digest import LogDigest, RunDigest, digest_logs
from ampmeter.analysis.lineage import run_labels
from ampmeter.analysis.summary import summary_table
from ampmeter.metrics import was_sent
from ampmeter.report import charts
from ampmeter.report.charts import dollars
from ampmeter.report.panels import PAGE_RUNS, run_panel, runs_table, scrubbed

__all__ = ["MAX_PANELS", "build_report", "embed_json", "focus_run", "write_report"]

_STREAM: Final = ".stream.jsonl"
_PROBLEMS: Final = ".problems.jsonl"
_EVENTS: Final = ".token_events.jsonl"
_CALLS: Final = ".calls.jsonl"
_CSP: Final = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'"
MAX_PANELS: Final = 1000
"""Runs that get a panel of their own (the rest are rows of the table)."""
_GROWTH_RUNS: Final = 12


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


def _curves(streams: list[str], given: set[str]) -> list[dict[str, Any]]:
    """The amortization rows of each stream file, with its siblings among ``given``."""
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


def _rollups(run: RunDigest) -> list[list[Any] | None]:
    """Per kept call with inner calls (a sub-agent, a step): what its subtree used, as
    ``[tokens_in, tokens_out, priced cost, unpriced calls]``; None for a call with none. A
    sub-agent's own event has no usage of its own: the report shows this instead of zeros."""
    calls = run.calls
    index = {c.span_id: i for i, c in enumerate(calls)}
    totals: list[list[Any] | None] = [None] * len(calls)
    # Deepest first, so a call's total is complete before it is added to its parent's.
    for i in sorted(range(len(calls)), key=lambda i: -calls[i].depth):
        call = calls[i]
        own = [call.tokens_in, call.tokens_out, 0.0 if call.unpriced else call.cost_usd]
        own.append(int(call.unpriced))
        inner = totals[i]
        whole = own if inner is None else [a + b for a, b in zip(own, inner, strict=True)]
        parent = index.get(call.parent_id) if call.parent_id is not None else None
        if parent is not None and parent != i:
            above = totals[parent]
            totals[parent] = (
                whole if above is None else [a + b for a, b in zip(above, whole, strict=True)]
            )
    return totals


def _nodes(run: RunDigest) -> list[list[Any]]:
    index = {c.span_id: i for i, c in enumerate(run.calls)}
    rollups = _rollups(run)
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
            scrubbed(c.stop_reason),
            c.error_class,
            c.end_ms,
            c.depth,
            rollup,
        ]
        for c, rollup in zip(run.calls, rollups, strict=True)
    ]


def _root_key(run: RunDigest) -> tuple[str, str] | None:
    root = run.contexts.root
    return None if root is None or root.id is None else (root.name, root.id)


def _shared_roots(
    runs: Sequence[RunDigest],
) -> dict[tuple[str, str], tuple[int, dict[str, float]]]:
    """Roots (one context in one process) that more than one run of the report ran under, as
    a stream logger writes each problem as a run: how many runs, and their usage together."""
    found: dict[tuple[str, str], tuple[int, dict[str, float]]] = {}
    for run in runs:
        key = _root_key(run)
        if key is None:
            continue
        count, usage = found.get(key, (0, {}))
        for name, value in run.usage.items():
            usage[name] = usage.get(name, 0.0) + value
        found[key] = (count + 1, usage)
    return {key: value for key, value in found.items() if value[0] > 1}


def focus_run(runs: Sequence[RunDigest]) -> int:
    """The run the first screen opens: the first with a stop whose calls the report holds (so
    its timeline can be drawn), else the first with a stop, else the first run."""
    stopped = [i for i, r in enumerate(runs) if r.halted_nodes]
    return next((i for i in stopped if runs[i].calls), stopped[0] if stopped else 0)


def _figure(title: str, body: str, note: str = "") -> str:
    caption = f'<p class="muted">{html.escape(note)}</p>' if note else ""
    return f"<figure><figcaption>{html.escape(title)}</figcaption>{body}{caption}</figure>"


def _figures(
    digest: LogDigest, curve: list[dict[str, Any]] | None, labels: Mapping[str, str]
) -> list[str]:
    growth = []
    for run in digest.runs:
        sent = [
            c
            for c in run.calls
            if c.kind == "llm" and was_sent(c.status, c.tokens_in, c.tokens_out)
        ]
        growth.append((labels[run.run_id], [c.tokens_in for c in sent]))
    growth.sort(key=lambda item: -len(item[1]))
    series = [
        (name, [(float(i), float(t)) for i, t in enumerate(ts, 1)])
        for name, ts in growth[:_GROWTH_RUNS]
        if ts
    ]
    stopped = sum(r.stopped_unsent for r in digest.runs)
    unsent = (
        f"{stopped:,} call(s) stopped before sending are not in these figures." if stopped else ""
    )
    figs = [
        _figure("Spend by model", charts.bars_by_model(digest.by_model)),
        _figure(
            "Latency of LLM calls that were sent",
            charts.latency_histogram(
                digest.latencies, digest.latency_percentile(50.0), digest.latency_percentile(95.0)
            ),
            unsent,
        ),
        _figure(
            "Context growth: input tokens per LLM call",
            charts.line_chart(series, x_label="LLM call", y_label="input tokens"),
        ),
    ]
    if curve is not None:

        def points(column: str) -> list[tuple[float, float]]:
            return [(float(r["t"]), float(r[column])) for r in curve if r.get(column) is not None]

        figs[:0] = [
            _figure(
                f"Amortization: {title}",
                charts.line_chart(
                    [(label, points(column))], x_label="t (problems)", y_label=label, y_format=fmt
                ),
            )
            for title, column, label, fmt in (
                ("cost per solved problem", "cost_per_solved", "cost per solved", "usd"),
                ("cumulative accuracy", "cum_accuracy", "accuracy", "number"),
            )
        ]
    return figs


def _overview(digest: LogDigest, sources: str) -> str:
    runs = digest.runs

    def total(name: str) -> Any:
        return sum(getattr(run, name) for run in runs)

    unpriced, unsettled, estimated = (
        total(name) for name in ("unpriced_calls", "unsettled_cost_usd", "estimated_cost_usd")
    )
    p50 = digest.latency_percentile(50.0)
    parts = [
        f"<b>{len(runs):,}</b> run(s)",
        f"<b>{total('sent_calls'):,}</b> calls sent",
        f'<b class="stopped">{total("stopped_unsent"):,}</b> stopped before sending',
        f"<b>{total('failed'):,}</b> failed",
        f"<b>{dollars(total('cost_usd'))}</b> priced"
        + (f" + {unpriced:,} unpriced" if unpriced else ""),
        *([f'<b class="unsettled">{dollars(unsettled)}</b> unsettled'] if unsettled else []),
        *([f'<b class="estimated">{dollars(estimated)}</b> estimated'] if estimated else []),
        f"<b>{total('tokens_in'):,}</b> tokens in / <b>{total('tokens_out'):,}</b> out",
    ]
    if p50 is not None:
        parts.append(f"p50 latency <b>{p50:,.0f} ms</b> (sent LLM calls)")
    skipped = f" {digest.skipped_lines:,} bad line(s) skipped." if digest.skipped_lines else ""
    return (
        f'<p class="overview">{" · ".join(parts)}</p>'
        f'<p class="muted sources">from {html.escape(sources)}.{skipped}</p>'
    )


def build_report(
    logs: Iterable[str | os.PathLike[str]],
    *,
    title: str = "ampmeter report",
    best_effort: bool = False,
    ceilings: Mapping[str, float | Decimal] | None = None,
    notes: Sequence[str] = (),
) -> str:
    """The report's HTML for ``logs``: TokenTracker event logs (any name), plus optionally
    ``*.stream.jsonl`` files, whose ``.problems.jsonl`` and ``.token_events.jsonl`` siblings
    are used for the amortization figures when they are among ``logs`` too. Logs that hold
    no event (and no stream) raise ``ValueError``: a report of nothing would read as a run
    that cost nothing.

    ``ceilings`` maps stats keys (``amp:cost``, ``amp:llm_calls``, ...) to the limits every
    run had; ceilings named by a run's stops are shown too. ``notes`` are shown under the
    title (e.g. how the calls were priced).
    """
    paths = [os.fspath(p) for p in logs]
    if not paths:
        raise ValueError("no log files given")
    for path in paths:
        require_file(path)
    # A stream's problems and calls files are found from its stream file, never read as events.
    event_paths = [p for p in paths if not p.endswith((_STREAM, _PROBLEMS, _CALLS))]
    streams = [p for p in paths if p.endswith(_STREAM)]
    digest = digest_logs(event_paths, best_effort=best_effort)
    runs = digest.runs
    if not runs and not streams:
        names = ", ".join(os.path.basename(p) for p in paths)
        raise ValueError(f"{names}: no event in the log(s), so no run to report")
    labels = run_labels((r.run_id, r.contexts.name) for r in runs)
    roots = _shared_roots(runs)
    table = summary_table([r.summary() for r in runs])
    curve = _curves(streams, set(paths)) if streams else None

    # ceilings may come as Decimal dollars (the ledger's API) or as plain numbers
    limits_given = {key: float(cap) for key, cap in (ceilings or {}).items()}
    focus = focus_run(runs)
    order = ([focus] if runs else []) + [i for i in range(len(runs)) if i != focus]
    panel_runs = order[:MAX_PANELS]
    data_runs: list[dict[str, Any]] = []
    panels: dict[int, str] = {}
    for number, i in enumerate(panel_runs):
        run = runs[i]
        data_index = None
        if run.calls:
            data_index = len(data_runs)
            data_runs.append({"id": run.run_id, "t0": run.start_ms, "nodes": _nodes(run)})
        label = labels[run.run_id]
        root = _root_key(run)
        shared = roots.get(root) if root is not None else None
        panels[i] = run_panel(number, run, data_index, limits_given, number == 0, label, shared)
    esc = html.escape
    glance = ""
    if runs:
        which = "first run with a stop" if runs[focus].halted_nodes else "first run"
        why = "the only run" if len(runs) == 1 else f"the {which}; every run is listed below"
        glance = (
            f'<section id="glance"><h2>Run at a glance <span class="muted">({why})</span></h2>'
            f"{panels[focus]}</section>"
        )
    others = "".join(panels[i] for i in panel_runs[1:])
    unpanelled = len(runs) - len(panel_runs)
    others_note = (
        f'<p class="muted">{unpanelled:,} more run(s) are in the table only.</p>'
        if unpanelled > 0
        else ""
    )
    note_html = "".join(f'<p class="note">{esc(n)}</p>' for n in notes)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    sources = ", ".join(os.path.basename(p) for p in paths)
    links = {i: n for n, i in enumerate(panel_runs)}
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{_CSP}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{esc(title)}</title>
<style>{_asset("report.css")}</style>
</head><body>
<header><h1>{esc(title)}</h1><span class="muted">generated {stamp}</span></header>
{_overview(digest, sources)}
{note_html}
{glance or '<p class="muted">no runs</p>'}
<h2>All runs</h2>
{runs_table(table.runs, table.across, links, labels)}
<h2>Figures</h2>
<div class="figures">{"".join(_figures(digest, curve, labels))}</div>
{_every_run(others, others_note)}
<div id="tip" role="tooltip" hidden></div>
<script type="application/json" id="amp-data">{embed_json({"runs": data_runs})}</script>
<script>{_asset("report.js")}</script>
</body></html>
"""


def _every_run(panels: str, note: str) -> str:
    """The section of the other runs' panels; none when the run at a glance is the only one."""
    if not panels:
        return note
    return f"""<h2>Every other run</h2>
<p class="muted">Open a run to see its limits, stops, timeline and calls; + opens a node.
Stopped calls are marked in red, failed ones in orange.</p>
<div class="paged" data-page="{PAGE_RUNS}" data-items=":scope > details.run">{panels}
<nav class="pager"></nav></div>{note}"""


def write_report(
    logs: Iterable[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    title: str = "ampmeter report",
    best_effort: bool = False,
    ceilings: Mapping[str, float | Decimal] | None = None,
    notes: Sequence[str] = (),
) -> str:
    """Build the report (see :func:`build_report`) and write it to ``out`` (replaced only
    when complete); returns the path written."""
    text = build_report(logs, title=title, best_effort=best_effort, ceilings=ceilings, notes=notes)
    target = os.fspath(out)
    with replaced_when_complete(target) as tmp, open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
    return target
