"""A batch's creation cannot pass a cap unseen: it is one node that says it is not metered,
and under a cost limit it is refused before it is sent unless the context lets unpriced calls
through (``on_unpriced``). Real SDKs (openai, anthropic, google-genai) and raw httpx against
the replay server.
"""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import openai
import pytest

from ampmeter import ExecutionContext, Limit, LimitExceeded
from ampmeter.keys import KEY_INPUT_TOKENS
from ampmeter.node import Node
from ampmeter.sinks.memory import MemorySink
from ampmeter.testing import recorded
from ampmeter.testing.replay import ReplayResponse, ReplayServer

pytestmark = pytest.mark.usefixtures("instrumented")  # conftest.py

OPENAI_BATCH = {
    "id": "batch_abc",
    "object": "batch",
    "endpoint": "/v1/chat/completions",
    "input_file_id": "file-abc",
    "completion_window": "24h",
    "status": "validating",
    "created_at": 1_700_000_000,
}
ANTHROPIC_BATCH = {
    "id": "msgbatch_abc",
    "type": "message_batch",
    "processing_status": "in_progress",
    "request_counts": {"processing": 1, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0},
    "created_at": "2026-11-30T08:00:00Z",
    "expires_at": "2026-12-01T08:00:00Z",
    "ended_at": None,
    "cancel_initiated_at": None,
    "archived_at": None,
    "results_url": None,
}
GEMINI_BATCH = {
    "name": "batches/abc",
    "metadata": {"displayName": "nightly", "state": "BATCH_STATE_PENDING"},
}
GEMINI_PATH = "/v1beta/models/gemini-2.5-flash:batchGenerateContent"


def _openai(replay: ReplayServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=replay.openai_base_url, api_key="k", max_retries=0)


def _create_openai_batch(client: openai.OpenAI) -> Any:
    return client.batches.create(
        input_file_id="file-abc", endpoint="/v1/chat/completions", completion_window="24h"
    )


def _only(sink: MemorySink) -> Node:
    (node,) = [n for n in sink.nodes if n.kind == "llm"]
    return node


def test_an_openai_batch_under_a_cost_limit_is_refused_before_it_is_sent(
    replay: ReplayServer,
) -> None:
    replay.script("/v1/batches", ReplayResponse.json(OPENAI_BATCH))
    sink = MemorySink()
    with (
        ExecutionContext("nightly", sinks=[sink], max_cost_usd=5.0),
        pytest.raises(LimitExceeded) as stop,
    ):
        _create_openai_batch(_openai(replay))
    assert replay.pending("/v1/batches") == 1  # nothing was sent
    message = str(stop.value)
    assert "'batches.create' sends a batch, billed when it runs" in message
    assert "does not meter" in message and "on_unpriced='warn' or 'allow'" in message
    assert "'nightly'" in message
    node = _only(sink)
    assert (node.status, node.name, node.metadata["unmetered"]) == (
        "halt",
        "batches.create",
        "a batch, billed when it runs",
    )


def test_a_batch_the_context_lets_through_is_a_node_that_says_it_is_not_metered(
    replay: ReplayServer,
) -> None:
    replay.script("/v1/batches", ReplayResponse.json(OPENAI_BATCH))
    sink = MemorySink()
    with ExecutionContext(sinks=[sink], max_cost_usd=5.0, on_unpriced="allow") as ctx:
        batch = _create_openai_batch(_openai(replay))
    assert batch.id.startswith("batch_abc")  # the SDK's own object
    node = _only(sink)
    assert (node.status, node.model, node.tokens_in, node.tokens_out) == ("success", "", 0, 0)
    assert node.metadata["cost_status"] == "unpriced"  # never $0
    assert node.metadata["unmetered"] == "a batch, billed when it runs"
    assert ctx.stats.get_counter("amp:unpriced_llm_calls") == 1
    assert ctx.stats.get_counter("amp:llm_calls") == 1  # one LLM call, as the docs say


def test_without_a_cost_limit_a_batch_is_sent_and_noted(replay: ReplayServer) -> None:
    replay.script("/v1/batches", ReplayResponse.json(OPENAI_BATCH))
    sink = MemorySink()
    with ExecutionContext(sinks=[sink], max_steps=10):
        _create_openai_batch(_openai(replay))
    assert _only(sink).metadata["cost_status"] == "unpriced"


