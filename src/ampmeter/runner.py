"""``ampmeter run -- COMMAND``: run a Python program with its SDK calls metered and contained.

The parent (:func:`run_command`) starts the program in a process group of its own with
``ampmeter/_bootstrap`` first on ``PYTHONPATH``; the ``sitecustomize`` there calls
:func:`child_setup` in every Python interpreter of the program's process tree (subprocesses and
``spawn`` workers inherit the path; ``fork`` children are set up again right after the fork).
Each process instruments the SDKs and opens one :class:`~ampmeter.ExecutionContext` with the
requested limits and the run's shared ledger (SQLite in the run's temporary directory, or
``--ledger redis://...``), so the limits hold for the whole tree; each writes its events to a
file of its own, line by line (in ``<out>.parts/`` while the run lasts, so it can be watched),
which the parent merges into ``--out`` at the end.

Limits come from flags or from the environment: ``AMPMETER_MAX_COST``,
``AMPMETER_MAX_LLM_CALLS``, ``AMPMETER_MAX_INPUT_TOKENS``, ``AMPMETER_MAX_TOKENS_PER_MODEL``
(``MODEL=N,MODEL=N``), ``AMPMETER_TIMEOUT``, ``AMPMETER_OUT``, ``AMPMETER_LEDGER``.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import math
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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Final

from ampmeter.keys import KEY_COST, KEY_INPUT_TOKENS, KEY_INPUT_TOKENS_FOR, KEY_LLM_CALLS

__all__ = [
    "EXIT_LIMIT",
    "EXIT_TIMEOUT",
    "RunConfig",
    "RunOutcome",
    "child_setup",
    "format_summary",
    "parse_model_limits",
    "run_command",
]

EXIT_LIMIT: Final = 3
"""Exit code of ``ampmeter run`` when a limit stopped the program."""
EXIT_TIMEOUT: Final = 124
"""Exit code when the program outlived ``--timeout`` (plus a grace period) and was killed."""

ENV_CONFIG: Final = "AMPMETER_RUN_CONFIG"
ENV_TREE: Final = "AMPMETER_RUN_TREE"
ENV_TOP_TAKEN: Final = "AMPMETER_RUN_TOP_TAKEN"  # set by the first Python process of the run
# The node id of a new context's root: the top process's context, under which the others' logs
# hang (known before the top process starts metering, which it may do late or never).
_ROOT_NODE_ID: Final = "n000001"
_KILL_GRACE_S: Final = 5.0
# How long the program's leftover processes (multiprocessing's resource tracker, a forkserver)
# get, after the program itself exits, to end and leave their summaries.
_LINGER_S: Final = 2.0
_BOOTSTRAP_DIR: Final = str(Path(__file__).resolve().parent / "_bootstrap")


@dataclass(frozen=True)
class RunConfig:
    """Limits and output of one metered run (None: no such limit)."""

    max_cost: float | None = None
    max_llm_calls: int | None = None
    max_input_tokens: int | None = None
    max_tokens_per_model: dict[str, int] = field(default_factory=dict)
    timeout: float | None = None
    out: str | None = None
    capture_content: bool = False
    ledger: str | None = None

    def __post_init__(self) -> None:
        _check_number("max cost", self.max_cost, integer=False)
        _check_number("max LLM calls", self.max_llm_calls, integer=True)
        _check_number("max input tokens", self.max_input_tokens, integer=True)
        _check_number("timeout", self.timeout, integer=False)
        for model, cap in self.max_tokens_per_model.items():
            if not isinstance(model, str) or not model:
                raise ValueError(f"per-model token limit needs a model name, got {model!r}")
            _check_number(f"token limit for {model}", cap, integer=True)
        if self.ledger is not None and not self.ledger.startswith(("redis://", "rediss://")):
            raise ValueError(
                f"--ledger must be a redis:// or rediss:// URL, got {self.ledger!r} (without "
                "it, the run shares a SQLite ledger in its temporary directory)"
            )

    @classmethod
    def from_env(cls, env: Mapping[str, str], **overrides: Any) -> RunConfig:
        """Config from ``AMPMETER_*`` variables, with non-None ``overrides`` (flags) winning."""
        values: dict[str, Any] = {
            "max_cost": _env_number(env, "AMPMETER_MAX_COST", float),
            "max_llm_calls": _env_number(env, "AMPMETER_MAX_LLM_CALLS", int),
            "max_input_tokens": _env_number(env, "AMPMETER_MAX_INPUT_TOKENS", int),
            "timeout": _env_number(env, "AMPMETER_TIMEOUT", float),
            "out": env.get("AMPMETER_OUT") or None,
            "ledger": env.get("AMPMETER_LEDGER") or None,
        }
        per_model = env.get("AMPMETER_MAX_TOKENS_PER_MODEL", "").strip()
        values["max_tokens_per_model"] = (
            parse_model_limits([p for p in per_model.split(",") if p.strip()]) if per_model
            else {}
        )  # fmt: skip
        for key, value in overrides.items():
            if value is not None and value != {}:
                values[key] = value
        return cls(**values)

    def limits(self) -> list[Any]:
        """The :class:`~ampmeter.Limit` objects this config asks for."""
        from ampmeter.limits import Limit

        limits: list[Limit] = []
        if self.max_cost is not None:
            limits.append(Limit(KEY_COST, self.max_cost))
        if self.max_llm_calls is not None:
            limits.append(Limit(KEY_LLM_CALLS, self.max_llm_calls))
        if self.max_input_tokens is not None:
            limits.append(Limit(KEY_INPUT_TOKENS, self.max_input_tokens))
        for model, cap in self.max_tokens_per_model.items():
            limits.append(Limit(KEY_INPUT_TOKENS_FOR + model, cap))
        return limits


def _check_number(name: str, value: object, *, integer: bool) -> None:
    if value is None:
        return
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise ValueError(f"{name} must be {'an integer' if integer else 'a number'}, "
                         f"got {value!r}")  # fmt: skip
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


def _env_number(env: Mapping[str, str], name: str, kind: type) -> Any:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        return kind(raw)
    except ValueError:
        raise ValueError(f"{name} must be {'an integer' if kind is int else 'a number'}, "
                         f"got {raw!r}") from None  # fmt: skip


def parse_model_limits(items: Sequence[str]) -> dict[str, int]:
    """``["gpt-4o=1000", ...]`` -> ``{"gpt-4o": 1000}``; a bad item raises ``ValueError``."""
    limits: dict[str, int] = {}
    for item in items:
        model, sep, raw = item.strip().rpartition("=")
        if not sep or not model.strip():
            raise ValueError(f"per-model token limit must look like MODEL=N, got {item!r}")
        try:
            cap = int(raw)
        except ValueError:
            raise ValueError(f"token limit for {model!r} must be an integer, got {raw!r}") from None
        if cap < 0:
            raise ValueError(f"token limit for {model!r} must be >= 0, got {cap}")
        limits[model.strip()] = cap
    return limits


@dataclass(frozen=True)
class RunOutcome:
    """What a metered run ended with."""

    exit_code: int
    program_exit_code: int | None
    summary: dict[str, Any] | None
    stop_reason: str | None


def run_command(command: Sequence[str], config: RunConfig, *, env: Mapping[str, str] | None = None,
                cwd: str | None = None) -> RunOutcome:  # fmt: skip
    """Run ``command`` (a Python program) metered; return its exit code and summary.

    A first argument ending in ``.py`` is run with this interpreter. The exit code is the
    program's, except :data:`EXIT_LIMIT` when a limit stopped it and :data:`EXIT_TIMEOUT` when
    it outlived its timeout and its whole process group was killed.
    """
    if not command:
        raise ValueError("no command given: use `ampmeter run -- python your_script.py`")
    argv = list(command)
    if argv[0].endswith(".py"):
        argv.insert(0, sys.executable)
    child_env = dict(os.environ if env is None else env)
    path = child_env.get("PYTHONPATH")
    child_env["PYTHONPATH"] = _BOOTSTRAP_DIR + (os.pathsep + path if path else "")
    # A process that outlives the wait below may still write into the directory as it is
    # removed; that must not turn a finished run into a crash.
    with tempfile.TemporaryDirectory(prefix="ampmeter-run-", ignore_cleanup_errors=True) as tmp:
        # With --out, each process's events go to <out>.parts/ while the run lasts, so
        # `ampmeter watch '<out>.parts/*.jsonl'` can follow them live; they are merged into
        # <out> at the end and the parts removed.
        events_dir = f"{config.out}.parts" if config.out else os.path.join(tmp, "events")
        summaries_dir = os.path.join(tmp, "summaries")
        os.makedirs(events_dir, exist_ok=True)
        os.mkdir(summaries_dir)
        tree: dict[str, Any] = {
            "ledger": config.ledger or os.path.join(tmp, "ledger.sqlite3"),
            "scope": f"run-{uuid.uuid4().hex}",
            "chain": str(uuid.uuid4()),
            "events": events_dir,
            "summaries": summaries_dir,
            "deadline": None if config.timeout is None else time.time() + config.timeout,
            "root": _ROOT_NODE_ID,
        }
        child_env.setdefault("AMPMETER_HANDOFF_KEY", secrets.token_hex(32))  # signs hand-offs
        child_env[ENV_CONFIG] = json.dumps(asdict(config))
        child_env[ENV_TREE] = json.dumps(tree)
        child_env.pop(ENV_TOP_TAKEN, None)
        wait = None if config.timeout is None else config.timeout + _KILL_GRACE_S
        try:
            proc = subprocess.Popen(argv, env=child_env, cwd=cwd, start_new_session=True)
        except OSError as exc:
            raise ValueError(f"cannot start {argv[0]!r}: {exc.strerror or exc}") from exc
        killed = False
        with _forwarding_signals(proc.pid):
            try:
                code: int | None = proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)  # the program and all it started
                proc.wait()
                code, killed = None, True
        if not killed:
            _wait_for_group(proc.pid, _LINGER_S)
        events = sorted(Path(events_dir).glob("*.jsonl"))
        summary = _tree_summary(events, sorted(Path(summaries_dir).glob("*.json")))
        if config.out:
            _merge_events(events, config.out)
            shutil.rmtree(events_dir, ignore_errors=True)
    if killed:
        return RunOutcome(EXIT_TIMEOUT, None, summary,
                          f"timeout: killed after {config.timeout:g} s")  # fmt: skip
    stop = summary.get("stop_reason") if summary else None
    if summary is not None and summary.get("termination") in ("limit_exceeded", "timeout"):
        return RunOutcome(EXIT_LIMIT, code, summary, stop)
    return RunOutcome(code if code is not None else 1, code, summary, None)


@contextlib.contextmanager
def _forwarding_signals(group: int) -> Iterator[None]:
    """Pass SIGINT and SIGTERM on to the program's process group (it has its own, so a
    terminal's Ctrl-C would not reach it) while the program runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def forward(signum: int, frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signum)

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


