"""``ampmeter summary``, ``amortize``, ``validate`` and ``report``: commands that read logs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Literal, Optional

import typer

from ampmeter.cli.output import fail, number, printable, say, user_errors
from ampmeter.cli.params import argument, option

__all__ = ["amortize_command", "report_command", "summary_command", "validate_command"]

LogsArg = Annotated[
    list[Path], argument("JSONL log files (TokenTracker events; .gz too).", "LOG...")
]
BestEffort = Annotated[
    bool,
    option(
        "--best-effort", "Skip bad lines (and count them) instead of stopping at the first one."
    ),
]
Engine = Literal["auto", "python", "duckdb"]  # the query engines of `amortize` and `summary`


def summary_command(
    logs: LogsArg,
    engine: Annotated[
        Engine, option("--engine", "auto picks DuckDB for logs over 64 MB in all.")
    ] = "auto",
    best_effort: BestEffort = False,
    wide: Annotated[
        bool, option("--wide", "Show every column, not only those that fit 80.")
    ] = False,
    fmt: Annotated[
        Literal["table", "json", "csv"],
        option("--format", "table for people; json or csv: every field of every run."),
    ] = "table",
) -> None:
    """Print one row per run: its name, LLM calls sent and refused, tokens, cost, how it ended.

    Runs are told apart by run_id and named by their root context (with the id where names
    collide). The table fits 80 columns; --wide adds tools, retries, tokens out, unpriced and
    unsettled spend, amplification, context growth and depth; --format json or csv prints
    every field. The last two rows give the p50 and p95 across runs. Both engines give the
    same rows.
    """
    from ampmeter.analysis import summarize

    if engine == "duckdb" and best_effort:
        fail("summary", "--engine duckdb reads strictly; use --engine python with --best-effort")
    # (--engine duckdb without the analysis extra: user_errors names the extra to install)
    with user_errors("summary", best_effort_flag=True):
        progress = sys.stderr.isatty()
        table = summarize(logs, engine=engine, best_effort=best_effort, progress=progress)
    from ampmeter.cli.summary import as_csv, as_json, as_table

    if fmt == "json":
        typer.echo(as_json(table))
        return
    if fmt == "csv":
        typer.echo(as_csv(table), nl=False)
        return
    if not table.runs:
        say("ampmeter summary: warning: the logs hold no event, so no run")
    from rich.console import Console

    console = Console()
    if wide and not console.is_terminal:  # piped or captured: do not squeeze every column
        console = Console(width=200)
    console.print(as_table(table, wide))


def amortize_command(
    stream: Annotated[Path, argument("The `*.stream.jsonl` file.", "STREAM")],
    output: Annotated[
        Path, option("-o --output", "Where to write the CSV.", "PATH", show_default=False)
    ],
    problems: Annotated[
        Optional[Path],  # noqa: UP045 - typer needs Optional on Python 3.10
        option("--problems", "The `*.problems.jsonl` file (accuracy, latency).", "PATH"),
    ] = None,
    events: Annotated[
        Optional[Path],  # noqa: UP045
        option("--events", "The TokenTracker event log (Track A/B cost).", "LOG"),
    ] = None,
    fmt: Annotated[
        Literal["v0", "extended"],
        option(
            "--format",
            "v0: the stream's four columns; extended: also accuracy, latency, Track A/B.",
        ),
    ] = "v0",
    plot: Annotated[
        Optional[Path],  # noqa: UP045
        option("--plot", "Also draw the curve as a PNG here.", "PATH"),
    ] = None,
    engine: Annotated[
        Engine, option("--engine", "auto reads with plain Python, faster here than DuckDB.")
    ] = "auto",
    best_effort: BestEffort = False,
) -> None:
    """Write the amortization curve against t as CSV (and optionally a PNG).

    v0 has the stream's cost and solved columns; extended adds accuracy, p50/p95 latency and
    Track A (pipeline) / Track B (all components) cost per problem.
    """
    from ampmeter.analysis import amortization_table, write_extended_csv, write_v0_csv

    with user_errors("amortize", best_effort_flag=True):
        # Columns, not a dict per row: a million-problem stream stays fast.
        table = amortization_table(
            stream,
            problems_jsonl=problems,
            token_events_jsonl=events,
            best_effort=best_effort,
            engine=engine,
            progress=sys.stderr.isatty(),
        )
        writer = write_v0_csv if fmt == "v0" else write_extended_csv
        count = writer(table, output)
        if plot is not None:
            from ampmeter.report.figures import amortization_figure, save_png

            save_png(amortization_figure(table.rows()), plot)
    written = f"wrote {number(count)} row(s) to {output}" + (f" and {plot}" if plot else "")
    say(printable(written))


def validate_command(logs: LogsArg) -> None:
    """Check logs line by line and print every bad line with its number, field and reason.

    Lines are read by the same rules as every other command (only a last line without its
    newline is a cut-off write); event logs are also checked against the TokenTracker v0
    schema, and `*.stream.jsonl`, `*.problems.jsonl` and `*.calls.jsonl` against the fields
    analysis needs. Exit status: 0 when every line is valid, 1 when some are not, 2 when a file
    cannot be read.
    """
    from ampmeter.analysis.validate import validate_file

    bad = files_bad = 0
    with user_errors("validate"):
        for path in logs:
            file_bad = 0
            for problem in validate_file(path):
                typer.echo(printable(str(problem)), err=problem.warning)
                if not problem.warning:
                    file_bad += 1
            bad += file_bad
            files_bad += 1 if file_bad else 0
    if bad:
        say(f"{number(bad)} bad line(s) in {files_bad} of {len(logs)} file(s)")
        raise typer.Exit(1)
    say(f"{len(logs)} file(s) valid")


def report_command(
    logs: LogsArg,
    output: Annotated[Path, option("-o --output", "The HTML file to write.", "PATH")] = Path(
        "report.html"
    ),
    title: Annotated[str, option("--title", "Title of the report.", "TEXT")] = "ampmeter report",
    best_effort: BestEffort = False,
) -> None:
    """Write one self-contained HTML report: summary, figures and call trees.

    The file opens from disk with no network. Pass `*.stream.jsonl` with its `.problems.jsonl`
    and `.token_events.jsonl` siblings to include the amortization figure. Logs that hold no
    event are an error (exit status 2), not a report of nothing.
    """
    from ampmeter.report import write_report

    with user_errors("report", best_effort_flag=True):
        write_report(logs, output, title=title, best_effort=best_effort)
    say(printable(f"wrote {output}"))
