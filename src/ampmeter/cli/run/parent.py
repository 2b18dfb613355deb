"""The parent side of ``ampmeter run``: start the program, stop it on time, and judge the run.

The program runs in a process group of its own with ``ampmeter/cli/run/_bootstrap`` first on
``PYTHONPATH``; the ``sitecustomize`` there meters every Python interpreter of its process tree
(:mod:`ampmeter.cli.run.child`). Each process writes its events line by line to a file of its
own (in ``<out>.parts/`` while the run lasts, so it can be watched), which the parent merges
into ``--out`` at the end.

How the run ended is read from what it recorded, never from which processes lived to say so:
the events of every process (a call a limit stopped is a ``halt`` line, written before the
stop reaches the program, so a worker killed right after still left it) are summarised by the
same rules as ``ampmeter summary``. The same run therefore gives the same answer every time.

``--timeout N`` is the run's wall-time limit: every context of the run refuses calls past N s,
and at N s the program's whole process group gets SIGTERM; whatever still runs ``--grace`` s
later (default 2) is killed. The grace period is for the program's own shutdown only.
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
from typing import Any, Final

from ampmeter.cli.run.config import RunConfig

__all__ = [
    "BOOTSTRAP_DIR",
    "ENV_CONFIG",
    "ENV_TREE",
    "EXIT_LIMIT",
    "EXIT_TIMEOUT",
    "ROOT_NODE_ID",
    "RunOutcome",
    "format_summary",
    "run_command",
]

EXIT_LIMIT: Final = 3
"""Exit code of ``ampmeter run`` when a limit stopped a call of the program."""
EXIT_TIMEOUT: Final = 124
"""Exit code when the program was stopped at ``--timeout``."""

ENV_CONFIG: Final = "AMPMETER_RUN_CONFIG"
ENV_TREE: Final = "AMPMETER_RUN_TREE"
ENV_TOP_TAKEN: Final = "AMPMETER_RUN_TOP_TAKEN"  # set by the first Python process of the run
# The node id of a new context's root: the top process's context, under which the others' logs
# hang (known before the top process starts metering, which it may do late or never).
ROOT_NODE_ID: Final = "n000001"
# How long the program's leftover processes (multiprocessing's resource tracker, a forkserver)
# get, after the program itself exits, to end and leave their logs.
_LINGER_S: Final = 2.0
BOOTSTRAP_DIR: Final = str(Path(__file__).resolve().parent / "_bootstrap")


@dataclass(frozen=True)
class RunOutcome:
    """What a metered run ended with: ``summary`` is the run's figures (always there)."""

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
) -> RunOutcome:
    """Run ``command`` (a Python program) metered; return its exit code and summary.

    A first argument ending in ``.py`` is run with this interpreter. The exit code is
    :data:`EXIT_TIMEOUT` when ``config.timeout`` stopped the program, :data:`EXIT_LIMIT` when
    the run's logs show a call stopped by a limit, else the program's own.
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
    with tempfile.TemporaryDirectory(prefix="ampmeter-run-", ignore_cleanup_errors=True) as tmp:
        events_dir = f"{config.out}.parts" if config.out else os.path.join(tmp, "events")
        processes_dir = os.path.join(tmp, "processes")
        os.makedirs(events_dir, exist_ok=True)
        os.mkdir(processes_dir)
        tree: dict[str, Any] = {
            "ledger": config.ledger or os.path.join(tmp, "ledger.sqlite3"),
            "scope": f"run-{uuid.uuid4().hex}",
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
        child_env.pop(ENV_TOP_TAKEN, None)
        try:
            proc = subprocess.Popen(argv, env=child_env, cwd=cwd, start_new_session=True)
        except OSError as exc:
            raise ValueError(f"cannot start {argv[0]!r}: {exc.strerror or exc}") from exc
        with _forwarding_signals(proc.pid):
            code, timed_out = _wait(proc, config.timeout, config.grace)
        if not timed_out:
            _wait_for_group(proc.pid, _LINGER_S)
        events = sorted(Path(events_dir).glob("*.jsonl"))
        summary = _run_summary(events, len(list(Path(processes_dir).iterdir())), code)
        if config.out:
            _merge_events(events, config.out)
            shutil.rmtree(events_dir, ignore_errors=True)
    if timed_out:
        reason = f"timeout: stopped at --timeout {config.timeout:g} s"
        summary.update(termination="timeout", stop_reason=reason)
        return RunOutcome(EXIT_TIMEOUT, code, summary, reason)
    if summary["termination"] in ("limit_exceeded", "timeout"):
        return RunOutcome(EXIT_LIMIT, code, summary, summary["stop_reason"])
    return RunOutcome(code if code is not None else 1, code, summary, None)


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
def _forwarding_signals(group: int) -> Iterator[None]:
    """Pass SIGINT and SIGTERM on to the program's process group (it has its own, so a
    terminal's Ctrl-C would not reach it) while the program runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def forward(signum: int, frame: object) -> None:
        _signal_group(group, signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
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


def _merge_events(files: Sequence[Path], out: str) -> None:
    """Append every process's events to ``out``, process by process, whole lines only."""
    with open(out, "ab") as target:
        for path in files:
            data = path.read_bytes()
            target.write(data[: data.rfind(b"\n") + 1])  # a killed writer's cut line is dropped


def _run_summary(events: Sequence[Path], processes: int, code: int) -> dict[str, Any]:
    """The run's figures and how it ended, from every process's events by the rules of
    ``ampmeter summary`` (a killed writer's cut last line is ignored, as there)."""
    import warnings

    from ampmeter.analysis.runs import load_runs
    from ampmeter.analysis.summary import summarize_run

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a cut last line of a killed worker
        runs = list(load_runs(events, best_effort=True).values())
    rows = [summarize_run(run) for run in runs]
    stopped = next((r for r in rows if r.termination in ("limit_exceeded", "timeout")), None)
    if stopped is not None:
        termination, stop_reason = stopped.termination, stopped.stop_reason
    else:
        termination, stop_reason = ("success" if code == 0 else "error"), None
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
        "cost_usd": sum(r.cost_usd for r in rows),
        "unpriced_calls": sum(r.unpriced_calls for r in rows),
        "estimated_cost_usd": sum(r.estimated_cost_usd for r in rows),
        "amplification": llm + tools,
        "base_context": rows[0].base_context if len(rows) == 1 else 0,
        "context_growth_avg": rows[0].context_growth_avg if len(rows) == 1 else 0.0,
        "termination": termination,
        "stop_reason": stop_reason,
        "processes": processes,
    }


