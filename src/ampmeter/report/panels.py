"""The pieces of the report's HTML for one run (spend against each limit, the stop list, its
limit events, the panel that holds them with the timeline and the calls) and the table of all
runs.

Log text is escaped here; stop reasons are scrubbed of secrets again, since logs written
elsewhere (or by an older version) may hold unscrubbed error text.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any, Final

from ampmeter import redact
from ampmeter.analysis.ceilings import derivable
from ampmeter.analysis.digest import RunDigest
from ampmeter.analysis.summary import NUMERIC_COLUMNS, RunSummary
from ampmeter.keys import KEY_COST, KEY_INPUT_TOKENS, KEY_LLM_CALLS
from ampmeter.report.charts import amount, dollars, share_of

__all__ = ["TABLE_COLUMNS", "run_panel", "runs_table", "scrubbed"]

esc = html.escape

# The amplification factors per root are left out: with one root per run they equal the totals.
TABLE_COLUMNS: Final = (
    ("label", "run"),
    ("llm_sent", "LLM calls sent"),
    ("tool_calls", "tool calls"),
    ("refused_calls", "refused calls"),
    ("failed", "failed"),
    ("retries", "retries"),
    ("tokens_in", "tokens in"),
    ("tokens_out", "tokens out"),
    ("cost_usd", "cost (priced)"),
    ("unpriced_calls", "unpriced calls"),
    ("unsettled_cost_usd", "unsettled spend"),
    ("estimated_cost_usd", "estimated spend"),
    ("base_context", "base ctx"),
    ("context_growth_avg", "ctx growth"),
    ("max_depth", "max depth"),
    ("termination", "termination"),
    ("stop_reason", "stop reason"),
)
_TEXT_COLUMNS: Final = ("label", "termination", "stop_reason")
# Columns whose total over runs means something (a sum of depths or of averages does not).
_SUMMED: Final = tuple(
    key
    for key, _ in TABLE_COLUMNS
    if key not in (*_TEXT_COLUMNS, "base_context", "context_growth_avg", "max_depth")
)
PAGE_ROWS: Final = 50
PAGE_RUNS: Final = 20
# Keys shown as spend even when no ceiling is known for them.
_SPEND_KEYS: Final = (KEY_COST, KEY_LLM_CALLS, KEY_INPUT_TOKENS)


def scrubbed(text: str | None) -> str | None:
    """``text`` with secrets removed (None stays None)."""
    return None if text is None else redact.scrub(text)


def _fmt(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:,.4g}" if value != int(value) else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _cell(key: str, value: object) -> str:
    if key in ("cost_usd", "unsettled_cost_usd", "estimated_cost_usd") and isinstance(value, float):
        return dollars(value)
    return _fmt(value)


def _limit_row(
    key: str, used: float | None, cap: float | None, origin: str, context: str | None = None
) -> str:
    where = f'<span class="context">{esc(context)}</span> ' if context else ""
    name = f'<span class="key">{where}{esc(key)}</span>'
    if cap is None:
        spent = esc(amount(key, used or 0.0))
        return (
            f'<div class="limit none">{name}<span class="bar"></span>'
            f'<span class="used">{spent} <span class="muted">(no ceiling known)</span>'
            f"</span></div>"
        )
    if used is None:
        return (
            f'<div class="limit">{name}<span class="bar"></span><span class="used muted">'
            f"not in the log; ceiling {esc(amount(key, cap))} ({origin})</span></div>"
        )
    share, level = share_of(used, cap)
    tip = esc(f"{key}: {amount(key, used)} of {amount(key, cap)} ({share:.0%})", quote=True)
    return (
        f'<div class="limit {level}">{name}<span class="bar" role="meter" data-tip="{tip}" '
        f'aria-valuenow="{share:.4f}" aria-valuemin="0" aria-valuemax="1">'
        f'<span style="width:{min(share, 1.0) * 100:.1f}%"></span></span>'
        f'<span class="used">{esc(amount(key, used))} of {esc(amount(key, cap))} '
        f"({share:.0%}; ceiling {origin})</span></div>"
    )


def _limits(
    run: RunDigest,
    given: Mapping[str, float],
    shared: tuple[int, Mapping[str, float]] | None = None,
    most_subagents: int = 8,
) -> str:
    """The run's spend against each of its own ceilings (set by its root context, as the log
    says; given; or named by a stop of the run's own), its spend on the main keys when no
    ceiling is known for them, then each sub-agent's own limits, nearest to their ceiling
    first. ``shared``: (how many runs, their usage by key) when the root's ceilings cover
    other runs of the report too (a stream logger's problems), so its share says it."""
    root = run.contexts.name
    ceilings: dict[str, tuple[float, str]] = {
        key: (cap, f"set by {root}") for key, cap in run.contexts.own_limits().items()
    }
    together = []
    if shared is not None and ceilings:
        usage = shared[1]
        for key, (cap, _) in ceilings.items():
            if derivable(key):
                spent = amount(key, usage.get(key, 0.0))
                together.append(f"{esc(key)}: {esc(spent)} of {esc(amount(key, cap))}")
    note = (
        f'<p class="muted shared">{esc(str(root))}\'s ceilings cover {shared[0]:,} runs of this '
        f"report; together they used {'; '.join(together)}.</p>"
        if together and shared is not None
        else ""
    )
    for key, cap in given.items():
        ceilings.setdefault(key, (cap, "given"))
    for key, cap in run.ceilings.items():
        ceilings.setdefault(key, (cap, "named by a stop"))
    rows = [
        _limit_row(key, run.usage.get(key, 0.0) if derivable(key) else None, cap, origin)
        for key, (cap, origin) in ceilings.items()
    ]
    rows += [
        _limit_row(k, run.usage.get(k, 0.0), None, "") for k in _SPEND_KEYS if k not in ceilings
    ]
    # A sub-agent's limit the logs cannot tell (parse errors in a row) is shown if it stopped it.
    subagents = [row for row in run.contexts.subagent_rows() if row[3] is not None or row[5]]
    for _, path, key, used, cap, stopped in subagents[:most_subagents]:
        origin = f"set by {path[-1]}" + (", which it stopped" if stopped else "")
        rows.append(_limit_row(key, used, cap, origin, context=path[-1]))
    if len(subagents) > most_subagents:
        more = len(subagents) - most_subagents
        rows.append(f'<p class="muted">and {more:,} more sub-agent limit(s)</p>')
    return f'<div class="limits">{"".join(rows)}</div>{note}'


def _limit_events(events: Sequence[Mapping[str, Any]]) -> tuple[str, str]:
    """A badge for the run's summary line and the list of its limit events ("" when none),
    from the ``limit_events`` metadata the policies write (see :mod:`ampmeter.policies`)."""
    if not events:
        return "", ""
    items = []
    for event in events:
        fraction = event.get("fraction")
        share = f" ({fraction:.0%})" if isinstance(fraction, (int, float)) else ""
        items.append(
            f"<li>{esc(str(event.get('kind')))}: {esc(str(event.get('key')))}{esc(share)} "
            f'<span class="muted">limit {esc(str(event.get("limit")))}, node '
            f"{esc(str(event.get('node_id')))}</span></li>"
        )
    badge = f'<span class="badge warn">{len(events)} limit event(s)</span>'
    return badge, f'<ul class="limit-events">{"".join(items)}</ul>'


def _stops(run: RunDigest) -> str:
    if not run.stops:
        return '<p class="muted">No call was stopped.</p>'
    t0 = run.start_ms
    items = []
    for stop in run.stops:
        when = ""
        if t0 is not None and stop.end_ms is not None:
            when = f'<span class="when">{(stop.end_ms - t0) / 1000:.2f} s</span>'
        what = "sub-agent" if stop.kind == "system" else stop.kind
        items.append(
            f'<li data-span="{esc(stop.span_id, quote=True)}">{when}<span class="what">'
            f"{esc(what)} <b>{esc(stop.name)}</b></span>"
            f'<span class="why">{esc(scrubbed(stop.stop_reason) or "stopped")}</span></li>'
        )
    more = run.halted_nodes - len(run.stops)
    tail = f'<p class="muted">and {more:,} more</p>' if more > 0 else ""
    return f'<ol class="stops">{"".join(items)}</ol>{tail}'


def run_panel(
    index: int,
    run: RunDigest,
    data_index: int | None,
    given: Mapping[str, float],
    open_: bool,
    label: str,
    shared: tuple[int, Mapping[str, float]] | None = None,
) -> str:
    """One run's panel: spend against each limit and its stops side by side, its timeline,
    then its calls (drawn by the page's script from the data of run ``data_index``; None when
    the run is beyond the report's detail budget)."""
    s = run.summary()
    marks = [f'<span class="badge sent">{run.sent_calls:,} calls sent</span>']
    if run.stopped_unsent:
        marks.append(f'<span class="badge halt">{run.stopped_unsent:,} refused</span>')
    if s.failed:
        marks.append(f'<span class="badge fail">{s.failed:,} failed</span>')
    badge, limit_events = _limit_events(run.limit_events)
    marks.append(badge)
    for kind, usd in (("unsettled", s.unsettled_cost_usd), ("estimated", s.estimated_cost_usd)):
        if usd:
            marks.append(f'<span class="badge {kind}">{esc(dollars(usd))} {kind}</span>')
    cost = dollars(s.cost_usd) + (f" + {s.unpriced_calls} unpriced" if s.unpriced_calls else "")
    named = run.contexts.name
    run_id = f'<span class="run-id muted">{esc(run.run_id)}</span> ' if label == named else ""
    head = (
        f'<summary><span class="run-name">{esc(label)}</span> {run_id}'
        f'<span class="muted">{run.events:,} nodes · {esc(cost)} · {esc(s.termination)}'
        f"</span> {' '.join(m for m in marks if m)}</summary>"
    )
    if data_index is None:
        calls = (
            '<p class="muted">This run is beyond the report\'s detail budget: its totals, '
            "limits and stops are shown, its timeline and calls are not.</p>"
        )
        timeline = ""
    else:
        dropped = (
            f'<p class="muted">The first {len(run.calls):,} of {run.events:,} events '
            "are drawn (the report's detail budget).</p>"
            if run.calls_dropped
            else ""
        )
        timeline = f'<h3>Timeline</h3><div class="timeline"></div>{dropped}'
        calls = (
            '<h3>Calls</h3><div class="filters"><input type="search" class="filter-text" '
            'placeholder="filter by name or model" aria-label="filter by name or model">'
            '<select class="filter-status" aria-label="status"><option value="">any status'
            "</option><option>success</option><option>fail</option><option>halt</option>"
            '</select><select class="filter-model" aria-label="model"><option value="">any '
            'model</option></select><span class="filter-count muted"></span></div>'
        )
    data = f' data-run="{data_index}"' if data_index is not None else ""
    return (
        f'<details class="run" id="run-{index}"{data}{" open" if open_ else ""}>{head}'
        f'{limit_events}<div class="glance"><section class="limit-panel"><h3>Spend and limits'
        f'</h3>{_limits(run, given, shared)}</section><section class="stop-panel"><h3>Stops '
        f'<span class="muted">({run.halted_nodes:,})</span></h3>{_stops(run)}</section></div>'
        f"{timeline}{calls}</details>"
    )


def runs_table(
    summaries: Sequence[RunSummary],
    across: Mapping[str, Mapping[str, float | None]],
    panels: Mapping[int, int],
    labels: Mapping[str, str],
) -> str:
    """All runs in one sortable table shown :data:`PAGE_ROWS` rows a page, with a totals row
    and the p50/p95 of each column across runs; a run's id links to its panel (``panels``
    maps a row to the run's panel number)."""
    head = "".join(
        f'<th scope="col" data-sort="{"text" if k in _TEXT_COLUMNS else "num"}" tabindex="0" '
        f'title="sort by {esc(label)}">{esc(label)}</th>'
        for k, label in TABLE_COLUMNS
    )
    body = []
    for i, summary in enumerate(summaries):
        d = summary.to_dict()
        d["stop_reason"] = scrubbed(d["stop_reason"])
        d["label"] = labels.get(summary.run_id, summary.run_id)
        cells = []
        for key, _ in TABLE_COLUMNS:
            if key not in _TEXT_COLUMNS:
                cells.append(f'<td data-v="{d[key]!r}">{esc(_cell(key, d[key]))}</td>')
                continue
            text = esc(_fmt(d[key])).replace("_", "_<wbr>")  # may break after "_" when narrow
            if key == "label" and i in panels:
                text = f'<a href="#run-{panels[i]}" class="open-run">{text}</a>'
            cells.append(f'<td class="text">{text}</td>')
        body.append(f"<tr>{''.join(cells)}</tr>")
    totals = "".join(
        f'<td class="text">total ({len(summaries):,} runs)</td>'
        if k == "label"
        else f"<td>{esc(_cell(k, sum(getattr(s, k) for s in summaries)))}</td>"
        if k in _SUMMED
        else "<td></td>"
        for k, _ in TABLE_COLUMNS
    )
    foot = [f'<tr class="totals">{totals}</tr>']
    for q in ("p50", "p95"):
        row = "".join(
            f"<td>{esc(_cell(k, across[k][q]))}</td>"
            if k in NUMERIC_COLUMNS
            else f'<td class="text">{q if k == "label" else ""}</td>'
            for k, _ in TABLE_COLUMNS
        )
        foot.append(f'<tr class="across">{row}</tr>')
    return (
        f'<div class="paged" data-page="{PAGE_ROWS}" data-items="tbody tr">'
        f'<table class="summary"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody>'
        f'<tfoot>{"".join(foot)}</tfoot></table><nav class="pager"></nav></div>'
    )
