"""An instrumented stream is the SDK's own object: frameworks that test its class still work.

Replayed provider streams (their usage is the truth) through the real ``openai`` and
``anthropic`` SDKs, sync and async, plain and raw.
"""

from __future__ import annotations

import gc
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import anthropic
import openai
import pytest

from ampmeter import ExecutionContext, LimitExceeded, Node
from ampmeter.sinks.memory import MemorySink
from ampmeter.testing import recorded
from ampmeter.testing.replay import ReplayResponse, ReplayServer
from support.wire import chat_stream

pytestmark = pytest.mark.usefixtures("instrumented")  # conftest.py

CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"
PROMPT = [{"role": "user", "content": "Weather in Paris?"}]


def llm_nodes(sink: MemorySink) -> list[Node]:
    return [n for n in sink.nodes if n.kind == "llm"]


def chat_usage() -> dict[str, Any]:
    (usage,) = [c["usage"] for c in recorded.load("openai_chat_stream_usage") if c.get("usage")]
    return usage


def anthropic_usage() -> tuple[int, int]:
    events = recorded.load("anthropic_message_stream")
    start = events[0]["data"]["message"]["usage"]
    final = [e["data"]["usage"] for e in events if e["event"] == "message_delta"][-1]
    tokens_in = (
        start["input_tokens"]
        + start["cache_read_input_tokens"]
        + start["cache_creation_input_tokens"]
    )
    return tokens_in, final["output_tokens"]


def test_openai_stream_is_the_sdks_stream_and_is_metered() -> None:
    with ReplayServer(verbatim_ids=True) as replay:  # both answers alike, ids included
        sees_what_it_saw_without_ampmeter(replay)


def sees_what_it_saw_without_ampmeter(replay: ReplayServer) -> None:
    replay.script(CHAT, recorded.openai_chat_stream_usage(), recorded.openai_chat_stream_usage())
    client = openai.OpenAI(base_url=replay.openai_base_url, api_key="k", max_retries=0)
    bare = client.chat.completions.create(model="gpt-4o-mini", messages=PROMPT, stream=True)
    bare_chunks = list(bare)
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        stream = client.chat.completions.create(model="gpt-4o-mini", messages=PROMPT, stream=True)
        assert type(stream) is openai.Stream
        assert type(stream.response) is type(bare.response)
        assert stream.response.status_code == 200
        with stream as entered:
            assert entered is stream
            chunks = list(stream)
    usage = chat_usage()
    # the usage chunk ampmeter asked for is not shown: the caller sees what it saw without it
    assert [c.model_dump() for c in chunks] == [
        c.model_dump() for c in bare_chunks if c.usage is None
    ]
    (node,) = llm_nodes(sink)
    assert node.status == "success"
    assert (node.tokens_in, node.tokens_out) == (usage["prompt_tokens"], usage["completion_tokens"])
    assert len(replay.requests) == 2


async def test_openai_async_stream_is_the_sdks_async_stream(replay: ReplayServer) -> None:
    replay.script(CHAT, recorded.openai_chat_stream_usage())
    client = openai.AsyncOpenAI(base_url=replay.openai_base_url, api_key="k", max_retries=0)
    sink = MemorySink()
    async with ExecutionContext(sinks=[sink]):
        stream = await client.chat.completions.create(
            model="gpt-4o-mini",
            messages=PROMPT,
            stream=True,
            stream_options={"include_usage": True},
        )
        assert isinstance(stream, openai.AsyncStream)
        assert type(stream) is openai.AsyncStream
        chunks = [chunk async for chunk in stream]
        await stream.close()
    usage = chat_usage()
    assert [c.usage.prompt_tokens for c in chunks if c.usage] == [usage["prompt_tokens"]]
    (node,) = llm_nodes(sink)
    assert (node.status, node.tokens_in, node.tokens_out) == (
        "success",
        usage["prompt_tokens"],
        usage["completion_tokens"],
    )


def _read_one_then_close(stream: openai.Stream[Any]) -> None:
    next(stream)  # the SDK's own __next__
    stream.close()


def _close_its_response(stream: openai.Stream[Any]) -> None:
    stream.response.close()  # as SDK helpers do, without the stream


def _leave_it(stream: openai.Stream[Any]) -> None:
    """Nothing: its response stays open, and only dropping the stream tells."""


@pytest.mark.parametrize("leave", [_read_one_then_close, _close_its_response, _leave_it])
def test_an_openai_stream_left_before_its_end_is_abandoned(
    replay: ReplayServer, leave: Callable[[openai.Stream[Any]], None]
) -> None:
    replay.script(CHAT, recorded.openai_chat_stream_usage())
    client = openai.OpenAI(base_url=replay.openai_base_url, api_key="k", max_retries=0)
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        stream = client.chat.completions.create(model="gpt-4o-mini", messages=PROMPT, stream=True)
        leave(stream)
        del stream
        gc.collect()  # the SDK's stream and its iterator refer to each other
        (node,) = llm_nodes(sink)
        assert node.status == "fail" and node.error_class == "StreamAbandoned"
        assert node.tokens_in is not None and node.tokens_in > 0


_LEFT_UNREAD_AT_EXIT = """
import atexit, sys
# Registered first, so it runs after ampmeter's own exit hook (atexit runs last-in first).
atexit.register(lambda: print([(n.kind, n.status, n.error_class) for n in sink.nodes]))
import openai
import ampmeter
from ampmeter.sinks.memory import MemorySink
ampmeter.instrument()
sink = MemorySink()
ampmeter.ExecutionContext(sinks=[sink]).__enter__()
client = openai.OpenAI(base_url=sys.argv[1], api_key="k", max_retries=0)
stream = client.chat.completions.create(
    model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], stream=True
)
"""