def format_summary(summary: Mapping[str, Any]) -> str:
    """The summary as an aligned two-column table, numbers in the CLI's one format."""
    from ampmeter.money import format_usd

    def count(key: str) -> str:
        return f"{summary[key]:,}"

    unpriced = summary.get("unpriced_calls", 0)
    estimated = summary.get("estimated_cost_usd", 0.0)
    rows = [
        (
            "LLM calls",
            f"{count('llm_calls')} ({count('failed_calls')} failed, "
            f"{count('halted_calls')} stopped before they were sent)",
        ),
        ("tool calls", count("tool_calls")),
        ("retries", count("retries")),
        ("tokens in / out", f"{count('tokens_in')} / {count('tokens_out')}"),
        (
            "cost",
            format_usd(summary["cost_usd"])
            + (f" + {unpriced:,} unpriced call(s)" if unpriced else "")
            + (f" ({format_usd(estimated)} of it estimated)" if estimated else ""),
        ),
        ("amplification", f"{count('amplification')} calls for 1 run"),
        (
            "context growth",
            f"{summary['context_growth_avg']:+,.1f} tokens/call (base {count('base_context')})",
        ),
        ("ended", summary["termination"]),
        ("processes", count("processes")),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"  {name:<{width}}  {value}" for name, value in rows)
