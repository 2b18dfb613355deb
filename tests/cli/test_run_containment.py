"""``ampmeter run`` contains everything its program does: calls in flight when the run stops are
charged, the program's own contexts run inside the run's, Python processes that never joined
are named, and every ending has its own exit status and end reason."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from ampmeter import ExecutionContext, JsonlSink
from ampmeter.analysis import summarize
from ampmeter.cli.run.config import RunConfig
from ampmeter.cli.run.ending import (
    EXIT_ADMISSION_WAIT,
    EXIT_LIMIT,
    EXIT_TIMEOUT,
    EXIT_UNMETERED,
    judge,
)
from ampmeter.cli.run.parent import format_summary, run_command
from ampmeter.errors import BudgetBusy
from ampmeter.testing.billing import BillingProvider

PRICES = {"gpt-4o-mini": ("0.15", "0.60")}

# One call that the provider holds far longer than the test waits: it is in flight when the
# run stops. The program says when it is about to send.
SLOW_CALL = """
import os, sys, openai
client = openai.OpenAI(base_url=os.environ["LLM_URL"], api_key="k", max_retries=0)
client.chat.completions.create(model="gpt-4o-mini", max_tokens=50,
    messages=[{"role": "user", "content": "Say yes."}])
"""


# The same call through httpx alone (metered at its transport, and quicker to import than an SDK,
# so a short --timeout still finds it in flight).
SLOW_HTTPX_CALL = """
import os, httpx
httpx.post(os.environ["LLM_URL"] + "/chat/completions", timeout=120, json={
    "model": "gpt-4o-mini", "max_tokens": 50,
    "messages": [{"role": "user", "content": "Say yes."}]})
"""


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _charged_in_flight(events: list[dict[str, Any]], received: int) -> None:
    """Every request the provider received is in the log, charged at its reservation."""
    assert received == 1
    (call,) = [e for e in events if e["event_type"] == "llm_completion"]
    meta = call["metadata"]
    assert meta["status"] == "fail" and meta["cost_status"] == "unsettled"
    assert call["cost_usd"] > 0  # the reservation: 50 output tokens and the input, priced
    assert "after it was sent" in meta["stop_reason"]
    assert "before it was sent" not in json.dumps(events)


def test_a_call_in_flight_at_the_timeout_is_charged(tmp_path: Path) -> None:
    app, out = tmp_path / "app.py", tmp_path / "events.jsonl"
    app.write_text(SLOW_HTTPX_CALL)
    with BillingProvider(delay_s=60, prices=PRICES) as provider:
        env = {**os.environ, "LLM_URL": provider.openai_base_url}
        outcome = run_command([str(app)], RunConfig(timeout=8, out=str(out)), env=env)
        received = len(provider.requests)
    _charged_in_flight(_events(out), received)
    assert outcome.exit_code == EXIT_TIMEOUT
    summary = outcome.summary
    assert summary["termination"] == "timeout" and summary["processes"] == 1
    assert summary["unsettled_calls"] == 1 and summary["cost_usd"] == summary["unsettled_cost_usd"]
    assert "unsettled" in format_summary(summary)
    (run,) = summarize([out]).runs  # `summary` and `report` read the same
    assert run.unsettled_cost_usd == run.cost_usd > 0


# The program exits while a daemon thread waits for its call's answer: the process cannot end
# the call, and its hold stays in the run's ledger (as after a SIGKILL). It exits once the test
# has seen the provider receive the call (the file GO appears).
EXIT_WITH_CALL_OPEN = """
import os, sys, threading, time, httpx
def call():
    httpx.post(os.environ["LLM_URL"] + "/chat/completions", timeout=120, json={
        "model": "gpt-4o-mini", "max_tokens": 50,
        "messages": [{"role": "user", "content": "Say yes."}]})
threading.Thread(target=call, daemon=True).start()
while not os.path.exists(sys.argv[1]):
    time.sleep(0.02)