def _tree_summary(events: Sequence[Path], summaries: Sequence[Path]) -> dict[str, Any] | None:
    """The run summary over every process: counts from the events all of them logged, the
    termination from the processes that lived to write their summary (the top one first)."""
    written = [found for found in map(_read_summary, summaries) if found is not None]
    top = next((found for found in written if found.get("top")), None)
    if top is None:
        return None
    llm: list[dict[str, Any]] = []
    tools: list[dict[str, Any]] = []
    retries = 0
    for path in events:
        for line in path.read_bytes().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue  # the cut last line of a killed process
            kind = event.get("event_type")
            retries += int(event.get("metadata", {}).get("retries_used") or 0)
            if kind == "llm_completion":
                llm.append(event)
            elif kind == "tool_call":
                tools.append(event)
    statuses = [event["metadata"].get("status") for event in llm]
    sizes = [int(e["usage"]["prompt_tokens"]) for e in llm if e["metadata"].get("status") != "halt"]
    growth = (sizes[-1] - sizes[0]) / (len(sizes) - 1) if len(sizes) >= 2 else 0.0
    stopped = next((f for f in [top, *written] if f.get("termination") in _STOPS), top)
    return {
        "llm_calls": len(llm),
        "failed_calls": statuses.count("fail"),
        "halted_calls": statuses.count("halt"),
        "tool_calls": len(tools),
        "retries": retries,
        "tokens_in": sum(int(e["usage"]["prompt_tokens"]) for e in llm),
        "tokens_out": sum(int(e["usage"]["completion_tokens"]) for e in llm),
        "cost_usd": sum(float(e["cost_usd"]) for e in (*llm, *tools)),
        "amplification": len(llm) + len(tools),
        "base_context": sizes[0] if len(sizes) >= 2 else 0,
        "context_growth_avg": growth,
        "termination": stopped["termination"],
        "stop_reason": stopped.get("stop_reason"),
        "processes": len({_pid_of(path) for path in (*events, *summaries)}),
    }


