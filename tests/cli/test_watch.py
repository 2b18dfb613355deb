"""``ampmeter watch``: following logs as they grow, inferring running calls, and the frames it
draws over logs written at the same time by real processes (``ampmeter run`` on the local model,
a program writing with JsonlSink) and, in tmux, as a person sees it live."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ampmeter import ExecutionContext, JsonlSink, LimitExceeded
from ampmeter.cli import app
from ampmeter.cli.watch.follow import LogFollower
from ampmeter.cli.watch.live import watch
from ampmeter.cli.watch.state import WatchState
from ampmeter.local_llm import LocalLLMServer

WAIT_S = 120.0  # generous: the machine is shared; nothing here asserts how long a thing takes


def wait_for(what: str, check: Callable[[], str | None]) -> str:
    """Poll ``check`` until it returns text; fail naming ``what`` after WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last is not None:
            return last
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


def event(
    span: str,
    parent: str | None = None,
    *,
    run: str = "r1",
    status: str = "success",
    kind: str = "llm_completion",
    cost: float = 0.001,
    stop: str | None = None,
    ts: str = "2026-01-22T08:10:00.000Z",
) -> bytes:
    body = {
        "timestamp": ts,
        "run_id": run,
        "span_id": span,
        "event_type": kind,
        "operation": f"op_{span}",
        "component": "pipeline",
        "model": "m",
        "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110},
        "cost_usd": cost,
        "latency_ms": 500,
        "metadata": {"status": status, "stop_reason": stop},
    }
    if parent is not None:
        body["parent_id"] = parent
    return json.dumps(body).encode() + b"\n"


