"""The HTML report in a real headless Chromium (Debian's package, driven by Playwright).

Chromium comes from the OS (``apt-get install chromium``, as ``scripts/system-deps.sh`` does);
no browser is ever downloaded. The page is opened from disk with the network unused.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from ampmeter import ExecutionContext, JsonlSink, LimitExceeded
from ampmeter.report import write_report
from support.event_logs import (
    IMG_PAYLOAD,
    SCRIPT_NAME,
    make_event_log,
    make_research_log,
    make_stream_logs,
    make_subagent_log,
)

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ROOT = Path(__file__).resolve().parents[2]


def _ensure_chromium() -> None:
    if os.path.exists(CHROMIUM):
        return
    script = ROOT / "scripts" / "system-deps.sh"
    if script.exists() and shutil.which("apt-get") and os.geteuid() == 0:
        subprocess.run(["bash", str(script)], check=False, timeout=900)
    if not os.path.exists(CHROMIUM):
        message = "Debian's chromium is not installed (apt-get install -y chromium)"
        if os.environ.get("CI"):
            pytest.fail(f"{message}: CI must test the report in a real browser")
        pytest.skip(message)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    _ensure_chromium()
    from playwright.sync_api import sync_playwright

    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(profile), executable_path=CHROMIUM, headless=True, args=ARGS
        )
        try:
            yield context
        finally:
            context.close()


def _big_log(path: Path, nodes: int = 10_000) -> Path:
    """One run of ``nodes`` events: 2,000 top-level calls with tool children, some halted."""
    lines = []
    for i in range(nodes):
        top = i % 5 == 0
        event = {
            "timestamp": "2026-01-22T08:10:00.000Z",
            "run_id": "big",
            "span_id": f"s{i}",
            "event_type": "llm_completion" if top else "tool_call",
            "operation": f"op-{i}",
            "component": "pipeline",
            "model": "gpt-4o-mini" if top else "",
            "usage": {"prompt_tokens": i, "completion_tokens": 1, "total_tokens": i + 1},
            "cost_usd": 0.0001,
            "latency_ms": i % 700,
            "metadata": {"status": "halt" if i % 997 == 0 else "success", "retries_used": 0},
        }
        if not top:
            event["parent_id"] = f"s{i - i % 5}"
        lines.append(orjson.dumps(event))
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("report")
    agent = make_event_log(d / "agent.jsonl", run_id="agent")
    big = _big_log(d / "big.jsonl")
    return Path(write_report([agent, big], d / "report.html"))


def _open(page: object) -> None:
    page.wait_for_selector("html[data-ready='1']")  # type: ignore[attr-defined]


def test_the_first_run_with_a_stop_is_open_and_its_tree_expands(
    browser: object, report: Path
) -> None:
    page = browser.new_page()  # type: ignore[attr-defined]
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto(report.as_uri())
    _open(page)
    charts = page.locator("svg.chart")
    assert charts.count() == 3
    assert [u for u in requests if u != report.as_uri()] == []

    run = page.locator("#glance details.run[open]")  # the agent run: it has a stop
    assert run.get_attribute("data-run") == "0"
    rows = run.locator("ul.tree.top > li > .node")
    assert rows.count() == 8  # the agent's top-level calls
    halted = run.locator(".node.halt")
    failed = run.locator(".node.fail")
    assert halted.count() == 1 and failed.count() == 1
    assert "limit exceeded" in halted.inner_text()
    first = rows.nth(0)
    assert first.locator(".name").inner_text() == "step-0"
    first.locator("button.toggle").click()
    child = run.locator("ul.tree ul.tree .node")
    assert child.count() == 1
    assert child.locator(".kind").inner_text() == "tool"
    assert child.locator(".name").inner_text() == "search"
    assert first.locator("button.toggle").get_attribute("aria-expanded") == "true"
    first.locator("button.toggle").click()
    assert not child.is_visible()
    page.close()


def test_script_in_names_is_text_and_never_runs(browser: object, report: Path) -> None:
    page = browser.new_page()  # type: ignore[attr-defined]
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.goto(report.as_uri())
    _open(page)
    run = page.locator("details.run[data-run='0']")
    run.locator(".node").first.wait_for()
    names = run.locator(".node .name").all_inner_texts()
    assert SCRIPT_NAME in names
    assert IMG_PAYLOAD in run.locator(".node.fail").inner_text()  # the failure, as text
    assert page.evaluate("document.querySelectorAll('.node img').length") == 0
    toggles = run.locator(".node button.toggle:enabled")
    for i in range(toggles.count()):
        toggles.nth(i).click()
    # the timeline's labels carry the same names, as text too (shortened; the tip is whole)
    tips = run.locator("svg.gantt text.label").evaluate_all(
        "ts => ts.map(t => t.getAttribute('data-tip'))"
    )
    assert any(SCRIPT_NAME in t for t in tips)
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert page.evaluate("document.querySelectorAll('script').length") == 2
    assert dialogs == []
    page.close()


def test_ten_thousand_nodes_stay_usable(browser: object, report: Path) -> None:
    page = browser.new_page()  # type: ignore[attr-defined]
    page.goto(report.as_uri())
    _open(page)
    run = page.locator("details.run[data-run='1']")
    assert "10,000 nodes" in run.locator("summary").inner_text()
    run.locator("summary").click()
    run.locator(".node").first.wait_for()
    top = run.locator("ul.tree.top > li")
    assert top.count() == 200  # rendered in chunks, not all 2,000 at once
    run.locator("ul.tree.top > button.more").click()
    assert top.count() == 400
    top.nth(0).locator("button.toggle").click()
    assert top.nth(0).locator("ul.tree .node").count() == 4
    assert run.locator(".node.halt").count() >= 1
    assert run.locator("svg.gantt rect.bar").count() >= 290  # the first 300 calls are drawn
    page.close()


def _timed_log(path: Path) -> Path:
    """A run whose calls take real time (nested tools inside LLM calls) until its cost
    ceiling stops one, so its timeline has bars of different lengths and a stop."""
    with JsonlSink(path, flush="line") as sink:
        ctx = ExecutionContext("agent", sinks=[sink], chain_id="timed", max_cost_usd=0.002)
        with contextlib.suppress(LimitExceeded), ctx:
            for step in range(20):
                with ctx.llm_call(f"think-{step}", model="gpt-4o-mini", max_tokens=50) as call:
                    time.sleep(0.03)
                    with ctx.tool_call("search"):
                        time.sleep(0.02)
                    call.record(tokens_in=2000 + 500 * step, tokens_out=50)
    return path


def _distinct_colours(png: bytes) -> int:
    from PIL import Image

    return len(Image.open(io.BytesIO(png)).convert("RGB").getcolors(1 << 20) or [])


# Pairs of boxes (labels against labels, labels against bars and marks) that intersect, in
# every drawn SVG of the page, measured by the browser itself.
OVERLAPS = """() => {
  const meet = (a, b) => a.left < b.right - 0.5 && b.left < a.right - 0.5 &&
                         a.top < b.bottom - 0.5 && b.top < a.bottom - 0.5;
  const found = [];
  for (const svg of document.querySelectorAll("svg")) {
    if (!svg.getClientRects().length) continue;
    const texts = [...svg.querySelectorAll("text")]
      .map(t => [t.textContent, t.getBoundingClientRect()]);
    const marks = [...svg.querySelectorAll("rect.bar, path.stop-mark")]
      .map(m => [m.getAttribute("class"), m.getBoundingClientRect()]);
    texts.forEach(([a, ra], i) => {
      texts.slice(i + 1).forEach(([b, rb]) => { if (meet(ra, rb)) found.push([a, b]); });
      marks.forEach(([b, rb]) => {
        if (meet(ra, rb) && !svg.querySelector("text.value.in")) found.push([a, b]);
      });
    });
  }
  return found;
}"""


def _box(page: object, selector: str) -> dict[str, float]:
    box = page.locator(selector).bounding_box()  # type: ignore[attr-defined]
    assert box is not None, selector
    return box  # type: ignore[no-any-return]


def test_what_a_person_sees(browser: object, tmp_path: Path) -> None:
    logs = [
        _timed_log(tmp_path / "timed.jsonl"),
        make_event_log(tmp_path / "agent.jsonl"),
        make_subagent_log(tmp_path / "sub.jsonl"),
        *make_stream_logs(tmp_path).values(),
    ]
    out = Path(write_report(logs, tmp_path / "report.html", notes=["priced as gpt-4o-mini"]))
    page = browser.new_page()  # type: ignore[attr-defined]
    left_the_page: list[str] = []
    page.route(
        "**/*",
        lambda route: (
            route.continue_()
            if route.request.url == out.as_uri()
            else (left_the_page.append(route.request.url), route.abort())
        ),
    )
    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto(out.as_uri())
    _open(page)
    page.screenshot(path=str(tmp_path / "first-screen.png"))
    # The first screen: the run with a stop is open, with its spend against each limit, its
    # stops and its timeline, all inside the first viewport and not covered by anything.
    glance = page.locator("#glance details.run")
    assert (
        glance.get_attribute("open") is not None
        and "timed" in glance.locator("summary").inner_text()
    )
    for selector in ("#glance .limit-panel", "#glance .stop-panel", "#glance .timeline"):
        box = _box(page, selector)
        assert box["y"] >= 0 and box["y"] + box["height"] <= 800, (selector, box)
        assert page.evaluate(
            "([s, x, y]) => document.querySelector(s).contains(document.elementFromPoint(x, y))",
            [selector, box["x"] + box["width"] / 2, box["y"] + min(box["height"] / 2, 30)],
        ), selector
    limit = glance.locator(".limit", has_text="amp:cost")
    # The ceiling the run's root context set, named as such (the log says it).
    assert "set by agent" in limit.inner_text() and "of $0.002" in limit.inner_text()
    assert limit.locator(".bar > span").bounding_box()["width"] > 50  # type: ignore[index]
    stops = glance.locator("ol.stops li")
    assert stops.count() == 1 and "amp:cost" in stops.first.inner_text()
    assert "10 calls sent" in glance.locator("summary").inner_text()
    assert "1 refused" in glance.locator("summary").inner_text()
    # The timeline: bars of different lengths, the stop marked, its reason in its own column.
    gantt = glance.locator("svg.gantt")
    bars = gantt.locator("rect.bar")
    assert bars.count() >= 4
    widths = [bars.nth(i).bounding_box()["width"] for i in range(bars.count())]  # type: ignore[index]
    assert max(widths) > 20 and len({round(w) for w in widths}) > 1
    assert gantt.locator(".stop-mark").count() == 1
    assert "limit exceeded: amp:cost" in gantt.locator(".stop-text").text_content()
    reason_left = gantt.locator(".stop-text").bounding_box()["x"]  # type: ignore[index]
    assert all(
        bars.nth(i).bounding_box()["x"] + widths[i] < reason_left  # type: ignore[index]
        for i in range(bars.count())
    )
    assert _distinct_colours(gantt.screenshot(path=str(tmp_path / "timeline.png"))) > 10
    # Nothing written overlaps: not in the timeline, not in any chart.
    assert page.evaluate(OVERLAPS) == []
    # The charts answer the pointer: a tooltip names what is under it.
    bars.first.hover()
    tip = page.locator("#tip")
    assert tip.is_visible() and "think-0" in tip.inner_text() and "ms" in tip.inner_text()
    page.screenshot(path=str(tmp_path / "tooltip-timeline.png"))
    page.locator("svg.by-model rect.bar.cost").first.hover()
    assert tip.is_visible() and "gpt-4o-mini" in tip.inner_text()
    page.locator("svg.latency rect.bar").first.hover()
    assert tip.is_visible() and "call(s)" in tip.inner_text()
    page.locator("h1").hover()
    assert not tip.is_visible()
    # The latency figure holds the sent calls only; stopped calls are told apart.
    assert "stopped before sending are not in these figures" in page.inner_text(".figures")
    sent = page.evaluate("() => document.querySelector('.overview').textContent")
    assert "3 stopped before sending" in sent
    # Sizes follow the data: one model with a price is one short row.
    assert _box(page, "svg.by-model")["height"] < 90
    # The sub-agent's stop: its own node is in the stop list, but not among refused calls.
    sub_row = page.locator("table.summary tbody tr", has_text="(sub)").first
    column = page.evaluate(
        "() => [...document.querySelectorAll('table.summary th')]"
        ".findIndex(th => th.textContent.startsWith('refused'))"
    )
    assert sub_row.locator("td").nth(column).inner_text() == "1"
    sub_row.locator("a.open-run").click()
    sub = page.locator("details.run", has_text="researcher").first
    assert sub.get_attribute("open") is not None
    assert (
        sub.locator("ol.stops li").count() == 2
        and "sub-agent" in sub.locator("ol.stops").inner_text()
    )
    assert page.evaluate(OVERLAPS) == []
    page.screenshot(path=str(tmp_path / "full.png"), full_page=True)
    assert left_the_page == []
    page.close()


def test_a_run_is_its_root_s_and_each_limit_is_its_setter_s(
    browser: object, tmp_path: Path
) -> None:
    """Issue 39: one run, root capped at $0.0004, six sub-agents capped at 2 LLM calls."""
    out = Path(write_report([make_research_log(tmp_path / "r.jsonl")], tmp_path / "r.html"))
    page = browser.new_page()  # type: ignore[attr-defined]
    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto(out.as_uri())
    _open(page)
    glance = page.locator("#glance details.run")
    head = glance.locator("summary").inner_text()
    assert head.startswith("research_run") and "success" in head and "6 refused" in head
    # The run's own ceiling first, named by who set it; then each sub-agent's own.
    limits = glance.locator(".limit-panel .limit").all_inner_texts()
    assert "amp:cost" in limits[0] and "of $0.0004 (30%; ceiling set by research_run)" in limits[0]
    subagents = [t for t in limits if "researcher-" in t]
    assert len(subagents) == 6 and all(
        "amp:llm_calls" in t and "2 of 2 (100%" in t and "which it stopped" in t for t in subagents
    ), limits
    assert "no ceiling known" not in " ".join(limits[:1]) and "600%" not in page.content()
    # The table names the run; its calls are counted as sent and refused.
    row = page.locator("table.summary tbody tr").first.inner_text().split("\t")
    assert row[:4] == ["research_run", "12", "0", "6"], row
    # With one run the run at a glance is all there is: no empty "every other run" section.
    assert page.locator("h2", has_text="Every other run").count() == 0
    assert "(the only run)" in page.inner_text("#glance h2")
    # The timeline lists each sub-agent above its first call.
    labels = glance.locator("svg.gantt text.label").all_text_contents()
    for i in range(6):
        assert labels.index(f"system researcher-{i}") < labels.index("llm ask-0", i * 4), labels
    # A sub-agent's row shows what its calls used; money reads one way.
    top = glance.locator("ul.tree.top > li > .node").first
    assert "with its calls: tokens 200 / 20 · $0.00002" in top.inner_text()
    top.locator("button.toggle").click()
    inner = glance.locator("ul.tree ul.tree .node").all_inner_texts()
    assert any("$0.00001" in t for t in inner) and any("$0.00" in t for t in inner)
    assert "$0.000 " not in page.inner_text("body") and "e-" not in page.inner_text(".limits")
    assert page.evaluate(OVERLAPS) == []
    page.screenshot(path=str(tmp_path / "research.png"), full_page=True)
    page.close()


def test_latency_reads_with_separators(browser: object, tmp_path: Path) -> None:
    log = tmp_path / "slow.jsonl"
    event = {
        "timestamp": "2026-01-22T08:10:22.436Z",
        "run_id": "slow",
        "span_id": "s1",
        "event_type": "llm_completion",
        "operation": "think",
        "model": "m",
        "cost_usd": 0.00001298,
        "latency_ms": 22436,
        "usage": {"prompt_tokens": 12345, "completion_tokens": 2},
        "metadata": {"status": "success"},
    }
    log.write_bytes(orjson.dumps(event) + b"\n")
    out = Path(write_report([log], tmp_path / "slow.html"))
    page = browser.new_page()  # type: ignore[attr-defined]
    page.goto(out.as_uri())
    _open(page)
    node = page.locator("#glance ul.tree.top .node").first.inner_text()
    assert "22,436 ms" in node and "tokens 12,345 / 2" in node and "$0.00001298" in node
    assert "22,436 ms" in page.inner_text(".overview")
    page.close()


def test_many_runs_page_with_totals(browser: object, tmp_path: Path) -> None:
    log = tmp_path / "many.jsonl"
    log.write_bytes(
        b"".join(
            orjson.dumps(
                {
                    "timestamp": "2026-01-22T08:10:00.000Z",
                    "run_id": f"r{i:04d}",
                    "span_id": "s1",
                    "event_type": "llm_completion",
                    "model": "m",
                    "cost_usd": 0.001 * (i % 7),
                    "latency_ms": 5 + i % 50,
                    "usage": {"prompt_tokens": 10, "completion_tokens": 2},
                    "metadata": {"status": "success"},
                }
            )
            + b"\n"
            for i in range(955)
        )
    )
    out = Path(write_report([log], tmp_path / "many.html"))
    page = browser.new_page()  # type: ignore[attr-defined]
    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto(out.as_uri())
    _open(page)
    rows = page.locator("table.summary tbody tr:visible")
    assert rows.count() == 50
    nav = page.locator(".paged:has(table.summary) nav.pager")
    assert "page 1 of 20 (1–50 of 955)" in nav.inner_text()
    totals = page.locator("table.summary tr.totals")
    assert totals.is_visible() and "total (955 runs)" in totals.inner_text()
    assert "955" in totals.inner_text()
    nav.locator("button.next").click()
    assert rows.first.locator("td").first.inner_text() == "r0050"
    assert "page 2 of 20" in nav.inner_text()
    page.locator("table.summary th", has_text="cost").click()  # sorting starts at page 1
    assert "page 1 of 20" in nav.inner_text() and rows.count() == 50
    ticks = page.locator("#glance svg.gantt text.tick").all_text_contents()
    assert len(ticks) >= 3 and len(set(ticks)) == len(ticks), ticks  # a 5 ms run: in ms
    assert all(t.endswith(" ms") for t in ticks)
    panels = page.locator(".paged > details.run:visible")
    assert panels.count() == 20
    page.locator("h2", has_text="All runs").scroll_into_view_if_needed()
    page.screenshot(path=str(tmp_path / "many.png"))
    assert page.evaluate(OVERLAPS) == []
    page.close()
