"""The parent side of ``ampmeter run``: start the program, stop it on time, and judge the run.

The program runs in a process group of its own with ``ampmeter/cli/run/_bootstrap`` first on
``PYTHONPATH``, whose ``sitecustomize`` meters every Python interpreter of its tree
(:mod:`.child`). Each process writes its events to a file of its own (in ``<out>.parts/``
while the run lasts, so it can be watched), which the parent merges into ``--out`` at the end.

How the run ended is read from what it recorded, never from which processes lived to say so
(a call a limit stopped is a ``halt`` line, written before the stop reaches the program, so a
worker killed right after still left it), by the rules of ``ampmeter summary``: the same run
gives the same answer every time. ``--timeout``: every context of the run refuses calls past
it, and then the program's group gets SIGTERM, and SIGKILL ``--grace`` s later.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any, Final

from ampmeter.cli.output import os_error_message, printable
from ampmeter.cli.run.config import RunConfig
from ampmeter.cli.run.ending import EXIT_LIMIT, EXIT_TIMEOUT, judge
from ampmeter.cli.run.leftover import record_leftover_holds
from ampmeter.cli.run.notices import plain_limit, watching_pauses
from ampmeter.cli.run.proxied import run_proxy
from ampmeter.cli.run.tree import TreeWatch, joined_pids
from ampmeter.node import ROOT_NODE_ID

# (EXIT_LIMIT and EXIT_TIMEOUT: what a caller of run_command compares its exit code with.)
__all__ = [
    "ENV_CONFIG",
    "ENV_TREE",
    "EXIT_LIMIT",
    "EXIT_TIMEOUT",
    "RunOutcome",
    "format_summary",
    "run_command",
]

ENV_CONFIG: Final = "AMPMETER_RUN_CONFIG"
ENV_TREE: Final = "AMPMETER_RUN_TREE"
ENV_TOP_TAKEN: Final = "AMPMETER_RUN_TOP_TAKEN"  # set by the first Python process of the run
ENV_PROCESSES: Final = "AMPMETER_RUN_PROCESSES"  # where each joining process leaves its mark
# How long the program's leftover processes (multiprocessing's resource tracker, a forkserver)
# get, after the program itself exits, to end and leave their logs.
_LINGER_S: Final = 2.0
BOOTSTRAP_DIR: Final = str(Path(__file__).resolve().parent / "_bootstrap")


@dataclass(frozen=True)
class RunOutcome:
    """What a metered run ended with: ``summary`` is the run's figures (always there), with
    ``unmetered`` the Python processes of its tree that never joined (pid and command)."""

    exit_code: int
    program_exit_code: int | None
    summary: dict[str, Any]
    stop_reason: str | None


def run_command(
    command: Sequence[str],
    config: RunConfig,
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    allow_unmetered: bool = False,
) -> RunOutcome:
    """Run ``command`` (a Python program) metered; return its exit code and summary.

    A first argument ending in ``.py`` is run with this interpreter. The exit code and end
    reason follow :mod:`ampmeter.cli.run.ending`; ``allow_unmetered`` accepts Python
    processes of the tree that never joined the run's metering (they are still named).
    """
    if not command:
        raise ValueError("no command given: use `ampmeter run -- python your_script.py`")
    argv = list(command)
    if argv[0].endswith(".py"):
        argv.insert(0, sys.executable)
    child_env = dict(os.environ if env is None else env)
    path = child_env.get("PYTHONPATH")
    child_env["PYTHONPATH"] = BOOTSTRAP_DIR + (os.pathsep + path if path else "")
    # A process that outlives the wait below may still write into the directory as it is
    # removed; that must not turn a finished run into a crash.
    with (
        tempfile.TemporaryDirectory(prefix="ampmeter-run-", ignore_cleanup_errors=True) as tmp,
        _open_out(config.out) as target,
    ):
        # Paths as this folder reads them: a process of the run may work in another one.
        if config.out:
            events_dir = os.path.abspath(f"{config.out}.parts")
        else:
            events_dir = os.path.join(tmp, "events")
        processes_dir = os.path.join(tmp, "processes")
        try:
            os.makedirs(events_dir, exist_ok=True)
        except OSError as exc:
            message = f"--out: no folder for the run's parts: {os_error_message(exc)}"
            raise ValueError(message) from None
        os.mkdir(processes_dir)
        ledger = config.ledger or os.path.join(tmp, "ledger.sqlite3")
        tree: dict[str, Any] = {
            "ledger": ledger if "://" in ledger else os.path.abspath(ledger),  # (else a URL)
            "scope": config.scope or f"run-{uuid.uuid4().hex}",
            "chain": str(uuid.uuid4()),
            "events": events_dir,
            "processes": processes_dir,
            "deadline": None if config.timeout is None else time.time() + config.timeout,
            "root": ROOT_NODE_ID,
        }
        child_env[ENV_CONFIG] = json.dumps(asdict(config))
        # One key per run signs the run's hand-off tokens, so a token cannot be forged from
        # outside the process tree (a key the user set is kept).
        child_env.setdefault("AMPMETER_HANDOFF_KEY", secrets.token_hex(32))
        child_env[ENV_TREE] = json.dumps(tree)
        child_env[ENV_PROCESSES] = processes_dir
        child_env.pop(ENV_TOP_TAKEN, None)
        # Signals are passed on until the run has charged what its processes left: a Ctrl-C
        # while it waits for their holds must not end it before it logs them.
        with contextlib.ExitStack() as passing_signals:
            # The proxy serves until the program's whole process group has ended.
            with run_proxy(config, tree, child_env) if config.proxy else contextlib.nullcontext():
                # With --output json, stdout is the result's alone: the program writes to
                # stderr (the descriptor: sys.stderr may be a Python object without one, as
                # under a test).
                stdout = 2 if config.output == "json" else None
                try:
                    proc = subprocess.Popen(
                        argv, env=child_env, cwd=cwd, start_new_session=True, stdout=stdout
                    )
                except OSError as exc:
                    raise ValueError(f"cannot start {argv[0]!r}: {exc.strerror or exc}") from exc
                watch = TreeWatch(proc.pid).start()
                signalled = passing_signals.enter_context(_forwarding_signals(proc.pid))
                with watching_pauses(config, tree):
                    code, timed_out = _wait(proc, config.timeout, config.grace)
                if not timed_out:
                    _wait_for_group(proc.pid, _LINGER_S)
            watch.stop()
            record_leftover_holds(tree)
        joined = joined_pids(processes_dir)
        unmetered = watch.unmetered(joined)
        events = sorted(Path(events_dir).glob("*.jsonl"))
        summary = _run_summary(events, len(joined))
        summary["other_processes"] = watch.others() if watch.available else None
        summary["unmetered"] = [{"pid": s.pid, "command": s.command} for s in unmetered]
        if target is not None:
            _merge_events(events, target)
            shutil.rmtree(events_dir, ignore_errors=True)
    ending = judge(
        code,
        logged=(summary["termination"], summary["stop_reason"]),
        timeout=config.timeout,
        timed_out=timed_out,
        signalled=signalled[0] if signalled else None,
        unmetered=0 if allow_unmetered else len(unmetered),
    )
    summary.update(termination=ending.termination, stop_reason=ending.stop_reason)
    return RunOutcome(ending.exit_code, code, summary, ending.stop_reason)


def _wait(proc: subprocess.Popen[bytes], timeout: float | None, grace: float) -> tuple[int, bool]:
    """Wait for the program; at ``timeout`` s send its group SIGTERM, and SIGKILL ``grace`` s
    later. Returns its exit status (negative: the signal that ended it) and whether it was
    stopped."""
    try:
        return proc.wait(timeout=timeout), False
    except subprocess.TimeoutExpired:
        pass
    _signal_group(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)
    _signal_group(proc.pid, signal.SIGKILL)  # the program and everything it started
    return proc.wait(), True


def _signal_group(group: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signum)


@contextlib.contextmanager
def _forwarding_signals(group: int) -> Iterator[list[int]]:
    """Pass SIGINT and SIGTERM on to the program's process group (it has its own, so a
    terminal's Ctrl-C would not reach it) while the program runs and the run finishes; yields
    the list of the signals passed on, so the run can say it was interrupted."""
    passed: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield passed
        return

    def forward(signum: int, frame: object) -> None:
        passed.append(signum)
        _signal_group(group, signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield passed
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _wait_for_group(group: int, limit_s: float) -> None:
    """Wait up to ``limit_s`` for every process left in the program's group to end."""
    deadline = time.monotonic() + limit_s
    pause = 0.002
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def _open_out(out: str | None) -> contextlib.AbstractContextManager[IO[bytes] | None]:
    """``--out`` opened for appending before the program starts: a path that cannot take the
    log (a directory, a missing or read-only folder) stops the run before it costs anything,
    rather than losing the log after it."""
    if out is None:
        return contextlib.nullcontext()
    try:
        return open(out, "ab")
    except FileNotFoundError:
        folder = os.path.dirname(out)
        raise ValueError(f"--out {out}: the folder {folder} does not exist") from None
    except OSError as exc:
        raise ValueError(f"--out {os_error_message(exc)}") from None