def test_on_unpriced_warn_sends_the_batch_with_a_warning(replay: ReplayServer) -> None:
    replay.script("/v1/batches", ReplayResponse.json(OPENAI_BATCH))
    with (
        ExecutionContext(max_cost_usd=5.0, on_unpriced="warn"),
        pytest.warns(RuntimeWarning, match="sends a batch, billed when it runs"),
    ):
        _create_openai_batch(_openai(replay))
    assert replay.pending("/v1/batches") == 0


def test_an_anthropic_message_batch_under_a_cost_limit_is_refused(replay: ReplayServer) -> None:
    replay.script("/v1/messages/batches", ReplayResponse.json(ANTHROPIC_BATCH))
    client = anthropic.Anthropic(base_url=replay.anthropic_base_url, api_key="k", max_retries=0)
    params = {
        "model": "claude-haiku-4-5",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "Hi"}],
    }
    sink = MemorySink()
    with ExecutionContext(sinks=[sink], max_cost_usd=5.0), pytest.raises(LimitExceeded):
        client.messages.batches.create(requests=[{"custom_id": "a", "params": params}])
    assert replay.pending("/v1/messages/batches") == 1
    node = _only(sink)
    assert (node.name, node.status) == ("messages.batches.create", "halt")
    assert node.metadata["unmetered"] == "a batch, billed when it runs"


def test_a_gemini_batch_under_a_cost_limit_is_refused(replay: ReplayServer) -> None:
    from google import genai
    from google.genai import types

    replay.script(GEMINI_PATH, ReplayResponse.json(GEMINI_BATCH))
    options = types.HttpOptions(base_url=replay.url, api_version="v1beta")
    client = genai.Client(api_key="k", http_options=options)
    request = {"contents": [{"parts": [{"text": "Hi"}], "role": "user"}]}
    sink = MemorySink()
    with ExecutionContext(sinks=[sink], max_cost_usd=5.0), pytest.raises(LimitExceeded):
        client.batches.create(model="gemini-2.5-flash", src=[request])
    assert replay.pending(GEMINI_PATH) == 1
    assert _only(sink).name == "batchGenerateContent"
    with ExecutionContext(sinks=[sink], max_cost_usd=5.0, on_unpriced="allow"):
        job = client.batches.create(model="gemini-2.5-flash", src=[request])
    assert job.name == "batches/abc"
    sent = [n for n in sink.nodes if n.kind == "llm" and n.status == "success"]
    assert [n.metadata["cost_status"] for n in sent] == ["unpriced"]


def test_raw_http_batch_creations_are_refused_and_their_other_requests_untouched(
    replay: ReplayServer,
) -> None:
    """``/v1/batches`` over raw httpx too; reading or cancelling a batch is no creation."""
    replay.script("/v1/batches", ReplayResponse.json(OPENAI_BATCH))
    replay.script("/v1/batches/batch_abc/cancel", ReplayResponse.json(OPENAI_BATCH))
    body = {"input_file_id": "file-abc", "endpoint": "/v1/embeddings", "completion_window": "24h"}
    sink = MemorySink()
    with ExecutionContext(sinks=[sink], max_cost_usd=5.0), httpx.Client() as client:
        with pytest.raises(LimitExceeded, match="'batches' sends a batch"):
            client.post(replay.url + "/v1/batches", json=body)
        client.post(replay.url + "/v1/batches/batch_abc/cancel").raise_for_status()
    assert replay.pending("/v1/batches") == 1
    assert [n.name for n in sink.nodes if n.kind == "llm"] == ["batches"]


def test_a_batch_body_that_names_a_model_is_still_a_batch(replay: ReplayServer) -> None:
    """A ``model`` in the body (the SDK's ``extra_body``, a raw body) makes no model call of
    it: a priced model would have let it through at $0."""
    replay.script("/v1/batches", ReplayResponse.json(OPENAI_BATCH))
    body = {"input_file_id": "file-abc", "endpoint": "/v1/chat/completions", "model": "gpt-4o"}
    sink = MemorySink()
    with ExecutionContext(sinks=[sink], max_cost_usd=5.0):
        with pytest.raises(LimitExceeded):
            _openai(replay).batches.create(
                input_file_id="file-abc",
                endpoint="/v1/chat/completions",
                completion_window="24h",
                extra_body={"model": "gpt-4o"},
            )
        with httpx.Client() as client, pytest.raises(LimitExceeded):
            client.post(replay.url + "/v1/batches", json=body)
    assert replay.pending("/v1/batches") == 1
    assert {n.metadata["unmetered"] for n in sink.nodes if n.kind == "llm"} == {
        "a batch, billed when it runs"
    }