"""


def _run_once_sent(
    command: list[str], config: RunConfig, provider: BillingProvider, sent: int
) -> Any:
    """Run ``command`` (its first argument: the file it waits for) against ``provider``; once
    ``sent`` requests reached the provider, create that file; the run's outcome."""
    ended: list[Any] = []
    env = {**os.environ, "LLM_URL": provider.openai_base_url}
    runner = threading.Thread(target=lambda: ended.append(run_command(command, config, env=env)))
    runner.start()
    deadline = time.monotonic() + 60
    while len(provider.requests) < sent:
        assert time.monotonic() < deadline and runner.is_alive()
        time.sleep(0.02)
    Path(command[1]).touch()
    runner.join(60)
    (outcome,) = ended
    return outcome


@pytest.mark.parametrize("max_cost", [1.0, None], ids=["with a cap", "without limits"])
def test_a_call_left_open_at_exit_is_charged_by_the_run(
    tmp_path: Path, max_cost: float | None
) -> None:
    app, out, go = tmp_path / "app.py", tmp_path / "events.jsonl", tmp_path / "go"
    app.write_text(EXIT_WITH_CALL_OPEN)
    with BillingProvider(delay_s=60, prices=PRICES) as provider:
        config = RunConfig(max_cost=max_cost, out=str(out))
        outcome = _run_once_sent([str(app), str(go)], config, provider, 1)
        received = len(provider.requests)
    assert received == 1
    (call,) = _events(out)
    assert call["metadata"]["cost_status"] == "unsettled" and call["cost_usd"] > 0
    assert call["metadata"]["error_class"] == "UnsettledHold"
    assert "parent_id" not in call  # a top-level call of the run's one tree
    assert outcome.exit_code == 0 and outcome.summary["unsettled_calls"] == 1


# A launcher that meters nothing itself kills its metered workers mid-call, then works on past
# their lease: no process of the run is left to see their holds run out.
KILL_THE_WORKERS = """
import os, signal, subprocess, sys, time
workers = [subprocess.Popen([sys.executable, "-c", call]) for call in sys.argv[2:]]
while not os.path.exists(sys.argv[1]):
    time.sleep(0.02)
for worker in workers:
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait()
time.sleep(5)  # the run's lease is 4 s
"""


def test_killed_workers_holds_that_ran_out_before_the_run_looked_are_charged(
    tmp_path: Path,
) -> None:
    """The run looked for holds still held, and reading them ended the expired ones: they were
    charged in the ledger but left out of the log, so the run said $0 for billed calls. A
    call of a model without a price, let through under the cap, held no amount at all: its
    hold was logged as $0.00 of unsettled spend, where unpriced is never zero."""
    app, out, go = tmp_path / "app.py", tmp_path / "events.jsonl", tmp_path / "go"
    app.write_text(KILL_THE_WORKERS)
    with BillingProvider(delay_s=60, prices=PRICES) as provider:
        config = RunConfig(max_cost=1.0, on_unpriced="allow", out=str(out))
        calls = [SLOW_CALL, SLOW_CALL.replace("gpt-4o-mini", "local-model")]
        outcome = _run_once_sent([str(app), str(go), *calls], config, provider, 2)
        received = len(provider.requests)
    assert received == 2
    logged = {call["metadata"]["cost_status"]: call for call in _events(out)}
    assert {c["metadata"]["status"] for c in logged.values()} == {"fail"}
    priced, unpriced = logged["unsettled"], logged["unpriced"]
    assert priced["cost_usd"] > 0 and unpriced["model"] == "local-model"
    summary = outcome.summary
    assert (summary["unsettled_calls"], summary["unpriced_calls"]) == (1, 1)
    assert summary["cost_usd"] == Decimal(str(priced["cost_usd"])) > 0


