"""``ampmeter run`` over a whole process tree: one budget, one log, one process group."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ampmeter.analysis import summarize
from ampmeter.cli.run.config import RunConfig
from ampmeter.cli.run.parent import EXIT_LIMIT, EXIT_TIMEOUT, run_command
from ampmeter.testing.replay import ReplayResponse, ReplayServer
from support.redis_server import RedisServer, redis_server_fixture  # noqa: F401

COMPLETION = {
    "id": "c1",
    "object": "chat.completion",
    "created": 1,
    "model": "gpt-4o-mini",
    "choices": [
        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "yes"}}
    ],
    "usage": {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10},
}

# Four workers, each trying three calls; a refused call ends the worker quietly.
APP = """
import multiprocessing, os, subprocess, sys, openai

def work(i):
    client = openai.OpenAI(base_url=os.environ["LLM_URL"], api_key="k", max_retries=0)
    made = 0
    for _ in range(3):
        try:
            client.chat.completions.create(model="gpt-4o-mini", max_tokens=2,
                messages=[{"role": "user", "content": "Say yes."}])
        except Exception as exc:
            return made, type(exc).__name__
        made += 1
    return made, None

if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "one":
        print(work(0))
    elif mode == "subprocess":
        procs = [subprocess.Popen([sys.executable, __file__, "one"]) for _ in range(4)]
        assert all(p.wait() == 0 for p in procs)
    elif mode == "elsewhere":  # one worker in a folder of its own, then one here
        os.makedirs("elsewhere", exist_ok=True)
        for where in ("elsewhere", "."):
            assert subprocess.run([sys.executable, __file__, "one"], cwd=where).returncode == 0
    elif mode.startswith("pool-"):
        with multiprocessing.get_context(mode[5:]).Pool(4) as pool:
            print(pool.map(work, range(4), chunksize=1))
    else:
        ctx = multiprocessing.get_context(mode)
        procs = [ctx.Process(target=work, args=(i,)) for i in range(4)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
            assert p.exitcode == 0
"""


def run_app(
    tmp_path: Path, mode: str, config: RunConfig, *, verbatim_ids: bool = False
) -> tuple[Any, list[dict[str, Any]], int]:
    """Run the app under ``config``; ``verbatim_ids``: the server answers every request with
    the same response id (``c1``), as gateways and mock servers do."""
    app = tmp_path / "app.py"
    app.write_text(APP)
    with ReplayServer(verbatim_ids=verbatim_ids) as server:
        server.script("/v1/chat/completions", *(ReplayResponse.json(COMPLETION) for _ in range(20)))
        env = {**os.environ, "LLM_URL": server.openai_base_url}
        outcome = run_command([str(app), mode], config, env=env)
        requests = len(server.requests)
    assert config.out is not None
    events = [json.loads(line) for line in Path(config.out).read_text().splitlines()]
    return outcome, events, requests


# (pool-spawn is slowest: the test below runs it three times, with these checks each time.)
@pytest.mark.parametrize("mode", ["fork", "spawn", "forkserver", "subprocess", "pool-fork"])
def test_limit_holds_across_worker_processes(tmp_path: Path, mode: str) -> None:
    out = tmp_path / "events.jsonl"
    _check_limit_run(out, mode, *run_app(tmp_path, mode, RunConfig(max_llm_calls=2, out=str(out))))


def _check_limit_run(
    out: Path, mode: str, outcome: Any, events: list[dict[str, Any]], requests: int
) -> None:
    """A run of the app whose workers share ``max_llm_calls=2``, logged to ``out``."""
    assert requests == 2  # counted by the server: exactly N reached the provider
    llm = [e for e in events if e["event_type"] == "llm_completion"]
    statuses = [e["metadata"]["status"] for e in llm]
    assert statuses.count("success") == 2
    assert statuses.count("halt") >= 1
    # Every call was made in a worker, and every worker's events reached the log.
    workers = {e["metadata"]["pid"] for e in llm}
    assert len(workers) == 4 if not mode.startswith("pool-") else len(workers) >= 1
    # One run, one tree, no id twice.
    assert len({e["run_id"] for e in events}) == 1
    spans = [e["span_id"] for e in events]
    assert len(spans) == len(set(spans))
    (run,) = summarize([out]).runs
    assert run.llm_calls == len(llm)
    assert outcome.summary is not None
    assert outcome.summary["llm_calls"] == len(llm)
    assert outcome.summary["halted_calls"] == statuses.count("halt")
    assert outcome.summary["tokens_in"] == 18
    # A worker's call was stopped: the run says so, whichever process lived to the end.
    assert outcome.exit_code == EXIT_LIMIT
    assert outcome.summary["termination"] == "limit_exceeded" == run.termination
    assert outcome.stop_reason is not None and "amp:llm_calls" in outcome.stop_reason


def test_a_spawn_pool_that_hits_a_limit_gives_the_same_answer_every_time(tmp_path: Path) -> None:
    """Pool workers end by SIGTERM when the pool closes and never write a summary of their
    own; the answer comes from the run's log, so it does not depend on which lived longest.

    The last time the server answers every request with the same response id, as gateways and
    mock servers do: an id is no idempotency key, every answer was billed and counts, so the
    pool still sends 2 requests (not 8)."""
    for attempt in range(3):
        out = tmp_path / f"events{attempt}.jsonl"
        config = RunConfig(max_llm_calls=2, out=str(out))
        repeated = attempt == 2
        outcome, events, requests = run_app(tmp_path, "pool-spawn", config, verbatim_ids=repeated)
        # each time: the limit's exit code and termination, and a reason naming the limit
        # (its wording says whether the worker's own count or the shared ledger refused)
        _check_limit_run(out, "pool-spawn", outcome, events, requests)
        llm = [e for e in events if e["event_type"] == "llm_completion"]
        ids = {e["metadata"]["response_id"] for e in llm if e["metadata"]["status"] != "halt"}
        assert len(ids) == (1 if repeated else 2)  # the premise: one id, or one each


def test_a_relative_ledger_and_out_hold_for_a_worker_in_another_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--ledger budget.db --out events.jsonl`` were read from each process's own folder: a
    worker started in another one opened a second ledger file there (its calls escaped the
    run's cap: 4 sent under --max-llm-calls 2) and found no folder for its events."""
    monkeypatch.chdir(tmp_path)
    config = RunConfig(max_llm_calls=2, ledger="budget.db", out="events.jsonl")
    outcome, events, requests = run_app(tmp_path, "elsewhere", config)
    assert outcome.program_exit_code == 0
    assert requests == 2
    assert [e["metadata"]["status"] for e in events] == ["success", "success", "halt", "halt"]
    assert list(tmp_path.rglob("*.db")) == [tmp_path / "budget.db"]


def test_a_process_that_outlives_the_program_is_waited_for_briefly(tmp_path: Path) -> None:
    """Like multiprocessing's resource tracker: it ends just after the program and still
    leaves its summary, instead of writing into a directory being removed."""
    program = tmp_path / "leaver.py"
    program.write_text(
        "import subprocess, sys\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(0.3)'])\n"
    )
    outcome = run_command([str(program)], RunConfig())
    assert outcome.exit_code == 0
    assert outcome.summary is not None
    assert outcome.summary["processes"] == 2


def test_a_metered_process_that_outlives_the_run_exits_cleanly(tmp_path: Path) -> None:
    """Past the wait, the run reports and removes its directory; the straggler's summary has
    nowhere to go, and it must not end with a traceback."""
    errors, pid_file = tmp_path / "straggler.err", tmp_path / "straggler.pid"
    straggler = tmp_path / "straggler.py"
    straggler.write_text(
        "import os, sys, time, ampmeter\n"
        "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
        "time.sleep(3)\n"
    )
    program = tmp_path / "leaver.py"
    program.write_text(
        "import subprocess, sys\n"
        "err = open(sys.argv[3], 'w')\n"
        "subprocess.Popen([sys.executable, sys.argv[1], sys.argv[2]], stderr=err)\n"
    )
    outcome = run_command([str(program), str(straggler), str(pid_file), str(errors)], RunConfig())
    assert outcome.exit_code == 0
    deadline = time.monotonic() + 60
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    pid = int(pid_file.read_text())
    while Path(f"/proc/{pid}").exists() and "zombie" not in _state(pid):
        assert time.monotonic() < deadline, "the straggler did not end"
        time.sleep(0.05)
    assert "Traceback" not in errors.read_text(), errors.read_text()


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().lower()
    except OSError:
        return "zombie"


def test_forked_child_does_not_inherit_the_parents_spend(tmp_path: Path) -> None:
    """The parent spends 2 of 3 before forking: the child may make one call, not three."""
    program = tmp_path / "forker.py"
    program.write_text(
        "import os, openai, ampmeter\n"
        "client = openai.OpenAI(base_url=os.environ['LLM_URL'], api_key='k', max_retries=0)\n"
        "def call():\n"
        "    client.chat.completions.create(model='gpt-4o-mini', max_tokens=2,\n"
        "        messages=[{'role': 'user', 'content': 'Say yes.'}])\n"
        "call(); call()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    ctx = ampmeter.current_context()\n"
        "    assert ctx.stats.get_counter('amp:llm_calls') == 0, ctx.stats.counters()\n"
        "    made = 0\n"
        "    try:\n"
        "        for _ in range(3):\n"
        "            call(); made += 1\n"
        "    except ampmeter.LimitExceeded:\n"
        "        pass\n"
        "    print('child made', made, flush=True)\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
    )
    out = tmp_path / "events.jsonl"
    with ReplayServer() as server:
        server.script("/v1/chat/completions", *(ReplayResponse.json(COMPLETION) for _ in range(10)))
        env = {**os.environ, "LLM_URL": server.openai_base_url}
        outcome = run_command([str(program)], RunConfig(max_llm_calls=3, out=str(out)), env=env)
        assert len(server.requests) == 3
    # The child caught the stop and exited 0; a limit still stopped a call of the run.
    assert outcome.program_exit_code == 0
    assert outcome.exit_code == EXIT_LIMIT
    assert outcome.summary["llm_calls"] == 4  # 2 + 1 in the child, and its refused one
    assert outcome.summary["processes"] == 2


def test_a_forked_worker_ends_at_sigterm_as_multiprocessing_expects(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The run's top process unwinds at SIGTERM (a call in flight is charged and logged); a
    fork child inherits that handler, and a pool worker terminated while it holds the pool's
    queue lock must not unwind (it would leave the lock held and the run hanging): the child's
    SIGTERM is back at the default, in a process forked from the main thread and from another."""
    program = tmp_path / "forker.py"
    program.write_text(
        "import os, signal, sys, threading, openai\n"
        "print('top', signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, flush=True)\n"
        "def fork():\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        print('child', signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, flush=True)\n"
        "        os._exit(0)\n"
        "    os.waitpid(pid, 0)\n"
        "fork()\n"
        "thread = threading.Thread(target=fork)\n"
        "thread.start(); thread.join()\n"
    )
    outcome = run_command([sys.executable, str(program)], RunConfig(out=str(tmp_path / "e.jsonl")))
    assert outcome.program_exit_code == 0
    printed = [
        line for line in capfd.readouterr().out.splitlines() if line.split()[0] in {"top", "child"}
    ]
    assert printed == ["top False", "child True", "child True"]


def test_run_shares_a_redis_ledger(tmp_path: Path, redis_server: RedisServer) -> None:
    out = tmp_path / "events.jsonl"
    config = RunConfig(max_llm_calls=3, out=str(out), ledger=redis_server.url)
    outcome, events, requests = run_app(tmp_path, "spawn", config)
    assert requests == 3
    assert [e["metadata"]["status"] for e in events].count("success") >= 3
    assert outcome.summary is not None
    assert outcome.summary["processes"] >= 5  # the program, 4 workers (and a resource tracker)


def test_bad_ledger_url_is_refused() -> None:
    with pytest.raises(ValueError, match="redis://"):
        RunConfig(ledger="http://example.com/ledger")


def test_timeout_ends_the_whole_process_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    program = tmp_path / "sleeper.py"
    program.write_text(
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(600)\n"
    )
    # Long enough for a loaded machine to start the program and its child.
    outcome = run_command([str(program)], RunConfig(timeout=10.0, grace=0.5))
    assert outcome.exit_code == EXIT_TIMEOUT
    grandchild = int(pid_file.read_text())
    for _ in range(200):  # the kill is sent; give the kernel a moment to reap it
        if not _alive(grandchild):
            break
        time.sleep(0.05)
    assert not _alive(grandchild)


def test_timeout_stops_the_work_at_its_time(tmp_path: Path) -> None:
    """`--timeout 1` over `sleep 5`: the program gets SIGTERM at 1 s (sleep ends on it), not
    after a hidden grace period."""
    started = time.monotonic()
    outcome = run_command(["sleep", "5"], RunConfig(timeout=1.0))
    elapsed = time.monotonic() - started
    assert outcome.exit_code == EXIT_TIMEOUT
    assert outcome.program_exit_code == -15  # SIGTERM, not the grace period's SIGKILL
    assert outcome.summary["termination"] == "timeout"
    assert outcome.stop_reason == "timeout: stopped at --timeout 1 s"
    assert 1.0 <= elapsed < 2.5, elapsed


def test_a_program_that_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    program = tmp_path / "stubborn.py"
    program.write_text(
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(30)\n"
    )
    started = time.monotonic()
    outcome = run_command([str(program)], RunConfig(timeout=1.5, grace=0.5))
    elapsed = time.monotonic() - started
    assert outcome.exit_code == EXIT_TIMEOUT
    assert outcome.program_exit_code == -9
    assert 2.0 <= elapsed < 4.0, elapsed


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def test_sitecustomize_reaches_grandchildren(tmp_path: Path) -> None:
    program = tmp_path / "nest.py"
    program.write_text(
        "import subprocess, sys\n"
        "code = 'from ampmeter.integrations import is_instrumented; import ampmeter;"
        " assert is_instrumented() and ampmeter.current_context() is not None'\n"
        "subprocess.run([sys.executable, '-c', code], check=True)\n"
    )
    outcome = run_command([sys.executable, str(program)], RunConfig())
    assert outcome.exit_code == 0
    assert outcome.summary is not None and outcome.summary["processes"] == 2
