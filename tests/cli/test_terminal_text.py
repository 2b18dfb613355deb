"""Text from logs, ledgers and providers reaches a terminal with its control characters escaped:
a model name, an error class or a ledger key cannot write the clipboard (OSC 52), set the window
title (OSC 0), clear the screen (CSI 2J) or hide a link (OSC 8) through ``ampmeter watch``,
``summary``, ``budget show`` or any message line."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ampmeter import ExecutionContext, JsonlSink, LimitExceeded
from ampmeter.cli import app
from ampmeter.cli.output import say, show
from ampmeter.ledgers import SqliteLedger

HOSTILE = (
    "\x1b]52;c;cHduZWQ=\x07"  # write the clipboard
    "\x1b]0;pwned\x07"  # set the window title
    "\x1b[2J"  # clear the screen
    "\x1b]8;;https://attacker.example/\x1b\\click\x1b]8;;\x1b\\"  # a hidden link
)
ESCAPED = "\\x1b]52;c;cHduZWQ=\\x07"


def assert_safe(text: str) -> None:
    """No control character but the line breaks, and the hostile text shown escaped."""
    assert not any(ord(c) < 32 and c != "\n" for c in text), repr(text)
    assert "\x9b" not in text and "\x9d" not in text  # the 8-bit CSI and OSC


def _hostile_log(path: Path) -> Path:
    """A real run whose model names, error class and context name carry escape sequences (as a
    provider's response or a caller's names may), with a call a limit stopped."""
    error = type("Boom" + HOSTILE, (RuntimeError,), {})
    with (
        JsonlSink(path, flush="line") as sink,
        ExecutionContext(
            "agent" + HOSTILE, sinks=[sink], max_cost_usd=0.004, on_unpriced="allow"
        ) as ctx,
    ):
        with ctx.llm_call("plan", model="gpt-4o" + HOSTILE) as call:
            call.record(tokens_in=10, tokens_out=2, cost_usd=0.001)
        with pytest.raises(error), ctx.tool_call("search" + HOSTILE):
            raise error("failed")
        with pytest.raises(LimitExceeded):
            for _ in range(5):
                with ctx.llm_call("answer" + HOSTILE, model="gpt-4o-mini", max_tokens=500) as call:
                    call.record(tokens_in=10_000, tokens_out=500)
    return path


def test_watch_and_summary_escape_every_field_of_a_log(tmp_path: Path) -> None:
    log = _hostile_log(tmp_path / "events.jsonl")
    models = [json.loads(line)["model"] for line in log.read_text().splitlines()]
    assert "gpt-4o" + HOSTILE in models  # the log keeps the name as it was given
    runner = CliRunner()
    wide = {"COLUMNS": "600"}  # wide enough that no field is cut short
    watched = runner.invoke(app, ["watch", "--once", str(log)], env=wide)
    assert watched.exit_code == 0, watched.output
    assert_safe(watched.stdout)
    assert "gpt-4o" + ESCAPED in watched.stdout  # the model name
    assert "Boom" + ESCAPED in watched.stdout  # the error class
    assert "search" + ESCAPED in watched.stdout  # the call's name
    summary = runner.invoke(app, ["summary", str(log)], env=wide)
    assert summary.exit_code == 0, summary.output
    assert_safe(summary.stdout)


def test_budget_show_escapes_what_another_writer_put_in_the_ledger(tmp_path: Path) -> None:
    where = tmp_path / "budget.sqlite3"
    ledger = SqliteLedger(str(where), "team")
    ledger.set_ceilings("team", {"amp:cost": 1.0})
    ledger.close()
    with sqlite3.connect(where) as db:  # a process that writes the file behind the API's back
        db.execute(
            "INSERT INTO ampmeter_ceilings VALUES ('team', ?, 5)", ("amp:llm_calls" + HOSTILE,)
        )
    result = CliRunner().invoke(app, ["budget", "show", str(where), "team"])
    assert result.exit_code == 0, result.output
    assert_safe(result.stdout)
    assert "amp:llm_calls" + ESCAPED in result.stdout and "amp:cost $1.00" in result.stdout


def test_every_message_line_is_made_safe_where_it_is_written(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A command's own line breaks are kept; every other control character is escaped, even
    # in text a caller forgot to pass through printable() (the run's summary, the demo's
    # answers from the model).
    say("stopped: " + HOSTILE + "\nsecond line")
    show("answer: " + HOSTILE)
    out, err = capsys.readouterr()
    assert_safe(out + err)
    assert err.endswith("\nsecond line\n") and err.startswith("stopped: " + ESCAPED)
    assert out.startswith("answer: " + ESCAPED)
