"""Hand-off across real processes: budgets through the ledger's scopes, logs as one tree."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ampmeter import ExecutionContext, HandoffError, Limit, propagation
from ampmeter.analysis import summarize
from ampmeter.cli import app
from ampmeter.ledgers import InMemoryLedger, RedisLedger, SqliteLedger
from ampmeter.sinks.jsonl import JsonlSink
from support.redis_server import RedisServer, redis_server_fixture  # noqa: F401

COST = 0.125  # exact in binary: sums of it compare exactly with the ceilings

CHILD = """
import json, os
from ampmeter import ExecutionContext, LimitExceeded
from ampmeter.sinks.jsonl import JsonlSink

ledger = None
if os.environ.get("LEDGER_URL"):
    from ampmeter.ledgers import RedisLedger
    ledger = RedisLedger(os.environ["LEDGER_URL"], os.environ["LEDGER_SCOPE"])
sink = JsonlSink(os.environ["LOG"], flush="line")
made, stop = 0, None
with ExecutionContext.from_handoff(os.environ["AMPMETER_HANDOFF"], ledger=ledger,
                                   sinks=[sink]) as ctx:
    try:
        for _ in range(50):
            with ctx.llm_call("work", model="m", estimate_usd=COST) as call:
                call.record(10, 5, cost_usd=COST)
            made += 1
    except LimitExceeded as exc:
        stop = str(exc)
sink.close()
print(json.dumps({"made": made, "stop": stop}))
""".replace("COST", repr(COST))


def run_child(token: str, log: Path, **env: str) -> dict[str, Any]:
    full = {**os.environ, "AMPMETER_HANDOFF": token, "LOG": str(log), **env}
    done = subprocess.run(
        [sys.executable, "-c", CHILD], env=full, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def spend(ctx: ExecutionContext, calls: int) -> None:
    for _ in range(calls):
        with ctx.llm_call("own", model="m", estimate_usd=COST) as call:
            call.record(10, 5, cost_usd=COST)


def events(*paths: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for path in paths for line in path.read_text().splitlines()]


@pytest.fixture(autouse=True)
def handoff_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parent and children share a signing key, as under ``ampmeter run``."""
    monkeypatch.setenv("AMPMETER_HANDOFF_KEY", "test-handoff-key")


@pytest.fixture
def sqlite_ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SqliteLedger]:
    path = tmp_path / "budget.sqlite3"
    monkeypatch.setenv("AMPMETER_LEDGER_ALLOW", str(path))  # children may open it from a token
    ledger = SqliteLedger(path, "team")
    yield ledger
    ledger.close()


def test_child_is_stopped_by_its_own_cap_and_counts_in_the_parent(
    tmp_path: Path, sqlite_ledger: SqliteLedger
) -> None:
    parent_log, child_log = tmp_path / "parent.jsonl", tmp_path / "child.jsonl"
    sink = JsonlSink(parent_log)
    with ExecutionContext("boss", max_cost_usd=1.0, ledger=sqlite_ledger, sinks=[sink]) as ctx:
        spend(ctx, 2)
        token = ctx.handoff("researcher", limits=[Limit("amp:llm_calls", 3)])
        result = run_child(token, child_log)
        assert result["made"] == 3
        assert "amp:llm_calls" in result["stop"]
    sink.close()
    # The parent's totals hold the child's three calls, once.
    assert ctx.stats.total_cost() == pytest.approx(5 * COST)
    counters = ctx.snapshot()["counters"]
    assert counters["amp:llm_calls"] == 5
    assert counters["amp:input_tokens"] == 50
    assert sqlite_ledger.spent()["amp:cost"] == pytest.approx(5 * COST)
    # Both logs read as one run and one tree: unique span ids, every parent known.
    logged = events(parent_log, child_log)
    spans = [e["span_id"] for e in logged]
    assert len(spans) == len(set(spans))
    assert {e["run_id"] for e in logged} == {ctx.chain_id}
    known = set(spans)
    assert all(e.get("parent_id") in known for e in logged if "parent_id" in e)
    handoff = next(e for e in logged if e["operation"] == "researcher")
    child_root = next(e for e in logged if e.get("parent_id") == handoff["span_id"])
    child_calls = [e for e in logged if e.get("parent_id") == child_root["span_id"]]
    assert len(child_calls) == 4  # three made, the fourth halted before it ran
    assert handoff["cost_usd"] == 0.0  # the child's own events carry its cost
    table = summarize([parent_log, child_log])
    (run,) = table.runs
    assert run.cost_usd == pytest.approx(5 * COST)
    assert run.llm_calls == 2 + 4
    assert run.max_depth == 3


