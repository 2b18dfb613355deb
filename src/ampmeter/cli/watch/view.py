"""The frame ``ampmeter watch`` draws: totals and rates, each run's limits and call tree, stops."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from rich.console import Group, RenderableType
from rich.markup import escape
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from ampmeter.analysis.lineage import run_labels
from ampmeter.analysis.runs import Call, is_estimated
from ampmeter.cli.output import printable
from ampmeter.cli.watch.state import RUNNING, RunState, WatchState
from ampmeter.keys import KEY_COST, KEY_INPUT_TOKENS, KEY_OUTPUT_TOKENS
from ampmeter.report.charts import amount, dollars, share_of

__all__ = ["FrameInfo", "render_frame", "short_ids"]

_MARK: Final = {
    "success": ("✓", "green"),
    "fail": ("✗", "red"),
    "halt": ("■", "magenta"),
    RUNNING: ("●", "yellow"),
}
_BAR_WIDTH: Final = 16


@dataclass(frozen=True)
class FrameInfo:
    """What the frame says about the files themselves."""

    patterns: Sequence[str]
    files: int
    lines: int
    bad_lines: int
    pending_bytes: int


def _header(state: WatchState, info: FrameInfo, now_ms: float | None) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    files = f"{info.files} file(s), {info.lines:,} line(s)"
    if info.bad_lines or state.malformed:
        files += f", [red]{info.bad_lines + state.malformed} bad line(s) skipped[/]"
    if info.pending_bytes:
        files += f", {info.pending_bytes} byte(s) of a line still being written"
    if not info.files:
        files = "waiting for " + ", ".join(escape(printable(p)) for p in info.patterns)
    grid.add_row("ampmeter watch", files + time.strftime("  (%H:%M:%S)"))
    rates = state.rates(now_ms)
    runs = state.runs.values()
    ended = sum(len(run.calls) for run in runs)
    spent = sum(run.usage(KEY_COST) or 0.0 for run in runs)
    running = sum(len(run.running()) for run in runs)
    going = sum(1 for run in runs if run.running() or run.liveness() == "alive")
    # "Going" counts runs whose processes are alive: a call in flight logs nothing until it
    # ends, so the calls seen running (a parent of an ended call) can be none of them.
    grid.add_row(
        "all runs",
        f"{len(state.runs)} run(s), {going} going · {ended} call(s) ended, {running} seen "
        f"running · {dollars(spent)}",
    )
    grid.add_row(
        "rate",
        f"{rates.calls_per_min:,.1f} LLM calls/min, {dollars(round(rates.usd_per_min, 6))}/min "
        f"(over the last {rates.window_s:,.0f} s)",
    )
    return grid


_LEVEL_STYLES: Final = {"over": "red", "near": "yellow", "ok": "green"}


def _bar_row(
    key: str, used: float | None, cap: float, note: str = ""
) -> tuple[RenderableType, ...]:
    """A limit's row: what was used, a bar, and the share of the ceiling (and ``note``)."""
    if used is None:
        return "[dim]not in the log[/]", "", f"of {amount(key, cap)}"
    share, level = share_of(used, cap)
    style = _LEVEL_STYLES[level]
    bar = ProgressBar(
        total=1.0,
        completed=min(share, 1.0),
        width=_BAR_WIDTH,
        complete_style=style,
        finished_style=style,
    )
    return amount(key, used), bar, f"{share:.0%} of {amount(key, cap)}{note}"


def _limits(state: WatchState, run: RunState, max_subagents: int = 3) -> Group:
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True, overflow="ellipsis", max_width=28)
    for _ in range(3):
        grid.add_column(no_wrap=True)
    tokens_in = int(run.usage(KEY_INPUT_TOKENS) or 0)
    tokens_out = int(run.usage(KEY_OUTPUT_TOKENS) or 0)
    counted = run.digest
    unpriced = counted.unpriced_calls
    spent = Text.assemble(
        ("spent ", "bold"),
        dollars(run.usage(KEY_COST) or 0.0) + (f" + {unpriced} unpriced" if unpriced else ""),
        ("  tokens ", "bold"),
        f"{tokens_in:,} in / {tokens_out:,} out",
    )
    calls = Text.assemble(("calls ", "bold"), f"{counted.llm_sent:,} LLM call(s) sent")
    if counted.stopped_unsent:
        calls.append(f", {counted.stopped_unsent:,} refused before sending")
    if counted.unsettled_cost_usd:
        unsettled = dollars(counted.unsettled_cost_usd)
        spent.append(f"  (unsettled {unsettled}: calls in flight at a stop or in dead workers)")
    if counted.estimated_cost_usd:
        estimated = dollars(counted.estimated_cost_usd)
        spent.append(f"  (estimated {estimated}: billed without their usage)")
    ceilings = state.ceilings_of(run)
    if not ceilings:
        known = "[dim]no ceiling of the run's known (give --max-cost, --max-llm-calls, ...)[/]"
        grid.add_row("limits", known)
    for key, cap in ceilings.items():  # the run's own ceilings first
        # A ceiling's key may come from a stop reason in the log: plain text, controls escaped.
        grid.add_row(Text(printable(key)), *_bar_row(key, run.usage(key), cap))
    # Then each sub-agent's own limits, the nearest to (or past) their ceiling first.
    rows = counted.contexts.subagent_rows()
    for _, path, key, used, cap, stopped in rows[:max_subagents]:
        label = Text.assemble((printable(short_ids(path[-1])), "bold"), f" {printable(key)}")
        grid.add_row(label, *_bar_row(key, used, cap, "  ■ stopped" if stopped else ""))
    if len(rows) > max_subagents:
        more = len(rows) - max_subagents
        grid.add_row(f"[dim]… {more} more sub-agent limit(s)[/]")
    return Group(spent, calls, grid)