def test_ctrl_c_while_the_run_waits_for_leftover_holds_loses_nothing(tmp_path: Path) -> None:
    """Once the program has ended the run waits up to its lease for a killed worker's hold, to
    charge and log it. A Ctrl-C then killed ``ampmeter run`` with a traceback: no summary, the
    hold never logged and nothing merged into --out. It is now passed on like any other, and
    the run finishes its work."""
    app, out, go = tmp_path / "app.py", tmp_path / "events.jsonl", tmp_path / "go"
    app.write_text(KILL_THE_WORKERS.replace("time.sleep(5)", "open(sys.argv[1] + '.done', 'w')"))
    with BillingProvider(delay_s=60, prices=PRICES) as provider:
        env = {**os.environ, "LLM_URL": provider.openai_base_url}
        run = [sys.executable, "-m", "ampmeter", "run", "--out", str(out), "--max-cost", "1"]
        ampmeter = subprocess.Popen(
            [*run, "--", str(app), str(go), SLOW_CALL], env=env, stderr=subprocess.PIPE, text=True
        )
        deadline = time.monotonic() + 60
        while not provider.requests:
            assert time.monotonic() < deadline and ampmeter.poll() is None
            time.sleep(0.02)
        go.touch()
        while not Path(f"{go}.done").exists():
            assert time.monotonic() < deadline and ampmeter.poll() is None
            time.sleep(0.02)
        time.sleep(0.5)  # the program has ended: the run waits for the hold's lease (4 s)
        ampmeter.send_signal(signal.SIGINT)
        _, err = ampmeter.communicate(timeout=60)
    assert "Traceback" not in err, err
    assert "ampmeter run summary" in err
    (call,) = _events(out)
    assert call["metadata"]["cost_status"] == "unsettled" and call["cost_usd"] > 0


def test_an_interrupt_before_admission_is_free_and_after_it_is_charged() -> None:
    """The line between "not yet sent" (halt, free) and "maybe sent" (charged) is admission."""
    ctx = ExecutionContext("interrupts")
    with ctx:
        before = ctx.llm_call("never sent", model="gpt-4o-mini", max_tokens=100)
        before.finish(KeyboardInterrupt())  # ended before it was admitted
        sent = ctx.llm_call("sent", model="gpt-4o-mini", max_tokens=100)
        with pytest.raises(KeyboardInterrupt), sent:
            raise KeyboardInterrupt
    nodes = {n.name: n for n in ctx.graph.nodes()}
    assert nodes["never sent"].status == "halt" and nodes["never sent"].cost_usd == 0
    charged = nodes["sent"]
    assert charged.status == "fail" and charged.error_class == "KeyboardInterrupt"
    assert charged.metadata["cost_status"] == "unsettled" and charged.cost_usd > 0
    assert ctx.stats.get_gauge("amp:unsettled_cost") == charged.cost_usd
    assert ctx.stats.get_gauge("amp:cost") == charged.cost_usd


# The docs' own shape: the program wraps its work in contexts of its own. The first has a cap
# tighter than the run's (it stops its own loop, which the program catches); the second a
# looser one, so the run's cap stops it (uncaught: the program exits 1).
OWN_CONTEXT = """
import os, sys, httpx
from ampmeter import ExecutionContext, LimitExceeded
body = {"model": "gpt-4o-mini", "max_tokens": 20,
        "messages": [{"role": "user", "content": "Say yes, please."}]}
def loop(ctx, client):
    for _ in range(20):
        client.post(os.environ["LLM_URL"] + "/chat/completions", json=body).raise_for_status()
with httpx.Client() as client:
    try:
        with ExecutionContext("tight", max_cost_usd=0.00003) as ctx:
            loop(ctx, client)
    except LimitExceeded as stop:
        print("own cap:", stop, file=sys.stderr)
    with ExecutionContext("research_run", max_cost_usd=1.0) as ctx:
        loop(ctx, client)
"""