def _merge_events(files: Sequence[Path], target: IO[bytes]) -> None:
    """Append every process's events to ``target``, process by process, whole lines only."""
    for path in files:
        data = path.read_bytes()
        target.write(data[: data.rfind(b"\n") + 1])  # a killed writer's cut line is dropped


def _run_summary(events: Sequence[Path], processes: int) -> dict[str, Any]:
    """The run's figures and how its log says it ended, from every process's events by the
    rules of ``ampmeter summary`` (a killed writer's cut last line is ignored, as there).
    Money is summed exactly, as each event wrote it."""
    import warnings

    from ampmeter.analysis.runs import is_estimated, is_unsettled, load_runs
    from ampmeter.analysis.summary import summarize_run
    from ampmeter.cli.run.result import exact_usd, limit_events, spend_by_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a cut last line of a killed worker
        runs = list(load_runs(events, best_effort=True).values())
    rows = [summarize_run(run) for run in runs]
    stops = ("limit_exceeded", "admission_wait", "timeout")
    stopped = next((r for r in rows if r.termination in stops), None)
    if stopped is not None:
        termination, stop_reason = stopped.termination, stopped.stop_reason
    else:
        termination, stop_reason = "success", None
    calls = [call for run in runs for call in run.calls]
    llm = sum(r.llm_calls for r in rows)
    tools = sum(r.tool_calls for r in rows)
    return {
        "llm_calls": llm,
        "failed_calls": sum(r.failed for r in rows),
        "halted_calls": sum(r.halted for r in rows),
        "tool_calls": tools,
        "retries": sum(r.retries for r in rows),
        "tokens_in": sum(r.tokens_in for r in rows),
        "tokens_out": sum(r.tokens_out for r in rows),
        "cost_usd": exact_usd(c for c in calls if not c.unpriced),
        "unsettled_cost_usd": exact_usd(filter(is_unsettled, calls)),
        "unsettled_calls": sum(1 for c in calls if is_unsettled(c)),
        "unpriced_calls": sum(r.unpriced_calls for r in rows),
        "estimated_cost_usd": exact_usd(filter(is_estimated, calls)),
        "amplification": llm + tools,
        "base_context": rows[0].base_context if len(rows) == 1 else 0,
        "context_growth_avg": rows[0].context_growth_avg if len(rows) == 1 else 0.0,
        "termination": termination,
        "stop_reason": stop_reason,
        "processes": processes,
        "models": spend_by_model(calls),
        "limit_events": limit_events(calls),
    }