# Long hexadecimal ids (run UUIDs, ledger scopes) shortened to their first 8 digits: the frame
# repeats them on every stop, and at 80 columns a 40-character id would wrap mid-word.
_LONG_ID: Final = re.compile(r"\b([0-9a-f]{8})[0-9a-f-]{8,}\b")


def short_ids(text: str) -> str:
    """``text`` from a log, control characters escaped, every long hexadecimal id cut to its
    first 8 digits and an ellipsis."""
    return _LONG_ID.sub(r"\1…", printable(text))


def _running_label(run: RunState, span: str) -> Text:
    mark, style = _MARK[RUNNING]
    kids = run.children.get(span, ())
    contexts = {run.calls[k].metadata.get("context") for k in kids if k in run.calls}
    inside = next(iter(contexts)) if len(contexts) == 1 else None
    where = f" in {short_ids(inside)}" if isinstance(inside, str) and inside != run.name else ""
    return Text.assemble(
        (f"{mark} running", style),
        (where, "bold"),
        # `ampmeter run` prefixes other processes' spans (p<pid>-<tag>.n000003): the node id
        # says enough.
        (f"  {span.rpartition('.')[2]}, {len(kids)} inner call(s) ended", "dim"),
    )


def _label(call: Call) -> Text:
    mark, style = _MARK.get(call.status, ("?", "white"))
    name = short_ids(call.name)
    kind = printable(call.kind)
    text = Text.assemble((f"{mark} ", style), (f"{kind} ", "dim"), (name, "bold"))
    if call.model:
        text.append(f"  {printable(call.model)}", "cyan")
    if call.kind == "llm" and call.status != "halt":
        text.append(f"  {call.tokens_in:,}→{call.tokens_out:,} tok")
    if call.cost_usd or call.unpriced:
        text.append("  unpriced" if call.unpriced else f"  {dollars(call.cost_usd)}")
        if is_estimated(call):
            text.append(" estimated", "yellow")
    if call.latency_ms is not None and call.status != "halt":
        text.append(f"  {call.latency_ms:,.0f} ms", "dim")
    if call.status == "halt":
        text.append(f"  stopped: {short_ids(call.stop_reason or 'limit')}", style)
    elif call.status == "fail" and call.error_class:
        text.append(f"  {printable(call.error_class)}", style)
    return text


def _start(run: RunState, span: str) -> float:
    """When a call started: its end less its latency; a running call (or one logged without a
    time): when the first of its inner calls started, as they logged it."""
    call = run.calls.get(span)
    if call is None or call.end_ms is None:
        timed = [run.calls.get(kid) for kid in run.children.get(span, ())]
    else:
        timed = [call]
    starts = [c.end_ms - (c.latency_ms or 0.0) for c in timed if c and c.end_ms is not None]
    return min(starts, default=math.inf)


def _subtree(run: RunState, top: str, last: bool, rows: list[tuple[str, str]]) -> None:
    """Rows of the top-level call ``top`` and its calls, each with the tree's lines in front of
    it, in display order. Walked with a stack of its own: a log's tree may be any depth."""
    seen: set[str] = set()  # a damaged log's cycle is drawn once
    stack = [(top, "", last)]
    while stack:
        span, prefix, is_last = stack.pop()
        if span in seen:
            continue
        seen.add(span)
        rows.append((prefix + ("└─ " if is_last else "├─ "), span))
        kids = run.children.get(span, ())
        if len(kids) > 1:
            kids = sorted(kids, key=lambda s: (_start(run, s), s))
        inner = prefix + ("   " if is_last else "│  ")
        stack.extend((kid, inner, i == len(kids) - 1) for i, kid in reversed(list(enumerate(kids))))