_STOPS: Final = ("limit_exceeded", "timeout")


def _pid_of(path: Path) -> str:
    """The process id in a log (``<time>-<pid>.jsonl``) or summary (``<pid>-<tag>.json``) name."""
    stem = path.stem.split("-")
    return stem[1] if path.suffix == ".jsonl" else stem[0]


def _read_summary(path: Path) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


# -- the child side -----------------------------------------------------------------------------


def child_setup(*, top: bool) -> None:
    """Meter this interpreter for ``ampmeter run`` (called from the bootstrap sitecustomize when
    the program first imports something it meters; ``top``: the run's first Python process).

    The run's settings stay in the environment, so every Python process the program starts is
    metered too, against the same shared ledger; a ``fork`` child starts afresh (its own
    context and log file) instead of counting on the parent's copy.
    """
    raw = os.environ.get(ENV_CONFIG)
    if raw is None or ENV_TREE not in os.environ:
        return
    config = RunConfig(**json.loads(raw))

    from ampmeter.integrations import instrument

    instrument(capture_content=config.capture_content)
    _Process.start(config, top)
    os.register_at_fork(after_in_child=functools.partial(_Process.start, config, False))
    previous_hook = sys.excepthook

    def excepthook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        if _Process.current is not None:
            _Process.current.seen.append(exc)
        from ampmeter.errors import LimitExceeded

        if isinstance(exc, LimitExceeded):
            return  # the parent prints the one-line reason
        previous_hook(kind, exc, tb)

    sys.excepthook = excepthook


