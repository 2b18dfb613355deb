"""Figures and the self-contained HTML report (structure and escaping; the browser test is in
test_report_browser.py)."""

from __future__ import annotations

import io
import itertools
import json
import re
import struct
from decimal import Decimal
from pathlib import Path

import pytest

from ampmeter import ExecutionContext
from ampmeter.analysis import amortization_curve
from ampmeter.logs import StreamMetricsLogger
from ampmeter.report import (
    amortization_figure,
    build_report,
    embed_json,
    save_png,
    write_report,
)
from ampmeter.report.charts import bars_by_model, line_chart, nice_ticks, tick_label
from support.event_logs import SCRIPT_NAME, make_event_log, make_research_log, make_stream_logs

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_MAGIC
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_amortization_figure_is_a_png_image(tmp_path: Path) -> None:
    logs = make_stream_logs(tmp_path)
    rows = amortization_curve(logs["stream"], problems_jsonl=logs["problems"])
    image = amortization_figure(rows)
    width, height = png_size(image)
    assert width > 200 and height > 100
    # an empty input still gives an image that says so
    assert png_size(amortization_figure([]))[0] > 100
    target = tmp_path / "f.png"
    save_png(image, target)
    assert target.read_bytes() == image


def test_embed_json_cannot_close_the_script_element() -> None:
    value = {"name": "</script><script>alert(1)</script><!-- & \u2028"}
    text = embed_json(value)
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == value


def _blob(page: str) -> dict:  # type: ignore[type-arg]
    match = re.search(r'<script type="application/json" id="amp-data">(.*?)</script>', page, re.S)
    assert match is not None
    return json.loads(match.group(1))  # type: ignore[no-any-return]


def test_report_is_one_self_contained_file_with_escaped_text(tmp_path: Path) -> None:
    events = make_event_log(tmp_path / "agent.jsonl", run_id=f"run {SCRIPT_NAME}")
    page = build_report([events], title="t <b>x</b>")
    # nothing to fetch: no external URLs, only data: images, a CSP that forbids the network
    assert not re.search(r"(src|href)=\"(?!#)", page)  # links inside the page only
    code = page.replace('"http://www.w3.org/2000/svg"', "")  # a namespace name, never fetched
    assert "http://" not in code and "https://" not in code and "<link" not in page
    assert "default-src 'none'" in page
    assert page.count("<img ") == 0 and page.count('<svg class="chart') == 3  # inline SVG
    # the only script elements are the report's own two
    assert page.count("<script") == 2
    assert SCRIPT_NAME not in page
    assert "&lt;script&gt;" in page  # the run id in the table and the run list, escaped
    assert "<title>t &lt;b&gt;x&lt;/b&gt;</title>" in page
    data = _blob(page)
    (run,) = data["runs"]
    assert run["id"] == f"run {SCRIPT_NAME}"
    names = [n[3] for n in run["nodes"]]
    assert SCRIPT_NAME in names
    statuses = {n[4] for n in run["nodes"]}
    assert {"success", "fail", "halt"} <= statuses
    by_span = {n[0]: i for i, n in enumerate(run["nodes"])}
    tool = next(n for n in run["nodes"] if n[2] == "tool" and n[1] >= 0)
    assert run["nodes"][tool[1]][2] == "llm" and tool[1] in by_span.values()


def test_report_with_stream_logs_has_the_amortization_figure(tmp_path: Path) -> None:
    logs = make_stream_logs(tmp_path, problems=5)
    out = tmp_path / "r.html"
    assert write_report([logs["stream"], logs["problems"], logs["events"]], out) == str(out)
    page = out.read_text()
    assert page.count('<svg class="chart') == 5
    assert "Amortization: cost per solved problem" in page
    assert len(_blob(page)["runs"]) == 5  # one run per problem (run_id stream:problem)


