"""Exactly-once accounting across replays: ``idempotency_key=`` counts a call once per run and
once per shared ledger scope (a real SQLite file and a real Redis), when a step is run again
after a crash (as DBOS and Prefect do) and when recorded results are re-delivered without
being sent again (as Temporal's workflow replay does)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from ampmeter import ExecutionContext
from ampmeter.keys import KEY_COST
from ampmeter.ledgers import Ledger, RedisLedger, SqliteLedger
from ampmeter.sinks.jsonl import JsonlSink
from support.redis_server import RedisServer, redis_server_fixture  # noqa: F401

RECORDED = {"tokens_in": 100, "tokens_out": 20, "cost_usd": 0.25}


def step(ctx: ExecutionContext, key: str) -> None:
    """One workflow step: an LLM call and a tool call, each with the step's key."""
    with ctx.llm_call("plan", estimate_usd=0.3, idempotency_key=f"{key}/llm") as call:
        call.record(**RECORDED)
    with ctx.tool_call("search", estimate_usd=0.05, idempotency_key=f"{key}/tool") as tool:
        tool.record(cost_usd=0.05)


def test_a_step_run_twice_in_one_run_counts_once() -> None:
    with ExecutionContext(max_cost_usd=1.0) as ctx:
        step(ctx, "wf-1/step-1")
        step(ctx, "wf-1/step-1")  # retried by the engine: same keys
        step(ctx, "wf-1/step-2")  # a new step counts
    assert ctx.stats.get_gauge(KEY_COST) == Decimal("0.6")
    counters = ctx.snapshot()["counters"]
    assert counters["amp:llm_calls"] == 2 and counters["amp:tool_calls"] == 2
    assert counters["amp:input_tokens"] == 200
    nodes = [n for n in ctx.snapshot()["graph"]["nodes"].values() if n["kind"] in ("llm", "tool")]
    again = [n for n in nodes if "duplicate_of" in n["metadata"]]
    assert len(again) == 2 and all(n["cost_usd"] == 0 for n in again)
    assert {n["metadata"]["first_cost_usd"] for n in again} == {0.25, 0.05}


@pytest.fixture(params=["sqlite", "redis"])
def shared(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str, Ledger]]:
    """How a worker process opens the ledger (Python source), its scope, and the ledger."""
    scope = f"wf-{uuid.uuid4().hex[:8]}"
    ledger: Ledger
    if request.param == "sqlite":
        path = str(tmp_path / "budget.sqlite3")
        opener = f"SqliteLedger({path!r}, {scope!r})"
        ledger = SqliteLedger(path, scope)
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        opener = f"RedisLedger({server.url!r}, {scope!r})"
        ledger = RedisLedger(server.url, scope)
    yield opener, scope, ledger
    ledger.close()