class _Process:
    """The metering of one process of the run: its context, ledger and log file."""

    current: _Process | None = None

    def __init__(self, ctx: Any, sink: Any, ledger: Any, summary: str, top: bool) -> None:
        self.pid = os.getpid()
        self.ctx = ctx
        self.sink = sink
        self.ledger = ledger
        self.summary = summary
        self.top = top
        self.seen: list[BaseException] = []

    @classmethod
    def start(cls, config: RunConfig, top: bool) -> None:
        """Open this process's context (the top one's node is the run's root)."""
        from ampmeter.context import ExecutionContext
        from ampmeter.integrations import set_default_context
        from ampmeter.sinks.jsonl import JsonlSink
        from ampmeter.sinks.relabel import RelabeledSink

        tree = json.loads(os.environ[ENV_TREE])
        pid = os.getpid()
        ledger = _open_ledger(tree["ledger"], tree["scope"])
        # Line by line: pool workers are often ended with SIGTERM or os._exit, never closing.
        log = JsonlSink(os.path.join(tree["events"], f"{time.time_ns()}-{pid}.jsonl"), flush="line")
        sink = log if top else RelabeledSink(
            log, prefix=f"p{pid}-{secrets.token_hex(2)}.", attach_to=tree["root"],
            depth_offset=1, keep_root=False, metadata={"pid": pid},
        )  # fmt: skip
        deadline = tree["deadline"]
        ctx = ExecutionContext(
            "ampmeter_run" if top else f"process {pid}", limits=config.limits(),
            timeout_s=None if deadline is None else max(deadline - time.time(), 0.0),
            sinks=[sink], ledger=ledger, chain_id=tree["chain"],
        )  # fmt: skip
        ctx.__enter__()  # also in a fork child: the parent's context is not ours any more
        set_default_context(ctx)
        if top and ctx.node_id != tree["root"]:
            raise RuntimeError(
                f"the run's root context got node id {ctx.node_id!r}, not {tree['root']!r}: "
                "the other processes' logs would not join it"
            )
        summary = os.path.join(tree["summaries"], f"{pid}-{secrets.token_hex(2)}.json")
        cls.current = cls(ctx, log, ledger, summary, top)
        atexit.register(cls.current.finish)

    def finish(self) -> None:
        """Close the context, log and ledger and write the summary (in this process only)."""
        if os.getpid() != self.pid:
            return  # an atexit hook inherited through fork: the parent's, not ours
        self.ctx.close(self.seen[0] if self.seen else None)
        self.sink.close()
        self.ledger.close()
        try:
            with open(self.summary, "w", encoding="utf-8") as handle:
                json.dump({**summarize(self.ctx), "top": self.top}, handle)
        except FileNotFoundError:
            pass  # this process outlived the run: `ampmeter run` has reported and cleaned up


