"""The loop of ``ampmeter watch``: poll the logs, update the state, redraw the frame."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence

from rich.console import Console, RenderableType
from rich.live import Live

from ampmeter.cli.watch.follow import LogFollower
from ampmeter.cli.watch.state import WatchState
from ampmeter.cli.watch.view import FrameInfo, render_frame

__all__ = ["watch"]


def watch(
    patterns: Sequence[str | os.PathLike[str]],
    *,
    ceilings: Mapping[str, float] | None = None,
    once: bool = False,
    interval: float = 1.0,
    max_runs: int = 4,
    max_rows: int = 20,
    console: Console | None = None,
) -> None:
    """Show the logs matching ``patterns`` (paths or globs), redrawn every ``interval`` s.

    ``ceilings`` maps stats keys (``amp:cost``, ``amp:llm_calls``, ...) to their limits.
    ``once`` prints a single frame of what the files hold now and returns; otherwise the view
    runs until interrupted (Ctrl-C ends it quietly).
    """
    if not interval > 0:
        raise ValueError(f"interval must be a number of seconds > 0, got {interval!r}")
    follower = LogFollower(patterns)
    state = WatchState(ceilings)
    out = console or Console()

    def poll_and_draw(now_ms: float | None) -> RenderableType:
        for batch in follower.poll():
            if batch.restarted:
                state.forget(batch.path)
            state.add(batch.records, batch.path)
        info = FrameInfo(
            patterns=follower.patterns,
            files=len(follower.paths),
            lines=sum(follower.lines_read(p) for p in follower.paths),
            bad_lines=follower.bad_lines,
            pending_bytes=follower.pending_bytes,
        )
        return render_frame(state, info, now_ms=now_ms, max_runs=max_runs, max_rows=max_rows)

    if once:
        out.print(poll_and_draw(None))
        return
    first = poll_and_draw(time.time() * 1000.0)
    try:
        with Live(first, console=out, auto_refresh=False, redirect_stderr=False) as live:
            while True:
                time.sleep(interval)
                live.update(poll_and_draw(time.time() * 1000.0), refresh=True)
    except KeyboardInterrupt:
        return