def crash_after_step(opener: str, key: str) -> None:
    """Run the step in a worker process that is killed (SIGKILL: no clean close, its context
    still open) right after the step, before the workflow engine saw it finish."""
    source = textwrap.dedent(
        f"""
        import sys, time
        from ampmeter import ExecutionContext
        from ampmeter.ledgers import RedisLedger, SqliteLedger
        ledger = {opener}
        ctx = ExecutionContext(max_cost_usd=5.0, ledger=ledger).__enter__()
        with ctx.llm_call("plan", estimate_usd=0.3, idempotency_key={key + "/llm"!r}) as call:
            call.record(tokens_in=100, tokens_out=20, cost_usd=0.25)
        with ctx.tool_call("search", estimate_usd=0.05, idempotency_key={key + "/tool"!r}) as t:
            t.record(cost_usd=0.05)
        print("step done", flush=True)
        time.sleep(120)
        """
    )
    worker = subprocess.Popen(
        [sys.executable, "-c", source], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert worker.stdout is not None
        line = worker.stdout.readline()
    finally:
        worker.send_signal(signal.SIGKILL)
        _, errors = worker.communicate(timeout=30)
    assert line == "step done\n", errors
    assert worker.returncode == -signal.SIGKILL


def test_a_step_re_executed_in_a_new_process_after_a_crash_counts_once(
    shared: tuple[str, str, Ledger], tmp_path: Path
) -> None:
    opener, scope, ledger = shared
    crash_after_step(opener, "wf-7/step-1")
    assert ledger.spent()[KEY_COST] == Decimal("0.3")
    # The engine runs the step again in this process: the shared spend does not move, and
    # this process's stats, aggregates and log count only what the ledger had not.
    log = tmp_path / "events.jsonl"
    with (
        JsonlSink(log) as sink,
        ExecutionContext(max_cost_usd=5.0, ledger=ledger, sinks=[sink]) as ctx,
    ):
        step(ctx, "wf-7/step-1")
        step(ctx, "wf-7/step-1")  # and once more here: this run knows it now
        step(ctx, "wf-7/step-2")
    assert ledger.spent()[KEY_COST] == Decimal("0.6")
    assert ctx.stats.get_gauge(KEY_COST) == Decimal("0.3")
    assert ctx.stats.get_counter("amp:llm_calls") == 1
    assert ctx.stats.get_counter("amp:input_tokens") == 100
    assert ctx.graph.aggregates()["total_cost_usd"] == Decimal("0.3")
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert sum(Decimal(str(e["cost_usd"])) for e in events) == Decimal("0.3")
    marks = [e["metadata"].get("duplicate_of") for e in events]
    assert marks == [f"ledger:{scope}"] * 4 + [None, None]  # who counted it first
    assert [e["metadata"]["first_cost_usd"] for e in events[:4]] == [0.25, 0.05] * 2


def test_a_replay_of_recorded_results_counts_once(shared: tuple[str, str, Ledger]) -> None:
    _, _, ledger = shared
    history: list[dict[str, Any]] = []
    ctx = ExecutionContext(max_cost_usd=5.0, ledger=ledger)
    with ctx, ctx.llm_call("plan", estimate_usd=0.3, idempotency_key="wf-9/event-4") as call:
        call.record(**RECORDED)
        history.append({"key": "wf-9/event-4", **RECORDED})
    # The worker restarts; the workflow replays its history: the results are re-delivered
    # from the record, not sent again, and recorded with the same keys.
    with ExecutionContext(max_cost_usd=5.0, ledger=ledger) as replayed:
        for event in history:
            key = event.pop("key")
            with replayed.llm_call("plan", estimate_usd=0.3, idempotency_key=key) as call:
                call.record(**event)
    assert ledger.spent()[KEY_COST] == Decimal("0.25")


def test_an_idempotency_key_must_be_text() -> None:
    with ExecutionContext() as ctx, pytest.raises(TypeError, match="idempotency_key"):
        ctx.llm_call("x", idempotency_key=7)  # type: ignore[arg-type]


def test_a_gateway_keyed_call_counts_once_per_key(instrumented: None) -> None:
    """With ``instrument(response_id_keys=True)`` the node's key is the provider's response id
    with its endpoint and usage; a replay that re-delivers the response with that key counts
    nothing more (tests/integrations/test_response_ids.py re-delivers it through the SDKs)."""
    import openai

    from ampmeter.integrations import instrument
    from ampmeter.testing import BillingProvider

    instrument(response_id_keys=True)  # the fixture puts the default back

    with BillingProvider(output_tokens=5) as server:
        client = openai.OpenAI(base_url=server.openai_base_url, api_key="k", max_retries=0)
        with ExecutionContext(max_cost_usd=1.0) as ctx:
            answer = client.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": "Hi"}]
            )
            node = next(n for n in ctx.snapshot()["graph"]["nodes"].values() if n["kind"] == "llm")
            key = node["metadata"]["idempotency_key"]
            assert key.startswith(f"openai:{answer.id} chat.completions.create in=")
            spent = ctx.stats.get_gauge(KEY_COST)
            assert spent > 0
            usage = answer.usage
            assert usage is not None
            with ctx.llm_call("replayed", model="gpt-4o-mini", idempotency_key=key) as call:
                call.record(usage.prompt_tokens, usage.completion_tokens)
        assert ctx.stats.get_gauge(KEY_COST) == spent
        assert len(server.requests) == 1


