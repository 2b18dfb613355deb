"""Unsettled spend, end to end: a worker SIGKILLed mid-call on a shared ledger (SQLite, a real
Redis) leaves a hold that its lease ends; the surviving context charges it (or, with
``on_expired_hold="release"``, returns it) and shows the charge in its stats, its graph, its
JSONL log, ``ampmeter summary``, the HTML report and ``ampmeter watch``."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ampmeter import ExecutionContext, HandoffError, JsonlSink, Limit, propagation
from ampmeter.analysis import summarize
from ampmeter.cli import app
from ampmeter.keys import KEY_COST, KEY_LLM_CALLS, KEY_TOOL_CALLS, KEY_UNSETTLED_COST
from ampmeter.ledgers import Ledger, RedisLedger, SqliteLedger
from ampmeter.logs import event_problem, validate_event
from ampmeter.report import write_report
from support.redis_server import RedisServer, redis_server_fixture  # noqa: F401

FORK = multiprocessing.get_context("fork")
Opener = Callable[..., Ledger]
SETTLED = Decimal("0.01")  # what the worker spends and settles before it hangs
HELD = Decimal("0.06")  # the hold of the call it is killed in


@pytest.fixture(autouse=True)
def handoff_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AMPMETER_HANDOFF_KEY", "test-unsettled-key")


@pytest.fixture(params=["sqlite", "redis"])
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    """Opens ledgers (in any process) on one shared SQLite file or real Redis server."""
    if request.param == "sqlite":

        def open_sqlite(scope: str, **options: Any) -> Ledger:
            journal = tmp_path / f"journal-{os.getpid()}"
            return SqliteLedger(tmp_path / "ledger.db", scope, journal=journal, **options)

        yield open_sqlite
    else:
        server: RedisServer = request.getfixturevalue("redis_server")

        def open_redis(scope: str, **options: Any) -> Ledger:
            journal = tmp_path / f"journal-{os.getpid()}"
            return RedisLedger(server.url, scope, timeout_s=10.0, journal=journal, **options)

        yield open_redis


def _handed_off_worker(
    opener: Opener, scope: str, token: str, log: str, ready: Any, go: Any
) -> None:
    """A hand-off child: one settled call, then a call it is killed in (or paused and let go)."""
    sink = JsonlSink(log, flush="line")
    ctx = ExecutionContext.from_handoff(token, ledger=opener(scope, lease_s=1.0), sinks=[sink])
    with ctx.llm_call("done", model="m", estimate_usd=SETTLED) as call:
        call.record(10, 5, cost_usd=SETTLED)
    with ctx.llm_call("hangs", model="m", estimate_usd=HELD) as call:
        ready.put(True)
        actual = go.get(timeout=600)  # killed here; or paused, then told to finish
        call.record(10, 5, cost_usd=Decimal(actual))
    ctx.close()
    sink.close()
    os._exit(0)


def _wait_for_expiry(ledger: Ledger) -> None:
    deadline = time.monotonic() + 60
    while ledger.reserved() and time.monotonic() < deadline:
        time.sleep(0.1)  # a read ends holds whose lease ran out
    assert ledger.reserved() == {}


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _unsettled_events(*paths: Path) -> list[dict[str, Any]]:
    found = [e for p in paths for e in _events(p)]
    return [e for e in found if e["metadata"].get("cost_status") == "unsettled"]


def _kill_a_handed_off_worker(
    opener: Opener, tmp_path: Path, rule: str, limits: list[Limit] | None = None
) -> tuple[ExecutionContext, Ledger, Path, Path]:
    scope = f"team-{uuid.uuid4().hex[:8]}"
    ledger = opener(scope)
    parent_log, child_log = tmp_path / "parent.jsonl", tmp_path / "child.jsonl"
    sink = JsonlSink(parent_log)
    ctx = ExecutionContext("boss", ledger=ledger, sinks=[sink], on_expired_hold=rule, limits=limits)
    token = ctx.handoff("worker", max_cost_usd=1.0)
    ready, go = FORK.Queue(), FORK.Queue()
    args = (opener, scope, token, str(child_log), ready, go)
    process = FORK.Process(target=_handed_off_worker, args=args)
    process.start()
    assert ready.get(timeout=60) is True and process.pid is not None
    os.kill(process.pid, signal.SIGKILL)
    process.join(timeout=30)
    _wait_for_expiry(ledger)
    ctx.close()
    sink.close()
    return ctx, ledger, parent_log, child_log


def test_a_killed_childs_hold_is_charged_and_shown_everywhere(
    opener: Opener, tmp_path: Path
) -> None:
    ctx, ledger, parent_log, child_log = _kill_a_handed_off_worker(opener, tmp_path, "charge")
    try:
        assert ledger.unsettled()[KEY_COST] == HELD
        assert ledger.spent()[KEY_COST] == SETTLED + HELD
        # the parent's stats: the charge in amp:cost and on its own key, exact Decimal
        assert ctx.stats.get_gauge(KEY_UNSETTLED_COST) == HELD
        assert ctx.stats.get_gauge(KEY_COST) == SETTLED + HELD
        assert ctx.stats.get_counter(KEY_LLM_CALLS) == 2
        assert ctx.graph.aggregates()["total_cost_usd"] == SETTLED + HELD
        # its own node under the hand-off node, and one valid line in the parent's log
        (line,) = _unsettled_events(parent_log, child_log)
        validate_event(line)
        assert event_problem(line) is None
        assert line["cost_usd"] == float(HELD) and line["model"] == "m"
        assert line["metadata"]["status"] == "fail"
        assert line["metadata"]["error_class"] == "UnsettledHold"
        handoff = next(e for e in _events(parent_log) if e["operation"] == "worker")
        assert line["parent_id"] == handoff["span_id"]
        # analysis, summary, report and watch each show it as its own figure
        assert line["event_type"] == "llm_completion"
        (run,) = summarize([parent_log, child_log], engine="python").runs
        assert run.unsettled_cost_usd == pytest.approx(float(HELD))
        assert run.cost_usd == pytest.approx(float(SETTLED + HELD))
        assert summarize([parent_log, child_log], engine="duckdb").runs == [run]
        runner = CliRunner()
        wide = ["summary", "--wide", str(parent_log), str(child_log)]
        out = runner.invoke(app, wide, env={"COLUMNS": "250"})
        assert out.exit_code == 0, out.output
        assert "unsettled" in out.output and "0.06" in out.output
        report = write_report([parent_log, child_log], tmp_path / "report.html")
        html = Path(report).read_text()
        assert '<b class="unsettled">$0.06</b> unsettled' in html
        assert '<span class="badge unsettled">$0.06 unsettled</span>' in html
        watched = runner.invoke(
            app, ["watch", "--once", str(parent_log), str(child_log)], env={"COLUMNS": "160"}
        )
        assert watched.exit_code == 0, watched.output
        assert "unsettled" in watched.stdout and "$0.06" in watched.stdout
        assert "UnsettledHold" in watched.stdout
        # read again: the hold is recorded once
        ctx.snapshot()
        assert ctx.stats.get_gauge(KEY_UNSETTLED_COST) == HELD
        assert len(_unsettled_events(parent_log)) == 1
        assert [n.name for n in ctx.graph.nodes()].count("unsettled hold") == 1
    finally:
        ledger.close()


def test_a_killed_llm_call_under_a_tool_call_limit_stays_an_llm_call(
    opener: Opener, tmp_path: Path
) -> None:
    # An exact tool-call limit makes every hold carry the tool-call key, at 0 for an LLM call:
    # the dead call's node must still be an LLM call of its model, not a tool call.
    limits = [Limit(KEY_TOOL_CALLS, 5)]
    ctx, ledger, parent_log, child_log = _kill_a_handed_off_worker(
        opener, tmp_path, "charge", limits
    )
    try:
        assert ledger.unsettled()[KEY_COST] == HELD
        (line,) = _unsettled_events(parent_log, child_log)
        assert line["event_type"] == "llm_completion" and line["model"] == "m"
        assert line["cost_usd"] == float(HELD)
        assert ctx.stats.get_counter(KEY_LLM_CALLS) == 2
        assert ctx.stats.get_counter(KEY_TOOL_CALLS) == 0
    finally:
        ledger.close()


def test_release_returns_a_killed_childs_hold_and_shows_none(
    opener: Opener, tmp_path: Path
) -> None:
    """The parent's rule reaches the child's holds (the ledger's default charges)."""
    ctx, ledger, parent_log, child_log = _kill_a_handed_off_worker(opener, tmp_path, "release")
    try:
        assert ledger.on_expired_hold == "charge"
        assert ledger.unsettled() == {}
        assert ledger.spent()[KEY_COST] == SETTLED
        assert KEY_UNSETTLED_COST not in ctx.stats.gauges()
        assert ctx.stats.get_gauge(KEY_COST) == SETTLED
        assert _unsettled_events(parent_log, child_log) == []
        (run,) = summarize([parent_log, child_log]).runs
        assert run.unsettled_cost_usd == 0.0
        html = Path(write_report([parent_log], tmp_path / "report.html")).read_text()
        assert "unsettled</span>" not in html
    finally:
        ledger.close()


def _shared_scope_worker(opener: Opener, scope: str, rule: str, ready: Any) -> None:
    ledger = opener(scope, lease_s=1.0, on_expired_hold=rule)  # the context sets no rule
    ctx = ExecutionContext("worker", max_cost_usd=1.0, ledger=ledger)
    with ctx.llm_call("hangs", model="m", estimate_usd=HELD):
        ready.put(True)
        time.sleep(600)


@pytest.mark.parametrize("rule", ["charge", "release"])
def test_a_context_on_the_same_scope_shows_a_dead_workers_charge(
    opener: Opener, tmp_path: Path, rule: str
) -> None:
    scope = f"team-{uuid.uuid4().hex[:8]}"
    ledger = opener(scope)
    ready = FORK.Queue()
    process = FORK.Process(target=_shared_scope_worker, args=(opener, scope, rule, ready))
    process.start()
    assert ready.get(timeout=60) is True and process.pid is not None
    os.kill(process.pid, signal.SIGKILL)
    process.join(timeout=30)
    try:
        _wait_for_expiry(ledger)
        logs = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
        survivors = []
        for log in logs:  # two survivors: the charge is recorded by one of them only
            with (
                JsonlSink(log) as sink,
                ExecutionContext("s", ledger=ledger, sinks=[sink]) as ctx,
                ctx.llm_call("own", model="m", estimate_usd=SETTLED) as call,
            ):
                call.record(10, 5, cost_usd=SETTLED)
            survivors.append(ctx)
        first, second = survivors
        if rule == "release":
            assert ledger.unsettled() == {}  # the dead worker's hold was given back
            assert ledger.spent()[KEY_COST] == 2 * SETTLED  # only the survivors' own calls
            assert _unsettled_events(*logs) == []
            assert KEY_UNSETTLED_COST not in first.stats.gauges()
            return
        assert ledger.unsettled() == {KEY_COST: HELD}
        assert first.stats.get_gauge(KEY_UNSETTLED_COST) == HELD
        assert first.stats.get_gauge(KEY_COST) == SETTLED + HELD
        assert KEY_UNSETTLED_COST not in second.stats.gauges()
        (line,) = _unsettled_events(*logs)
        validate_event(line)
        assert line["run_id"] == first.chain_id and line["cost_usd"] == float(HELD)
        assert "parent_id" not in line  # a top-level node of the survivor's run
    finally:
        ledger.close()


def test_a_paused_child_that_comes_back_is_not_counted_twice(
    opener: Opener, tmp_path: Path
) -> None:
    """SIGSTOP past the lease: the parent records the charge; SIGCONT: the child commits $0.05
    in place of the $0.06 charge, and the parent's totals do not add it again."""
    scope = f"team-{uuid.uuid4().hex[:8]}"
    ledger = opener(scope)
    parent_log, child_log = tmp_path / "parent.jsonl", tmp_path / "child.jsonl"
    sink = JsonlSink(parent_log)
    ctx = ExecutionContext("boss", ledger=ledger, sinks=[sink])
    token = ctx.handoff("worker", max_cost_usd=1.0)
    ready, go = FORK.Queue(), FORK.Queue()
    args = (opener, scope, token, str(child_log), ready, go)
    process = FORK.Process(target=_handed_off_worker, args=args)
    process.start()
    try:
        assert ready.get(timeout=60) is True and process.pid is not None
        os.kill(process.pid, signal.SIGSTOP)
        _wait_for_expiry(ledger)
        ctx.snapshot()  # the parent reads the charge while the child is stopped
        assert ctx.stats.get_gauge(KEY_UNSETTLED_COST) == HELD
        assert ctx.stats.get_gauge(KEY_COST) == SETTLED + HELD
        os.kill(process.pid, signal.SIGCONT)
        go.put("0.05")
        process.join(timeout=60)
        assert process.exitcode == 0
        assert ledger.unsettled() == {}
        assert ledger.spent()[KEY_COST] == SETTLED + Decimal("0.05")
        ctx.close()
        sink.close()
        # the charge stays what the parent reported; the late commit is not added on top
        assert ctx.stats.get_gauge(KEY_COST) == SETTLED + HELD
        assert ctx.graph.aggregates()["total_cost_usd"] == SETTLED + HELD
        assert len(_unsettled_events(parent_log)) == 1
    finally:
        if process.is_alive():
            os.kill(process.pid or 0, signal.SIGKILL)
        ledger.close()


def test_a_resumed_child_leaves_its_dead_holds_to_the_parent(
    opener: Opener, tmp_path: Path
) -> None:
    scope = f"team-{uuid.uuid4().hex[:8]}"
    ledger = opener(scope)
    parent_log, child_log = tmp_path / "parent.jsonl", tmp_path / "child.jsonl"
    sink = JsonlSink(parent_log)
    ctx = ExecutionContext("boss", ledger=ledger, sinks=[sink])
    token = ctx.handoff("worker", max_cost_usd=1.0)
    ready, go = FORK.Queue(), FORK.Queue()
    args = (opener, scope, token, str(child_log), ready, go)
    process = FORK.Process(target=_handed_off_worker, args=args)
    process.start()
    try:
        assert ready.get(timeout=60) is True and process.pid is not None
        os.kill(process.pid, signal.SIGKILL)
        process.join(timeout=30)
        _wait_for_expiry(ledger)
        resumed_log = tmp_path / "resumed.jsonl"
        with JsonlSink(resumed_log) as resumed_sink:
            resumed = ExecutionContext.resume(token, ledger=opener(scope), sinks=[resumed_sink])
            # the settled spend counts here; the dead call's charge is the parent's to show
            assert resumed.stats.get_gauge(KEY_COST) == SETTLED
            with resumed.llm_call("again", model="m", estimate_usd=SETTLED) as call:
                call.record(10, 5, cost_usd=SETTLED)
            resumed.close()
        assert KEY_UNSETTLED_COST not in resumed.stats.gauges()
        ctx.close()
        sink.close()
        assert ctx.stats.get_gauge(KEY_UNSETTLED_COST) == HELD
        assert ctx.stats.get_gauge(KEY_COST) == SETTLED * 2 + HELD == ledger.spent()[KEY_COST]
        assert len(_unsettled_events(parent_log, child_log, resumed_log)) == 1
    finally:
        ledger.close()


def test_a_token_carries_the_rule_that_applies_to_the_childs_holds(tmp_path: Path) -> None:
    """The context's rule, else its ledger's; a signed token with another value is refused."""
    ledger = SqliteLedger(tmp_path / "ledger.db", "team", on_expired_hold="release")
    try:
        plain = ExecutionContext("boss", ledger=ledger)
        assert plain.on_expired_hold is None
        assert propagation.decode(plain.handoff("w")).on_expired_hold == "release"
        strict = ExecutionContext("boss", ledger=ledger, on_expired_hold="charge")
        child = strict.spawn_child("inner")
        assert child.on_expired_hold == "charge"  # children inherit it
        token = child.handoff("w")
        assert propagation.decode(token).on_expired_hold == "charge"
        received = ExecutionContext.from_handoff(token, ledger=ledger)
        assert received.on_expired_hold == "charge"
        received.close()
        forged = replace(propagation.decode(token), on_expired_hold="forget")
        with pytest.raises(HandoffError, match="expired_hold"):
            propagation.decode(propagation.encode(forged, ledger=ledger))
        for ctx in (child, strict, plain):
            ctx.close()
    finally:
        ledger.close()


def test_a_ledger_gone_at_close_is_named_and_the_close_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ledger = SqliteLedger(tmp_path / "ledger.db", "team")
    ctx = ExecutionContext("survivor", ledger=ledger)
    ledger.close()
    with caplog.at_level("WARNING", logger="ampmeter.shared"):
        ctx.close()
    assert ctx.closed
    assert "context 'survivor': unsettled holds not read" in caplog.text
    assert "unavailable" in caplog.text and "closed database" in caplog.text
