"""Amazon Bedrock's runtime API is metered at the HTTP layer: boto3's ``bedrock-runtime``
client (Converse, InvokeModel, and their streams) and LiteLLM's ``bedrock/`` models.

None of it was routed: every Bedrock call went out unmetered, counted as nothing and past every
cap. The replay server answers as Bedrock does, streams in its binary event frames.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import anthropic
import boto3
import genai_prices
import httpx
import litellm
import pytest

from ampmeter import ExecutionContext, LimitExceeded, Node
from ampmeter.sinks.memory import MemorySink
from ampmeter.testing.replay import ReplayResponse, ReplayServer
from support.aws_events import event_stream, frame, invoke_chunk

pytestmark = pytest.mark.usefixtures("instrumented")  # conftest.py

MODEL = "anthropic.claude-3-5-haiku-20241022-v1:0"
BASE = "/model/anthropic.claude-3-5-haiku-20241022-v1%3A0"
PROMPT = [{"role": "user", "content": [{"text": "Name three rivers."}]}]
USAGE = {
    "inputTokens": 12,
    "cacheReadInputTokens": 100,
    "cacheWriteInputTokens": 20,
    "outputTokens": 5,
    "totalTokens": 137,
}
# An Anthropic Messages answer, as InvokeModel and the anthropic SDK's Bedrock client get it.
MESSAGE = {
    "id": "msg_bdrk_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-3-5-haiku-20241022",
    "content": [{"type": "text", "text": "Nile."}],
    "stop_reason": "end_turn",
    "usage": {"input_tokens": 14, "output_tokens": 4},
}
ANSWER = {
    "output": {"message": {"role": "assistant", "content": [{"text": "Nile, Amazon, Rhine."}]}},
    "stopReason": "end_turn",
    "usage": USAGE,
    "metrics": {"latencyMs": 120},
}


def bedrock(replay: ReplayServer) -> Any:
    return boto3.client(
        "bedrock-runtime",
        region_name="us-east-1",
        endpoint_url=replay.url,
        aws_access_key_id="AKIDEXAMPLE",
        aws_secret_access_key="secret",
    )


def calls(sink: MemorySink) -> list[Node]:
    return [node for node in sink.nodes if node.kind == "llm"]


def table_cost_of(model: str, uncached: int, read: int, written: int, output: int) -> Decimal:
    usage = genai_prices.Usage(
        input_tokens=uncached + read + written,
        cache_read_tokens=read,
        cache_write_tokens=written,
        output_tokens=output,
    )
    return genai_prices.calc_price(usage, model, provider_id="aws").total_price


def table_cost(uncached: int, read: int, written: int, output: int) -> Decimal:
    return table_cost_of(MODEL, uncached, read, written, output)


def test_a_converse_call_is_charged_its_usage_at_bedrocks_price(replay: ReplayServer) -> None:
    replay.script(f"{BASE}/converse", ReplayResponse.json(ANSWER))
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]) as ctx:
        answer = bedrock(replay).converse(
            modelId=MODEL, messages=PROMPT, inferenceConfig={"maxTokens": 200}
        )
    assert answer["output"]["message"]["content"][0]["text"] == "Nile, Amazon, Rhine."
    (node,) = calls(sink)
    assert (node.name, node.model, node.status) == ("converse", MODEL, "success")
    # Bedrock counts the cache's tokens beside the input, not inside it.
    assert (node.tokens_in, node.tokens_out) == (132, 5)
    assert node.metadata["cached_tokens"] == 100 and node.metadata["cache_write_tokens"] == 20
    assert node.cost_usd == ctx.stats.total_cost() == table_cost(12, 100, 20, 5) > 0


def test_a_converse_calls_one_hour_cache_writes_are_charged_at_their_rate(
    replay: ReplayServer,
) -> None:
    model = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"
    details = [{"ttl": "1h", "inputTokens": 15}, {"ttl": "5m", "inputTokens": 5}]
    replay.script(
        "/model/us.anthropic.claude-sonnet-4-5-20250929-v1%3A0/converse",
        ReplayResponse.json({**ANSWER, "usage": {**USAGE, "cacheDetails": details}}),
    )
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        bedrock(replay).converse(modelId=model, messages=PROMPT)
    (node,) = calls(sink)
    usage = genai_prices.Usage(
        input_tokens=132,
        cache_read_tokens=100,
        cache_write_tokens=20,
        cache_write_1h_tokens=15,
        output_tokens=5,
    )
    expected = genai_prices.calc_price(usage, model, provider_id="aws").total_price
    assert node.metadata["cache_write_1h_tokens"] == 15
    assert node.cost_usd == expected > table_cost_of(model, 12, 100, 20, 5)


def test_a_converse_stream_is_read_from_its_event_frames(replay: ReplayServer) -> None:
    frames = [
        frame("messageStart", {"role": "assistant"}),
        frame("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "Nile, "}}),
        frame("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "Amazon."}}),
        frame("contentBlockStop", {"contentBlockIndex": 0}),
        frame("messageStop", {"stopReason": "end_turn"}),
        frame("metadata", {"usage": USAGE, "metrics": {"latencyMs": 90}}),
    ]
    replay.script(f"{BASE}/converse-stream", event_stream(frames))
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        answer = bedrock(replay).converse_stream(modelId=MODEL, messages=PROMPT)
        text = "".join(
            event["contentBlockDelta"]["delta"]["text"]
            for event in answer["stream"]
            if "contentBlockDelta" in event
        )
    assert text == "Nile, Amazon."  # the caller reads the stream as it came
    (node,) = calls(sink)
    assert (node.name, node.tokens_in, node.tokens_out) == ("converse_stream", 132, 5)
    assert node.metadata["cost_status"] == "priced"


def test_a_converse_stream_cut_before_its_usage_is_charged_an_estimate(
    replay: ReplayServer,
) -> None:
    frames = [
        frame("messageStart", {"role": "assistant"}),
        frame("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "Nile, " * 20}}),
        frame("metadata", {"usage": USAGE}),
    ]
    replay.script(f"{BASE}/converse-stream", event_stream(frames, cut_after=2))
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        answer = bedrock(replay).converse_stream(modelId=MODEL, messages=PROMPT)
        with pytest.raises(Exception):  # noqa: B017 (botocore's own error for a cut body)
            list(answer["stream"])
    (node,) = calls(sink)
    assert node.tokens_in is not None and node.tokens_in > 0
    assert node.tokens_out is not None and node.tokens_out >= 20
    assert node.metadata["cost_status"] == "estimated" and node.cost_usd > 0


def test_a_bedrock_call_that_would_pass_the_cap_is_refused_before_it_is_sent(
    replay: ReplayServer,
) -> None:
    """The stop reaches the caller as itself: botocore wrapped it as an HTTP client error and
    retried it as a connection error, each retry one more refused node."""
    replay.script(f"{BASE}/converse", ReplayResponse.json(ANSWER))
    sink = MemorySink()
    with ExecutionContext(sinks=[sink], max_cost_usd=0.0001), pytest.raises(LimitExceeded):
        bedrock(replay).converse(
            modelId=MODEL, messages=PROMPT, inferenceConfig={"maxTokens": 4000}
        )
    assert replay.requests == []
    (refused,) = calls(sink)
    assert refused.status == "halt"


def test_invoke_model_with_an_anthropic_body_plain_and_streamed(replay: ReplayServer) -> None:
    start = {**MESSAGE, "content": [], "stop_reason": None, "usage": {**MESSAGE["usage"]}}
    start["usage"]["output_tokens"] = 1
    events = [
        {"type": "message_start", "message": start},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "N"}},
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn"},
            "usage": {"output_tokens": 9},
        },
        {"type": "message_stop"},
    ]
    replay.script(f"{BASE}/invoke", ReplayResponse.json(MESSAGE))
    replay.script(
        f"{BASE}/invoke-with-response-stream", event_stream([invoke_chunk(e) for e in events])
    )
    body = (
        '{"anthropic_version": "bedrock-2023-05-31", "max_tokens": 100, '
        '"messages": [{"role": "user", "content": "Name a river."}]}'
    )
    sink = MemorySink()
    client = bedrock(replay)
    with ExecutionContext(sinks=[sink]):
        answer = client.invoke_model(modelId=MODEL, body=body)["body"].read()
        assert b'"Nile."' in answer
        streamed = client.invoke_model_with_response_stream(modelId=MODEL, body=body)
        assert len(list(streamed["body"])) == len(events)
    plain, stream = calls(sink)
    assert (plain.name, plain.tokens_in, plain.tokens_out) == ("invoke_model", 14, 4)
    assert (stream.tokens_in, stream.tokens_out) == (14, 9)
    assert stream.name == "invoke_model_with_response_stream" and plain.cost_usd > 0


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_litellm_bedrock_models_are_metered(replay: ReplayServer, stream: bool) -> None:
    if stream:
        frames = [
            frame("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "Nile."}}),
            frame("messageStop", {"stopReason": "end_turn"}),
            frame("metadata", {"usage": USAGE}),
        ]
        replay.script(f"{BASE}/converse-stream", event_stream(frames))
    else:
        replay.script(f"{BASE}/converse", ReplayResponse.json(ANSWER))
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]) as ctx:
        answer = litellm.completion(
            model=f"bedrock/{MODEL}",
            messages=[{"role": "user", "content": "Name three rivers."}],
            stream=stream,
            aws_access_key_id="AKIDEXAMPLE",
            aws_secret_access_key="secret",
            aws_region_name="us-east-1",
            aws_bedrock_runtime_endpoint=replay.url,
        )
        if stream:
            list(answer)
    (node,) = calls(sink)
    assert (node.model, node.tokens_in, node.tokens_out) == (MODEL, 132, 5)
    assert ctx.stats.total_cost() == table_cost(12, 100, 20, 5)


def test_anthropics_bedrock_client_is_priced_at_bedrocks_price(replay: ReplayServer) -> None:
    """The anthropic SDK's Bedrock client is metered at the SDK's door, once, as a Messages
    call naming a Bedrock model id: priced at the table's ``aws`` price (it was unpriced)."""
    replay.script(f"/model/{MODEL}/invoke", ReplayResponse.json(MESSAGE))
    client = anthropic.AnthropicBedrock(
        aws_access_key="AKIDEXAMPLE",
        aws_secret_key="secret",
        aws_region="us-east-1",
        base_url=replay.url,
        max_retries=0,
    )
    sink = MemorySink()
    with ExecutionContext(sinks=[sink], max_cost_usd=1) as ctx:  # (refused when unpriced)
        client.messages.create(
            model=MODEL, max_tokens=100, messages=[{"role": "user", "content": "A river?"}]
        )
    (node,) = calls(sink)
    assert (node.name, node.tokens_in, node.tokens_out) == ("messages.create", 14, 4)
    assert node.cost_usd == ctx.stats.total_cost() == table_cost(14, 0, 0, 4)


def test_a_corrupt_event_frame_reaches_the_caller_and_the_call_is_charged(
    replay: ReplayServer,
) -> None:
    """A frame whose checksum does not match (a proxy's damage) raised out of ampmeter's reader
    into the caller's read; the caller now gets every byte, and the call, its usage never read,
    is charged an estimate."""
    good = frame("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "Nile. " * 10}})
    bad = bytearray(frame("metadata", {"usage": USAGE}))
    bad[-1] ^= 0xFF
    replay.script(f"{BASE}/converse-stream", event_stream([good, bytes(bad)]))
    body = {"messages": PROMPT, "inferenceConfig": {"maxTokens": 200}}
    sink = MemorySink()
    url = f"{replay.url}{BASE}/converse-stream"
    with (
        ExecutionContext(sinks=[sink]),
        httpx.Client() as client,
        client.stream("POST", url, json=body) as answer,
    ):
        received = b"".join(answer.iter_bytes())
    assert received == good + bytes(bad)
    (node,) = calls(sink)
    assert node.tokens_out is not None and node.tokens_out >= 60
    assert node.metadata["cost_status"] == "estimated" and node.cost_usd > 0