def _open_ledger(where: str, scope: str) -> Any:
    if where.startswith(("redis://", "rediss://")):
        from ampmeter.ledgers.redis import RedisLedger

        return RedisLedger(where, scope)
    from ampmeter.ledgers.sqlite import SqliteLedger

    return SqliteLedger(where, scope)


def summarize(ctx: Any) -> dict[str, Any]:
    """The run summary of a closed context: calls, tokens, cost, amplification, context growth."""
    agg = ctx.graph.aggregates()
    nodes = [n for n in ctx.graph.nodes() if n.kind == "llm" and n.tokens_in is not None]
    sizes = [int(n.tokens_in) for n in nodes]
    growth = (sizes[-1] - sizes[0]) / (len(sizes) - 1) if len(sizes) >= 2 else 0.0
    statuses = [n.status for n in ctx.graph.nodes() if n.kind == "llm"]
    exceeded = ctx.exceeded_limit
    reason = ctx.termination_reason.value if ctx.termination_reason else "success"
    return {
        "llm_calls": agg["total_llm_calls"],
        "failed_calls": statuses.count("fail"),
        "halted_calls": statuses.count("halt"),
        "tool_calls": agg["total_tool_calls"],
        "retries": agg["total_retries"],
        "tokens_in": agg["total_tokens_in"],
        "tokens_out": agg["total_tokens_out"],
        "cost_usd": agg["total_cost_usd"],
        "amplification": agg["total_llm_calls"] + agg["total_tool_calls"],
        "base_context": sizes[0] if len(sizes) >= 2 else 0,
        "context_growth_avg": growth,
        "termination": reason,
        "stop_reason": None if exceeded is None else str(exceeded),
    }


def format_summary(summary: Mapping[str, Any]) -> str:
    """The summary as an aligned two-column table."""
    rows = [
        ("LLM calls", f"{summary['llm_calls']} ({summary['failed_calls']} failed, "
                      f"{summary['halted_calls']} stopped)"),
        ("tool calls", str(summary["tool_calls"])),
        ("retries", str(summary["retries"])),
        ("tokens in / out", f"{summary['tokens_in']} / {summary['tokens_out']}"),
        ("cost (USD)", f"{summary['cost_usd']:.6f}"),
        ("amplification", f"{summary['amplification']} calls for 1 run"),
        ("context growth", f"{summary['context_growth_avg']:+.1f} tokens/call "
                           f"(base {summary['base_context']})"),
        ("stopped because", summary["stop_reason"] or summary["termination"]),
        ("processes", str(summary.get("processes", 1))),
    ]  # fmt: skip
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"  {name:<{width}}  {value}" for name, value in rows)
