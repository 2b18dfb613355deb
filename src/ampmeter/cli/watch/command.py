"""The ``ampmeter watch`` command.

Only typer is imported here; the view (rich, the log follower) loads when the command runs.
"""

from __future__ import annotations

import glob
import os
from typing import Annotated, Any

from ampmeter.cli.output import fail
from ampmeter.cli.params import argument, option
from ampmeter.cli.run.command import with_controls

__all__ = ["watch_command"]

# The controls of ``ampmeter run`` that ``watch`` takes: the ceilings it shows usage against.
_CEILINGS = ("max_cost", "max_llm_calls", "max_input_tokens", "max_tokens_per_model")


def _watch(
    logs: Annotated[
        list[str],
        argument(
            "JSONL logs to follow: files, directories (their `*.jsonl` files), or globs in "
            "quotes (e.g. `'runs/*.jsonl'`); directories and globs also pick up files created "
            "later.",
            "LOG...",
        ),
    ],
    once: Annotated[
        bool, option("--once", "Print one frame of what the logs hold now and exit.")
    ] = False,
    interval: Annotated[
        float, option("--interval", "Seconds between redraws.", "SECONDS", min=0.05)
    ] = 1.0,
    runs: Annotated[int, option("--runs", "How many runs to show.", "N", min=1)] = 4,
    rows: Annotated[int, option("--rows", "Call-tree rows per run.", "N", min=1)] = 20,
    **controls: Any,
) -> None:
    """Watch JSONL logs while they are written: call trees, spend against ceilings, stops.

    Follows every file as it grows, from one process or many (`ampmeter run --out PATH` writes
    to the directory `PATH.parts` while it runs). Each run is named by its root context (with
    a short id where names collide), with its calls as a tree; a call that has not ended is
    shown running once one of its inner calls has ended. A run is running while a process that
    wrote it is alive (however long its calls take) and ended, with how it ended (by the rules
    of `ampmeter summary`), once they all have ended; for a log that names no process this
    machine can check, the view says how long no line came. The run's own ceilings come first
    (as the log says them; else from the flags or the same `AMPMETER_MAX_*` variables as
    `ampmeter run`), then each sub-agent's own.
    """
    from ampmeter.cli.run.sources import gather
    from ampmeter.cli.watch.live import watch

    try:
        config = gather(controls, os.environ)
    except ValueError as exc:
        fail("watch", str(exc))
    compressed = [p for p in logs if p.endswith(".gz") and not glob.has_magic(p)]
    if compressed:
        fail(
            "watch",
            f"{compressed[0]} is compressed; watch follows plain JSONL files as they grow "
            "(use `ampmeter summary` or `report` for .gz)",
        )
    if once and not any(os.path.exists(p) or glob.has_magic(p) for p in logs):
        fail("watch", f"{logs[0]}: no such file or directory")
    ceilings = {limit.key: float(limit.max_value) for limit in config.limits()}
    watch(logs, ceilings=ceilings, once=once, interval=interval, max_runs=runs, max_rows=rows)


watch_command = with_controls(_watch, _CEILINGS, " For logs that do not say it.")