def frame(*args: str) -> str:
    result = CliRunner().invoke(app, ["watch", "--once", *args], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    return result.stdout


def frame_showing(pattern: str, *args: str) -> Callable[[], str | None]:
    """A check for :func:`wait_for`: the ``--once`` frame, once ``pattern`` is in it."""

    def check() -> str | None:
        result = CliRunner().invoke(app, ["watch", "--once", *args], env={"COLUMNS": "160"})
        if result.exit_code == 2 and "no such file" in result.output:  # not created yet
            return None
        assert result.exit_code == 0, result.output
        return result.stdout if re.search(pattern, result.stdout) else None

    return check


def test_a_cut_line_is_kept_and_completed_by_the_next_read(tmp_path: Path) -> None:
    log = tmp_path / "a.jsonl"
    line = event("n000002")
    log.write_bytes(event("n000001") + line[:40])
    follower = LogFollower([log])
    (batch,) = follower.poll()
    assert [r["span_id"] for r in batch.records] == ["n000001"]
    assert follower.pending_bytes == 40 and batch.bad_lines == 0
    assert follower.poll() == []  # nothing new yet
    with log.open("ab") as handle:
        handle.write(line[40:])
    (batch,) = follower.poll()
    assert [r["span_id"] for r in batch.records] == ["n000002"]
    assert follower.pending_bytes == 0 and follower.lines_read(str(log)) == 2


def test_bad_lines_are_counted_and_new_files_under_a_glob_join(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_bytes(event("n000001") + b"{not json\n" + event("n000002"))
    (tmp_path / "c.jsonl.gz").write_bytes(b"\x1f\x8b compressed: not followed")
    follower = LogFollower([str(tmp_path / "*")])
    (batch,) = follower.poll()
    assert len(batch.records) == 2 and follower.bad_lines == 1
    (tmp_path / "b.jsonl").write_bytes(event("n000001", run="r2"))
    (batch,) = follower.poll()
    assert batch.path.endswith("b.jsonl") and batch.records[0]["run_id"] == "r2"
    (tmp_path / "a.jsonl").write_bytes(event("n000009"))  # truncated and rewritten: start over
    (batch,) = follower.poll()
    assert batch.restarted and [r["span_id"] for r in batch.records] == ["n000009"]


def test_state_infers_running_parents_learns_ceilings_and_adds_up(tmp_path: Path) -> None:
    state = WatchState({"amp:llm_calls": 10})
    lines = [
        event("n000003", "n000002"),
        event("n000004", "n000002", kind="tool_call", cost=0),
        event(
            "n000005",
            "n000002",
            status="halt",
            cost=0,
            stop="limit exceeded: amp:cost = 0.0031 > 0.003",
        ),
    ]
    state.add([json.loads(x) for x in lines], "a.jsonl")
    (run,) = state.runs.values()
    assert run.running() == ["n000002"]
    assert run.usage("amp:llm_calls") == 1  # the halted call was never made
    assert run.usage("amp:tool_calls") == 1 and run.usage("amp:cost") == pytest.approx(0.001)
    assert run.usage("amp:input_tokens:m") == 100 and run.usage("amp:unknown") is None
    assert state.ceilings_of(run) == {"amp:cost": 0.003, "amp:llm_calls": 10}
    (stop,) = state.stops()
    assert stop.span_id == "n000005" and "amp:cost" in stop.reason
    state.add([json.loads(event("n000002", kind="cpu_op", cost=0))], "a.jsonl")
    assert run.running() == []
    state.forget("a.jsonl")
    assert state.runs == {}


def test_a_span_seen_twice_counts_once_and_rates_cover_the_last_minute() -> None:
    state = WatchState()
    # 120 LLM calls over two minutes, one a second, $0.001 each; then one line repeated.
    lines = [
        event(f"n{i:06d}", ts=f"2026-01-22T08:{10 + i // 60:02d}:{i % 60:02d}.000Z")
        for i in range(120)
    ]
    state.add([json.loads(x) for x in lines], "a.jsonl")
    state.add([json.loads(lines[-1])], "a.jsonl")
    (run,) = state.runs.values()
    assert run.usage("amp:llm_calls") == 120 and run.usage("amp:cost") == pytest.approx(0.12)
    rates = state.rates()
    assert rates.window_s == 60.0
    assert rates.calls_per_min == 61  # the seconds 08:10:59 to 08:11:59 hold 61 calls
    assert rates.usd_per_min == pytest.approx(0.061)
    assert state.rates(now_ms=rates.window_s * 1000 + 1e15).calls_per_min == 0  # long idle


def test_once_frame_shows_tree_bars_stops_and_a_pending_line(tmp_path: Path) -> None:
    log = tmp_path / "a.jsonl"
    stop = "limit exceeded: amp:llm_calls = 3 > 2"
    halted = event("n000004", status="halt", cost=0, stop=stop)
    log.write_bytes(event("n000003", "n000002") + halted + event("n000005")[:30])
    text = frame(str(log), "--max-cost", "0.004")
    assert "1 file(s), 2 line(s), 30 byte(s) of a line still being written" in text
    # A real tree: the running call's inner call is drawn under it, one level in.
    assert "├─ ● running  n000002, 1 inner call(s) ended" in text
    assert "│  └─ ✓ llm op_n000003" in text
    assert "└─ ■ llm op_n000004  m  stopped: limit exceeded: amp:llm_calls = 3 > 2" in text
    assert re.search(r"amp:cost\s+\$0\.001 .*25% of \$0\.004\b", text), text
    assert re.search(r"amp:llm_calls\s+1 .*50% of 2", text), text  # learned from the stop
    assert "last stops" in text


def test_bad_input_is_one_clear_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["watch", "--once", str(tmp_path / "missing.jsonl")])
    assert result.exit_code == 2 and "no such file" in result.output
    result = CliRunner().invoke(app, ["watch", "--once", "x", "--max-tokens-per-model", "oops"])
    assert result.exit_code == 2 and "MODEL=N" in result.output
    result = CliRunner().invoke(app, ["watch", "--once", str(tmp_path / "old.jsonl.gz")])
    assert result.exit_code == 2 and "compressed" in result.output
    with pytest.raises(ValueError, match="interval"):
        watch([], interval=0)


WRITER = """
import sys, time
from pathlib import Path
from ampmeter import ExecutionContext, JsonlSink
out, gate = sys.argv[1], Path(sys.argv[2])
def wait(name):
    while not (gate / name).exists():
        time.sleep(0.05)
with JsonlSink(out, flush="line") as log:
    with ExecutionContext("worker", sinks=[log]) as ctx:
        with ctx.step("research"):
            with ctx.llm_call("draft", model="gpt-4o-mini") as call:
                call.record(tokens_in=1000, tokens_out=200)
            wait("go")
"""


def test_a_call_still_running_in_another_process_is_shown_running(tmp_path: Path) -> None:
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    log = tmp_path / "w.jsonl"
    proc = subprocess.Popen([sys.executable, str(script), str(log), str(tmp_path)])
    try:
        text = wait_for("the inner call's line", frame_showing("draft", str(log)))
        # Its inner call names the context it ran in; the call itself has not ended yet.
        assert "└─ ● running  n000002, 1 inner call(s) ended" in text, text
        assert "   └─ ✓ llm draft" in text
        assert "1 seen running" in text
        assert "✓ llm draft  gpt-4o-mini  1,000→200 tok" in text
        (tmp_path / "go").touch()
        assert proc.wait(timeout=WAIT_S) == 0
    finally:
        proc.kill()
    text = frame(str(log))
    assert "✓ system research" in text and "● running" not in text
    assert "run worker" in text and "■ ended: success" in text


SLOW = """
import sys, time
from pathlib import Path
from ampmeter import ExecutionContext, JsonlSink
out, gate = sys.argv[1], Path(sys.argv[2])
with JsonlSink(out, flush="line") as log:
    with ExecutionContext("slow_agent", sinks=[log]) as ctx:
        with ctx.llm_call("quick", model="gpt-4o-mini") as call:
            call.record(tokens_in=10, tokens_out=2)
        with ctx.llm_call("slow", model="gpt-4o-mini") as call:  # in flight, nothing logged
            while not (gate / "go").exists():
                time.sleep(0.05)
            call.record(tokens_in=10, tokens_out=2)
"""


def test_a_run_whose_call_is_in_flight_is_running_until_its_process_ends(
    tmp_path: Path,
) -> None:
    """Issue 39: a call slower than the quiet time logs nothing while in flight; the run is
    shown running while its process is alive, and ended only once the process has ended."""
    script = tmp_path / "slow.py"
    script.write_text(SLOW)
    log = tmp_path / "s.jsonl"
    proc = subprocess.Popen([sys.executable, str(script), str(log), str(tmp_path)])
    try:
        text = wait_for("the first call's line", frame_showing("quick", str(log)))
        assert "run slow_agent" in text
        assert "● running (its process is alive" in text, text
        assert "1 run(s), 1 going" in text and "■ ended" not in text
        # Live, long after the last line (the old rule said "ended" after 5 quiet seconds).
        state = WatchState()
        state.add(LogFollower([log]).poll()[0].records, str(log), arrived_ms=0.0)
        run = next(iter(state.runs.values()))
        assert run.ending(now_ms=time.time() * 1000.0) is None
        assert run.liveness() == "alive"
        (tmp_path / "go").touch()
        assert proc.wait(timeout=WAIT_S) == 0
    finally:
        proc.kill()
    text = frame(str(log))
    assert "run slow_agent" in text and "■ ended: success" in text


def test_a_log_naming_no_process_is_never_called_ended(tmp_path: Path) -> None:
    """Another producer's log names no process: the view says how long it has been quiet."""
    log = tmp_path / "other.jsonl"
    log.write_bytes(event("n000002"))
    text = frame(str(log))
    assert re.search(r"no new line for \d+ s", text), text
    assert "■ ended" not in text


RESEARCH = """
import contextlib, sys
from ampmeter import ExecutionContext, JsonlSink, LimitExceeded, Limit
with JsonlSink(sys.argv[1]) as sink:
    for run in ("run-a", "run-b"):
        root = ExecutionContext("research_run", max_cost_usd=0.0004, sinks=[sink], chain_id=run)
        with root:
            for i in range(6):
                child = root.spawn_child(f"researcher-{i}", limits=[Limit("amp:llm_calls", 2)])
                with contextlib.suppress(LimitExceeded), child:
                    for j in range(3):
                        with child.llm_call(f"ask-{j}", model="m", estimate_usd=0.00001) as call:
                            call.record(tokens_in=100, tokens_out=10, cost_usd=0.00001)
"""


def test_runs_are_named_by_their_root_and_limits_stay_with_who_set_them(tmp_path: Path) -> None:
    """Issue 39: six sub-agents each stopped by their own cap of 2 LLM calls, under a root
    capped at $0.0004. The run is the root's, its own cap comes first, each sub-agent's cap is
    its own, and their stops are not the run's end."""
    log = tmp_path / "research.jsonl"
    subprocess.run([sys.executable, "-c", RESEARCH, str(log)], check=True, timeout=WAIT_S)
    text = frame(str(log))
    # Two runs with one name: each is told apart by its id.
    assert "run research_run (run-a)" in text and "run research_run (run-b)" in text, text
    assert "researcher-0  " not in text.split("\n")[4]  # the title is not a sub-agent's
    own = re.search(r"amp:cost\s+\$0\.00012 .*30% of \$0\.0004\b", text)
    sub = re.search(r"researcher-\d amp:llm_calls\s+2 .*100% of 2  ■ stopped", text)
    assert own and sub and own.start() < sub.start(), text
    assert "600%" not in text and "of 2\n" not in text.split("researcher")[0]
    assert text.count("■ ended: success") == 2 and "stopped by a limit" not in text
    # Refused calls are not LLM calls sent.
    assert text.count("calls 12 LLM call(s) sent, 6 refused before sending") == 2


LOOP = """
import os, sys, time, openai
from pathlib import Path
client = openai.OpenAI(base_url=os.environ["LLM_URL"], api_key="k", max_retries=0)
for i in range(100):
    client.chat.completions.create(model=os.environ["LLM_MODEL"], max_tokens=2,
        messages=[{"role": "user", "content": "Say yes. " * (i + 1)}])
    while not Path(sys.argv[1], f"go{i}").exists():
        time.sleep(0.05)
"""


def test_frames_follow_a_real_ampmeter_run_until_its_limit_stops_it(
    tmp_path: Path, llm_server: LocalLLMServer
) -> None:
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    log = tmp_path / "run.jsonl"
    env = {**os.environ, "LLM_URL": llm_server.base_url, "LLM_MODEL": llm_server.model}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ampmeter",
            "run",
            "--max-llm-calls",
            "3",
            "--out",
            str(log),
            "--",
            sys.executable,
            str(script),
            str(tmp_path),
        ],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for calls in (1, 2, 3):
            # The watcher sees each call while the run waits before its next one.
            pattern = rf"amp:llm_calls\s+{calls} .*{round(calls / 3 * 100)}% of 3"
            # While the run lasts each process logs under <out>.parts/ (merged at the end).
            text = wait_for(
                f"{calls} call(s) in the frame",
                frame_showing(pattern, f"{log}.parts/*.jsonl", "--max-llm-calls", "3"),
            )
            assert "unpriced" in text  # the local model has no price: not shown as $0
            (tmp_path / f"go{calls - 1}").touch()
        _, stderr = proc.communicate(timeout=WAIT_S)
        assert proc.returncode == 3, stderr
    finally:
        proc.kill()
    assert not Path(f"{log}.parts").exists()  # merged into the log and removed
    text = frame(str(log), "--max-llm-calls", "3")
    assert "stopped: limit exceeded: amp:llm_calls = 4 > 3" in text
    assert re.search(r"amp:llm_calls\s+3 .*100% of 3", text), text
    assert text.count("✓ llm ") == 3 and "■ ended: stopped by a limit" in text


