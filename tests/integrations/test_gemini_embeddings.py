"""Gemini embeddings (``embedContent``, ``batchEmbedContents``) are metered and capped.

google-genai's ``models.embed_content`` sends ``batchEmbedContents`` to the Gemini API; a raw
client may send ``embedContent``. Their answers carry no usage: each request is an
``embedding`` node charged its measured input at the model's table rate (``cost_status``
``"estimated"``), never $0, and a cap stops it before it is sent. A ``usageMetadata`` (Vertex
AI's answers carry one) gives the count. Against the replay server, read at the HTTP layer.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import httpx
import pytest

from ampmeter import ExecutionContext, LimitExceeded
from ampmeter.node import Node
from ampmeter.sinks.memory import MemorySink
from ampmeter.testing.replay import ReplayResponse, ReplayServer

pytestmark = pytest.mark.usefixtures("instrumented")  # conftest.py

MODEL = "gemini-embedding-001"
BATCH = f"/v1beta/models/{MODEL}:batchEmbedContents"
SINGLE = f"/v1beta/models/{MODEL}:embedContent"
RATE = Decimal("0.15") / 1_000_000  # gemini-embedding-001: $0.15 per million input tokens
TEXTS = ["The sea was calm that morning. " * 20, "The boats went out early. " * 30]
VECTOR = {"values": [0.1, -0.2, 0.3]}


def _gemini(replay: ReplayServer) -> Any:
    from google import genai
    from google.genai import types

    options = types.HttpOptions(base_url=replay.url, api_version="v1beta")
    return genai.Client(api_key="k", http_options=options)


def _embeddings(sink: MemorySink) -> list[Node]:
    return [n for n in sink.nodes if n.kind != "system"]


def test_google_genai_embed_content_is_an_embedding_node_charged_its_measured_input(
    replay: ReplayServer,
) -> None:
    replay.script(BATCH, ReplayResponse.json({"embeddings": [VECTOR, VECTOR]}))
    client = _gemini(replay)
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]) as ctx:
        result = client.models.embed_content(model=MODEL, contents=TEXTS)
    assert len(result.embeddings) == 2  # the caller's answer, as without ampmeter
    (node,) = _embeddings(sink)
    assert (node.kind, node.model, node.name) == ("embedding", MODEL, "batchEmbedContents")
    chars = sum(map(len, TEXTS))
    # The input estimate: never less than the text's tokens (a token a character at first).
    assert node.tokens_in >= chars and node.tokens_out == 0
    assert node.metadata["cost_status"] == "estimated"
    assert Decimal(str(node.cost_usd)) == node.tokens_in * RATE > 0
    assert ctx.stats.get_gauge(f"amp:cost:{MODEL}") == node.cost_usd


def test_a_cap_stops_an_embedding_request_before_it_is_sent(replay: ReplayServer) -> None:
    replay.script(BATCH, ReplayResponse.json({"embeddings": [VECTOR, VECTOR]}))
    client = _gemini(replay)
    sink = MemorySink()
    with (
        ExecutionContext(sinks=[sink], max_cost_usd=0.00001),
        pytest.raises(LimitExceeded),
    ):
        client.models.embed_content(model=MODEL, contents=TEXTS)
    assert replay.pending(BATCH) == 1  # nothing was sent
    (node,) = _embeddings(sink)
    assert node.status == "halt"


def test_embed_content_over_http_reads_the_usage_a_response_reports(
    replay: ReplayServer,
) -> None:
    """Raw ``embedContent`` (its body names the model as ``models/<model>``, the path too);
    a Vertex-style ``usageMetadata`` is the count. The title is billed input."""
    replay.script(
        SINGLE,
        ReplayResponse.json({"embedding": VECTOR, "usageMetadata": {"promptTokenCount": 77}}),
        ReplayResponse.json({"embedding": VECTOR}),
    )
    body = {
        "model": f"models/{MODEL}",
        "content": {"parts": [{"text": TEXTS[0]}]},
        "taskType": "RETRIEVAL_DOCUMENT",
        "title": "A long title " * 40,
    }
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]), httpx.Client() as client:
        client.post(replay.url + SINGLE, json=body).raise_for_status()
        client.post(replay.url + SINGLE, json=body).raise_for_status()
    reported, estimated = _embeddings(sink)
    assert (reported.model, reported.tokens_in, reported.tokens_out) == (MODEL, 77, 0)
    assert reported.metadata["cost_status"] == "priced"
    assert estimated.tokens_in >= len(TEXTS[0]) + len(body["title"])
    assert estimated.metadata["cost_status"] == "estimated"


async def test_the_async_client_embeds_through_aiohttp_metered(replay: ReplayServer) -> None:
    replay.script(BATCH, ReplayResponse.json({"embeddings": [VECTOR, VECTOR]}))
    client = _gemini(replay)
    sink = MemorySink()
    async with ExecutionContext(sinks=[sink]):
        await client.aio.models.embed_content(model=MODEL, contents=TEXTS)
    (node,) = _embeddings(sink)
    assert (node.kind, node.metadata["transport"]) == ("embedding", "aiohttp")
    assert node.tokens_in >= sum(map(len, TEXTS)) and node.cost_usd > 0


def test_odd_bodies_and_usage_are_measured_without_breaking_the_call(
    replay: ReplayServer,
) -> None:
    """Requests of the wrong shape are measured for what they hold; a count that is no int
    reads as absent (estimated)."""
    replay.script(
        BATCH,
        ReplayResponse.json({"embeddings": [VECTOR], "usageMetadata": {"promptTokenCount": "9"}}),
    )
    body = {"requests": [5, {"content": TEXTS[0]}, {"content": {"parts": "x"}, "title": 3}]}
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]), httpx.Client() as client:
        assert client.post(replay.url + BATCH, json=body).status_code == 200
    (node,) = _embeddings(sink)
    assert node.status == "success" and node.tokens_in >= len(TEXTS[0])
    assert node.metadata["cost_status"] == "estimated"
