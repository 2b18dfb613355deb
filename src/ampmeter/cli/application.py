"""The ``ampmeter`` typer app: one help style, one error style, every command registered here.

Every command is one entry of :data:`COMMANDS`, so a new command is its module's import and
one entry there. Usage errors (an unknown option, a missing
argument, a bad value) are one line on stderr naming the flag and pointing at ``--help``, with
exit status 2, like every other error (see :mod:`ampmeter.cli.output`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Annotated, Any, Final

import typer
from typer.core import TyperCommand, TyperGroup

from ampmeter.cli import analysis, budget, demo, proxy
from ampmeter.cli.output import print_error
from ampmeter.cli.run import command as run
from ampmeter.cli.watch import command as watch

__all__ = ["COMMANDS", "FlagCommand", "app", "main"]

COMMANDS: Final = (
    ("summary", analysis.summary_command),
    ("amortize", analysis.amortize_command),
    ("validate", analysis.validate_command),
    ("report", analysis.report_command),
    ("budget", budget.budget),
    ("demo", demo.demo_command),
    ("proxy", proxy.proxy),
    ("run", run.run_command_line),
    ("watch", watch.watch_command),
)
"""Every command by name, in the order ``--help`` lists them."""


def _plain_metavars(params: list[Any]) -> list[Any]:
    """A flag reads as a flag (no ``<bool>`` after it), and a list argument as ``FILE...``."""
    for param in params:
        if getattr(param, "is_flag", False) and not getattr(param, "count", False):
            param.metavar = ""
    return params


class FlagCommand(TyperCommand):
    """Every ampmeter command: its help shows flags without a value type."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _plain_metavars(super().get_params(ctx))


class _OneLineErrors(TyperGroup):
    """The command group: a usage error (unknown option, missing argument) is one line on
    stderr and exit status 2, like every other error, instead of click's boxed panel."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _plain_metavars(super().get_params(ctx))

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        try:
            code = super().main(args, prog_name, complete_var, False, windows_expand_args, **extra)
        except Exception as exc:
            if not standalone_mode:
                raise
            name = prog_name or "ampmeter"
            if type(exc).__name__ == "Abort":
                print_error(name, "aborted")
                sys.exit(1)
            if not hasattr(exc, "format_message") or not hasattr(exc, "exit_code"):
                raise  # not a usage error
            if type(exc).__name__ != "NoArgsIsHelpError":  # its help is already printed
                ctx = getattr(exc, "ctx", None)
                where = ctx.command_path if ctx is not None else name
                print_error(where, f"{exc.format_message()} (see '{where} --help')")
            sys.exit(exc.exit_code)
        if not standalone_mode:
            return code
        sys.exit(code if isinstance(code, int) else 0)


class _App(typer.Typer):
    """The typer app whose commands are all :class:`FlagCommand` (also those added later)."""

    def command(self, name: str | None = None, *, cls: Any = None, **options: Any) -> Any:
        return super().command(name, cls=cls or FlagCommand, **options)


app = _App(
    cls=_OneLineErrors,
    name="ampmeter",
    help="Account for and contain LLM agent runs; turn their logs into tables, curves and reports.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    # Markdown reflows each paragraph of a docstring to the terminal's width ("rich" keeps
    # the docstring's own line breaks, which read as ragged breaks in a wider terminal).
    rich_markup_mode="markdown",
)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"ampmeter {version('ampmeter')}")
        except PackageNotFoundError:  # run from a source tree that was never installed
            typer.echo("ampmeter (version unknown: not installed)")
        raise typer.Exit(0)


@app.callback()
def _options(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version", help="Print ampmeter's version and exit.", callback=_version, is_eager=True
        ),
    ] = False,
) -> None:
    """Account for and contain LLM agent runs; turn their logs into tables, curves and reports."""


for _name, _command in COMMANDS:
    # Everything after ``run``'s program name is the program's own (its flags are not ours).
    _own_args = {"allow_interspersed_args": False} if _name == "run" else None
    app.command(_name, context_settings=_own_args)(_command)


def main(argv: list[str] | None = None) -> None:
    """Run the command line (the ``ampmeter`` script and ``python -m ampmeter`` come here
    through :mod:`ampmeter._console_script`, which first checks that typer and rich exist)."""
    app(args=argv, prog_name="ampmeter")