def test_report_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no log files"):
        build_report([])
    with pytest.raises(FileNotFoundError, match="no such file"):
        build_report([tmp_path / "missing.jsonl"])
    out = tmp_path / "never.html"
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{nope\n{}\n")
    with pytest.raises(ValueError):
        write_report([bad], out)
    assert not out.exists() and list(tmp_path.iterdir()) == [bad]


def _pixels_of(png: bytes, rgb: tuple[int, int, int], tolerance: int = 30) -> int:
    import numpy as np
    from PIL import Image

    pixels = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=int)
    return int((np.abs(pixels - np.array(rgb)) <= tolerance).all(axis=-1).sum())


def test_a_run_that_cost_nothing_gets_a_note_not_a_flat_cost_curve() -> None:
    blue = (0x1F, 0x77, 0xB4)  # the cost-per-solved line
    rows = [{"t": t, "cost_per_solved": 0.0, "cum_accuracy": 0.5} for t in range(1, 6)]
    free = amortization_figure(rows)
    priced = amortization_figure([{**r, "cost_per_solved": 0.01 * r["t"]} for r in rows])
    assert _pixels_of(free, blue) == 0
    assert _pixels_of(priced, blue) > 100


def _svg_height(svg: str) -> int:
    match = re.search(r'height="(\d+)"', svg)
    assert match is not None
    return int(match.group(1))


def test_charts_are_sized_to_their_data() -> None:
    one = bars_by_model({"gpt-4o-mini": {"cost_usd": 0.2, "tokens": 900.0}})
    many = bars_by_model({f"model-{i}": {"cost_usd": i, "tokens": 10.0 * i} for i in range(10)})
    assert _svg_height(one) < 60  # one short row, not a panel
    assert _svg_height(many) == _svg_height(one) + 9 * 22
    # the one bar is as long as its column, and its value is written inside it
    assert 'class="value in"' in one and "$0.20" in one


def test_ticks_keep_their_labels_apart() -> None:
    for low, high, room in ((0, 1, 600), (0, 7_300, 500), (1, 6, 560), (0.002, 0.0131, 120)):
        ticks = nice_ticks(low, high, room, 40)
        assert len(ticks) <= room // 40 + 1
        labels = [tick_label(t, ticks) for t in ticks]
        assert len(set(labels)) == len(labels), labels
    assert nice_ticks(1, 6, 560, 30, integer=True) == [1, 2, 3, 4, 5, 6]


def test_a_root_s_ceilings_over_many_runs_say_what_the_runs_used_together(
    tmp_path: Path,
) -> None:
    """A stream logger writes each problem as a run, all under one root and its budget (the
    demo's run budget): each run's panel says what they used together against that budget,
    while two roots of one name in one process stay two runs of their own."""
    with (
        StreamMetricsLogger(tmp_path, "batch") as logger,
        ExecutionContext("batch_run", max_cost_usd=0.01) as root,
    ):
        for t in range(3):
            with (
                root.spawn_child(f"q{t}", sinks=[logger.problem(t, f"q{t}")]) as child,
                child.llm_call("solve", model="m", estimate_usd=0.002) as call,
            ):
                call.record(tokens_in=10, tokens_out=1, cost_usd=0.002)
    page = build_report([logger.token_events_path])
    note = "batch_run's ceilings cover 3 runs of this report; together they used"
    assert page.count(note) == 3 and "amp:cost: $0.006 of $0.01." in page
    assert "ceiling set by batch_run" in page
    two = build_report([make_research_log(tmp_path / "r.jsonl", 2)])
    assert "ceilings cover" not in two and two.count("of $0.0004 (30%; ceiling set by") == 2


def test_a_line_chart_s_axes_reach_past_its_data() -> None:
    """Issue 39: input tokens reaching 46 were drawn under an axis labelled up to 40."""
    chart = line_chart(
        [("run", [(1.0, 12.0), (2.0, 30.0), (3.0, 46.0)])],
        x_label="LLM call",
        y_label="input tokens",
    )
    y_labels = [float(v) for v in re.findall(r'class="tick" text-anchor="end">([\d.,]+)<', chart)]
    assert y_labels and max(y_labels) >= 46, y_labels
    top_tick = re.search(r'text-anchor="end">' + re.escape(f"{max(y_labels):,.0f}") + "<", chart)
    assert top_tick is not None


