"""``ampmeter run``: run a Python program with its LLM calls metered and limited."""

from __future__ import annotations

import os
from typing import Annotated, Optional

import typer

from ampmeter.cli.output import fail, printable, say

__all__ = ["register"]


def run_command_line(
    command: Annotated[
        list[str],
        typer.Argument(
            help="The program and its arguments, after `--` (e.g. `-- python agent.py`).",
            show_default=False,
            metavar="COMMAND",
        ),
    ],
    max_cost: Annotated[
        Optional[float],  # noqa: UP045 - typer needs Optional on Python 3.10
        typer.Option("--max-cost", metavar="USD", help="Cost ceiling in USD."),
    ] = None,
    max_llm_calls: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option("--max-llm-calls", metavar="N", help="Most LLM calls."),
    ] = None,
    max_input_tokens: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option("--max-input-tokens", metavar="N", help="Most input tokens over all calls."),
    ] = None,
    max_tokens_per_model: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option(
            "--max-tokens-per-model",
            metavar="MODEL=N",
            help="Most input tokens for one model (repeatable).",
        ),
    ] = None,
    timeout: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option(
            "--timeout",
            metavar="SECONDS",
            help="Wall-time limit: calls past it are refused, and at SECONDS the program gets "
            "SIGTERM (then SIGKILL after --grace). Exit status 124.",
        ),
    ] = None,
    grace: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option(
            "--grace",
            metavar="SECONDS",
            help="How long the program may take to shut down after --timeout's SIGTERM before "
            "it is killed (default 2). Only its own shutdown: the work stops at --timeout.",
        ),
    ] = None,
    out: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--out",
            metavar="PATH",
            help="Write the TokenTracker JSONL events here (while the run lasts, each process "
            "writes to PATH.parts/, which `ampmeter watch` can follow).",
        ),
    ] = None,
    capture_content: Annotated[
        bool, typer.Option("--capture-content", help="Also log prompt and response text.")
    ] = False,
    ledger: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--ledger",
            metavar="redis://HOST:PORT/DB",
            help="Share the limits through this Redis (processes on many machines); default: "
            "a SQLite ledger for this run's process tree.",
        ),
    ] = None,
    proxy: Annotated[
        bool,
        typer.Option(
            "--proxy",
            help="Also serve a metering proxy on loopback and point the program's OpenAI and "
            "Anthropic base URLs at it (OPENAI_BASE_URL, ANTHROPIC_BASE_URL): processes in any "
            "language are metered and capped with the rest (needs ampmeter[proxy]).",
        ),
    ] = False,
    upstream: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option(
            "--upstream",
            metavar="NAME=URL",
            help="Where the proxy forwards openai or anthropic requests (repeatable; default: "
            "the base URL variables of this environment, else the official endpoints).",
        ),
    ] = None,
    allow_unmetered: Annotated[
        bool,
        typer.Option(
            "--allow-unmetered",
            help="Accept Python processes of the program's tree that never joined the run's "
            "metering (started with another environment, `-I` or `-S`): they are still named, "
            "but the run does not exit 5 for them.",
        ),
    ] = False,
) -> None:
    """Run a Python program with its LLM calls metered and limited.

    The limits hold across every Python process the program starts. Limits also come from
    AMPMETER_MAX_COST, AMPMETER_MAX_LLM_CALLS, AMPMETER_MAX_INPUT_TOKENS,
    AMPMETER_MAX_TOKENS_PER_MODEL (MODEL=N,...), AMPMETER_TIMEOUT, AMPMETER_GRACE, AMPMETER_OUT
    and AMPMETER_LEDGER; flags win.

    A context the program opens itself runs inside the run's: its calls are logged and count
    toward the run's limits, and its own limits apply too. A Python process of the program's
    tree that never joined the run's metering (started with an environment of its own, or
    `python -I` / `-S`) is named, and the run exits 5: pass the environment on, or use
    `--allow-unmetered`.

    Exit status | end reason ("ended") | when (the first that applies)
    --- | --- | ---
    130 / 143 | interrupted | Ctrl-C / SIGTERM, passed on to the program
    124 | timeout | --timeout ended the program
    5 | unmetered | Python processes ran outside the run's metering
    3 | limit_exceeded | a limit stopped a call, in any process
    4 | admission_wait | a call waited past its admission timeout for others' holds
    the program's | success / error | nothing above; 3 and 4 replace only its 0 and 1
    2 | | `ampmeter run` used wrongly, or metering could not start

    Example: `ampmeter run --max-cost 0.50 --out run.jsonl -- python agent.py`
    """
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        fail("run", "give the program to run after `--`, e.g. `ampmeter run -- python agent.py`")
    from ampmeter.cli.run.config import RunConfig, parse_model_limits, parse_upstreams
    from ampmeter.cli.run.parent import format_summary, run_command

    try:
        config = RunConfig.from_env(
            os.environ,
            max_cost=max_cost,
            max_llm_calls=max_llm_calls,
            max_input_tokens=max_input_tokens,
            max_tokens_per_model=parse_model_limits(max_tokens_per_model or []),
            timeout=timeout,
            grace=grace,
            out=out,
            capture_content=capture_content or None,
            ledger=ledger,
            proxy=proxy or None,
            upstreams=parse_upstreams(upstream or []),
        )
        outcome = run_command(command, config, allow_unmetered=allow_unmetered)
    except ValueError as exc:
        fail("run", str(exc))
    say("\nampmeter run summary")
    say(format_summary(outcome.summary))
    unmetered = outcome.summary["unmetered"]
    if unmetered:
        accepted = " (accepted: --allow-unmetered)" if allow_unmetered else ""
        say(
            f"ampmeter run: {len(unmetered)} Python process(es) ran without joining the run's "
            f"metering{accepted}: their LLM calls were not counted and not limited. Start them "
            "with the program's environment (env=None, or dict(os.environ, ...)) and without "
            "-I or -S, or give them a hand-off token (docs/integrations.md: processes that "
            "escape the run)."
        )
    if outcome.stop_reason:
        say(printable(f"ampmeter run: stopped: {outcome.stop_reason}"))
    raise typer.Exit(outcome.exit_code)


def register(app: typer.Typer) -> None:
    """Add the ``run`` command to ``app``."""
    # Everything after the program's name is the program's own (its flags are not ours).
    app.command("run", context_settings={"allow_interspersed_args": False})(run_command_line)