def test_the_programs_own_contexts_run_inside_the_run(tmp_path: Path) -> None:
    app, out = tmp_path / "app.py", tmp_path / "events.jsonl"
    app.write_text(OWN_CONTEXT)
    with BillingProvider(prices=PRICES) as provider:
        env = {**os.environ, "LLM_URL": provider.openai_base_url}
        outcome = run_command([str(app)], RunConfig(max_cost=0.0001, out=str(out)), env=env)
        billed = [call.cost_usd or 0 for call in provider.calls]
    assert 0 < sum(billed) <= Decimal("0.0001") and len(billed) < 20  # the run's cap held
    events = _events(out)
    llm = [e for e in events if e["event_type"] == "llm_completion"]
    sent = [e for e in llm if e["metadata"]["status"] == "success"]
    assert len(sent) == len(billed)
    # Each call logged under its own context's name; the tight one's own cap held too.
    tight = [e for e in sent if e["metadata"]["context"] == "tight"]
    assert tight and {e["metadata"]["context"] for e in sent} == {"tight", "research_run"}
    assert sum(Decimal(repr(e["cost_usd"])) for e in tight) <= Decimal("0.00003")
    assert sum(billed[: len(tight)]) <= Decimal("0.00003")
    # The uncaught LimitExceeded made the program exit 1: the stop's status replaces it.
    assert outcome.program_exit_code == 1 and outcome.exit_code == EXIT_LIMIT
    summary = outcome.summary
    assert summary["termination"] == "limit_exceeded"
    assert "amp:cost" in (outcome.stop_reason or "")
    # Money summed exactly, as each event wrote it, and printed as `summary` prints it.
    exact = sum((Decimal(repr(e["cost_usd"])) for e in llm), Decimal(0))
    assert summary["cost_usd"] == exact >= sum(billed)
    assert f"cost             ${exact:f}".rstrip("0") in format_summary(summary)


# Three Python workers that escape the run's metering, and two processes that are not Python
# and must not be flagged for existing.
ESCAPES = """
import os, subprocess, sys
wait = "import time; time.sleep(1.5)"
procs = [
    subprocess.Popen([sys.executable, "-c", wait], env={"PATH": os.environ["PATH"]}),
    subprocess.Popen([sys.executable, "-I", "-c", wait]),
    subprocess.Popen([sys.executable, "-S", "-c", wait]),
    subprocess.Popen(["sh", "-c", "sleep 1.5"]),
    subprocess.Popen([sys.executable, "-c", wait]),  # joins: it has the run's environment
]
assert all(p.wait() == 0 for p in procs)
"""


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="the tree is watched in /proc")
def test_python_processes_that_never_joined_are_named(tmp_path: Path) -> None:
    app = tmp_path / "app.py"
    app.write_text(ESCAPES)
    outcome = run_command([str(app)], RunConfig(), allow_unmetered=True)
    summary = outcome.summary
    named = {seen["command"].split(" ", 1)[1]: seen["pid"] for seen in summary["unmetered"]}
    wait = "-c 'import time; time.sleep(1.5)'"
    assert set(named) == {wait, f"-I {wait}", f"-S {wait}"}, named
    assert summary["processes"] == 2  # the program and the worker that kept its environment
    assert summary["other_processes"] >= 1  # sh (and sleep): seen, not flagged
    assert outcome.exit_code == 0  # accepted with --allow-unmetered ...
    text = format_summary(summary)
    assert "2 Python joined the run, 3 Python ran unmetered" in text
    assert all(f"unmetered: pid {pid}: " in text for pid in named.values())
    # ... and without it, the run says they ran unmetered.
    quiet = ("success", None)
    ending = judge(0, logged=quiet, timeout=None, timed_out=False, signalled=None, unmetered=3)
    assert ending.exit_code == EXIT_UNMETERED and ending.termination == "unmetered"


