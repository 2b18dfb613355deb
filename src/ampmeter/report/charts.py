"""The report's charts as inline SVG: sized to their data, labels laid out so they never meet,
and a ``data-tip`` on every mark that the page's script shows as a tooltip under the pointer.

Each function returns an SVG element as text. Every piece of log text is escaped here; axis
labels are placed on a grid wide enough for the longest label (estimated from its length, then
checked in the browser by the page's script, which shortens a label that still does not fit).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape
from typing import Final

from ampmeter.keys import KEY_COST, KEY_COST_FOR
from ampmeter.money import format_usd

__all__ = [
    "amount",
    "bars_by_model",
    "dollars",
    "latency_histogram",
    "line_chart",
    "nice_ticks",
    "share_of",
    "text_width",
]


def dollars(value: float) -> str:
    """Dollars as every view shows them (``$0.00012``, ``$1,234.50``, never ``5.06e-02``):
    :func:`ampmeter.money.format_usd` of the amount to the nano-dollar, the unit ampmeter
    counts in, so a sum of floats shows no binary noise (as ``ampmeter summary`` and
    ``watch``)."""
    return format_usd(round(value, 9))


def share_of(used: float, cap: float) -> tuple[float, str]:
    """The share of ceiling ``cap`` that ``used`` is, and how every view marks it: ``"over"``
    from the whole ceiling, ``"near"`` from 80 %, else ``"ok"`` (a zero ceiling is reached by
    any use)."""
    share = used / cap if cap > 0 else (1.0 if used > 0 else 0.0)
    return share, "over" if share >= 1 else "near" if share >= 0.8 else "ok"


def amount(key: str, value: float) -> str:
    """The value of stats key ``key`` as every view shows it: dollars for a cost key, else a
    count with thousands separators."""
    if key == KEY_COST or key.startswith(KEY_COST_FOR):
        return dollars(value)
    return f"{value:,.0f}" if value == int(value) else f"{value:,.4g}"


_CHAR_PX: Final = 6.6  # a generous average advance of an 11 px system-ui glyph
_WIDTH: Final = 640
_PALETTE: Final = (
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#9467bd",
    "#ff7f0e",
    "#17becf",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#393b79",
    "#637939",
)


def text_width(text: str) -> float:
    """A width (px) that an 11 px label of ``text`` does not exceed in practice."""
    return len(text) * _CHAR_PX + 2


def nice_ticks(
    low: float, high: float, room_px: float, label_px: float, *, integer: bool = False
) -> list[float]:
    """Round tick values from ``low`` to ``high`` no closer than ``label_px`` apart on an axis
    ``room_px`` long, so their labels cannot overlap (whole numbers only when ``integer``)."""
    if high <= low:
        return [low]
    most = max(1, int(room_px // max(label_px, 1.0)))
    raw = (high - low) / most
    if integer:
        raw = max(raw, 1.0)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next((m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw), raw)
    if integer:
        step = max(1.0, float(math.ceil(step)))
    first = math.ceil(low / step - 1e-9) * step
    count = int((high - first) / step + 1e-9) + 1
    return [round(first + i * step, 12) for i in range(count)]


def covering(ticks: list[float], high: float) -> list[float]:
    """``ticks`` with one more step when the last falls short of ``high``, so the axis they
    label reaches past every point (an axis labelled to 40 for data reaching 46 misleads)."""
    if len(ticks) > 1 and ticks[-1] < high - 1e-12:
        ticks = [*ticks, round(ticks[-1] + (ticks[1] - ticks[0]), 12)]
    return ticks


def tick_label(value: float, ticks: Sequence[float]) -> str:
    """``value`` with as many decimals as the spacing of ``ticks`` needs (so no two read alike)."""
    step = abs(ticks[1] - ticks[0]) if len(ticks) > 1 else abs(value) or 1.0
    decimals = 0
    while decimals < 9 and abs(round(step, decimals) - step) > step * 1e-6:
        decimals += 1
    return f"{value:,.{decimals}f}"


def number(value: float) -> str:
    """A compact, exact-looking label: ``1,200``, ``0.25``, ``3.5e-05`` never; ``0.000035``."""
    if value == 0:
        return "0"
    if abs(value) >= 100 or value == int(value):
        return f"{value:,.0f}"
    if abs(value) >= 0.01:
        return f"{value:,.2f}".rstrip("0").rstrip(".")
    return f"{value:.6f}".rstrip("0")


def _svg(width: float, height: float, label: str, body: list[str], cls: str) -> str:
    return (
        f'<svg class="chart {cls}" viewBox="0 0 {width:.0f} {height:.0f}" width="{width:.0f}" '
        f'height="{height:.0f}" role="img" aria-label="{escape(label)}">{"".join(body)}</svg>'
    )


def _text(x: float, y: float, text: str, cls: str, anchor: str = "start", fit: float = 0) -> str:
    fitted = f' data-fit="{fit:.0f}"' if fit else ""
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" class="{cls}" text-anchor="{anchor}"{fitted}>'
        f"{escape(text)}</text>"
    )


def _x_ticks(ticks: Sequence[tuple[float, str]], y: float, left: float, right: float) -> str:
    """Tick labels along the x axis: each centred on its tick, or flush with the plot's edge
    where centring would push it past ``left`` (into the y axis's labels) or ``right``; a label
    that would then come within 6 px of the one before it is left out."""
    out = []
    last_end = -math.inf
    for x, label in ticks:
        width = text_width(label)
        if x - width / 2 < left:
            start, anchor = x, "start"
        elif x + width / 2 > right:
            start, anchor = x - width, "end"
        else:
            start, anchor = x - width / 2, "middle"
        if start < last_end + 6:
            continue
        out.append(_text(x, y, label, "tick", anchor))
        last_end = start + width
    return "".join(out)


def _y_grid(marks: Sequence[tuple[float, str]], left: float, width: float) -> str:
    """A grid line across the plot, labelled left of the axis, at each ``(y, label)``."""
    return "".join(
        f'<line class="grid" x1="{left}" x2="{left + width}" y1="{y:.1f}" y2="{y:.1f}"></line>'
        + _text(left - 4, y + 4, label, "tick", "end")
        for y, label in marks
    )


def bars_by_model(by_model: Mapping[str, Mapping[str, float]]) -> str:
    """Priced cost and tokens per model as two bar columns, one 22 px row per model (so one
    model gives one short row, not a panel). ``by_model`` maps a model to ``cost_usd`` and
    ``tokens``."""
    models = sorted(by_model, key=lambda m: -by_model[m].get("cost_usd", 0.0))
    if not models:
        return '<p class="muted">No LLM calls.</p>'
    row, top = 22, 22
    label_w = min(200.0, max(text_width(m) for m in models))
    col_w = (_WIDTH - label_w - 20) / 2
    height = top + row * len(models) + 6
    body = [
        _text(label_w + 10, 14, "cost (priced, $)", "head"),
        _text(label_w + 20 + col_w, 14, "tokens (in + out)", "head"),
    ]
    max_cost = max(by_model[m].get("cost_usd", 0.0) for m in models) or 1.0
    max_tokens = max(by_model[m].get("tokens", 0.0) for m in models) or 1.0
    for i, model in enumerate(models):
        y = top + i * row
        cost, tokens = by_model[model].get("cost_usd", 0.0), by_model[model].get("tokens", 0.0)
        tip = escape(f"{model}: {dollars(cost)} priced, {tokens:,.0f} tokens", quote=True)
        body.append(_text(label_w, y + 14, model, "label", "end", fit=label_w))
        for x0, value, peak, cls, text in (
            (label_w + 10, cost, max_cost, "cost", dollars(cost)),
            (label_w + 20 + col_w, tokens, max_tokens, "tokens", f"{tokens:,.0f}"),
        ):
            # the value's label sits inside the column, after the bar or inside a long one
            room = col_w - 10
            length = max(1.0, room * value / peak) if value else 0.0
            body.append(
                f'<rect class="bar {cls}" x="{x0:.1f}" y="{y + 3}" width="{length:.1f}" '
                f'height="{row - 6}" data-tip="{tip}"></rect>'
            )
            if length > text_width(text) + 8:
                body.append(_text(x0 + length - 4, y + 15, text, "value in", "end"))
            else:
                body.append(_text(x0 + length + 4, y + 15, text, "value", "start"))
    return _svg(_WIDTH, height, "cost and tokens by model", body, "by-model")


def latency_histogram(counts: Mapping[float, int], p50: float | None, p95: float | None) -> str:
    """A histogram of latencies (ms) given as a count per value, with p50 and p95 marked; the
    two labels sit in lanes of their own above the bars, so they never overlap."""
    total = sum(counts.values())
    if not total:
        return '<p class="muted">No sent LLM call has a latency.</p>'
    low, high = min(counts), max(counts)
    bins = max(1, min(40, math.ceil(math.sqrt(total))))
    width = (high - low) / bins or 1.0
    tally = [0] * bins
    for value, count in counts.items():
        tally[min(bins - 1, int((value - low) / width))] += count
    left, right, top, bottom = 44, 16, 40, 34
    plot_w, plot_h = _WIDTH - left - right, 130
    height = top + plot_h + bottom
    peak = max(tally)

    def x(value: float) -> float:
        return left + (value - low) / (width * bins) * plot_w

    y_ticks = nice_ticks(0, peak, plot_h, 16, integer=True)
    marks = [(top + plot_h - tick / peak * plot_h, f"{tick:,.0f}") for tick in y_ticks]
    body = [_y_grid(marks, left, plot_w)]
    bar_w = plot_w / bins
    for i, count in enumerate(tally):
        if not count:
            continue
        h = count / peak * plot_h
        tip = escape(
            f"{number(low + i * width)}–{number(low + (i + 1) * width)} ms: {count:,} call(s)",
            quote=True,
        )
        body.append(
            f'<rect class="bar latency" x="{left + i * bar_w + 0.5:.1f}" '
            f'y="{top + plot_h - h:.1f}" width="{max(bar_w - 1, 1):.1f}" height="{h:.1f}" '
            f'data-tip="{tip}"></rect>'
        )
    label_px = text_width(number(high) + " ms") + 12
    x_ticks = nice_ticks(low, low + width * bins, plot_w, label_px)
    labels = [(x(t), tick_label(t, x_ticks) + " ms") for t in x_ticks]
    body.append(_x_ticks(labels, top + plot_h + 14, left, left + plot_w))
    caption = f"latency of {total:,} sent LLM call(s)"
    body.append(_text(left + plot_w / 2, height - 4, caption, "axis", "middle"))
    for lane, (name, mark) in enumerate((("p50", p50), ("p95", p95))):
        if mark is None:
            continue
        vx = x(mark)
        text = f"{name} {number(mark)} ms"
        anchor, dx = ("end", -4) if vx > left + plot_w / 2 else ("start", 4)
        body.append(
            f'<line class="mark {name}" x1="{vx:.1f}" x2="{vx:.1f}" '
            f'y1="{6 + lane * 15}" y2="{top + plot_h}"></line>'
        )
        body.append(_text(vx + dx, 15 + lane * 15, text, f"mark-label {name}", anchor))
    return _svg(_WIDTH, height, "latency histogram", body, "latency")


def line_chart(
    series: Sequence[tuple[str, Sequence[tuple[float, float]]]],
    *,
    x_label: str,
    y_label: str,
    y_format: str = "number",
) -> str:
    """Lines of ``(x, y)`` points, one per named series, each point with a tooltip; a legend
    (HTML, beside the chart) names the series when there are several."""
    points = [p for _, pts in series for p in pts]
    if not points:
        return '<p class="muted">Nothing to draw.</p>'
    x0, x1 = min(p[0] for p in points), max(p[0] for p in points)
    y0, y1 = min(0.0, min(p[1] for p in points)), max(p[1] for p in points)
    y1 = y1 if y1 > y0 else y0 + 1

    def fmt(v: float) -> str:
        return dollars(v) if y_format == "usd" else number(v)

    y_ticks = covering(nice_ticks(y0, y1, 120, 18), y1)
    y1 = max(y1, y_ticks[-1])
    y_labels = [("$" if y_format == "usd" else "") + tick_label(t, y_ticks) for t in y_ticks]
    left = 14 + max(text_width(label) for label in y_labels)
    right, top, bottom, plot_h = 16, 10, 34, 140
    plot_w = _WIDTH - left - right
    height = top + plot_h + bottom

    def px(v: float) -> float:
        return left + (v - x0) / ((x1 - x0) or 1) * plot_w

    def py(v: float) -> float:
        return top + plot_h - (v - y0) / (y1 - y0) * plot_h

    body = [
        _y_grid([(py(t), label) for t, label in zip(y_ticks, y_labels, strict=True)], left, plot_w)
    ]
    whole = all(p[0] == int(p[0]) for p in points)
    label_px = text_width(f"{x1:,.2f}") + 14
    x_ticks = covering(nice_ticks(x0, x1, plot_w, label_px, integer=whole), x1)
    x1 = max(x1, x_ticks[-1])
    labels = [(px(t), tick_label(t, x_ticks)) for t in x_ticks]
    body.append(_x_ticks(labels, top + plot_h + 14, left, left + plot_w))
    body.append(_text(left + plot_w / 2, height - 4, x_label, "axis", "middle"))
    for i, (name, pts) in enumerate(series):
        colour = _PALETTE[i % len(_PALETTE)]
        path = " ".join(
            f"{'M' if j == 0 else 'L'}{px(a):.1f} {py(b):.1f}" for j, (a, b) in enumerate(pts)
        )
        body.append(f'<path class="line" d="{path}" stroke="{colour}"></path>')
        for a, b in pts:
            tip = escape(f"{name}: {x_label} {number(a)}, {y_label} {fmt(b)}", quote=True)
            body.append(
                f'<circle class="point" cx="{px(a):.1f}" cy="{py(b):.1f}" r="3.5" '
                f'fill="{colour}" data-tip="{tip}"></circle>'
            )
    chart = _svg(_WIDTH, height, f"{y_label} against {x_label}", body, "lines")
    if len(series) < 2:
        return chart
    legend = "".join(
        f'<li><span class="swatch" style="background:{_PALETTE[i % len(_PALETTE)]}"></span>'
        f"{escape(name)}</li>"
        for i, (name, _) in enumerate(series)
    )
    return f'<div class="with-legend">{chart}<ul class="legend">{legend}</ul></div>'
