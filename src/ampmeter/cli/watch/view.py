"""The frame ``ampmeter watch`` draws: totals and rates, each run's limits and call tree, stops."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from rich.console import Group, RenderableType
from rich.markup import escape
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from ampmeter.analysis.runs import Call
from ampmeter.cli.watch.state import RUNNING, RunState, WatchState
from ampmeter.keys import KEY_COST, KEY_COST_FOR, KEY_INPUT_TOKENS, KEY_OUTPUT_TOKENS

__all__ = ["FrameInfo", "render_frame"]

_MARK: Final = {
    "success": ("✓", "green"),
    "fail": ("✗", "red"),
    "halt": ("■", "magenta"),
    RUNNING: ("●", "yellow"),
}
_BAR_WIDTH: Final = 24


@dataclass(frozen=True)
class FrameInfo:
    """What the frame says about the files themselves."""

    patterns: Sequence[str]
    files: int
    lines: int
    bad_lines: int
    pending_bytes: int


def _money(value: float) -> str:
    return f"${value:,.6f}" if value < 1 else f"${value:,.2f}"


def _amount(key: str, value: float) -> str:
    if key == KEY_COST or key.startswith(KEY_COST_FOR):
        return _money(value)
    return f"{value:,.0f}" if value == int(value) else f"{value:,.4g}"


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
        files = "waiting for " + ", ".join(escape(p) for p in info.patterns)
    grid.add_row("ampmeter watch", files + time.strftime("  (%H:%M:%S)"))
    rates = state.rates(now_ms)
    runs = state.runs.values()
    ended = sum(len(run.calls) for run in runs)
    spent = sum(run.usage(KEY_COST) or 0.0 for run in runs)
    running = sum(len(run.running()) for run in runs)
    grid.add_row(
        "all runs",
        f"{len(state.runs)} run(s), {ended} call(s) ended, {running} running, "
        f"{_money(spent)} spent",
    )
    grid.add_row(
        "rate",
        f"{rates.calls_per_min:,.1f} LLM calls/min, {_money(rates.usd_per_min)}/min "
        f"(over the last {rates.window_s:,.0f} s)",
    )
    return grid


def _limits(state: WatchState, run: RunState) -> Table:
    grid = Table.grid(padding=(0, 1))
    for _ in range(4):
        grid.add_column()
    tokens_in = int(run.usage(KEY_INPUT_TOKENS) or 0)
    tokens_out = int(run.usage(KEY_OUTPUT_TOKENS) or 0)
    unpriced = run.unpriced_calls()
    spent = _money(run.usage(KEY_COST) or 0.0) + (f" + {unpriced} unpriced" if unpriced else "")
    grid.add_row("spent", spent, "", f"tokens {tokens_in:,} in / {tokens_out:,} out")
    ceilings = state.ceilings_of(run)
    if not ceilings:
        grid.add_row("limits", "[dim]no ceiling known (give --max-cost, --max-llm-calls, ...)[/]")
    for key, cap in ceilings.items():
        used = run.usage(key)
        if used is None:
            grid.add_row(escape(key), "[dim]not in the log[/]", "", f"of {_amount(key, cap)}")
            continue
        share = used / cap if cap > 0 else (1.0 if used > 0 else 0.0)
        style = "red" if share >= 1 else "yellow" if share >= 0.8 else "green"
        bar = ProgressBar(
            total=1.0,
            completed=min(share, 1.0),
            width=_BAR_WIDTH,
            complete_style=style,
            finished_style=style,
        )
        grid.add_row(escape(key), _amount(key, used), bar, f"{share:.0%} of {_amount(key, cap)}")
    return grid


def _label(call: Call | None, span: str, open_children: int) -> Text:
    if call is None:
        mark, style = _MARK[RUNNING]
        return Text.assemble(
            (f"{mark} running ", style),
            (span, "bold"),
            (f"  ({open_children} call(s) in it ended)", "dim"),
        )
    mark, style = _MARK.get(call.status, ("?", "white"))
    text = Text.assemble((f"{mark} ", style), (f"{call.kind} ", "dim"), (call.name, "bold"))
    if call.model:
        text.append(f"  {call.model}", "cyan")
    if call.kind == "llm" and call.status != "halt":
        text.append(f"  {call.tokens_in:,}→{call.tokens_out:,} tok")
    if call.cost_usd or call.unpriced:
        text.append("  unpriced" if call.unpriced else f"  {_money(call.cost_usd)}")
    if call.latency_ms is not None and call.status != "halt":
        text.append(f"  {call.latency_ms:,.0f} ms", "dim")
    if call.status == "halt":
        text.append(f"  stopped: {call.stop_reason or 'limit'}", style)
    elif call.status == "fail" and call.error_class:
        text.append(f"  {call.error_class}", style)
    return text


def _start(run: RunState, span: str) -> float:
    """When a call started (a running call: when its first inner call started)."""
    call = run.calls.get(span)
    if call is not None and call.end_ms is not None:
        return call.end_ms - (call.latency_ms or 0.0)
    return min((_start(run, s) for s in run.children.get(span, ())), default=math.inf)


def _subtree(run: RunState, span: str, depth: int, rows: list[tuple[int, str]]) -> None:
    rows.append((depth, span))
    kids = run.children.get(span, ())
    for kid in sorted(kids, key=lambda s: (_start(run, s), s)) if len(kids) > 1 else kids:
        _subtree(run, kid, depth + 1, rows)


def _tree(run: RunState, max_rows: int) -> Text:
    """The newest ``max_rows`` rows of the call tree: whole top-level calls, newest last.

    Only the top-level calls that fit are walked, so a long run costs no more to draw.
    """
    rows: list[tuple[int, str]] = []
    for span in reversed(run.top):
        block: list[tuple[int, str]] = []
        _subtree(run, span, 0, block)
        rows[:0] = block
        if len(rows) >= max_rows:
            break
    total = len(run.calls) + sum(1 for p in run.children if p not in run.calls)
    out = Text()
    if len(rows) > max_rows:
        rows = rows[-max_rows:]
    if total > len(rows):
        out.append(f"… {total - len(rows)} earlier call(s)\n", "dim")
    for depth, span in rows:
        out.append("  " * depth + "└ ")
        out.append_text(_label(run.calls.get(span), span, len(run.children.get(span, ()))))
        out.append("\n")
    out.rstrip()
    return out


def _run_block(state: WatchState, run: RunState, max_rows: int) -> Group:
    running = run.running()
    status = f"[yellow]{len(running)} running[/]" if running else "[dim]nothing running[/]"
    title = Text.from_markup(f"[bold underline]run {escape(run.run_id)}[/]  {status}")
    return Group(title, _limits(state, run), _tree(run, max_rows))


def _stops(state: WatchState) -> Table | Text:
    stops = state.stops()
    if not stops:
        return Text("no call stopped by a limit", style="dim")
    table = Table(
        title="last stops", title_justify="left", box=None, show_header=True, header_style="bold"
    )
    for column in ("time", "run", "call", "reason"):
        table.add_column(column, overflow="fold")
    for stop in stops:
        at = time.strftime("%H:%M:%S", time.localtime(stop.at_ms / 1000)) if stop.at_ms else "-"
        table.add_row(at, stop.run_id, f"{stop.name} ({stop.span_id})", stop.reason)
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
    for run in sorted(runs[:max_runs], key=lambda r: r.run_id):
        parts += [_run_block(state, run, max_rows), Text("")]
    if len(runs) > max_runs:
        parts.append(Text(f"{len(runs) - max_runs} less recent run(s) not shown", style="dim"))
    parts.append(_stops(state))
    return Group(*parts)