@pytest.fixture
def tmux() -> Iterator[str]:
    if shutil.which("tmux") is None:
        if os.environ.get("CI"):
            pytest.fail("tmux is missing: scripts/system-deps.sh installs it")
        pytest.skip("tmux is not installed (scripts/system-deps.sh installs it)")
    session = f"ampmeter-watch-{os.getpid()}"
    yield session
    subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)


def test_live_view_in_a_real_terminal(tmp_path: Path, tmux: str) -> None:
    command = (
        f"{sys.executable} -m ampmeter watch --interval 0.2 --max-cost 0.01 '{tmp_path}/*.jsonl'"
    )
    subprocess.run(
        ["tmux", "new-session", "-d", "-s", tmux, "-x", "150", "-y", "45", command],
        check=True,
        env={**os.environ, "TERM": "xterm-256color"},
    )

    def screen(needle: str) -> Callable[[], str | None]:
        def check() -> str | None:
            shown = subprocess.run(
                ["tmux", "capture-pane", "-p", "-t", tmux], capture_output=True, text=True
            ).stdout
            return shown if needle in shown else None

        return check

    wait_for("the empty view", screen("waiting for"))
    log = tmp_path / "live.jsonl"
    with (
        JsonlSink(log, flush="line", run_id="live-run") as sink,
        ExecutionContext("agent", max_cost_usd=0.0025, sinks=[sink]) as ctx,
    ):
        with ctx.llm_call("plan", model="gpt-4o-mini", max_tokens=500) as call:
            call.record(tokens_in=10_000, tokens_out=500)
        shown = wait_for("the first call", screen("llm plan"))
        # The ceiling the run set itself (the log says it) wins over the --max-cost guess.
        assert "run agent  live-run" in shown and "amp:cost" in shown and "of $0.0025" in shown
        with pytest.raises(LimitExceeded):
            for _ in range(5):
                with ctx.llm_call("act", model="gpt-4o-mini", max_tokens=500) as call:
                    call.record(tokens_in=10_000, tokens_out=500)
    wait_for("the stop", screen("last stops"))
    with log.open("ab") as handle:  # a line cut in two writes is shown once it is whole
        line = event("n000099", run="live-run", cost=0.0)
        handle.write(line[:50])
        handle.flush()
        wait_for("the pending bytes", screen("still being written"))
        handle.write(line[50:])
    wait_for("the completed line", screen("op_n000099"))
    # The view redraws in place: one frame's worth of lines, not a scrolling log.
    shown = screen("ampmeter watch")() or ""
    assert shown.count("ampmeter watch") == 1