def test_many_runs_get_totals_and_pages(tmp_path: Path) -> None:
    lines = [
        json.dumps(
            {
                "timestamp": "2026-01-22T08:10:00.000Z",
                "run_id": f"r{i:04d}",
                "span_id": "s1",
                "event_type": "llm_completion",
                "model": "m",
                "cost_usd": 0.001,
                "latency_ms": 5,
                "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
                "metadata": {"status": "success"},
            }
        )
        for i in range(955)
    ]
    log = tmp_path / "many.jsonl"
    log.write_text("\n".join(lines) + "\n")
    page = build_report([log])
    assert 'data-page="50"' in page
    totals = re.search(r'<tr class="totals">(.*?)</tr>', page)
    assert totals is not None
    cells = re.findall(r"<td[^>]*>(.*?)</td>", totals.group(1))
    assert cells[:3] == ["total (955 runs)", "955", "0"]
    assert "9,550" in cells and "$0.955" in cells


def test_ceilings_may_be_given_in_decimal_dollars(tmp_path: Path) -> None:
    events = make_event_log(tmp_path / "agent.jsonl")
    page = build_report([events], ceilings={"amp:cost": Decimal("0.05")})
    assert "of $0.05 (" in page and "ceiling given" in page


def test_the_run_at_a_glance_is_one_whose_timeline_the_report_holds(tmp_path: Path) -> None:
    from ampmeter.analysis.digest import digest_logs
    from ampmeter.report.html import focus_run

    quiet = make_event_log(tmp_path / "quiet.jsonl", run_id="quiet", halt=False)
    first = make_event_log(tmp_path / "first.jsonl", run_id="first-stop")
    second = make_event_log(tmp_path / "second.jsonl", run_id="second-stop")
    page = build_report([quiet, first, second])
    glance = page.split('<section id="glance">', 1)[1].split("<h2>All runs</h2>", 1)[0]
    assert "first-stop" in glance and 'class="timeline"' in glance
    full = digest_logs([quiet, first, second])
    assert focus_run(full.runs) == 1
    # when the detail budget ends before the first stopped run, the next one is shown instead
    events = full.runs[0].events
    short = digest_logs([quiet, first, second], detail_budget=events + 5, detail_per_run=events)
    assert [len(r.calls) for r in short.runs] == [events, 5, 0]
    assert focus_run(short.runs) == 1  # five of its calls are held: enough for a timeline
    shorter = digest_logs([quiet, first, second], detail_budget=events, detail_per_run=events)
    assert focus_run(shorter.runs) == 1  # none held anywhere: still the first stop
    assert focus_run(full.runs[:1]) == 0 and focus_run([]) == 0


def test_best_effort_says_how_many_lines_it_skipped(tmp_path: Path) -> None:
    good = make_event_log(tmp_path / "agent.jsonl").read_text().splitlines()
    log = tmp_path / "damaged.jsonl"
    log.write_text("\n".join([good[0], "{not json", *good[1:]]) + "\n")
    with pytest.raises(ValueError, match=r"damaged\.jsonl:2"):
        build_report([log])
    page = build_report([log], best_effort=True)
    assert "1 bad line(s) skipped." in page


def test_latency_tick_labels_keep_apart_at_the_plot_edges() -> None:
    from ampmeter.report.charts import latency_histogram, text_width

    for high in (58.6, 60.0, 61.0, 99.0, 3_010.0):
        svg = latency_histogram({0.0: 18, 30.0: 1, 50.0: 3, high: 2}, 0.0, high * 0.97)
        ticks = re.findall(
            r'<text x="([\d.]+)" y="[\d.]+" class="tick" text-anchor="(\w+)">([^<]+) ms</text>',
            svg,
        )
        boxes = []
        for x, anchor, label in ticks:
            width = text_width(label + " ms")
            start = float(x) - {"start": 0, "middle": width / 2, "end": width}[anchor]
            boxes.append((start, start + width))
        assert len(boxes) >= 3
        assert all(a[1] + 6 <= b[0] for a, b in itertools.pairwise(boxes)), (high, ticks)