def test_openai_audio_requests_cannot_pass_a_cost_cap_unseen(
    replay: ReplayServer,
) -> None:
    """Speech and transcriptions (a multipart form) went out unmetered under any cap, billed by
    the audio made or heard. Each is now a node that says so, refused under a cost limit and
    counted as a call where unpriced calls are let through."""
    client = _openai(replay)
    sends = {
        "/v1/audio/speech": lambda: client.audio.speech.create(
            model="gpt-4o-mini-tts", voice="alloy", input="Hello."
        ),
        "/v1/audio/transcriptions": lambda: client.audio.transcriptions.create(
            model="whisper-1", file=("hello.wav", b"RIFF\x00\x00\x00\x00WAVE", "audio/wav")
        ),
    }
    answers = {
        "/v1/audio/speech": ReplayResponse(
            chunks=(b"ID3 audio",), headers=(("content-type", "audio/mpeg"),)
        ),
        "/v1/audio/transcriptions": ReplayResponse.json({"text": "Hello."}),
    }
    sink = MemorySink()
    with ExecutionContext(sinks=[sink], max_cost_usd=5.0):
        for send in sends.values():
            with pytest.raises(LimitExceeded, match="which ampmeter does not meter"):
                send()
    assert replay.requests == []
    with ExecutionContext(sinks=[sink], on_unpriced="allow") as ctx:
        for path, send in sends.items():
            replay.script(path, answers[path])
            send()
        assert ctx.stats.get_counter("amp:llm_calls") == 2
    sent = [n for n in sink.nodes if n.kind == "llm" and n.status == "success"]
    assert [n.name for n in sent] == ["audio.speech.create", "audio.transcriptions.create"]
    assert all(n.metadata["cost_status"] == "unpriced" for n in sent)


@pytest.mark.parametrize(
    ("path", "what"),
    [
        ("/v1beta/cachedContents", "a context cache"),  # Gemini's context caching
        ("/model-invocation-job", "a batch"),  # Bedrock's batch inference
    ],
)
def test_a_gemini_context_cache_and_a_bedrock_batch_are_refused_under_a_cost_cap(
    replay: ReplayServer, path: str, what: str
) -> None:
    body = {"model": "models/gemini-2.5-flash", "contents": [{"parts": [{"text": "A book."}]}]}
    refused = pytest.raises(LimitExceeded, match=f"sends {what}")
    with ExecutionContext(max_cost_usd=5.0), httpx.Client() as client, refused:
        client.post(replay.url + path, json=body)
    assert replay.requests == []


def test_a_batch_cannot_pass_a_token_limit_unseen_but_an_unpriced_model_can(
    replay: ReplayServer,
) -> None:
    """A run capped by tokens alone let batches through: their tokens are counted nowhere. An
    unpriced model's call is not refused by a token limit: its tokens are counted."""
    replay.script("/v1/chat/completions", recorded.openai_chat_tool_calls())
    client = _openai(replay)
    tokens = [Limit(KEY_INPUT_TOKENS, 1_000_000)]
    with ExecutionContext("tokens", limits=tokens):
        with pytest.raises(LimitExceeded, match="context 'tokens' has a token limit"):
            client.batches.create(
                input_file_id="file-abc", endpoint="/v1/chat/completions", completion_window="24h"
            )
        client.chat.completions.create(
            model="my-local-model", messages=[{"role": "user", "content": "Hi"}]
        )
    assert [r.path for r in replay.requests] == ["/v1/chat/completions"]
    replay.script("/v1/batches", ReplayResponse.json(OPENAI_BATCH))
    with ExecutionContext(limits=tokens, on_unpriced="allow"):
        client.batches.create(
            input_file_id="file-abc", endpoint="/v1/chat/completions", completion_window="24h"
        )
