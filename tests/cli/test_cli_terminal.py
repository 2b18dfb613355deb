"""The CLI as a person sees it: help, errors and the live view in a real 80-column terminal
(tmux), not through a test runner's captured streams."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ampmeter import ExecutionContext, JsonlSink, LimitExceeded
from ampmeter.cli import app

WAIT_S = 120.0  # the machine is shared; nothing here asserts how long a thing takes
DONE = "__ampmeter_done__"
START = "__ampmeter_start__"


@pytest.fixture
def terminal() -> Iterator[str]:
    if shutil.which("tmux") is None:
        if os.environ.get("CI"):
            pytest.fail("tmux is missing: scripts/system-deps.sh installs it")
        pytest.skip("tmux is not installed (scripts/system-deps.sh installs it)")
    session = f"ampmeter-cli-{os.getpid()}-{time.monotonic_ns()}"
    new = ["tmux", "new-session", "-d", "-s", session, "-x", "80", "-y", "40"]
    env = {**os.environ, "TERM": "xterm-256color"}
    # The last test's kill-session ends the tmux server when it held the only session; a new
    # session asked for while it exits fails ("server exited unexpectedly"): ask again.
    for _ in range(20):
        if subprocess.run(new, env=env, capture_output=True).returncode == 0:
            break
        time.sleep(0.1)
    else:
        subprocess.run(new, check=True, env=env)
    subprocess.run(["tmux", "set-option", "-t", session, "history-limit", "5000"], check=True)
    yield session
    subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)


def shown(session: str, *args: str) -> str:
    """What ``ampmeter ARGS`` leaves on the 80-column screen (scrollback included)."""
    subprocess.run(["tmux", "send-keys", "-t", session, "clear", "Enter"], check=True)
    subprocess.run(["tmux", "clear-history", "-t", session], check=True)
    command = shlex.join([sys.executable, "-m", "ampmeter", *args])
    line = f"echo {START}; {command}; echo {DONE}$?"
    subprocess.run(["tmux", "send-keys", "-t", session, line, "Enter"], check=True)
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        text = subprocess.run(
            ["tmux", "capture-pane", "-p", "-S", "-", "-t", session], capture_output=True, text=True
        ).stdout
        if re.search(rf"^{DONE}\d+", text, re.M):
            return text.split(f"\n{START}\n", 1)[-1]
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for `ampmeter {' '.join(args)}`")


def exit_status(text: str) -> int:
    found = re.search(rf"^{DONE}(\d+)", text, re.M)
    assert found is not None
    return int(found.group(1))


@pytest.mark.parametrize("command", [[], ["run"], ["summary"], ["watch"], ["validate"]])
def test_help_reads_the_same_everywhere_in_80_columns(terminal: str, command: list[str]) -> None:
    text = shown(terminal, *command, "-h")
    assert exit_status(text) == 0
    assert "Usage: ampmeter" in text and "╭─ Options" in text  # one style, run included
    assert "<bool>" not in text  # flags read as flags
    assert re.search(r"--help\s+-h\s+Show this message", text)
    assert all(len(line) <= 80 for line in text.splitlines())
    if not command:
        assert "--version" in text
        for name in ("summary", "amortize", "validate", "report", "demo", "run", "watch"):
            assert re.search(rf"│ {name}\s", text), name
    if command == ["run"]:  # the grace period is documented, and what it applies to
        assert "--grace" in text and "SIGTERM" in text and "Exit status: the program's" in text


def test_one_help_style_same_placeholders_choices_listed_nothing_eaten(terminal: str) -> None:
    """Issue 39: the same placeholder for the same thing in every command, choices listed, and
    no markup eating a glob's star."""
    helps = {c: shown(terminal, c, "-h") for c in ("summary", "report", "validate", "watch")}
    for command, text in helps.items():
        assert f"Usage: ampmeter {command} [OPTIONS] {{LOG...}}" in text, text
    words = helps["watch"].replace("│", " ").split()  # the help wraps in its box
    assert "'runs/*.jsonl');" in words and "*.jsonl" in words
    for command in ("watch", "demo", "run"):
        assert re.search(r"--max-cost\s+USD\s", shown(terminal, command, "-h")), command
    assert re.search(r"--max-llm-calls\s+N\s", helps["watch"])
    budget = shown(terminal, "budget", "-h")
    assert "{ACTION} {LEDGER} {SCOPE} [KEY] [VALUE]" in budget
    assert "<show|pause|resume|raise>" in budget
    text = shown(terminal, "budget", "frob", "ledger.db", "team")
    joined = " ".join(text.split())  # the terminal wraps the one long line
    assert exit_status(text) == 2 and "'frob' is not one of 'show', 'pause', 'resume'" in joined
    summary = helps["summary"]
    assert "<table|json|csv>" in summary and "--wide" in summary


