"""``ampmeter run``: run a Python program with its LLM calls metered and limited."""

from __future__ import annotations

import os
from typing import Annotated, Any, Literal, Optional

import typer

from ampmeter.cli.output import fail, printable, say, show

__all__ = ["register"]

_LIMITS, _POLICIES = "Limits (the whole process tree)", "Prices and what happens at a limit"
_SHARED, _OUTPUT, _OTHERS = "Shared budget and budget file", "Output", "Processes not in Python"


def _option(flag: str, metavar: str | None, text: str, panel: str, **more: Any) -> Any:
    """One option of ``run``: each is also ``AMPMETER_<NAME>`` and ``<name>`` in the budget
    file (:mod:`ampmeter.cli.run.sources`)."""
    return typer.Option(flag, metavar=metavar, help=text, rich_help_panel=panel, **more)


Count = Optional[int]  # noqa: UP045 - typer needs Optional on Python 3.10
Number = Optional[float]  # noqa: UP045
Text = Optional[str]  # noqa: UP045
Items = Optional[list[str]]  # noqa: UP045


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
        Number, _option("--max-cost", "USD", "Cost ceiling in USD.", _LIMITS)
    ] = None,
    max_llm_calls: Annotated[
        Count, _option("--max-llm-calls", "N", "Most LLM calls sent.", _LIMITS)
    ] = None,
    max_steps: Annotated[
        Count,
        _option("--max-steps", "N", "Most steps (LLM and tool calls that succeeded).", _LIMITS),
    ] = None,
    max_tool_calls: Annotated[
        Count, _option("--max-tool-calls", "N", "Most tool calls.", _LIMITS)
    ] = None,
    max_tokens: Annotated[
        Count,
        _option(
            "--max-tokens",
            "N",
            "Most tokens the models write (output tokens, as an API's max_tokens counts them) "
            "over all calls.",
            _LIMITS,
        ),
    ] = None,
    max_input_tokens: Annotated[
        Count, _option("--max-input-tokens", "N", "Most input tokens over all calls.", _LIMITS)
    ] = None,
    max_tokens_per_model: Annotated[
        Items,
        _option(
            "--max-tokens-per-model",
            "MODEL=N",
            "Most input tokens for one model (repeatable).",
            _LIMITS,
        ),
    ] = None,
    timeout: Annotated[
        Number,
        _option(
            "--timeout",
            "SECONDS",
            "Wall-time limit: calls past it are refused, and at SECONDS the program gets "
            "SIGTERM (then SIGKILL after --grace). Exit status 124.",
            _LIMITS,
        ),
    ] = None,
    grace: Annotated[
        Number,
        _option(
            "--grace",
            "SECONDS",
            "How long the program may take to shut down after --timeout's SIGTERM before it is "
            "killed (default 2). Only its own shutdown: the work stops at --timeout.",
            _LIMITS,
        ),
    ] = None,
    price: Annotated[
        Items,
        _option(
            "--price",
            "MODEL=IN/OUT",
            "Price a model in USD per million input / output tokens, read exactly as written "
            "(repeatable; MODEL may be a pattern such as 'ft:gpt-4o*'). Wins over the price table.",
            _POLICIES,
        ),
    ] = None,
    on_unpriced: Annotated[
        Optional[Literal["refuse", "warn", "allow"]],  # noqa: UP045
        _option(
            "--on-unpriced",
            None,
            "A call to a model without a price under --max-cost: refused before it is sent "
            "(default), let through with a warning, or allowed. Its cost counts as unpriced, "
            "never as $0.",
            _POLICIES,
        ),
    ] = None,
    warn_at: Annotated[
        Optional[list[float]],  # noqa: UP045
        _option(
            "--warn-at",
            "FRACTION",
            "Warn once when this fraction of each limit is used, in any process (repeatable: "
            "--warn-at 0.5 --warn-at 0.8).",
            _POLICIES,
        ),
    ] = None,
    downgrade: Annotated[
        Items,
        _option(
            "--downgrade",
            "FROM=TO@FRACTION",
            "Past FRACTION of --max-cost, send requests for model FROM ('*': any) to model TO, "
            "reserved at TO's price (repeatable).",
            _POLICIES,
        ),
    ] = None,
    on_exhausted: Annotated[
        Optional[Literal["raise", "pause"]],  # noqa: UP045
        _option(
            "--on-exhausted",
            None,
            "A call a limit would stop: stop it (raise, the default) or pause it until the "
            "limit is raised with `ampmeter budget raise` (the run says how).",
            _POLICIES,
        ),
    ] = None,
    pause_timeout: Annotated[
        Number,
        _option(
            "--pause-timeout",
            "SECONDS",
            "How long a paused call waits before it is stopped (default: no end).",
            _POLICIES,
        ),
    ] = None,
    dry_run: Annotated[
        bool,
        _option(
            "--dry-run",
            None,
            "Meter and warn, never stop: each limit only says which call passed it (and "
            "--on-unpriced refuse becomes warn; --timeout still ends the program).",
            _POLICIES,
        ),
    ] = False,
    ledger: Annotated[
        Text,
        _option(
            "--ledger",
            "LEDGER",
            "Share the limits through this ledger: a SQLite file (processes of one machine) or a "
            "redis:// URL (many machines). Default: a SQLite ledger of this run's own.",
            _SHARED,
        ),
    ] = None,
    scope: Annotated[
        Text,
        _option(
            "--scope",
            "SCOPE",
            "The budget scope in --ledger that runs given the same SCOPE spend together "
            "(e.g. team/nightly). Default: one of this run's own.",
            _SHARED,
        ),
    ] = None,
    budget_file: Annotated[
        Text,
        _option(
            "--budget-file",
            "PATH",
            "A TOML file of these controls, keyed by their names with underscores "
            '(max_cost = 0.5, price = ["m=1/2"]).',
            _SHARED,
        ),
    ] = None,
    out: Annotated[
        Text,
        _option(
            "--out",
            "PATH",
            "Write the TokenTracker JSONL events here (while the run lasts, each process "
            "writes to PATH.parts/, which `ampmeter watch` can follow).",
            _OUTPUT,
        ),
    ] = None,
    output: Annotated[
        Optional[Literal["text", "json"]],  # noqa: UP045
        _option(
            "--output",
            None,
            "json: print the run's result as one JSON document on stdout (totals, end reason, "
            "exit status, limits, spend per model); the program's output and every other "
            "message go to stderr.",
            _OUTPUT,
        ),
    ] = None,
    capture_content: Annotated[
        bool, _option("--capture-content", None, "Also log prompt and response text.", _OUTPUT)
    ] = False,
    proxy: Annotated[
        bool,
        _option(
            "--proxy",
            None,
            "Also serve a metering proxy on loopback and point the program's OpenAI and "
            "Anthropic base URLs at it (OPENAI_BASE_URL, ANTHROPIC_BASE_URL): processes in any "
            "language are metered and capped with the rest (needs ampmeter[proxy]).",
            _OTHERS,
        ),
    ] = False,
    upstream: Annotated[
        Items,
        _option(
            "--upstream",
            "NAME=URL",
            "Where the proxy forwards openai or anthropic requests (repeatable; default: the "
            "base URL variables of this environment, else the official endpoints).",
            _OTHERS,
        ),
    ] = None,
    allow_unmetered: Annotated[
        bool,
        _option(
            "--allow-unmetered",
            None,
            "Accept Python processes of the program's tree that never joined the run's "
            "metering (started with another environment, `-I` or `-S`): they are still named, "
            "but the run does not exit 5 for them.",
            _OTHERS,
        ),
    ] = False,
) -> None:
    """Run a Python program with its LLM calls metered and limited.

    The limits hold across every Python process the program starts. Each option is also a
    variable, which the program's processes inherit (`--max-tool-calls` is
    AMPMETER_MAX_TOOL_CALLS; repeatable ones take items separated by commas), and a key of the
    TOML `--budget-file` (`max_tool_calls = 40`; repeatable ones take a list). The command line
    beats the environment, which beats the budget file.

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
    flags = dict(locals())  # every option, by its RunConfig field (sources.gather reads them)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        fail("run", "give the program to run after `--`, e.g. `ampmeter run -- python agent.py`")
    from ampmeter.cli.run.parent import format_summary, run_command
    from ampmeter.cli.run.sources import gather

    try:
        config = gather(flags, os.environ, budget_file)
        outcome = run_command(command, config, allow_unmetered=allow_unmetered)
    except ValueError as exc:
        fail("run", str(exc))
    if config.output == "json":
        from ampmeter.cli.run.result import result_json

        show(result_json(outcome, config))
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