def test_openai_stream_left_unread_at_exit_is_abandoned(replay: ReplayServer) -> None:
    replay.script(CHAT, recorded.openai_chat_stream_usage())
    done = subprocess.run(
        [sys.executable, "-c", _LEFT_UNREAD_AT_EXIT, replay.openai_base_url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[('llm', 'fail', 'StreamAbandoned')]"
    assert "Traceback" not in done.stderr, done.stderr


def test_openai_raw_stream_response_and_its_parse_are_the_sdks(replay: ReplayServer) -> None:
    replay.script(CHAT, recorded.openai_chat_stream_usage())
    client = openai.OpenAI(base_url=replay.openai_base_url, api_key="k", max_retries=0)
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        raw = client.chat.completions.with_raw_response.create(
            model="gpt-4o-mini", messages=PROMPT, stream=True
        )
        assert type(raw).__module__.startswith("openai.")
        stream = raw.parse()
        assert type(stream) is openai.Stream and raw.parse() is stream
        list(stream)
    (node,) = llm_nodes(sink)
    assert (node.status, node.tokens_in) == ("success", chat_usage()["prompt_tokens"])


def test_openai_stream_helper_wraps_the_sdks_stream(replay: ReplayServer) -> None:
    replay.script(CHAT, recorded.openai_chat_stream_usage())
    client = openai.OpenAI(base_url=replay.openai_base_url, api_key="k", max_retries=0)
    sink = MemorySink()
    with (
        ExecutionContext(sinks=[sink]),
        client.chat.completions.stream(model="gpt-4o-mini", messages=PROMPT) as helper,
    ):
        final = helper.get_final_completion()
    usage = chat_usage()
    assert final.usage is None  # not asked for: the one ampmeter asked for stays hidden
    (node,) = llm_nodes(sink)
    assert (node.tokens_in, node.tokens_out) == (usage["prompt_tokens"], usage["completion_tokens"])


def test_anthropic_streams_are_the_sdks_streams(replay: ReplayServer) -> None:
    replay.script(MESSAGES, recorded.anthropic_message_stream())
    client = anthropic.Anthropic(base_url=replay.anthropic_base_url, api_key="k", max_retries=0)
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        stream = client.messages.create(
            model="claude-haiku-4-5", messages=PROMPT, max_tokens=50, stream=True
        )
        assert type(stream) is anthropic.Stream
        kinds = [event.type for event in stream]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    (node,) = llm_nodes(sink)
    assert (node.status, node.tokens_in, node.tokens_out) == ("success", *anthropic_usage())


async def test_anthropic_async_stream_and_a_stop_before_it(replay: ReplayServer) -> None:
    replay.script(MESSAGES, recorded.anthropic_message_stream())
    client = anthropic.AsyncAnthropic(
        base_url=replay.anthropic_base_url, api_key="k", max_retries=0
    )
    sink = MemorySink()
    async with ExecutionContext(sinks=[sink], max_steps=1):
        stream = await client.messages.create(
            model="claude-haiku-4-5", messages=PROMPT, max_tokens=50, stream=True
        )
        assert type(stream) is anthropic.AsyncStream
        async for _ in stream:
            pass
        with pytest.raises(LimitExceeded):
            await client.messages.create(
                model="claude-haiku-4-5", messages=PROMPT, max_tokens=50, stream=True
            )
    assert len(replay.requests) == 1  # the second was stopped before it was sent
    assert [n.status for n in llm_nodes(sink)] == ["success", "halt"]
    assert (llm_nodes(sink)[0].tokens_in, llm_nodes(sink)[0].tokens_out) == anthropic_usage()


# Where an object is expected, values no SDK model is built from: the SDK keeps them as they are.
HOSTILE_CHOICES: list[Any] = [5, "text", [1, 2], None, {"delta": 7, "message": [3]}]


def test_openai_choices_of_a_hostile_body_are_skipped_and_its_usage_counted(
    replay: ReplayServer,
) -> None:
    """Choices, messages and deltas that are not objects read as absent, through the SDK's own
    objects (plain and streamed): the call is not broken and the reported usage is counted."""
    usage = {"prompt_tokens": 11, "completion_tokens": 4, "total_tokens": 15}
    whole = {"id": "chatcmpl-h1", "object": "chat.completion", "choices": HOSTILE_CHOICES}
    chunk = {"id": "chatcmpl-h2", "object": "chat.completion.chunk", "choices": HOSTILE_CHOICES}
    replay.script(
        CHAT,
        ReplayResponse.json({**whole, "usage": usage}),
        chat_stream(chunk, usage),
    )
    client = openai.OpenAI(base_url=replay.openai_base_url, api_key="k", max_retries=0)
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        client.chat.completions.create(model="gpt-4o-mini", messages=PROMPT)
        chunks = list(
            client.chat.completions.create(model="gpt-4o-mini", messages=PROMPT, stream=True)
        )
    assert [c.choices[:4] for c in chunks] == [HOSTILE_CHOICES[:4]]  # not the usage chunk
    nodes = llm_nodes(sink)
    assert [(n.status, n.tokens_in, n.tokens_out) for n in nodes] == [("success", 11, 4)] * 2
