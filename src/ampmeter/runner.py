"""``ampmeter run -- COMMAND``: run a Python program with its SDK calls metered and contained.

The parent (:func:`run_command`) starts the program with ``ampmeter/_bootstrap`` first on
``PYTHONPATH``; the ``sitecustomize`` there calls :func:`child_setup` in the program's
interpreter before the program starts. That instruments the SDKs, opens one
:class:`~ampmeter.ExecutionContext` with the requested limits (and a JSONL sink), and, when the
interpreter exits, closes it and writes a small JSON summary the parent prints.

Limits come from flags or from the environment: ``AMPMETER_MAX_COST``,
``AMPMETER_MAX_LLM_CALLS``, ``AMPMETER_MAX_INPUT_TOKENS``, ``AMPMETER_MAX_TOKENS_PER_MODEL``
(``MODEL=N,MODEL=N``), ``AMPMETER_TIMEOUT``, ``AMPMETER_OUT``.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
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
ENV_SUMMARY: Final = "AMPMETER_RUN_SUMMARY"
_KILL_GRACE_S: Final = 5.0
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

    def __post_init__(self) -> None:
        _check_number("max cost", self.max_cost, integer=False)
        _check_number("max LLM calls", self.max_llm_calls, integer=True)
        _check_number("max input tokens", self.max_input_tokens, integer=True)
        _check_number("timeout", self.timeout, integer=False)
        for model, cap in self.max_tokens_per_model.items():
            if not isinstance(model, str) or not model:
                raise ValueError(f"per-model token limit needs a model name, got {model!r}")
            _check_number(f"token limit for {model}", cap, integer=True)

    @classmethod
    def from_env(cls, env: Mapping[str, str], **overrides: Any) -> RunConfig:
        """Config from ``AMPMETER_*`` variables, with non-None ``overrides`` (flags) winning."""
        values: dict[str, Any] = {
            "max_cost": _env_number(env, "AMPMETER_MAX_COST", float),
            "max_llm_calls": _env_number(env, "AMPMETER_MAX_LLM_CALLS", int),
            "max_input_tokens": _env_number(env, "AMPMETER_MAX_INPUT_TOKENS", int),
            "timeout": _env_number(env, "AMPMETER_TIMEOUT", float),
            "out": env.get("AMPMETER_OUT") or None,
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
    it was killed for outliving its timeout.
    """
    if not command:
        raise ValueError("no command given: use `ampmeter run -- python your_script.py`")
    argv = list(command)
    if argv[0].endswith(".py"):
        argv.insert(0, sys.executable)
    child_env = dict(os.environ if env is None else env)
    path = child_env.get("PYTHONPATH")
    child_env["PYTHONPATH"] = _BOOTSTRAP_DIR + (os.pathsep + path if path else "")
    with tempfile.TemporaryDirectory(prefix="ampmeter-run-") as tmp:
        summary_path = os.path.join(tmp, "summary.json")
        child_env[ENV_CONFIG] = json.dumps(asdict(config))
        child_env[ENV_SUMMARY] = summary_path
        wait = None if config.timeout is None else config.timeout + _KILL_GRACE_S
        try:
            proc = subprocess.Popen(argv, env=child_env, cwd=cwd)
        except OSError as exc:
            raise ValueError(f"cannot start {argv[0]!r}: {exc.strerror or exc}") from exc
        killed = False
        try:
            code: int | None = proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            code, killed = None, True
        summary = _read_summary(summary_path)
    if killed:
        return RunOutcome(EXIT_TIMEOUT, None, summary,
                          f"timeout: killed after {config.timeout:g} s")  # fmt: skip
    stop = summary.get("stop_reason") if summary else None
    if summary is not None and summary.get("termination") in ("limit_exceeded", "timeout"):
        return RunOutcome(EXIT_LIMIT, code, summary, stop)
    return RunOutcome(code if code is not None else 1, code, summary, None)


def _read_summary(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


# -- the child side -----------------------------------------------------------------------------


def child_setup() -> None:
    """Meter this interpreter for ``ampmeter run`` (called from the bootstrap sitecustomize)."""
    raw = os.environ.pop(ENV_CONFIG, None)
    summary_path = os.environ.pop(ENV_SUMMARY, None)
    if raw is None:
        return
    # Programs this one starts must not meter themselves into the same summary.
    path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in path.split(os.pathsep) if p and p != _BOOTSTRAP_DIR
    )
    config = RunConfig(**json.loads(raw))

    from ampmeter.context import ExecutionContext
    from ampmeter.integrations import instrument, set_default_context
    from ampmeter.sinks.jsonl import JsonlSink

    instrument(capture_content=config.capture_content)
    sink = JsonlSink(config.out) if config.out else None
    ctx = ExecutionContext(
        "ampmeter_run", limits=config.limits(), timeout_s=config.timeout,
        sinks=[sink] if sink is not None else [],
    )  # fmt: skip
    ctx.__enter__()
    set_default_context(ctx)
    seen: list[BaseException] = []
    previous_hook = sys.excepthook

    def excepthook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        seen.append(exc)
        from ampmeter.errors import LimitExceeded

        if isinstance(exc, LimitExceeded):
            return  # the parent prints the one-line reason
        previous_hook(kind, exc, tb)

    sys.excepthook = excepthook

    def finish() -> None:
        exc = seen[0] if seen else None
        ctx.close(exc)
        if sink is not None:
            sink.close()
        if summary_path:
            with open(summary_path, "w", encoding="utf-8") as handle:
                json.dump(summarize(ctx), handle)

    atexit.register(finish)


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
    ]  # fmt: skip
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"  {name:<{width}}  {value}" for name, value in rows)
