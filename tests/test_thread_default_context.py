"""SDK calls on pool threads: the process default context, or one clear warning."""

from __future__ import annotations

import gc
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

import ampmeter
from ampmeter.integrations import instrument, lifecycle, uninstrument
from ampmeter.testing.replay import ReplayResponse, ReplayServer

COMPLETION = {
    "id": "c1", "object": "chat.completion", "created": 1, "model": "gpt-4o-mini",
    "choices": [{"index": 0, "finish_reason": "stop",
                 "message": {"role": "assistant", "content": "yes"}}],
    "usage": {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10},
}  # fmt: skip


@pytest.fixture
def client() -> Iterator[openai.OpenAI]:
    instrument()
    with ReplayServer() as server:
        server.script("/v1/chat/completions", *(ReplayResponse.json(COMPLETION) for _ in range(8)))
        yield openai.OpenAI(base_url=server.openai_base_url, api_key="k", max_retries=0)
    uninstrument()
    ampmeter.set_default_context(None)


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