def test_a_run_resumed_in_a_new_process_keeps_its_spend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ampmeter import LimitExceeded

    path = tmp_path / "budget.sqlite3"
    monkeypatch.setenv("AMPMETER_HANDOFF_KEY", "test-handoff-key")
    monkeypatch.setenv("AMPMETER_LEDGER_ALLOW", str(path))
    with SqliteLedger(path, "team") as ledger, ExecutionContext(ledger=ledger) as boss:
        token = boss.handoff("worker", max_cost_usd=0.5)
    source = textwrap.dedent(
        f"""
        import os
        from ampmeter import ExecutionContext
        ctx = ExecutionContext.from_handoff({token!r}).__enter__()
        with ctx.llm_call("plan", estimate_usd=0.3) as call:
            call.record(cost_usd=0.3)
        os._exit(3)  # the worker dies; its parent and ledger connection are gone too
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", source], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 3, done.stderr
    with ExecutionContext.resume(token) as resumed:
        assert resumed.stats.get_gauge(KEY_COST) == Decimal("0.3")
        assert resumed.remaining()[KEY_COST] <= Decimal("0.2")
        too_much = resumed.llm_call("too much", estimate_usd=0.25)
        with pytest.raises(LimitExceeded), too_much as call:
            call.record(cost_usd=0.25)
        with resumed.llm_call("fits", estimate_usd=0.15) as call:
            call.record(cost_usd=0.15)
        scope = resumed.ledger.scope if resumed.ledger is not None else ""
    with SqliteLedger(path, "team") as reader:
        assert reader.spent(scope)[KEY_COST] == Decimal("0.45")


def test_a_replayed_trace_record_counts_once() -> None:
    """Usage reported after the fact (trace records) is exactly-once by its key too: a workflow
    that replays its history delivers the same records again."""
    from ampmeter import ModelCallTrace, ToolCallTrace

    with ExecutionContext() as ctx:
        for _ in range(2):  # the history, delivered twice
            ctx.trace(ModelCallTrace(model="m", input_tokens=10, cost_usd=0.1, idempotency_key="a"))
            ctx.trace(ToolCallTrace(tool_name="search", idempotency_key="b"))
        ctx.trace(ModelCallTrace(model="m", input_tokens=5, cost_usd=0.05))  # no key: counted
    assert ctx.stats.get_gauge(KEY_COST) == Decimal("0.15")
    assert ctx.stats.total_input_tokens() == 15
    assert ctx.stats.get_counter("amp:tool_calls") == 1


def priced_steps(ctx: ExecutionContext, keys: list[str]) -> None:
    for key in keys:
        with ctx.llm_call("plan", estimate_usd=0.01, idempotency_key=key) as call:
            call.record(cost_usd=0.01)


def test_a_run_forgets_its_oldest_keys_past_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """Response ids key every instrumented call: a long run keeps only the newest keys."""
    from ampmeter._core import idempotency

    monkeypatch.setattr(idempotency, "KEYS_KEPT", 3)
    with ExecutionContext() as ctx:
        priced_steps(ctx, ["k0", "k1", "k2", "k3", "k4"])  # k0 and k1 forgotten
        priced_steps(ctx, ["k4", "k3"])  # recent: nothing more
        assert ctx.stats.get_gauge(KEY_COST) == Decimal("0.05")
        priced_steps(ctx, ["k0"])  # forgotten: counted again (and k2 goes)
        priced_steps(ctx, ["k2"])
    assert ctx.stats.get_gauge(KEY_COST) == Decimal("0.07")


def test_a_run_forgets_keys_older_than_the_ledgers_keep_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ampmeter._core import idempotency

    monkeypatch.setattr(idempotency, "KEEP_S", 0.2)
    with ExecutionContext() as ctx:
        priced_steps(ctx, ["old", "old"])
        time.sleep(0.3)
        priced_steps(ctx, ["old", "old"])
    assert ctx.stats.get_gauge(KEY_COST) == Decimal("0.02")


def test_seen_keys_stay_within_their_bound() -> None:
    from ampmeter._core.idempotency import KEYS_KEPT, SeenKeys

    seen = SeenKeys()
    for number in range(3 * KEYS_KEPT):
        assert seen.claim(f"openai:chatcmpl-{number}", (f"n{number}", 1)) is None
        assert len(seen) <= KEYS_KEPT
    assert seen.claim(f"openai:chatcmpl-{3 * KEYS_KEPT - 1}", ("later", 1)) is not None
    assert seen.claim("openai:chatcmpl-0", ("later", 1)) is None  # forgotten long ago


def test_a_key_the_run_forgot_is_still_counted_once_through_the_ledger(
    shared: tuple[str, str, Ledger], monkeypatch: pytest.MonkeyPatch
) -> None:
    from ampmeter._core import idempotency

    monkeypatch.setattr(idempotency, "KEYS_KEPT", 1)
    _, scope, ledger = shared
    with ExecutionContext(max_cost_usd=1.0, ledger=ledger) as ctx:
        priced_steps(ctx, ["a", "b", "a"])  # "a" is forgotten here, not in the ledger
    assert ledger.spent()[KEY_COST] == ctx.stats.get_gauge(KEY_COST) == Decimal("0.02")
    last = [n for n in ctx.snapshot()["graph"]["nodes"].values() if n["kind"] == "llm"][-1]
    assert last["metadata"]["duplicate_of"] == f"ledger:{scope}"


def test_a_response_redelivered_to_a_new_process_counts_once(
    shared: tuple[str, str, Ledger], instrumented: None
) -> None:
    """A worker is killed after an instrumented call; its replacement gets the same response
    again (a gateway's cache, a cassette replayed through the SDK): keyed by the provider's
    response id with its endpoint and usage (``response_id_keys=True``), it adds nothing to the
    ledger nor to the new process's own stats."""
    import openai

    from ampmeter.integrations import instrument
    from ampmeter.testing import ReplayServer, recorded

    instrument(response_id_keys=True)  # the fixture puts the default back

    opener, scope, ledger = shared
    with ReplayServer(verbatim_ids=True) as server:
        chat = "/v1/chat/completions"
        server.script(chat, recorded.openai_chat_tool_calls(), recorded.openai_chat_tool_calls())
        source = textwrap.dedent(
            f"""
            import time
            import openai
            import ampmeter
            from ampmeter import ExecutionContext
            from ampmeter.ledgers import RedisLedger, SqliteLedger
            ampmeter.instrument(response_id_keys=True)
            client = openai.OpenAI(base_url={server.openai_base_url!r}, api_key="k")
            ctx = ExecutionContext(max_cost_usd=5.0, ledger={opener}).__enter__()
            client.chat.completions.create(model="gpt-4o-mini", messages=[])
            print("step done", flush=True)
            time.sleep(120)
            """
        )
        worker = subprocess.Popen(
            [sys.executable, "-c", source],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert worker.stdout is not None
            line = worker.stdout.readline()
        finally:
            worker.send_signal(signal.SIGKILL)
            _, errors = worker.communicate(timeout=30)
        assert line == "step done\n", errors
        spent = ledger.spent()[KEY_COST]
        assert spent > 0
        client = openai.OpenAI(base_url=server.openai_base_url, api_key="k", max_retries=0)
        with ExecutionContext(max_cost_usd=5.0, ledger=ledger) as ctx:
            answer = client.chat.completions.create(model="gpt-4o-mini", messages=[])
        assert answer.choices[0].message.tool_calls  # returned as usual
    assert ledger.spent()[KEY_COST] == spent
    assert ctx.stats.get_gauge(KEY_COST) == 0 and ctx.stats.get_counter("amp:llm_calls") == 0
    (node,) = [n for n in ctx.snapshot()["graph"]["nodes"].values() if n["kind"] == "llm"]
    assert node["metadata"]["duplicate_of"] == f"ledger:{scope}"
    assert node["metadata"]["idempotency_key"].startswith(f"openai:{answer.id} ")
    assert Decimal(str(node["metadata"]["first_cost_usd"])) == spent
