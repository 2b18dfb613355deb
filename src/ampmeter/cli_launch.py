"""``ampmeter run``'s command line, parsed with :mod:`argparse`.

``ampmeter run`` starts a program and waits for it, so its own start-up is time the user pays on
every run: this module imports neither typer nor rich (nor anything else of the other commands).
The console script hands ``run`` straight to :func:`main`; the typer app's ``run`` command (which
makes ``ampmeter --help`` list it) hands its arguments here too, so there is one parser.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

__all__ = ["main", "parser"]

_DESCRIPTION = """\
Run a Python program with its LLM calls metered and limited.

Limits also come from AMPMETER_MAX_COST, AMPMETER_MAX_LLM_CALLS, AMPMETER_MAX_INPUT_TOKENS,
AMPMETER_MAX_TOKENS_PER_MODEL (MODEL=N,...), AMPMETER_TIMEOUT, AMPMETER_OUT and AMPMETER_LEDGER;
flags win. The limits hold across every Python process the program starts."""

_EPILOG = """\
example:
  ampmeter run --max-cost 0.50 --out run.jsonl -- python agent.py"""


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """``Usage:`` capitalised, as in the other commands' help."""

    def add_usage(self, usage: str | None, actions: Any, groups: Any, prefix: str | None = None
                  ) -> None:  # fmt: skip
        super().add_usage(usage, actions, groups, "Usage: " if prefix is None else prefix)


class _Parser(argparse.ArgumentParser):
    """argparse with ampmeter's one-line error style (no usage block before it)."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"ampmeter run: error: {message}\n")
        raise SystemExit(2)


def parser() -> argparse.ArgumentParser:
    """The parser of ``ampmeter run``'s options."""
    p = _Parser(
        prog="ampmeter run",
        usage="ampmeter run [OPTIONS] -- COMMAND [ARGS...]",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=_Formatter,
    )
    p.add_argument("--max-cost", type=float, metavar="USD", help="Cost ceiling in USD.")
    p.add_argument("--max-llm-calls", type=int, metavar="N", help="Most LLM calls.")
    p.add_argument(
        "--max-input-tokens", type=int, metavar="N", help="Most input tokens over all calls."
    )
    p.add_argument(
        "--max-tokens-per-model",
        action="append",
        metavar="MODEL=N",
        help="Most input tokens for one model (repeatable).",
    )
    p.add_argument("--timeout", type=float, metavar="SECONDS", help="Wall-time limit in seconds.")
    p.add_argument("--out", metavar="PATH", help="Write TokenTracker JSONL events here.")
    p.add_argument(
        "--capture-content", action="store_true", help="Also log prompt and response text."
    )
    p.add_argument(
        "--ledger",
        metavar="redis://HOST:PORT/DB",
        help="Share the limits through this Redis (processes on many machines); default: a "
        "SQLite ledger for this run's process tree.",
    )
    p.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        metavar="COMMAND",
        help="The program to run, after `--` (e.g. `-- python agent.py`).",
    )
    return p


def main(argv: Sequence[str]) -> NoReturn:
    """Parse ``argv`` (the arguments after ``run``), run the program, exit with its status."""
    args = parser().parse_args(list(argv))
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        _fail("give the program to run after `--`, e.g. `ampmeter run -- python agent.py`")
    from ampmeter.runner import RunConfig, format_summary, parse_model_limits, run_command

    try:
        config = RunConfig.from_env(
            os.environ,
            max_cost=args.max_cost,
            max_llm_calls=args.max_llm_calls,
            max_input_tokens=args.max_input_tokens,
            max_tokens_per_model=parse_model_limits(args.max_tokens_per_model or []),
            timeout=args.timeout,
            out=args.out,
            capture_content=args.capture_content or None,
            ledger=args.ledger,
        )
        outcome = run_command(command, config)
    except ValueError as exc:
        _fail(str(exc))
    lines = ["", "ampmeter run summary"]
    if outcome.summary is not None:
        lines.append(format_summary(outcome.summary))
    else:
        lines.append("  (the program ended before ampmeter could write its summary)")
    if outcome.stop_reason:
        lines.append(f"ampmeter: run stopped: {outcome.stop_reason}")
    sys.stderr.write("\n".join(lines) + "\n")
    raise SystemExit(outcome.exit_code)


def _fail(message: str) -> NoReturn:
    sys.stderr.write(f"ampmeter run: error: {message}\n")
    raise SystemExit(2)
