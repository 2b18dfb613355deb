"""``ampmeter run``: run a Python program with its LLM calls metered and limited."""

from __future__ import annotations

import dataclasses
import inspect
import os
import typing
from collections.abc import Sequence
from typing import Annotated, Any, Optional

import typer

from ampmeter.cli.output import fail, printable, say, show
from ampmeter.cli.params import argument, option
from ampmeter.cli.run.config import OTHERS, SHARED, RunConfig, control_types, flag_of

__all__ = ["run_command_line", "with_controls"]


def with_controls(command: Any, names: Sequence[str] = (), note: str = "") -> Any:
    """Give ``command`` the options of the controls ``names`` (every one when none is named),
    each as :class:`~ampmeter.cli.run.config.RunConfig` describes it (``note``: words added to
    each help text, which then shows no groups); ``command`` takes them as keyword arguments,
    after its own arguments and before its own options."""
    own = [
        param
        for param in inspect.signature(command, eval_str=True).parameters.values()
        if param.kind is not param.VAR_KEYWORD
    ]
    controls = [
        _option(field, note)
        for field in dataclasses.fields(RunConfig)
        if field.name in names or not names
    ]
    arguments = [param for param in own if param.default is param.empty]
    options = [param for param in own if param.default is not param.empty]
    command.__signature__ = inspect.Signature([*arguments, *controls, *options])
    return command


def _option(field: dataclasses.Field[Any], note: str) -> inspect.Parameter:
    """The typer option of one control (each is also ``AMPMETER_<NAME>`` and ``<name>`` in the
    budget file: :mod:`ampmeter.cli.run.sources`)."""
    kind = control_types()[field.name]
    described = field.metadata
    panel = None if note else described["panel"]
    given = option(
        flag_of(field.name), described["help"] + note, described["metavar"], rich_help_panel=panel
    )
    if kind is bool:
        annotation, default = Annotated[bool, given], False
    else:  # not given: None (NAME=VALUE items come as a list of text)
        kind = list[str] if typing.get_origin(kind) is dict else kind
        annotation, default = Annotated[kind | None, given], None
    return inspect.Parameter(
        field.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default, annotation=annotation
    )


@with_controls  # every control of the run is an option
def run_command_line(
    command: Annotated[
        list[str],
        argument(
            "The program and its arguments, after `--` (e.g. `-- python agent.py`).", "COMMAND"
        ),
    ],
    budget_file: Annotated[
        Optional[str],  # noqa: UP045 - typer needs Optional on Python 3.10
        option(
            "--budget-file",
            "A TOML file of these controls, keyed by their names with underscores "
            '(max_cost = 0.5, price = ["m=1/2"]).',
            "PATH",
            rich_help_panel=SHARED,
        ),
    ] = None,
    allow_unmetered: Annotated[
        bool,
        option(
            "--allow-unmetered",
            "Accept Python processes of the program's tree that never joined the run's "
            "metering (started with another environment, `-I` or `-S`): they are still named, "
            "but the run does not exit 5 for them.",
            rich_help_panel=OTHERS,
        ),
    ] = False,
    **controls: Any,
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
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        fail("run", "give the program to run after `--`, e.g. `ampmeter run -- python agent.py`")
    from ampmeter.cli.run.parent import format_summary, run_command
    from ampmeter.cli.run.sources import gather

    try:
        config = gather(controls, os.environ, budget_file)
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
