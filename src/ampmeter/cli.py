"""The ``ampmeter`` command line: ``summary``, ``amortize``, ``validate``, ``report`` (and
``run``/``demo`` from :mod:`ampmeter.cli_run`).

Errors a user can cause (a missing file, invalid JSON, a record breaking the contract, a
mistyped option) are printed as one line on stderr, ``ampmeter <command>: error: <what>``, and
exit with status 2; there is never a traceback or a boxed panel. Text from logs (run ids, stop
reasons, file names) is printed as plain text, never as markup, with control characters and
terminal escape sequences shown escaped (``\x1b``).
"""

from __future__ import annotations

import contextlib
import enum
import errno
import os
import re
import sys
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any, Final, Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text
from typer.core import TyperGroup

from ampmeter import cli_budget

__all__ = ["app", "main"]

# C0 and C1 control characters (ESC starts every terminal escape sequence), DEL, and the
# characters that reorder or break displayed text (bidi overrides, line/paragraph separators).
_UNPRINTABLE: Final = re.compile(
    "[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]"
)


def printable(text: str) -> str:
    """``text`` with every control character written as an escape (``\\x1b``, ``\\n``)."""
    return _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def _print_error(where: str, message: str) -> None:
    """The one error line every ampmeter command prints."""
    _err.print(Text(f"{where}: error: {printable(message)}"), soft_wrap=True)


class _OneLineErrors(TyperGroup):
    """The command group: a usage error (unknown option, missing argument) is one line on
    stderr and exit status 2, like every other error, instead of click's boxed panel."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(
                args, prog_name, complete_var, standalone_mode, windows_expand_args, **extra
            )
        try:
            code = super().main(args, prog_name, complete_var, False, windows_expand_args, **extra)
        except Exception as exc:
            if type(exc).__name__ == "Abort":
                _print_error(prog_name or "ampmeter", "aborted")
                sys.exit(1)
            if not hasattr(exc, "format_message") or not hasattr(exc, "exit_code"):
                raise  # not a click usage error
            if type(exc).__name__ != "NoArgsIsHelpError":  # its help is already printed
                ctx = getattr(exc, "ctx", None)
                where = ctx.command_path if ctx is not None else prog_name or "ampmeter"
                _print_error(where, f"{exc.format_message()} (see '{where} --help')")
            sys.exit(exc.exit_code)
        sys.exit(code if isinstance(code, int) else 0)


app = typer.Typer(
    cls=_OneLineErrors,
    name="ampmeter",
    help="Account for and contain LLM agent runs; turn their logs into tables, curves and reports.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # Markdown reflows each paragraph of a docstring to the terminal's width ("rich" keeps
    # the docstring's own line breaks, which read as ragged breaks in a wider terminal).
    rich_markup_mode="markdown",
)

_err = Console(stderr=True, highlight=False, soft_wrap=True)

LogsArg = Annotated[
    list[Path],
    typer.Argument(help="JSONL log files (TokenTracker events; .gz too).", show_default=False),
]
BestEffort = Annotated[
    bool,
    typer.Option("--best-effort", help="Skip lines that are not valid JSON instead of failing."),
]


class Format(str, enum.Enum):
    """CSV layouts of ``ampmeter amortize``."""

    v0 = "v0"
    extended = "extended"


class EngineName(str, enum.Enum):
    """Query engines of ``ampmeter amortize``."""

    auto = "auto"
    python = "python"
    duckdb = "duckdb"


def _fail(command: str, message: str) -> typer.Exit:
    _print_error(f"ampmeter {command}", message)
    return typer.Exit(2)


# What the OS's own texts for these errors mean for a file named on the command line.
_OS_REASONS: Final = {
    errno.ENOENT: "no such file",
    errno.EISDIR: "is a directory, not a file",
    errno.ENOTDIR: "a part of the path is not a directory",
    errno.EACCES: "permission denied",
    errno.EROFS: "read-only file system",
    errno.ENOSPC: "no space left on the device",
}


def os_error_message(exc: OSError) -> str:
    """``<file>: <what>`` for an ``OSError``: ampmeter's own wording when it raised it, a short
    plain reason for the OS's."""
    reason = exc.strerror or str(exc)
    if exc.errno is not None and reason == os.strerror(exc.errno):
        reason = _OS_REASONS.get(exc.errno, reason[:1].lower() + reason[1:])
    return f"{exc.filename}: {reason}" if exc.filename else reason


