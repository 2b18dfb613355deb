"""``on_exhausted="pause"``: a call at a hard limit waits until the ceiling is raised (in this
process, by a callback, or through a real SQLite or Redis ledger from another process with
``ampmeter budget raise|resume``), or stops as before when ``pause_timeout_s`` runs out."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from ampmeter import ExecutionContext, LimitExceeded, find_limit_exceeded
from ampmeter.ledgers import Ledger, RedisLedger, SqliteLedger
from support.redis_server import RedisServer, redis_server_fixture  # noqa: F401

COST = "amp:cost"


def kinds(events: list[dict[str, Any]]) -> list[str]:
    return [event["kind"] for event in events]


def spend(ctx: ExecutionContext, name: str, estimate: float, cost: float) -> None:
    with ctx.llm_call(name, estimate_usd=estimate) as call:
        call.record(cost_usd=cost)


class Later:
    """Run ``action`` on a thread after ``seconds``; :meth:`join` re-raises its error."""

    def __init__(self, seconds: float, action: Any) -> None:
        self.errors: list[BaseException] = []

        def run() -> None:
            time.sleep(seconds)
            try:
                action()
            except BaseException as error:
                self.errors.append(error)

        self.thread = threading.Thread(target=run)
        self.thread.start()

    def join(self) -> None:
        self.thread.join()
        if self.errors:
            raise self.errors[0]


def test_default_still_raises_at_once() -> None:
    with ExecutionContext(max_cost_usd=1.0) as ctx:
        spend(ctx, "first", 0.9, 0.9)
        started = time.monotonic()
        with pytest.raises(LimitExceeded):
            spend(ctx, "second", 0.3, 0.3)
        assert time.monotonic() - started < 0.5
        assert ctx.snapshot()["limit_events"] == []


def test_a_paused_call_goes_on_when_another_thread_raises_the_limit() -> None:
    with ExecutionContext(max_cost_usd=1.0, on_exhausted="pause", pause_timeout_s=20) as ctx:
        spend(ctx, "first", 0.9, 0.9)
        raiser = Later(0.4, lambda: ctx.raise_limit(COST, 2.0))
        started = time.monotonic()
        spend(ctx, "second", 0.3, 0.3)
        waited = time.monotonic() - started
        raiser.join()
        assert 0.35 < waited < 5.0
        snap = ctx.snapshot()
        assert float(snap["gauges"][COST]) == pytest.approx(1.2)
        assert kinds(snap["limit_events"]) == ["pause", "resume"]
        pause, resume = snap["limit_events"]
        assert pause["key"] == COST and pause["context"] == "agent_run"
        assert resume["waited_s"] >= 0.35
        node = snap["graph"]["nodes"][pause["node_id"]]
        assert kinds(node["metadata"]["limit_events"]) == ["pause", "resume"]
        assert node["status"] == "success"
        # Later calls are checked against the raised ceiling, and still stop above it.
        spend(ctx, "third", 0.5, 0.5)
        assert ctx.limits[0].max_value == 2.0


def test_a_pause_that_times_out_stops_as_before_and_keeps_the_spend() -> None:
    ctx = ExecutionContext(max_cost_usd=1.0, on_exhausted="pause", pause_timeout_s=0.3)
    with pytest.raises(LimitExceeded) as caught, ctx:
        spend(ctx, "first", 0.9, 0.9)
        started = time.monotonic()
        try:
            spend(ctx, "second", 0.3, 0.3)
        finally:
            assert 0.25 < time.monotonic() - started < 3.0
    assert "pause_timeout_s ran out" in str(caught.value)
    snap = ctx.snapshot()
    assert float(snap["gauges"][COST]) == pytest.approx(0.9)
    assert kinds(snap["limit_events"]) == ["pause", "pause_timeout"]
    assert snap["termination_reason"] == "limit_exceeded"


def test_a_callback_may_raise_the_ceiling_at_once_or_stop_the_call() -> None:
    asked: list[tuple[str, str]] = []

    def approve(ctx: ExecutionContext, exceeded: Any) -> float | None:
        asked.append((ctx.name, exceeded.limit.key))
        return 1.5 if len(asked) == 1 else None

    # A callback that declines stops the call at once (never waiting out pause_timeout_s).
    with ExecutionContext("run", max_cost_usd=1.0, on_exhausted=approve, pause_timeout_s=5) as ctx:
        spend(ctx, "first", 0.9, 0.9)
        spend(ctx, "approved", 0.3, 0.3)
        assert ctx.limits[0].max_value == 1.5
        started = time.monotonic()
        with pytest.raises(LimitExceeded, match="on_exhausted returned None") as caught:
            spend(ctx, "declined", 0.4, 0.4)
        assert time.monotonic() - started < 2.0
        assert find_limit_exceeded(caught.value) is caught.value
    assert asked == [("run", COST), ("run", COST)]
    assert kinds(ctx.snapshot()["limit_events"]) == ["pause", "resume", "pause", "pause_declined"]
    assert float(ctx.snapshot()["gauges"][COST]) == pytest.approx(1.2)


def test_children_inherit_the_pause_and_a_parent_raise_frees_them() -> None:
    with ExecutionContext(max_cost_usd=1.0, on_exhausted="pause", pause_timeout_s=20) as ctx:
        with ctx.spawn_child("worker") as child:
            spend(child, "first", 0.9, 0.9)
            raiser = Later(0.2, lambda: ctx.raise_limit(COST, 3.0))
            spend(child, "second", 0.5, 0.5)
            raiser.join()
            assert kinds(child.snapshot()["limit_events"]) == ["pause", "resume"]
        assert float(ctx.snapshot()["gauges"][COST]) == pytest.approx(1.4)


def test_raise_limit_names_a_key_the_context_does_not_limit() -> None:
    with ExecutionContext(max_cost_usd=1.0) as ctx, pytest.raises(KeyError, match="amp:steps"):
        ctx.raise_limit("amp:steps", 3)
    with ExecutionContext(max_cost_usd=1.0) as ctx, pytest.raises(ValueError, match="on_exhausted"):
        ExecutionContext(on_exhausted="wait")


def test_a_paused_task_leaves_the_event_loop_free() -> None:
    async def main() -> tuple[int, list[str]]:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ctx = ExecutionContext(max_cost_usd=1.0, on_exhausted="pause", pause_timeout_s=20)
        with ctx:
            spend(ctx, "first", 0.9, 0.9)
            ticker = asyncio.create_task(tick())

            async def call() -> None:
                async with ctx.llm_call("second", estimate_usd=0.3) as running:
                    running.record(cost_usd=0.3)

            task = asyncio.create_task(call())
            await asyncio.sleep(0.3)
            assert not task.done()
            ctx.raise_limit(COST, 2.0)  # from the loop's own thread
            await asyncio.wait_for(task, 5)
            ticker.cancel()
            return ticks, kinds(ctx.snapshot()["limit_events"])

    ticks, seen = asyncio.run(main())
    assert ticks > 10
    assert seen == ["pause", "resume"]


@pytest.fixture(params=["sqlite", "redis"])
def shared(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Ledger]]:
    """A ledger's LEDGER argument (for the CLI) and the ledger, at a fresh scope."""
    scope = f"team-{uuid.uuid4().hex[:8]}"
    ledger: Ledger
    if request.param == "sqlite":
        where = str(tmp_path / "budget.sqlite3")
        ledger = SqliteLedger(where, scope)
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        where = server.url
        ledger = RedisLedger(where, scope)
    yield where, ledger
    ledger.close()


