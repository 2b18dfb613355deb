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
from test_analysis import IMG_PAYLOAD, SCRIPT_NAME, make_event_log, make_stream_logs

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]  # fmt: skip
ROOT = Path(__file__).resolve().parent.parent


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
            "timestamp": "2026-01-22T08:10:00.000Z", "run_id": "big", "span_id": f"s{i}",
            "event_type": "llm_completion" if top else "tool_call", "operation": f"op-{i}",
            "component": "pipeline", "model": "gpt-4o-mini" if top else "",
            "usage": {"prompt_tokens": i, "completion_tokens": 1, "total_tokens": i + 1},
            "cost_usd": 0.0001, "latency_ms": i % 700,
            "metadata": {"status": "halt" if i % 997 == 0 else "success", "retries_used": 0},
        }  # fmt: skip
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


def test_figures_render_and_tree_expands(browser: object, report: Path) -> None:
    page = browser.new_page()  # type: ignore[attr-defined]
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto(report.as_uri())
    page.wait_for_selector("html[data-ready='1']")
    widths = page.eval_on_selector_all("img", "imgs => imgs.map(i => i.complete && i.naturalWidth)")
    assert len(widths) == 3 and all(w and w > 0 for w in widths)
    assert [u for u in requests if not u.startswith(("file:", "data:"))] == []

    run = page.locator("details.run[data-run='0']")
    run.locator("summary").click()
    run.locator(".node").first.wait_for()  # the details "toggle" event is asynchronous
    rows = run.locator(".node")
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
    page.wait_for_selector("html[data-ready='1']")
    page.locator("details.run[data-run='0'] summary").click()
    page.locator("details.run[data-run='0'] .node").first.wait_for()
    names = page.locator(".node .name").all_inner_texts()
    assert SCRIPT_NAME in names
    failed = page.locator("details.run[data-run='0'] .node.fail").inner_text()
    assert IMG_PAYLOAD in failed  # the failure message, shown as text
    assert page.evaluate("document.querySelectorAll('.node img').length") == 0
    for i in range(page.locator("details.run[data-run='0'] .node button.toggle:enabled").count()):
        page.locator("details.run[data-run='0'] .node button.toggle:enabled").nth(i).click()
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert page.evaluate("document.querySelectorAll('script').length") == 2
    assert dialogs == []
    page.close()


def test_ten_thousand_nodes_stay_usable(browser: object, report: Path) -> None:
    page = browser.new_page()  # type: ignore[attr-defined]
    page.goto(report.as_uri())
    page.wait_for_selector("html[data-ready='1']")
    run = page.locator("details.run[data-run='1']")
    assert "10000 nodes" in run.locator("summary").inner_text()
    run.locator("summary").click()
    run.locator(".node").first.wait_for()
    top = run.locator("ul.tree.top > li")
    assert top.count() == 200  # rendered in chunks, not all 2,000 at once
    run.locator("ul.tree.top > button.more").click()
    assert top.count() == 400
    top.nth(0).locator("button.toggle").click()
    assert top.nth(0).locator("ul.tree .node").count() == 4
    assert run.locator(".node.halt").count() >= 1
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


def test_what_a_person_sees(browser: object, tmp_path: Path) -> None:
    logs = [_timed_log(tmp_path / "timed.jsonl"), make_event_log(tmp_path / "agent.jsonl"),
            *make_stream_logs(tmp_path).values()]  # fmt: skip
    out = Path(write_report(logs, tmp_path / "report.html", notes=["priced as gpt-4o-mini"]))
    page = browser.new_page()  # type: ignore[attr-defined]
    page.set_viewport_size({"width": 1000, "height": 900})
    page.goto(out.as_uri())
    page.wait_for_selector("html[data-ready='1']")
    # Figures: decoded, of a real size, and not blank.
    sizes = page.eval_on_selector_all(
        "img", "imgs => imgs.map(i => [i.complete, i.naturalWidth, i.naturalHeight])"
    )
    assert len(sizes) == 4 and all(ok and w > 300 and h > 150 for ok, w, h in sizes), sizes
    for i in range(4):
        assert _distinct_colours(page.locator("img").nth(i).screenshot()) > 20
    assert "priced as gpt-4o-mini" in page.locator("p.note").inner_text()
    # The summary table fits its container and the page: nothing scrolls sideways.
    fit = page.evaluate(
        "() => { const t = document.querySelector('table.summary');"
        " return [t.scrollWidth, t.parentElement.clientWidth,"
        " document.documentElement.scrollWidth, document.documentElement.clientWidth]; }"
    )
    assert fit[0] <= fit[1] and fit[2] <= fit[3], fit
    assert page.eval_on_selector("table.summary th", "th => getComputedStyle(th).position") == (
        "sticky"
    )
    # Sorting by cost, both ways.
    header = page.locator("table.summary th", has_text="cost $")
    column = page.evaluate("() => [...document.querySelectorAll('table.summary th')]"
                           ".findIndex(th => th.textContent.startsWith('cost $'))")  # fmt: skip
    values = f"() => [...document.querySelectorAll('table.summary tbody tr')].map(r => parseFloat(r.cells[{column}].dataset.v))"  # noqa: E501
    header.click()
    assert page.evaluate(values) == sorted(page.evaluate(values))
    header.click()
    assert page.evaluate(values) == sorted(page.evaluate(values), reverse=True)
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(tmp_path / "top.png"), full_page=True)

    # The timed run: limits against ceilings, its timeline, and the filter over its calls.
    run = page.locator("details.run", has_text="timed")
    run.locator("summary").click()
    run.locator("svg.gantt").wait_for()
    limit = run.locator(".limit", has_text="amp:cost")
    assert "named by a stop" in limit.inner_text() and "of $0.002" in limit.inner_text()
    assert limit.locator(".bar > span").bounding_box()["width"] > 50  # type: ignore[index]
    gantt = run.locator("svg.gantt")
    box = gantt.bounding_box()
    assert box is not None and box["width"] > 500 and box["height"] > 100
    bars = run.locator("svg.gantt rect.bar")
    assert bars.count() >= 4
    widths = [bars.nth(i).bounding_box()["width"] for i in range(bars.count())]  # type: ignore[index]
    assert max(widths) > 20 and len({round(w) for w in widths}) > 1
    assert run.locator("svg.gantt .stop-mark").count() == 1
    assert "stop: limit exceeded: amp:cost" in run.locator("svg.gantt .stop-text").text_content()
    shot = gantt.screenshot(path=str(tmp_path / "timeline.png"))
    assert _distinct_colours(shot) > 10
    nodes = run.locator("ul.tree.top:not(.results) > li > .node")
    total = nodes.count()
    run.locator(".filter-text").fill("search")
    shown = run.locator("ul.results > li > .node")
    assert shown.count() == total - 1  # every think-N has a search tool, but the stopped one
    assert "calls match" in run.locator(".filter-count").inner_text()
    assert not run.locator("ul.tree.top:not(.results)").is_visible()
    run.locator(".filter-text").fill("")
    run.locator(".filter-status").select_option("halt")
    assert shown.count() == 1 and "limit exceeded" in shown.first.inner_text()
    run.locator(".filter-status").select_option("")
    run.locator(".filter-model").select_option("gpt-4o-mini")
    assert shown.count() == total
    run.locator(".filter-model").select_option("")
    assert shown.count() == 0 and nodes.count() == total
    page.screenshot(path=str(tmp_path / "run.png"), full_page=True)
    page.close()
