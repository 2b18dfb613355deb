"""The CLI as a person sees it: help, errors and the live view in a real 80-column terminal
(tmux), not through a test runner's captured streams."""

from __future__ import annotations

import itertools
import json
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
from ampmeter.testing.billing import BillingProvider

WAIT_S = 120.0  # the machine is shared; nothing here asserts how long a thing takes
DONE = "__ampmeter_done__"
START = "__ampmeter_start__"
# A tmux server of this process's own: sessions that other test processes start and stop on
# the shared default server made new-session fail while that server was exiting.
TMUX = ["tmux", "-L", f"ampmeter-cli-{os.getpid()}"]
# `run -h`'s table of exit statuses and end reasons.
EXIT_TABLE = [
    ("130 / 143", "interrupted"),
    ("124", "timeout"),
    ("5", "unmetered"),
    ("3", "limit_exceeded"),
    ("4", "admission_wait"),
]


@pytest.fixture(scope="module", autouse=True)
def _tmux_server() -> Iterator[None]:
    """The module's own tmux server, kept up while it has no session: a server exits with its
    last session, and a new-session racing that exit failed."""
    if shutil.which("tmux") is None:
        yield
        return
    keep = [*TMUX, "start-server", ";", "set-option", "-g", "exit-empty", "off"]
    subprocess.run(keep, check=True, env={**os.environ, "TERM": "xterm-256color"})
    yield
    subprocess.run([*TMUX, "kill-server"], capture_output=True)


def _open_terminal(*shell: str) -> Iterator[str]:
    if shutil.which("tmux") is None:
        if os.environ.get("CI"):
            pytest.fail("tmux is missing: scripts/system-deps.sh installs it")
        pytest.skip("tmux is not installed (scripts/system-deps.sh installs it)")
    session = f"ampmeter-cli-{os.getpid()}-{time.monotonic_ns()}"
    subprocess.run(
        [*TMUX, "new-session", "-d", "-s", session, "-x", "80", "-y", "40", *shell],
        check=True,
        env={**os.environ, "TERM": "xterm-256color"},
    )
    subprocess.run([*TMUX, "set-option", "-t", session, "history-limit", "5000"], check=True)
    yield session
    subprocess.run([*TMUX, "kill-session", "-t", session], capture_output=True)


@pytest.fixture
def terminal() -> Iterator[str]:
    yield from _open_terminal()


@pytest.fixture
def slow_terminal() -> Iterator[str]:
    """A shell that takes a while before each prompt (as on a loaded machine): keys typed in
    that while wait, and the pane still shows the previous command's output."""
    yield from _open_terminal("env", "PROMPT_COMMAND=sleep 0.5", "bash", "--norc", "--noprofile")


_COMMANDS = itertools.count()


def shown(session: str, *args: str) -> str:
    """What ``ampmeter ARGS`` leaves on the 80-column screen (scrollback included), ending with
    a line ``{DONE}<exit status>``.

    The command's output is found between a start and a done marker unique to this command,
    printed from parts so that the typed command line never holds them: a marker a previous
    command in the same pane already printed cannot be mistaken for this one's.
    """
    subprocess.run([*TMUX, "send-keys", "-t", session, "clear", "Enter"], check=True)
    subprocess.run([*TMUX, "clear-history", "-t", session], check=True)
    tag = f"{os.getpid()}-{next(_COMMANDS)}"
    command = shlex.join([sys.executable, "-m", "ampmeter", *args])
    line = f"printf '%s%s\\n' {START} {tag}; {command}; printf '%s%s:%s\\n' {DONE} {tag} $?"
    subprocess.run([*TMUX, "send-keys", "-t", session, line, "Enter"], check=True)
    start = re.compile(rf"^{START}{tag}$", re.M)
    done = re.compile(rf"^{DONE}{tag}:(\d+)$", re.M)
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        text = subprocess.run(
            [*TMUX, "capture-pane", "-p", "-S", "-", "-t", session], capture_output=True, text=True
        ).stdout
        began, ended = start.search(text), done.search(text)
        if began is not None and ended is not None:
            return text[began.end() + 1 : ended.start()] + f"{DONE}{ended.group(1)}\n"
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
        assert "--grace" in text and "SIGTERM" in text
        # One table of exit statuses and end reasons, readable in 80 columns.
        for status, reason in EXIT_TABLE:
            assert re.search(rf"^\s+{status}\s+{reason}\s", text, re.M), (status, text)


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


def test_each_command_is_read_from_its_own_output(slow_terminal: str, tmp_path: Path) -> None:
    text = shown(slow_terminal, "--version")
    assert exit_status(text) == 0 and "ampmeter " in text
    # The previous command's output and done marker are still on the screen while this one
    # waits for its prompt: its own output is read, not theirs.
    text = shown(slow_terminal, "summary", str(tmp_path / "missing.jsonl"))
    assert exit_status(text) == 2 and "no such file" in text
    assert not re.search(r"^ampmeter \d+\.\d+", text, re.M)


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


def test_ctrl_c_charges_the_call_in_flight_and_ends_interrupted(
    terminal: str, tmp_path: Path
) -> None:
    """Ctrl-C in a real terminal while a call is in flight: the provider got the request, so
    the log charges it (at its reservation, unsettled), and the run says `interrupted`, 130."""
    program, out = tmp_path / "agent.py", tmp_path / "events.jsonl"
    program.write_text(
        "import os, httpx\n"
        "httpx.post(os.environ['LLM_URL'] + '/chat/completions', timeout=120, json={\n"
        "    'model': 'gpt-4o-mini', 'max_tokens': 50,\n"
        "    'messages': [{'role': 'user', 'content': 'Say yes.'}]})\n"
    )
    with BillingProvider(delay_s=60, prices={"gpt-4o-mini": ("0.15", "0.60")}) as provider:
        command = shlex.join(
            [sys.executable, "-m", "ampmeter", "run", "--out", str(out), "--", str(program)]
        )
        line = f"LLM_URL={provider.openai_base_url} {command}; echo {DONE}$?"
        subprocess.run([*TMUX, "send-keys", "-t", terminal, line, "Enter"], check=True)
        deadline = time.monotonic() + WAIT_S
        while not provider.requests:
            assert time.monotonic() < deadline, "the program never sent its call"
            time.sleep(0.05)
        subprocess.run([*TMUX, "send-keys", "-t", terminal, "C-c"], check=True)
        while True:
            text = subprocess.run(
                [*TMUX, "capture-pane", "-p", "-S", "-", "-t", terminal],
                capture_output=True,
                text=True,
            ).stdout
            if re.search(rf"^{DONE}\d+", text, re.M):
                break
            assert time.monotonic() < deadline, text
            time.sleep(0.1)
    assert exit_status(text) == 130, text
    assert re.search(r"^  ended\s+interrupted$", text, re.M), text
    assert "interrupted: SIGINT passed to the program" in text
    assert re.search(r"^  cost\s+\$0\.\d+ \(\$0\.\d+ of it unsettled\)$", text, re.M), text
    assert "LLM calls        1 (1 failed, 0 stopped before they were sent)" in text
    (call,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert call["metadata"]["cost_status"] == "unsettled" and call["cost_usd"] > 0
    assert call["metadata"]["status"] == "fail"