@contextlib.contextmanager
def _user_errors(command: str) -> Iterator[None]:
    """Turn the errors a user can cause into one line on stderr and exit status 2; show
    warnings (such as a cut-off last line) as one line each."""
    from ampmeter.analysis import AnalysisError
    from ampmeter.logs import JsonlError

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield
        except (JsonlError, AnalysisError) as exc:
            raise _fail(command, str(exc)) from None
        except OSError as exc:
            raise _fail(command, os_error_message(exc)) from None
        except ValueError as exc:
            raise _fail(command, str(exc)) from None
        finally:
            for item in caught:
                message = printable(f"ampmeter {command}: warning: {item.message}")
                _err.print(Text(message), soft_wrap=True)


def _fmt(value: object) -> Text:
    """A table cell: plain text (never markup), control characters escaped."""
    if value is None:
        return Text("-")
    if isinstance(value, float):
        return Text(f"{value:,.6g}")
    if isinstance(value, int):
        return Text(f"{value:,}")
    return Text(printable(str(value)))


@app.command("summary")
def summary_command(
    logs: LogsArg,
    engine: Annotated[
        EngineName,
        typer.Option("--engine", help="auto picks DuckDB for logs over 64 MB in all."),
    ] = EngineName.auto,
    best_effort: BestEffort = False,
) -> None:
    """Print a table of runs: calls, tokens, cost, amplification, growth, depth, termination.

    Runs are told apart by run_id; the last two rows give the p50 and p95 across runs. Both
    engines give the same table.
    """
    from ampmeter.analysis import summarize

    with _user_errors("summary"):
        try:
            table = summarize(
                logs,
                engine=engine.value,  # type: ignore[arg-type, unused-ignore]
                best_effort=best_effort,
                progress=_err.is_terminal,
            )
        except ImportError as exc:  # --engine duckdb without the analysis extra
            raise _fail("summary", str(exc)) from None
    columns = (
        ("run_id", "run"), ("llm_calls", "LLM"), ("tool_calls", "tools"),
        ("retries", "retries"), ("tokens_in", "tok in"), ("tokens_out", "tok out"),
        ("cost_usd", "cost $"), ("unpriced_calls", "unpriced"),
        ("llm_calls_per_root", "LLM amp"), ("tool_calls_per_root", "tool amp"),
        ("base_context", "base ctx"), ("context_growth_avg", "growth"),
        ("max_depth", "depth"), ("termination", "termination"),
    )  # fmt: skip
    out = Table(title=f"{len(table.runs)} run(s)", header_style="bold")
    for key, label in columns:
        text = key in ("run_id", "termination")
        out.add_column(label, justify="left" if text else "right", overflow="fold")
    for run in table.runs:
        row = run.to_dict()
        out.add_row(*(_fmt(row[key]) for key, _ in columns), style=None)
    if table.runs:
        for q in ("p50", "p95"):
            out.add_row(
                *(
                    Text(q) if key == "run_id" else _fmt(table.across.get(key, {}).get(q))
                    if key in table.across else Text("")
                    for key, _ in columns
                ),
                style="italic dim",
            )  # fmt: skip
    console = Console()
    if not console.is_terminal:  # piped or captured: do not squeeze into 80 columns
        console = Console(width=200)
    console.print(out)


@app.command("amortize")
def amortize_command(
    stream: Annotated[Path, typer.Argument(help="The *.stream.jsonl file.", show_default=False)],
    output: Annotated[
        Path, typer.Option("-o", "--output", help="Where to write the CSV.", show_default=False)
    ],
    problems: Annotated[
        Optional[Path],  # noqa: UP045 - typer needs Optional on Python 3.10
        typer.Option("--problems", help="The *.problems.jsonl file (accuracy, latency)."),
    ] = None,
    events: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option("--events", help="The TokenTracker event log (Track A/B cost)."),
    ] = None,
    fmt: Annotated[
        Format,
        typer.Option(
            "--format",
            help="v0: the stream's four columns; extended: also accuracy, latency, Track A/B.",
        ),
    ] = Format.v0,
    plot: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option("--plot", help="Also draw the curve as a PNG here."),
    ] = None,
    engine: Annotated[
        EngineName,
        typer.Option("--engine", help="auto picks DuckDB for inputs over 64 MB."),
    ] = EngineName.auto,
    best_effort: BestEffort = False,
) -> None:
    """Write the amortization curve against t as CSV (and optionally a PNG).

    v0 has the stream's cost and solved columns; extended adds accuracy, p50/p95 latency and
    Track A (pipeline) / Track B (all components) cost per problem.
    """
    from ampmeter.analysis import amortization_table, write_extended_csv, write_v0_csv

    with _user_errors("amortize"):
        # Columns, not a dict per row: a million-problem stream stays fast.
        table = amortization_table(
            stream,
            problems_jsonl=problems,
            token_events_jsonl=events,
            best_effort=best_effort,
            engine=engine.value,  # type: ignore[arg-type, unused-ignore]
            progress=_err.is_terminal,
        )
        writer = write_v0_csv if fmt is Format.v0 else write_extended_csv
        count = writer(table, output)
        if plot is not None:
            from ampmeter.report.figures import amortization_figure, save_png

            save_png(amortization_figure(table.rows()), plot)
    _err.print(Text(printable(f"wrote {count} row(s) to {output}" + (f" and {plot}" if plot
                                                                      else ""))))  # fmt: skip