def _tree(run: RunState, max_rows: int) -> Text:
    """The newest ``max_rows`` rows of the call tree: whole top-level calls, newest last, each
    call indented under the call it ran in.

    Only the top-level calls that fit are walked, so a long run costs no more to draw.
    """
    rows: list[tuple[str, str]] = []
    tops = list(run.top)
    for index in range(len(tops) - 1, -1, -1):
        block: list[tuple[str, str]] = []
        _subtree(run, tops[index], index == len(tops) - 1, block)
        rows[:0] = block
        if len(rows) >= max_rows:
            break
    total = len(run.calls) + sum(1 for p in run.children if p not in run.calls)
    out = Text(no_wrap=True, overflow="ellipsis")
    if len(rows) > max_rows:
        rows = rows[-max_rows:]
    if total > len(rows):
        out.append(f"… {total - len(rows)} earlier call(s)\n", "dim")
    for lines, span in rows:
        out.append(lines, "dim")
        call = run.calls.get(span)
        out.append_text(_label(call) if call is not None else _running_label(run, span))
        out.append("\n")
    out.rstrip()
    return out


_ENDED: Final = {
    "success": ("ended: success", "green"),
    "error": ("ended: error", "red"),
    "limit_exceeded": ("ended: stopped by a limit", "magenta"),
    "timeout": ("ended: timed out", "magenta"),
    "admission_wait": ("ended: waited too long for calls in flight", "magenta"),
}


def _title(run: RunState, now_ms: float | None, label: str) -> Text:
    title = Text.assemble(("run ", "bold"), (label, "bold underline"))
    if run.name and label == short_ids(run.name):  # else the label holds the id already
        title.append(f"  {short_ids(run.run_id)[:9]}", "dim")
    running = run.running()
    ending = run.ending(now_ms)
    quiet = run.quiet_ms(now_ms)
    if running:
        title.append(f"  ● {len(running)} call(s) running", "yellow")
    elif run.liveness() == "alive":
        title.append("  ● running (its process is alive; a call logs when it ends)", "yellow")
    elif ending is not None:
        termination, reason = ending
        words, style = _ENDED.get(termination, (f"ended: {printable(termination)}", "white"))
        title.append(f"  ■ {words}", f"bold {style}")
        if reason and termination != "limit_exceeded":  # a stop's reason is on its row
            title.append(f" ({short_ids(reason)})", style)
    elif quiet is not None:
        # The log names no process this machine can check: say what is known, not "ended".
        title.append(f"  no new line for {_duration(quiet)}", "dim")
    return title


def _duration(ms: float) -> str:
    seconds = int(ms // 1000)
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h"


def _stops(state: WatchState, labels: dict[str, str]) -> Table | Text:
    stops = state.stops()
    if not stops:
        return Text("no call stopped by a limit", style="dim")
    table = Table(
        title="last stops", title_justify="left", box=None, show_header=True, header_style="bold"
    )
    table.add_column("time", no_wrap=True)
    table.add_column("run", no_wrap=True, overflow="ellipsis", max_width=24)
    table.add_column("call", no_wrap=True, overflow="ellipsis", max_width=20)
    table.add_column("reason", overflow="fold", ratio=1)
    for stop in stops:
        at = time.strftime("%H:%M:%S", time.localtime(stop.at_ms / 1000)) if stop.at_ms else "-"
        table.add_row(
            at,
            Text(labels[stop.run_id]),
            Text(short_ids(stop.name)),
            Text(short_ids(stop.reason)),
        )
    return table


def render_frame(
    state: WatchState,
    info: FrameInfo,
    *,
    now_ms: float | None = None,
    max_runs: int = 4,
    max_rows: int = 20,
) -> RenderableType:
    """One frame: the header, the ``max_runs`` most recently active runs, the last stops."""

    runs = sorted(state.runs.values(), key=lambda run: run.last_end_ms, reverse=True)
    parts: list[RenderableType] = [_header(state, info, now_ms), Text("")]
    named = run_labels((run.run_id, run.name) for run in runs)
    labels = {run_id: short_ids(label) for run_id, label in named.items()}
    for run in sorted(runs[:max_runs], key=lambda r: r.run_id):
        title = _title(run, now_ms, labels[run.run_id])
        parts += [Group(title, _limits(state, run), _tree(run, max_rows)), Text("")]
    if len(runs) > max_runs:
        parts.append(Text(f"{len(runs) - max_runs} less recent run(s) not shown", style="dim"))
    parts.append(_stops(state, labels))
    return Group(*parts)