def test_child_is_stopped_by_the_parents_remaining_budget(
    tmp_path: Path, sqlite_ledger: SqliteLedger
) -> None:
    with ExecutionContext("boss", max_cost_usd=1.0, ledger=sqlite_ledger) as ctx:
        spend(ctx, 6)  # 0.75 of 1.00 spent: two more calls fit
        token = ctx.handoff("researcher", max_cost_usd=5.0)
        result = run_child(token, tmp_path / "child.jsonl")
    assert result["made"] == 2
    assert "shared budget 'team'" in result["stop"] and "amp:cost" in result["stop"]
    assert ctx.stats.total_cost() == pytest.approx(1.0)
    assert sqlite_ledger.spent()["amp:cost"] == pytest.approx(1.0)


def test_a_parents_soft_and_windowed_limits_do_not_stop_its_child(
    sqlite_ledger: SqliteLedger,
) -> None:
    """Only the parent's hard ceilings travel in the token: its soft limit (a signal to wrap
    up) and its window are its own policies, so a child may spend past them up to the cap."""
    limits = [
        Limit("amp:cost", 0.1, soft=True),
        Limit("amp:llm_calls", 1, window_s=60),
    ]
    with ExecutionContext("boss", max_cost_usd=1.0, limits=limits, ledger=sqlite_ledger) as ctx:
        child = ExecutionContext.from_handoff(ctx.handoff("researcher"))
        with child:
            spend(child, 3)  # 0.375: past the soft 0.1 and three calls in one minute
        assert child.stats.total_cost() == pytest.approx(3 * COST)
    assert ctx.stats.total_cost() == pytest.approx(3 * COST)


def test_nested_handoff_counts_toward_every_ancestor(
    tmp_path: Path, sqlite_ledger: SqliteLedger
) -> None:
    """A grandchild handed off by a handed-off child stops at the grandparent's ceiling."""
    with ExecutionContext("boss", max_cost_usd=0.5, ledger=sqlite_ledger) as ctx:
        token = ctx.handoff("middle", max_cost_usd=10.0)
        with ExecutionContext.from_handoff(token) as middle:
            spend(middle, 1)
            inner = middle.handoff("leaf")
            result = run_child(inner, tmp_path / "leaf.jsonl")
            assert result["made"] == 3  # 0.125 + 3 x 0.125 = 0.5
        assert middle.stats.total_cost() == pytest.approx(0.5)
    assert ctx.stats.total_cost() == pytest.approx(0.5)
    assert ctx.snapshot()["counters"]["amp:llm_calls"] == 4


def test_cli_summary_and_report_read_parent_and_child_as_one_run(
    tmp_path: Path, sqlite_ledger: SqliteLedger
) -> None:
    parent_log, child_log = tmp_path / "parent.jsonl", tmp_path / "child.jsonl"
    sink = JsonlSink(parent_log)
    with ExecutionContext("boss", ledger=sqlite_ledger, sinks=[sink]) as ctx:
        spend(ctx, 1)
        run_child(ctx.handoff("worker", limits=[Limit("amp:llm_calls", 2)]), child_log)
    sink.close()
    runner = CliRunner()
    result = runner.invoke(app, ["summary", str(parent_log), str(child_log)])
    assert result.exit_code == 0, result.output
    assert "1 run(s)" in result.output
    report = tmp_path / "report.html"
    result = runner.invoke(app, ["report", str(parent_log), str(child_log), "-o", str(report)])
    assert result.exit_code == 0, result.output
    html = report.read_text()
    assert ctx.chain_id in html