def test_version_and_errors_in_a_terminal(terminal: str, tmp_path: Path) -> None:
    text = shown(terminal, "--version")
    assert exit_status(text) == 0 and re.search(r"^ampmeter \d+\.\d+", text, re.M)
    text = shown(terminal, "run", "--max-cost", "-1", "--", "true")
    assert exit_status(text) == 2
    assert "ampmeter run: error: --max-cost must be a finite number >= 0, got -1.0" in text
    text = shown(terminal, "summary", "--engine", "duckdb", "--best-effort", "x.jsonl")
    assert exit_status(text) == 2 and "--best-effort" in text and "best_effort" not in text
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"run_id": "r", "event_type": "tool_call", "usage": {}, "cost_usd": 1e400}\n')
    text = shown(terminal, "summary", str(bad))
    assert exit_status(text) == 2
    joined = text.replace("\n", "")  # the terminal wraps the one long line
    assert f"{bad}:1: field 'cost_usd': must be a finite number" in joined
    assert "--best-effort skips bad lines" in joined and "Traceback" not in text


def _stopped_run(directory: Path) -> None:
    """A real run: a sub-agent with two calls, then a call that a limit stops."""
    with (
        JsonlSink(directory / "events.jsonl", flush="line") as sink,
        ExecutionContext("nightly-agent", max_cost_usd=0.004, sinks=[sink]) as ctx,
    ):
        with ctx.spawn_child("researcher") as sub:
            with sub.llm_call("plan", model="gpt-4o-mini", max_tokens=100) as call:
                call.record(tokens_in=10_000, tokens_out=100)
            with sub.tool_call("search") as tool:
                tool.record(cost_usd=0.0)
        with pytest.raises(LimitExceeded):
            for _ in range(5):
                with ctx.llm_call("answer", model="gpt-4o-mini", max_tokens=500) as call:
                    call.record(tokens_in=10_000, tokens_out=500)


def test_watch_once_on_a_directory_in_80_columns(terminal: str, tmp_path: Path) -> None:
    # Written by a process of its own, which has ended: watch calls a run ended only then.
    writer = f"import sys; sys.path[:0] = {sys.path!r}; from test_cli_terminal import _stopped_run"
    writer += f"; from pathlib import Path; _stopped_run(Path({str(tmp_path)!r}))"
    subprocess.run([sys.executable, "-c", writer], check=True, cwd=Path(__file__).parent)
    text = shown(terminal, "watch", "--once", str(tmp_path))
    assert exit_status(text) == 0
    # Runs by their context's name and a short id; a real tree, indented by depth.
    assert re.search(r"^run nightly-agent  [0-9a-f]{8}…  ■ ended: stopped by a limit", text, re.M)
    assert re.search(r"^├─ ✓ system researcher", text, re.M), text
    assert re.search(r"^│  ├─ ✓ llm plan", text, re.M)
    assert re.search(r"^│  └─ ✓ tool search", text, re.M)
    assert re.search(r"^└─ ■ llm answer .*stopped", text, re.M)
    assert all(len(line) <= 80 for line in text.splitlines())
    # No id or word broken across lines: every word on the 80-column screen is a word of the
    # same frame drawn 200 columns wide, or a word cut short with an ellipsis.
    wide = CliRunner().invoke(app, ["watch", "--once", str(tmp_path)], env={"COLUMNS": "200"})
    words = set(wide.stdout.split())
    clock = re.compile(r"^\(\d\d:\d\d:\d\d\)$")
    for word in text.split(DONE)[0].split():
        if clock.match(word) or word in words:
            continue
        assert word.endswith("…") and any(w.startswith(word[:-1]) for w in words), word