def format_summary(summary: Mapping[str, Any]) -> str:
    """The summary as an aligned two-column table, numbers in the CLI's one format, money as
    ``ampmeter summary`` and every message write it."""
    from ampmeter.money import format_usd

    def count(key: str) -> str:
        return f"{summary[key]:,}"

    unpriced = summary.get("unpriced_calls", 0)
    cost = format_usd(summary["cost_usd"])
    if summary.get("unsettled_calls"):
        # calls in flight when they were stopped, or whose worker died: charged as reserved
        cost += f" ({format_usd(summary['unsettled_cost_usd'])} of it unsettled)"
    if unpriced:
        cost += f" + {unpriced:,} unpriced call(s)"
    estimated = summary.get("estimated_cost_usd", 0)
    if estimated:
        cost += f" ({format_usd(estimated)} of it estimated)"
    rows = [
        (
            "LLM calls",
            f"{count('llm_calls')} ({count('failed_calls')} failed, "
            f"{count('halted_calls')} stopped before they were sent)",
        ),
        ("tool calls", count("tool_calls")),
        ("retries", count("retries")),
        ("tokens in / out", f"{count('tokens_in')} / {count('tokens_out')}"),
        ("cost", cost),
        ("amplification", f"{count('amplification')} calls for 1 run"),
        (
            "context growth",
            f"{summary['context_growth_avg']:+,.1f} tokens/call (base {count('base_context')})",
        ),
        ("ended", printable(summary["termination"])),  # read from the run's logs
        ("processes", _processes_line(summary)),
    ]
    passed = [e for e in summary.get("limit_events", ()) if e.get("kind") == "soft_limit"]
    for event in passed:  # a dry run: what the limits would have stopped
        limit = plain_limit(str(event.get("limit")))
        rows.append(("dry run", printable(f"{limit} passed at call {event['node_id']}")))
    width = max(len(name) for name, _ in rows)
    lines = [f"  {name:<{width}}  {value}" for name, value in rows]
    for seen in summary.get("unmetered", ()):
        command = printable(seen["command"])  # another process's command line
        lines.append(f"  {'':<{width}}  unmetered: pid {seen['pid']}: {command}")
    return "\n".join(lines)


def _processes_line(summary: Mapping[str, Any]) -> str:
    """How many Python processes joined the run, how many ran Python without joining, and
    how many others (not Python: never metered, never flagged) the tree had."""
    joined = summary["processes"]
    text = f"{joined:,} Python joined the run"
    unmetered = len(summary.get("unmetered", ()))
    if unmetered:
        text += f", {unmetered:,} Python ran unmetered"
    others = summary.get("other_processes")
    if others is None:
        return text + " (the process tree was not watched: no /proc here)"
    return text + (f", {others:,} not Python" if others else "")