def budget(*args: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ampmeter", "budget", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


def test_budget_raise_from_another_process_resumes_a_paused_call(
    shared: tuple[str, Ledger],
) -> None:
    where, ledger = shared
    with ExecutionContext(
        max_cost_usd=1.0, ledger=ledger, on_exhausted="pause", pause_timeout_s=20
    ) as ctx:
        spend(ctx, "first", 0.9, 0.9)
        raiser = Later(0.3, lambda: budget("raise", where, ledger.scope, COST, "2.0"))
        spend(ctx, "second", 0.3, 0.3)
        raiser.join()
        assert kinds(ctx.snapshot()["limit_events"]) == ["pause", "resume"]
        assert ctx.limits[0].max_value == 2.0
    assert float(ledger.spent()[COST]) == pytest.approx(1.2)


def test_an_operator_pause_pauses_the_call_until_budget_resume(
    shared: tuple[str, Ledger],
) -> None:
    where, ledger = shared
    with ExecutionContext(
        max_cost_usd=5.0, ledger=ledger, on_exhausted="pause", pause_timeout_s=20
    ) as ctx:
        spend(ctx, "first", 0.5, 0.5)
        budget("pause", where, ledger.scope)
        resumer = Later(0.3, lambda: budget("resume", where, ledger.scope))
        started = time.monotonic()
        spend(ctx, "second", 0.5, 0.5)
        assert time.monotonic() - started > 0.25
        resumer.join()
        assert kinds(ctx.snapshot()["limit_events"]) == ["pause", "resume"]
    assert float(ledger.spent()[COST]) == pytest.approx(1.0)


def test_an_operator_pause_still_refuses_where_calls_raise(shared: tuple[str, Ledger]) -> None:
    _, ledger = shared
    with ExecutionContext(max_cost_usd=5.0, ledger=ledger) as ctx:
        ledger.pause()
        with pytest.raises(LimitExceeded, match="paused"):
            spend(ctx, "refused", 0.5, 0.5)


def test_a_handed_off_child_pauses_as_its_parent_and_resumes_on_a_ledger_raise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "budget.sqlite3"
    monkeypatch.setenv("AMPMETER_HANDOFF_KEY", "test-handoff-key")
    monkeypatch.setenv("AMPMETER_LEDGER_ALLOW", str(path))
    with (
        SqliteLedger(path, "team") as ledger,
        ExecutionContext(
            "boss", max_cost_usd=5.0, ledger=ledger, on_exhausted="pause", pause_timeout_s=20
        ) as ctx,
    ):
        token = ctx.handoff("researcher", max_cost_usd=0.5)
        with ExecutionContext.from_handoff(token) as child:
            spend(child, "first", 0.4, 0.4)
            scope = child.ledger.scope if child.ledger is not None else ""
            with SqliteLedger(path, "team") as operator:  # another connection: the operator's
                raiser = Later(0.3, lambda: operator.set_ceiling(scope, COST, 1.0))
                spend(child, "second", 0.3, 0.3)
                raiser.join()
            assert kinds(child.snapshot()["limit_events"]) == ["pause", "resume"]
        assert float(ledger.spent(scope)[COST]) == pytest.approx(0.7)


def test_a_forged_exhaustion_mode_in_a_token_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import base64

    import orjson

    from ampmeter.propagation import HandoffError, decode

    monkeypatch.setenv("AMPMETER_HANDOFF_KEY", "k")
    monkeypatch.setenv("AMPMETER_LEDGER_ALLOW", str(tmp_path / "b.sqlite3"))
    with (
        SqliteLedger(tmp_path / "b.sqlite3", "team") as ledger,
        ExecutionContext(max_cost_usd=1.0, ledger=ledger, on_exhausted="pause") as ctx,
    ):
        token = ctx.handoff("child")
        assert decode(token).on_exhausted == "pause"
        body = token[len("amp2.") :].partition(".")[0]
        data = orjson.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        data["exhausted"] = ["forever", None]
        forged = base64.urlsafe_b64encode(orjson.dumps(data)).rstrip(b"=").decode()
        import hashlib
        import hmac

        signature = hmac.new(b"k", forged.encode(), hashlib.sha256).digest()
        signed = base64.urlsafe_b64encode(signature).rstrip(b"=").decode()
        with pytest.raises(HandoffError, match="exhausted"):
            decode(f"amp2.{forged}.{signed}")


def test_pauses_and_resumes_leave_the_process_through_the_webhook_sink() -> None:
    from ampmeter.sinks.webhook import WebhookSink
    from ampmeter.testing import RecordedRequest, ReplayResponse, ReplayServer

    def accepted(request: RecordedRequest) -> ReplayResponse:
        return ReplayResponse.json({"ok": True})

    with ReplayServer(fallback=accepted) as receiver:
        with WebhookSink(receiver.url + "/hook", events=["pause", "resume"]) as hook:
            ctx = ExecutionContext(
                "night", max_cost_usd=1.0, on_exhausted="pause", pause_timeout_s=20, sinks=[hook]
            )
            with ctx:
                spend(ctx, "first", 0.9, 0.9)
                raiser = Later(0.2, lambda: ctx.raise_limit(COST, 2.0))
                spend(ctx, "second", 0.3, 0.3)
                raiser.join()
        sent = [request.json() for request in receiver.requests if request.path == "/hook"]
    assert [(event["kind"], event["key"], event["node_name"]) for event in sent] == [
        ("pause", COST, "second"),
        ("resume", COST, "second"),
    ]


def test_a_ceiling_an_earlier_run_left_is_never_taken_only_a_raise_after_the_pause(
    shared: tuple[str, Ledger],
) -> None:
    where, ledger = shared
    # An earlier run's hand-off kept $5 for this scope, and an operator raised it once, too.
    ledger.set_ceilings(ledger.scope, {COST: 5})
    ledger.set_ceiling(ledger.scope, COST, 5)
    with ExecutionContext(
        max_cost_usd=0.10, ledger=ledger, on_exhausted="pause", pause_timeout_s=20
    ) as ctx:
        spend(ctx, "first", 0.05, 0.05)
        spend(ctx, "second", 0.05, 0.05)
        raiser = Later(0.6, lambda: budget("raise", where, ledger.scope, COST, "0.15"))
        started = time.monotonic()
        spend(ctx, "third", 0.05, 0.05)  # waits for the raise: the $5 left there is no approval
        waited = time.monotonic() - started
        raiser.join()
        assert waited > 0.55
        assert ctx.limits[0].max_value == Decimal("0.15")  # the raise, never the old $5
    assert ledger.spent()[COST] == Decimal("0.15")


def test_a_pause_ends_when_the_contexts_timeout_runs_out() -> None:
    from ampmeter.pricing import NO_PRICES  # the calls give their cost: no table to load

    ctx = ExecutionContext(
        max_cost_usd=0.10,
        on_exhausted="pause",
        timeout_s=0.8,
        pause_timeout_s=10,
        pricing=NO_PRICES,
    )
    started = time.monotonic()
    with pytest.raises(LimitExceeded, match="timeout_s ran out") as caught, ctx:
        spend(ctx, "first", 0.10, 0.10)
        spend(ctx, "second", 0.05, 0.05)
    assert time.monotonic() - started < 4.0
    assert find_limit_exceeded(caught.value) is caught.value
    snap = ctx.snapshot()
    assert snap["termination_reason"] == "timeout"
    assert kinds(snap["limit_events"]) == ["pause", "pause_timeout"]
    assert float(snap["gauges"][COST]) == pytest.approx(0.10)