def test_handoff_through_redis_keeps_the_password_out_of_the_token(tmp_path: Path) -> None:
    with RedisServer(extra=("--requirepass", "s3cret-pw")) as server:
        url = f"redis://:s3cret-pw@127.0.0.1:{server.port}/0"
        ledger = RedisLedger(url, "tenant", lease_s=30.0)
        try:
            with ExecutionContext("boss", max_cost_usd=0.5, ledger=ledger) as ctx:
                token = ctx.handoff("researcher", max_cost_usd=5.0)
                decoded = propagation.decode(token)
                assert "s3cret-pw" not in json.dumps(dict(decoded.ledger))
                assert "s3cret" not in token and "s3cret" not in str(decoded)
                with pytest.raises(HandoffError, match="needs credentials"):
                    ExecutionContext.from_handoff(token)
                result = run_child(
                    token, tmp_path / "child.jsonl", LEDGER_URL=url, LEDGER_SCOPE="tenant"
                )
            assert result["made"] == 4
            assert ctx.stats.total_cost() == pytest.approx(0.5)
        finally:
            ledger.close()


def test_handoff_through_redis_without_credentials_opens_the_ledger_itself(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    ledger = RedisLedger(redis_server.url, "plain-tenant")
    try:
        with ExecutionContext("boss", ledger=ledger) as ctx:
            spend(ctx, 1)
            token = ctx.handoff("researcher", limits=[Limit("amp:llm_calls", 2)])
            assert propagation.decode(token).ledger["url"] == redis_server.url
            allow = {"AMPMETER_LEDGER_ALLOW": redis_server.url}
            result = run_child(token, tmp_path / "child.jsonl", **allow)
        assert result["made"] == 2
        assert ctx.snapshot()["counters"]["amp:llm_calls"] == 3
    finally:
        ledger.close()


def test_env_token_attaches_an_instrumented_process_by_itself(
    tmp_path: Path, sqlite_ledger: SqliteLedger
) -> None:
    """A process with AMPMETER_HANDOFF and no context of its own is metered by the token."""
    from ampmeter.testing.replay import ReplayResponse, ReplayServer

    completion = {
        "id": "c1",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-4o-mini",
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": "yes"},
            }
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10},
    }
    program = (
        "import os, openai\n"
        "from ampmeter.integrations import instrument\n"
        "instrument()\n"
        "client = openai.OpenAI(base_url=os.environ['LLM_URL'], api_key='k', max_retries=0)\n"
        "made = 0\n"
        "try:\n"
        "    for _ in range(10):\n"
        "        client.chat.completions.create(model='gpt-4o-mini', max_tokens=4,\n"
        "            messages=[{'role': 'user', 'content': 'Say yes.'}])\n"
        "        made += 1\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__)\n"
        "print(made)\n"
    )
    log = tmp_path / "child.jsonl"
    with ReplayServer() as server:
        server.script("/v1/chat/completions", *(ReplayResponse.json(completion) for _ in range(10)))
        with ExecutionContext("boss", ledger=sqlite_ledger) as ctx:
            token = ctx.handoff("auto", limits=[Limit("amp:llm_calls", 3)])
            env = {
                **os.environ,
                propagation.HANDOFF_ENV: token,
                propagation.HANDOFF_LOG_ENV: str(log),
                "LLM_URL": server.openai_base_url,
            }
            done = subprocess.run(
                [sys.executable, "-c", program],
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 0, done.stderr
            assert done.stdout.split() == ["LimitExceeded", "3"]
        assert len(server.requests) == 3
    assert ctx.snapshot()["counters"]["amp:llm_calls"] == 3
    logged = events(log)
    assert {e["run_id"] for e in logged} == {ctx.chain_id}
    assert [e["metadata"]["status"] for e in logged if e["event_type"] == "llm_completion"] == [
        "success",
        "success",
        "success",
        "halt",
    ]


def test_http_header_carries_the_token_to_a_service(sqlite_ledger: SqliteLedger) -> None:
    """inject() on the client side, extract() in a real HTTP handler that attaches to it."""
    made: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            token = propagation.extract(self.headers)
            assert token is not None
            count = 0
            with ExecutionContext.from_handoff(token) as child:
                try:
                    while True:
                        spend(child, 1)
                        count += 1
                except Exception:
                    pass
            made.append(count)
            self.send_response(204)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        import urllib.request

        with ExecutionContext("boss", ledger=sqlite_ledger) as ctx:
            headers: dict[str, str] = {}
            propagation.inject(headers, ctx.handoff("remote", max_steps=2))
            assert list(headers) == ["ampmeter-handoff"]
            request = urllib.request.Request(
                f"http://127.0.0.1:{server.server_port}/", data=b"", headers=headers
            )
            with urllib.request.urlopen(request, timeout=60) as response:
                assert response.status == 204
        assert made == [2]
        assert ctx.snapshot()["counters"]["amp:llm_calls"] == 2
    finally:
        server.shutdown()
        server.server_close()


def test_extract_without_or_with_a_damaged_header() -> None:
    assert propagation.extract({"content-type": "text/plain"}) is None
    with pytest.raises(HandoffError, match="signature is missing"):
        propagation.extract({"Ampmeter-Handoff": "amp2.@@@"})
    with pytest.raises(HandoffError, match="not an ampmeter hand-off token"):
        propagation.extract({"AMPMETER-HANDOFF": "bearer xyz"})
    with pytest.raises(HandoffError, match="unsigned"):
        propagation.extract({"ampmeter-handoff": "amp1.e30"})  # the old, unsigned form
    with pytest.raises(HandoffError, match="damaged"):
        propagation.inject({}, "amp2.e30.AAAA")  # "{}": no fields


def test_handoff_needs_a_shared_ledger(tmp_path: Path) -> None:
    with ExecutionContext("boss") as ctx:
        with pytest.raises(HandoffError, match="needs a shared ledger"):
            ctx.handoff("worker")
        assert len(ctx.graph) == 1  # nothing half-made
    with ExecutionContext("boss", ledger=InMemoryLedger("x")) as ctx:
        with pytest.raises(HandoffError, match="cannot be shared with another"):
            ctx.handoff("worker")
        assert len(ctx.graph) == 1


def test_from_handoff_refuses_a_ledger_outside_its_scope(sqlite_ledger: SqliteLedger) -> None:
    with ExecutionContext("boss", ledger=sqlite_ledger) as ctx:
        token = ctx.handoff("worker")
        other = SqliteLedger(sqlite_ledger.path, "elsewhere")
        try:
            with pytest.raises(HandoffError, match="does not enclose"):
                ExecutionContext.from_handoff(token, ledger=other)
        finally:
            other.close()
        with pytest.raises(HandoffError, match="not an ampmeter hand-off token"):
            ExecutionContext.from_handoff("hello")


def test_unpriced_child_calls_stay_unpriced_in_the_parent(sqlite_ledger: SqliteLedger) -> None:
    with ExecutionContext("boss", ledger=sqlite_ledger) as ctx:
        child = ExecutionContext.from_handoff(ctx.handoff("local-child"))
        with child, child.llm_call("mystery", model="no-such-model-anywhere") as call:
            call.record(7, 3)  # no cost given and no price known
        assert child.stats.get_counter("amp:unpriced_llm_calls") == 1
    counters = ctx.snapshot()["counters"]
    assert counters["amp:unpriced_llm_calls"] == 1
    assert counters["amp:input_tokens"] == 7


# -- a child that outlives its parent; retries through the hand-off ---------------------------


def test_a_child_spending_after_its_parent_closed_reaches_its_totals(
    tmp_path: Path, sqlite_ledger: SqliteLedger
) -> None:
    parent_log, child_log = tmp_path / "parent.jsonl", tmp_path / "child.jsonl"
    sink = JsonlSink(parent_log)
    with ExecutionContext("boss", max_cost_usd=1.0, ledger=sqlite_ledger, sinks=[sink]) as ctx:
        spend(ctx, 1)
        token = ctx.handoff("background", limits=[Limit("amp:llm_calls", 3)])
    sink.close()
    assert ctx.stats.total_cost() == COST  # closed before the child ran
    result = run_child(token, child_log)  # a background worker, after the parent closed
    assert result["made"] == 3
    counters = ctx.snapshot()["counters"]  # reads the hand-off's spend again
    assert counters["amp:llm_calls"] == 4
    assert ctx.stats.total_cost() == 4 * COST
    assert ctx.refresh_handoffs() == {}  # counted once
    assert ctx.stats.total_cost() == 4 * COST
    # The logs carry it too: the child's own events hang under the hand-off node.
    (run,) = summarize([parent_log, child_log]).runs
    assert run.cost_usd == 4 * COST


def test_an_open_parents_snapshot_shows_a_running_childs_spend(
    tmp_path: Path, sqlite_ledger: SqliteLedger
) -> None:
    with ExecutionContext("boss", max_cost_usd=1.0, ledger=sqlite_ledger) as ctx:
        token = ctx.handoff("worker", limits=[Limit("amp:llm_calls", 2)])
        run_child(token, tmp_path / "child.jsonl")
        assert ctx.snapshot()["counters"]["amp:llm_calls"] == 2  # before the parent closes
    assert ctx.stats.total_cost() == 2 * COST  # and closing adds nothing twice
    assert ctx.snapshot()["counters"]["amp:llm_calls"] == 2


RETRYING_CHILD = """
import os
from ampmeter import ExecutionContext

with ExecutionContext.from_handoff(os.environ["AMPMETER_HANDOFF"]) as ctx:
    for _ in range(2):
        with ctx.llm_call("flaky", estimate_usd=0.125) as call:
            call.retry()
            call.retry()
            call.record(10, 5, cost_usd=0.125)
    print(ctx.stats.counters()["amp:retries"])
"""


def test_a_childs_retries_roll_up_to_the_parent(sqlite_ledger: SqliteLedger) -> None:
    with ExecutionContext("boss", max_retries=10, ledger=sqlite_ledger) as ctx:
        parent_retries = ctx.llm_call("own", estimate_usd=0.125)
        with parent_retries as call:
            call.retry()
            call.record(1, 1, cost_usd=0.0)
        token = ctx.handoff("worker")
        done = subprocess.run(
            [sys.executable, "-c", RETRYING_CHILD],
            env={**os.environ, "AMPMETER_HANDOFF": token},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "4"
    assert ctx.stats.counters()["amp:retries"] == 1 + 4
    assert sqlite_ledger.spent()["amp:retries"] == 1 + 4  # the parent's shared ceiling saw them


@pytest.mark.parametrize("backend", ["sqlite", "redis"])
def test_a_ceiling_raised_over_a_parent_without_limits_stops_its_child(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    from ampmeter import LimitExceeded, find_limit_exceeded
    from ampmeter.ledgers import Ledger

    root = f"team-{os.urandom(4).hex()}"
    opened: list[Ledger] = []
    for _ in range(2):  # the run's ledger, and the operator's own connection
        if backend == "sqlite":
            opened.append(SqliteLedger(tmp_path / "budget.sqlite3", root))
        else:
            server: RedisServer = request.getfixturevalue("redis_server")
            opened.append(RedisLedger(server.url, root, timeout_s=5.0))
    ledger, operator = opened
    try:
        with ExecutionContext("boss", ledger=ledger) as boss:  # a ledger, and no limits
            token = boss.handoff("researcher")
            with ExecutionContext.from_handoff(token, ledger=ledger) as child:
                spend(child, 1)
                operator.set_ceiling(root, "amp:cost", COST * 1.5)  # ampmeter budget raise
                with pytest.raises(LimitExceeded) as caught:
                    spend(child, 1)
        assert find_limit_exceeded(caught.value) is caught.value
        assert f"shared budget {root!r}: limit exceeded: amp:cost = $0.25 > $0.1875" in str(
            caught.value
        )
        assert float(ledger.spent()["amp:cost"]) == COST
    finally:
        for each in opened:
            each.close()