def test_unmetered_processes_fail_the_run_by_default_in_the_cli(tmp_path: Path) -> None:
    app = tmp_path / "app.py"
    app.write_text(
        "import os, subprocess, sys\n"
        "subprocess.run([sys.executable, '-I', '-c', 'import time; time.sleep(1)'], check=True)\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "ampmeter", "run", "--", str(app)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if not Path("/proc/self/stat").exists():
        assert done.returncode == 0 and "not watched" in done.stderr
        return
    assert done.returncode == EXIT_UNMETERED, done.stderr
    assert "ended            unmetered" in done.stderr
    assert "1 Python process(es) ran without joining the run's metering" in done.stderr
    assert "-I -c 'import time; time.sleep(1)'" in done.stderr


@pytest.mark.parametrize(
    ("code", "logged", "expected"),
    [
        (0, ("success", None), (0, "success")),
        (7, ("success", None), (7, "error")),
        (-9, ("success", None), (137, "error")),  # killed by a signal the run did not send
        (0, ("limit_exceeded", "r"), (EXIT_LIMIT, "limit_exceeded")),
        (1, ("limit_exceeded", "r"), (EXIT_LIMIT, "limit_exceeded")),
        (5, ("limit_exceeded", "r"), (5, "limit_exceeded")),  # the program's own answer
        (1, ("admission_wait", "r"), (EXIT_ADMISSION_WAIT, "admission_wait")),
        (0, ("timeout", "r"), (EXIT_LIMIT, "timeout")),  # its own context's timeout_s
    ],
)
def test_each_ending_has_one_status(
    code: int, logged: tuple[str, str | None], expected: tuple[int, str]
) -> None:
    ending = judge(code, logged=logged, timeout=None, timed_out=False, signalled=None, unmetered=0)
    assert (ending.exit_code, ending.termination) == expected


def test_interrupted_and_timeout_win_over_everything() -> None:
    stopped = ("limit_exceeded", "r")
    ending = judge(1, logged=stopped, timeout=4, timed_out=True, signalled=2, unmetered=1)
    assert (ending.exit_code, ending.termination) == (130, "interrupted")
    ending = judge(-15, logged=stopped, timeout=None, timed_out=False, signalled=15, unmetered=0)
    assert (ending.exit_code, ending.stop_reason) == (
        143,
        "interrupted: SIGTERM passed to the program",
    )
    ending = judge(1, logged=stopped, timeout=4, timed_out=True, signalled=None, unmetered=1)
    assert (ending.exit_code, ending.termination) == (EXIT_TIMEOUT, "timeout")
    late = ("timeout", "r")
    ending = judge(0, logged=late, timeout=4, timed_out=False, signalled=None, unmetered=0)
    assert ending.exit_code == EXIT_TIMEOUT  # calls refused past --timeout, program then ended


def test_a_wait_for_other_calls_holds_is_an_admission_wait(tmp_path: Path) -> None:
    """A real BudgetBusy: one call holds the whole budget while another waits 0.1 s for it."""
    log = tmp_path / "events.jsonl"
    held, done = threading.Event(), threading.Event()
    with (
        JsonlSink(log, flush="line") as sink,
        ExecutionContext("busy", max_cost_usd=0.0001, admission_timeout_s=0.1, sinks=[sink]) as ctx,
    ):

        def hold() -> None:
            with ctx.llm_call("holder", model="gpt-4o-mini", max_tokens=100) as call:
                held.set()
                done.wait(30)
                call.record(tokens_in=10, tokens_out=10)

        worker = threading.Thread(target=hold)
        worker.start()
        held.wait(30)
        try:
            waiter = ctx.llm_call("waiter", model="gpt-4o-mini", max_tokens=100)
            with pytest.raises(BudgetBusy), waiter:
                pass
        finally:
            done.set()
            worker.join()
    (run,) = summarize([log]).runs
    assert run.termination == "admission_wait", run.stop_reason