@app.command("validate")
def validate_command(logs: LogsArg) -> None:
    """Check logs line by line and print every bad line with its number and reason.

    Event logs are checked against the TokenTracker v0 schema; *.stream.jsonl,
    *.problems.jsonl and *.calls.jsonl against the fields analysis needs. Exit status: 0 when
    every line is valid, 1 when some are not, 2 when a file cannot be read.
    """
    from ampmeter.analysis.validate import validate_file

    bad = files_bad = 0
    with _user_errors("validate"):
        for path in logs:
            file_bad = 0
            for problem in validate_file(path):
                typer.echo(printable(str(problem)), err=problem.warning)
                if not problem.warning:
                    file_bad += 1
            bad += file_bad
            files_bad += 1 if file_bad else 0
    if bad:
        _err.print(f"{bad} bad line(s) in {files_bad} of {len(logs)} file(s)", markup=False)
        raise typer.Exit(1)
    _err.print(f"{len(logs)} file(s) valid", markup=False)


@app.command("report")
def report_command(
    logs: LogsArg,
    output: Annotated[Path, typer.Option("-o", "--output", help="The HTML file to write.")] = Path(
        "report.html"
    ),
    title: Annotated[str, typer.Option("--title", help="Title of the report.")] = (
        "ampmeter report"
    ),
    best_effort: BestEffort = False,
) -> None:
    """Write one self-contained HTML report: summary, figures and call trees.

    The file opens from disk with no network. Pass *.stream.jsonl with its .problems.jsonl and
    .token_events.jsonl siblings to include the amortization figure.
    """
    from ampmeter.report import write_report

    with _user_errors("report"):
        write_report(logs, output, title=title, best_effort=best_effort)
    _err.print(Text(printable(f"wrote {output}")))


def _fallback_demo() -> None:
    """Build a small call graph and print its aggregates."""
    from ampmeter.graph import ExecutionGraph

    graph = ExecutionGraph(chain_id="demo")
    root = graph.create_root("agent_run")
    for step in range(1, 4):
        llm = graph.begin_node(root, "llm", f"step_{step}", model="gpt-4o-mini")
        graph.mark_running(llm)
        graph.mark_success(llm, cost_usd=0.0003 * step, tokens_in=400 * step, tokens_out=60)
        tool = graph.begin_node(llm, "tool", "calculator")
        graph.mark_running(tool)
        graph.mark_success(tool, cost_usd=0.0)
    halted = graph.begin_node(root, "llm", "step_4", model="gpt-4o-mini")
    graph.mark_halt(halted, stop_reason="limit amp:cost exceeded")
    graph.mark_success(root, 0.0)
    for key, value in graph.snapshot()["aggregates"].items():
        typer.echo(f"{key:>22}  {value}")


def _register_run_commands() -> None:
    try:
        from ampmeter import cli_run
    except ImportError:
        app.command("demo")(_fallback_demo)
        return
    cli_run.register(app)


_register_run_commands()


def _register_watch_command() -> None:
    from ampmeter import cli_watch

    cli_watch.register(app)


_register_watch_command()
cli_budget.register(app)


def main(argv: list[str] | None = None) -> None:
    """Run the command line (the ``ampmeter`` script and ``python -m ampmeter`` come here
    through :mod:`ampmeter._console_script`, which first checks that typer and rich exist)."""
    app(args=argv, prog_name="ampmeter")
