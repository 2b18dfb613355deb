"""SDK calls on other threads: the submitter's context carried into pools and threads, the
process default context, or one clear warning."""

from __future__ import annotations

import contextvars
import gc
import threading
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

import ampmeter
from ampmeter.integrations import instrument, lifecycle, uninstrument
from ampmeter.sinks.memory import MemorySink
from ampmeter.testing.replay import ReplayResponse, ReplayServer

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


@pytest.fixture
def server() -> Iterator[ReplayServer]:
    instrument()
    with ReplayServer() as replay:
        replay.script("/v1/chat/completions", *(ReplayResponse.json(COMPLETION) for _ in range(8)))
        yield replay
    uninstrument()
    ampmeter.set_default_context(None)


@pytest.fixture
def client(server: ReplayServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.openai_base_url, api_key="k", max_retries=0)


def ask(client: openai.OpenAI) -> None:
    client.chat.completions.create(
        model="gpt-4o-mini", max_tokens=2, messages=[{"role": "user", "content": "Say yes."}]
    )


def test_pool_threads_attach_to_the_default_context(client: openai.OpenAI) -> None:
    with ampmeter.ExecutionContext("run", max_cost_usd=1.0) as ctx:
        ampmeter.set_default_context(ctx)
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda _: ask(client), range(4)))
    assert ctx.stats.get_counter("amp:llm_calls") == 4
    assert ctx.stats.total_input_tokens() == 36


def test_unmetered_pool_call_warns_once(
    client: openai.OpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    uninstrument()
    instrument(threads=False)  # the pool's threads then do not carry the context
    monkeypatch.setattr(lifecycle.settings, "warned_unmetered", False)
    with (
        ampmeter.ExecutionContext("main-run") as ctx,
        warnings.catch_warnings(record=True) as caught,
    ):
        warnings.simplefilter("always")
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda _: ask(client), range(3)))
    mine = [w for w in caught if "not metered" in str(w.message)]
    assert len(mine) == 1
    assert mine[0].category is RuntimeWarning
    assert "'main-run'" in str(mine[0].message)
    assert "set_default_context" in str(mine[0].message)
    assert ctx.stats.get_counter("amp:llm_calls") == 0  # not counted, and said so


def test_no_warning_without_any_open_context(
    client: openai.OpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lifecycle.settings, "warned_unmetered", False)
    gc.collect()  # contexts other tests dropped unclosed
    assert not ampmeter.context.open_contexts()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ask(client)
    assert not [w for w in caught if "not metered" in str(w.message)]


def test_pool_work_runs_in_the_submitters_context(
    client: openai.OpenAI, server: ReplayServer
) -> None:
    sink = MemorySink()
    with ampmeter.ExecutionContext("run", max_steps=3, sinks=[sink]) as ctx:
        with ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(ask, client) for _ in range(4)]
        outcomes = [f.exception() for f in futures]
    assert sum(1 for e in outcomes if isinstance(e, ampmeter.LimitExceeded)) == 1
    assert len(server.requests) == 3  # the fourth was stopped before it was sent
    assert ctx.stats.get_counter("amp:llm_calls") == 3
    assert ctx.stats.total_input_tokens() == 27
    statuses = sorted(n.status for n in sink.nodes if n.kind == "llm")
    assert statuses == ["halt", "success", "success", "success"]
    assert {n.parent_id for n in sink.nodes if n.kind == "llm"} == {ctx.node_id}


def test_a_thread_started_in_a_context_runs_in_it(client: openai.OpenAI) -> None:
    class Asker(threading.Thread):
        def run(self) -> None:  # a subclass's own run() is carried too
            ask(client)

    with ampmeter.ExecutionContext("run") as ctx:
        plain = threading.Thread(target=ask, args=(client,))
        own = Asker()
        for thread in (plain, own):
            thread.start()
        for thread in (plain, own):
            thread.join()
    assert ctx.stats.get_counter("amp:llm_calls") == 2
    assert "run" not in own.__dict__  # nothing of ampmeter left on the thread


def test_pool_work_outside_a_context_is_untouched(client: openai.OpenAI) -> None:
    marker: contextvars.ContextVar[str] = contextvars.ContextVar("marker", default="unset")
    marker.set("submitter")
    with ThreadPoolExecutor(1) as pool:
        seen = pool.submit(marker.get).result()
    assert seen == "unset"  # as without ampmeter: no context was current


def test_litellm_batch_completion_meters_in_its_callers_context() -> None:
    import litellm

    instrument()
    try:
        with ReplayServer() as server:
            server.script(
                "/v1/chat/completions", *(ReplayResponse.json(COMPLETION) for _ in range(2))
            )
            sink = MemorySink()
            with ampmeter.ExecutionContext("batch", sinks=[sink]) as ctx:
                answers = litellm.batch_completion(
                    model="openai/gpt-4o-mini",
                    api_base=server.openai_base_url,
                    api_key="k",
                    messages=[[{"role": "user", "content": f"Say yes {n}."}] for n in range(2)],
                    max_tokens=2,
                )
            sent = len(server.requests)
    finally:
        uninstrument()
    assert all(not isinstance(a, Exception) for a in answers), answers
    assert sent == 2
    assert ctx.stats.get_counter("amp:llm_calls") == 2
    assert ctx.stats.total_input_tokens() == sum(a.usage.prompt_tokens for a in answers) == 18
    assert [n.status for n in sink.nodes if n.kind == "llm"] == ["success", "success"]
