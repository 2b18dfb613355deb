"""HTTP-layer metering: clients the SDK patches do not cover, over real httpx / httpx2.

LiteLLM's own handlers (``hosted_vllm/`` and ``anthropic/``) talk to the real llama.cpp server;
google-genai, raw httpx and error cases talk to the replay server's recorded wire bodies.
"""

from __future__ import annotations

import asyncio
import builtins
import sys
from dataclasses import replace
from typing import Any

import httpx
import httpx2
import litellm
import openai
import pytest

from ampmeter import ExecutionContext, Limit, LimitExceeded, Node, find_limit_exceeded
from ampmeter.integrations import instrument, uninstrument
from ampmeter.integrations.http import META_TRANSPORT
from ampmeter.integrations.lifecycle import META_OPERATION, META_USAGE_ESTIMATED
from ampmeter.keys import KEY_INPUT_TOKENS, KEY_LLM_CALLS
from ampmeter.local_llm import LocalLLMServer
from ampmeter.sinks.memory import MemorySink
from ampmeter.testing import recorded
from ampmeter.testing.billing import BillingProvider
from ampmeter.testing.replay import ReplayServer

litellm.suppress_debug_info = True

MESSAGES = [{"role": "user", "content": "Name one colour."}]
GEMINI = "/v1beta/models/gemini-2.5-flash:generateContent"
GEMINI_STREAM = "/v1beta/models/gemini-2.0-flash:streamGenerateContent"


pytestmark = pytest.mark.usefixtures("instrumented")  # conftest.py


def calls(sink: MemorySink) -> list[Node]:
    return [n for n in sink.nodes if n.kind in ("llm", "embedding")]


def only(sink: MemorySink) -> Node:
    (node,) = calls(sink)
    return node


def vllm(server: LocalLLMServer) -> dict[str, Any]:
    return {"model": "hosted_vllm/" + server.model, "api_base": server.base_url, "api_key": "k"}


def claude(server: LocalLLMServer) -> dict[str, Any]:
    return {"model": "anthropic/" + server.model, "api_base": server.url, "api_key": "k"}


# -- LiteLLM's own handlers against the real server ------------------------------------------------


@pytest.mark.parametrize("route", [vllm, claude], ids=["hosted_vllm", "anthropic"])
def test_litellm_completion_records_the_server_usage(
    llm_server: LocalLLMServer, route: Any
) -> None:
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]) as ctx:
        resp = litellm.completion(**route(llm_server), messages=MESSAGES, max_tokens=5)
    node = only(sink)
    assert (node.tokens_in, node.tokens_out) == (
        resp.usage.prompt_tokens,
        resp.usage.completion_tokens,
    )
    assert node.status == "success"
    assert node.model == llm_server.model
    assert node.metadata[META_TRANSPORT] == "httpx"
    assert ctx.stats.get_counter(KEY_LLM_CALLS) == 1
    assert ctx.stats.get_counter(KEY_INPUT_TOKENS) == resp.usage.prompt_tokens


@pytest.mark.parametrize("route", [vllm, claude], ids=["hosted_vllm", "anthropic"])
@pytest.mark.usefixtures("litellm_streams_collected")
def test_litellm_stream_records_the_usage_it_reports(
    llm_server: LocalLLMServer, route: Any
) -> None:
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        chunks = list(
            litellm.completion(
                **route(llm_server),
                messages=MESSAGES,
                max_tokens=5,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
    usage = [c.usage for c in chunks if getattr(c, "usage", None) is not None][-1]
    node = only(sink)
    assert (node.tokens_in, node.tokens_out) == (usage.prompt_tokens, usage.completion_tokens)
    assert node.status == "success"


@pytest.mark.usefixtures("litellm_streams_collected")
def test_litellm_stream_without_usage_gets_it_and_hides_the_extra_chunk(
    llm_server: LocalLLMServer,
) -> None:
    args = {**vllm(llm_server), "messages": MESSAGES, "max_tokens": 5, "temperature": 0}
    plain = litellm.completion(**args)
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        chunks = list(litellm.completion(**args, stream=True))
    node = only(sink)
    assert (node.tokens_in, node.tokens_out) == (
        plain.usage.prompt_tokens,
        plain.usage.completion_tokens,
    )
    assert META_USAGE_ESTIMATED not in node.metadata
    assert chunks and all(c.choices for c in chunks)  # the caller sees no usage-only chunk


@pytest.mark.usefixtures("litellm_streams_collected")
async def test_litellm_async_goes_through_its_aiohttp_transport_and_is_metered(
    llm_server: LocalLLMServer,
) -> None:
    sink = MemorySink()
    async with ExecutionContext(sinks=[sink]):
        resp = await litellm.acompletion(**vllm(llm_server), messages=MESSAGES, max_tokens=5)
        stream = await litellm.acompletion(
            **claude(llm_server),
            messages=MESSAGES,
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
        streamed = [c async for c in stream]
    first, second = calls(sink)
    assert (first.tokens_in, first.tokens_out) == (
        resp.usage.prompt_tokens,
        resp.usage.completion_tokens,
    )
    usage = [c.usage for c in streamed if getattr(c, "usage", None) is not None][-1]
    assert (second.tokens_in, second.tokens_out) == (usage.prompt_tokens, usage.completion_tokens)


def test_litellm_responses_is_metered(llm_server: LocalLLMServer) -> None:
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        resp = litellm.responses(**vllm(llm_server), input="Name one colour.", max_output_tokens=5)
    node = only(sink)
    assert node.metadata[META_OPERATION] == "responses"
    assert (node.tokens_in, node.tokens_out) == (resp.usage.input_tokens, resp.usage.output_tokens)


# -- one layer per request ---------------------------------------------------------------------


def test_a_request_metered_by_the_sdk_patch_is_not_counted_again(
    openai_client: openai.OpenAI, llm_server: LocalLLMServer
) -> None:
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        resp = openai_client.chat.completions.create(
            model=llm_server.model, messages=MESSAGES, max_tokens=4
        )
    node = only(sink)
    assert node.metadata[META_OPERATION] == "chat.completions.create"  # the SDK layer's name
    assert META_TRANSPORT not in node.metadata
    assert resp.usage is not None and node.tokens_in == resp.usage.prompt_tokens


async def test_an_sdk_without_its_patch_is_metered_once_at_the_http_layer(
    llm_server: LocalLLMServer,
) -> None:
    uninstrument()
    instrument(openai=False)
    sink = MemorySink()
    client = openai.OpenAI(base_url=llm_server.base_url, api_key="k", max_retries=0)
    with client, ExecutionContext(sinks=[sink]):
        resp = client.chat.completions.create(
            model=llm_server.model, messages=MESSAGES, max_tokens=4
        )
        chunks = list(
            client.chat.completions.create(
                model=llm_server.model, messages=MESSAGES, max_tokens=4, stream=True
            )
        )
    plain, streamed = calls(sink)
    assert plain.metadata[META_TRANSPORT] == "httpx2"  # openai >= 3 sends with httpx2
    assert plain.metadata[META_OPERATION] == "chat.completions"
    assert resp.usage is not None
    assert (plain.tokens_in, plain.tokens_out) == (
        resp.usage.prompt_tokens,
        resp.usage.completion_tokens,
    )
    assert streamed.tokens_in == resp.usage.prompt_tokens and META_USAGE_ESTIMATED not in (
        streamed.metadata
    )
    assert all(c.choices for c in chunks)
    async with openai.AsyncOpenAI(base_url=llm_server.base_url, api_key="k") as aclient:
        sink = MemorySink()
        async with ExecutionContext(sinks=[sink]):
            aresp = await aclient.chat.completions.create(
                model=llm_server.model, messages=MESSAGES, max_tokens=4
            )
        assert aresp.usage is not None
        assert only(sink).tokens_in == aresp.usage.prompt_tokens


# -- limits stop the request before it is sent ----------------------------------------------------


def test_a_stop_sends_nothing_and_litellm_surfaces_it_as_a_client_error(
    replay: ReplayServer,
) -> None:
    sink = MemorySink()
    with ExecutionContext(max_steps=0, sinks=[sink]), pytest.raises(Exception) as caught:
        litellm.completion(
            model="hosted_vllm/m",
            api_base=replay.openai_base_url,
            api_key="k",
            messages=MESSAGES,
            max_tokens=5,
        )
    assert replay.requests == []  # not a byte left the process
    error = caught.value
    assert isinstance(error, litellm.BadRequestError)  # not a retried 500
    assert error.status_code == 400
    stop = find_limit_exceeded(error)
    assert isinstance(stop, LimitExceeded) and stop.node_id is not None
    assert only(sink).status == "halt"


def test_raw_httpx_over_the_limit_raises_before_sending(replay: ReplayServer) -> None:
    with ExecutionContext(max_steps=0), pytest.raises(LimitExceeded):
        httpx.post(
            replay.openai_base_url + "/chat/completions",
            json={"model": "gpt-4o-mini", "messages": MESSAGES},
        )
    assert replay.requests == []


def test_litellm_router_keeps_serving_other_contexts_after_one_is_stopped(
    llm_server: LocalLLMServer,
) -> None:
    router = litellm.Router(
        model_list=[{"model_name": "local", "litellm_params": vllm(llm_server)}],
        num_retries=2,
        allowed_fails=0,
    )
    stopped = MemorySink()
    with (
        ExecutionContext(max_steps=0, sinks=[stopped]),
        pytest.raises(litellm.BadRequestError) as caught,
    ):
        router.completion(model="local", messages=MESSAGES, max_tokens=4)
    assert find_limit_exceeded(caught.value) is not None
    assert len(calls(stopped)) == 1  # neither LiteLLM nor its Router retried the stop
    served = MemorySink()
    with ExecutionContext(max_steps=5, sinks=[served]):
        resp = router.completion(model="local", messages=MESSAGES, max_tokens=4)
    assert only(served).status == "success"
    assert only(served).tokens_in == resp.usage.prompt_tokens


# -- google-genai and raw httpx against recorded wire bodies -----------------------------------


def gemini_client(replay: ReplayServer) -> Any:
    from google import genai
    from google.genai import types

    options = types.HttpOptions(base_url=replay.url, api_version="v1beta")
    return genai.Client(api_key="gemini-secret", http_options=options)


def test_google_genai_generate_content(replay: ReplayServer) -> None:
    from google.genai import types

    replay.script(GEMINI, recorded.gemini_generate_content())
    sink = MemorySink()
    client = gemini_client(replay)  # kept: the SDK closes its HTTP client when collected
    with ExecutionContext(sinks=[sink]):
        client.models.generate_content(
            model="gemini-2.5-flash",
            contents="Weather in Paris and Oslo?",
            config=types.GenerateContentConfig(max_output_tokens=300),
        )
    usage = recorded.load("gemini_generate_content")["usageMetadata"]
    node = only(sink)
    assert node.model == "gemini-2.5-flash"
    assert node.tokens_in == usage["promptTokenCount"]
    assert node.tokens_out == usage["candidatesTokenCount"] + usage["thoughtsTokenCount"]
    assert node.metadata["cached_tokens"] == usage["cachedContentTokenCount"]
    assert node.metadata["reasoning_tokens"] == usage["thoughtsTokenCount"]
    assert node.metadata["tool_calls_made"] == 2
    assert node.metadata["cost_status"] == "priced" and node.cost_usd > 0
    assert "gemini-secret" not in repr(node.to_dict())
    assert replay.requests[0].json()["generationConfig"]["maxOutputTokens"] == 300


def test_google_genai_stream(replay: ReplayServer) -> None:
    replay.script(GEMINI_STREAM, recorded.gemini_stream_generate_content())
    sink = MemorySink()
    client = gemini_client(replay)
    with ExecutionContext(sinks=[sink]):
        chunks = list(
            client.models.generate_content_stream(model="gemini-2.0-flash", contents="The answer?")
        )
    last = recorded.load("gemini_stream_generate_content")[-1]["usageMetadata"]
    assert len(chunks) == 3
    node = only(sink)
    assert (node.tokens_in, node.tokens_out) == (
        last["promptTokenCount"],
        last["candidatesTokenCount"],
    )
    assert node.status == "success"
    assert replay.requests[0].query == "alt=sse"


@pytest.mark.parametrize("module", [httpx, httpx2], ids=["httpx", "httpx2"])
def test_raw_client_embeddings_become_embedding_nodes(replay: ReplayServer, module: Any) -> None:
    replay.script("/v1/embeddings", recorded.openai_embeddings())
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]) as ctx, module.Client() as client:
        client.post(
            replay.openai_base_url + "/embeddings",
            json={"model": "text-embedding-3-small", "input": ["a", "b"]},
        )
    node = only(sink)
    assert node.kind == "embedding"
    assert node.tokens_in == recorded.load("openai_embeddings")["usage"]["prompt_tokens"]
    assert node.tokens_out == 0
    assert node.model == "text-embedding-3-small"
    assert node.metadata["cost_status"] == "priced" and node.cost_usd > 0
    assert node.metadata[META_TRANSPORT] == module.__name__
    # Embeddings count in the context's stats (and so against its limits) like any usage.
    assert ctx.stats.get_counter("amp:input_tokens:text-embedding-3-small") == node.tokens_in
    assert ctx.stats.total_cost() == node.cost_usd
    assert ctx.stats.get_counter("amp:llm_calls") == 0


def test_gemini_stream_sent_as_one_json_array() -> None:
    sink = MemorySink()
    body = {"contents": [{"role": "user", "parts": [{"text": "The answer?"}]}]}
    with ReplayServer(verbatim_ids=True) as replay:  # the recorded bytes, ids included
        replay.script(GEMINI_STREAM, recorded.gemini_stream_generate_content(sse=False))
        with (
            ExecutionContext(sinks=[sink]),
            httpx.Client() as client,
            client.stream("POST", replay.url + GEMINI_STREAM, json=body) as response,
        ):
            raw = b"".join(response.iter_raw())
    assert raw == recorded.gemini_stream_generate_content(sse=False).body
    assert (only(sink).tokens_in, only(sink).tokens_out) == (12, 6)


async def test_async_raw_stream_closed_early_counts_what_it_saw(replay: ReplayServer) -> None:
    replay.script("/v1/chat/completions", recorded.openai_chat_stream_usage())
    sink = MemorySink()
    body = {
        "model": "gpt-4o-mini",
        "messages": MESSAGES,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with ExecutionContext(sinks=[sink]), httpx.AsyncClient() as client:
        url = replay.openai_base_url + "/chat/completions"
        async with client.stream("POST", url, json=body) as response:
            async for _line in response.aiter_lines():
                break  # the caller stops after the first piece
    node = only(sink)
    assert node.status == "fail" and node.error_class == "StreamAbandoned"
    assert node.metadata[META_USAGE_ESTIMATED] is True


async def test_an_aiohttp_stream_cut_by_the_provider_is_charged_at_once(
    replay: ReplayServer,
) -> None:
    """The provider drops a stream it bills: the read's error ends the call there, charged
    (the input's estimate and the output received), not when the response is collected."""
    import aiohttp

    replay.script("/v1/chat/completions", recorded.openai_chat_stream_usage(cut_after=2))
    sink = MemorySink()
    body = {"model": "gpt-4o-mini", "messages": MESSAGES, "stream": True}
    async with aiohttp.ClientSession() as session, ExecutionContext(sinks=[sink]) as ctx:
        post = session.post(replay.openai_base_url + "/chat/completions", json=body)
        with pytest.raises(aiohttp.ClientPayloadError):
            async with post as response:
                async for _line in response.content:
                    pass
        assert ctx.stats.total_cost() > 0  # (the response is still alive here)
    node = only(sink)
    assert node.status == "fail" and node.error_class == "ClientPayloadError"
    assert node.metadata["cost_status"] == "estimated" and node.tokens_in > 0


async def test_an_aiohttp_request_whose_answer_times_out_is_charged_its_estimate() -> None:
    """Sent, then the read timed out: the provider bills it all the same (its bill unknown,
    the call is charged its estimate); one that could not connect is free."""
    import aiohttp

    body = {"model": "gpt-4o-mini", "messages": MESSAGES, "max_tokens": 30}
    sink = MemorySink()
    with BillingProvider(delay_s=0.5) as bill:
        async with aiohttp.ClientSession() as session, ExecutionContext(sinks=[sink]):
            for url in (bill.openai_base_url, "http://127.0.0.1:9/v1"):
                post = session.post(
                    url + "/chat/completions", json=body, timeout=aiohttp.ClientTimeout(0.1)
                )
                with pytest.raises((asyncio.TimeoutError, aiohttp.ClientError)):
                    await post
    timed_out, unreachable = calls(sink)
    assert timed_out.tokens_out == 30 and timed_out.cost_usd > 0
    assert timed_out.metadata[META_USAGE_ESTIMATED] is True
    assert unreachable.cost_usd == 0 and unreachable.error_class == "ClientConnectorError"


def test_an_error_status_fails_the_node_without_usage(replay: ReplayServer) -> None:
    replay.script("/v1/messages", recorded.anthropic_error(500))
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        response = httpx.post(
            replay.url + "/v1/messages",
            json={"model": "claude-3-5-haiku-latest", "max_tokens": 10, "messages": MESSAGES},
        )
    assert response.status_code == 500
    node = only(sink)
    assert node.status == "fail" and node.tokens_in is None


def test_requests_outside_a_context_or_of_unknown_paths_are_left_alone(
    replay: ReplayServer,
) -> None:
    replay.script("/v1/chat/completions", recorded.openai_chat_tool_calls())
    replay.script("/v1/other", recorded.openai_chat_tool_calls())
    httpx.post(replay.openai_base_url + "/chat/completions", json={"model": "m"})  # no context
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        httpx.post(replay.openai_base_url + "/other", json={"model": "m"})
    assert calls(sink) == []


def test_a_body_whose_model_is_no_string_is_no_llm_request(replay: ReplayServer) -> None:
    """A model that is not text (a hostile or broken body's number) names no model: the
    request is left alone, embeddings included, and the caller's request goes through."""
    replay.script("/v1/embeddings", recorded.openai_chat_tool_calls())
    replay.script("/v1/chat/completions", recorded.openai_chat_tool_calls())
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        for path in ("/embeddings", "/chat/completions"):
            body = {"model": 5, "input": "a cat", "messages": []}
            assert httpx.post(replay.openai_base_url + path, json=body).status_code == 200
    assert calls(sink) == []


def test_uninstrument_restores_the_clients_exactly() -> None:
    patched = httpx.Client.__dict__["send"], httpx2.AsyncClient.__dict__["send"]
    uninstrument()
    restored = httpx.Client.__dict__["send"], httpx2.AsyncClient.__dict__["send"]
    assert restored == (patched[0].__wrapped__, patched[1].__wrapped__)
    instrument()
    again = httpx.Client.__dict__["send"]
    assert again is not restored[0] and again.__wrapped__ is restored[0]


def test_find_limit_exceeded_follows_causes_groups_and_retries() -> None:
    import tenacity

    stop = LimitExceeded("stopped")
    try:
        try:
            raise stop
        except LimitExceeded as inner:
            raise RuntimeError("generation failed") from inner  # smolagents' way
    except RuntimeError as wrapped:
        assert find_limit_exceeded(wrapped) is stop
    group_type = getattr(builtins, "ExceptionGroup", None)  # Python 3.11+
    if group_type is not None:
        assert find_limit_exceeded(group_type("many", [ValueError("x"), stop])) is stop

    @tenacity.retry(stop=tenacity.stop_after_attempt(2), wait=tenacity.wait_none())
    def always_stopped() -> None:
        raise LimitExceeded("again")

    with pytest.raises(tenacity.RetryError) as retried:
        always_stopped()
    assert isinstance(find_limit_exceeded(retried.value), LimitExceeded)
    assert find_limit_exceeded(ValueError("unrelated")) is None
    assert find_limit_exceeded(None) is None


# -- a stream belongs to the context it was created in -----------------------------------------


def test_streams_created_in_a_context_are_metered_there_when_read_after_it_closed(
    openai_client: openai.OpenAI, llm_server: LocalLLMServer
) -> None:
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]) as ctx:
        sdk_stream = openai_client.chat.completions.create(
            model=llm_server.model,
            messages=MESSAGES,
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
        http_stream = litellm.completion(
            **claude(llm_server),
            messages=MESSAGES,
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
    assert calls(sink) == []  # nothing has ended yet
    sdk_usage = [c.usage for c in sdk_stream if c.usage is not None][-1]
    http_usage = [c.usage for c in http_stream if getattr(c, "usage", None) is not None][-1]
    first, second = calls(sink)
    assert (first.tokens_in, first.tokens_out) == (
        sdk_usage.prompt_tokens,
        sdk_usage.completion_tokens,
    )
    assert (second.tokens_in, second.tokens_out) == (
        http_usage.prompt_tokens,
        http_usage.completion_tokens,
    )
    assert ctx.stats.get_counter(KEY_INPUT_TOKENS) == (
        sdk_usage.prompt_tokens + http_usage.prompt_tokens
    )
    assert ctx.snapshot()["graph"]["aggregates"]["in_flight"] == 0


# -- lazy patching -------------------------------------------------------------------------------


def test_instrument_imports_nothing_and_patches_each_library_when_it_is_imported() -> None:
    import subprocess

    program = (
        "import sys, ampmeter\n"
        "assert ampmeter.instrument() == ['threading']\n"  # the one module already imported
        "assert not {'openai', 'anthropic', 'httpx', 'httpx2', 'http.client', 'urllib3'}"
        " & set(sys.modules)\n"
        "import httpx, openai, requests, http.client, websockets.sync.client\n"
        # metering websockets does not import its deprecated legacy client (that warns)
        "assert 'websockets.legacy.client' not in sys.modules\n"
        "assert hasattr(http.client.HTTPConnection.request, '__wrapped__')\n"
        "assert hasattr(http.client.HTTPResponse.read, '__wrapped__')\n"
        "from openai._base_client import SyncAPIClient\n"
        "assert hasattr(httpx.Client.send, '__wrapped__')\n"
        "assert hasattr(SyncAPIClient.request, '__wrapped__')\n"
        "assert 'anthropic' not in sys.modules\n"
        "ampmeter.uninstrument()\n"
        "assert not hasattr(httpx.Client.send, '__wrapped__')\n"
        "assert not hasattr(http.client.HTTPConnection.request, '__wrapped__')\n"
        "assert not hasattr(SyncAPIClient.request, '__wrapped__')\n"
        "import anthropic\n"  # after uninstrument(): left alone
        "from anthropic._base_client import SyncAPIClient as AnthropicClient\n"
        "assert not hasattr(AnthropicClient.request, '__wrapped__')\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_a_path_that_only_looks_like_a_wire_format_is_left_alone(replay: ReplayServer) -> None:
    # the Assistants API adds a message to a thread: no model, no LLM call
    replay.script("/v1/threads/thread_1/messages", recorded.openai_chat_tool_calls())
    sink = MemorySink()
    with ExecutionContext(max_steps=0, sinks=[sink]):
        httpx.post(
            replay.openai_base_url + "/threads/thread_1/messages",
            json={"role": "user", "content": "hello"},
        )
    assert calls(sink) == []
    assert len(replay.requests) == 1


# -- aiohttp (google-genai's async client) -----------------------------------------------------


async def test_google_genai_async_sends_with_aiohttp_and_is_metered(replay: ReplayServer) -> None:
    replay.script(GEMINI, recorded.gemini_generate_content())
    replay.script(GEMINI_STREAM, recorded.gemini_stream_generate_content())
    client = gemini_client(replay)
    sink = MemorySink()
    async with ExecutionContext(sinks=[sink]):
        await client.aio.models.generate_content(model="gemini-2.5-flash", contents="Weather?")
        stream = await client.aio.models.generate_content_stream(
            model="gemini-2.0-flash", contents="The answer?"
        )
        chunks = [chunk async for chunk in stream]
    plain, streamed = calls(sink)
    usage = recorded.load("gemini_generate_content")["usageMetadata"]
    assert plain.metadata[META_TRANSPORT] == "aiohttp"
    assert plain.tokens_in == usage["promptTokenCount"]
    assert plain.tokens_out == usage["candidatesTokenCount"] + usage["thoughtsTokenCount"]
    assert len(chunks) == 3 and (streamed.tokens_in, streamed.tokens_out) == (12, 6)


async def test_raw_aiohttp_over_the_limit_sends_nothing(replay: ReplayServer) -> None:
    import aiohttp

    replay.script("/v1/messages", recorded.anthropic_message_tool_use())
    body = {"model": "claude-3-5-haiku-latest", "max_tokens": 100, "messages": MESSAGES}
    sink = MemorySink()
    async with aiohttp.ClientSession() as session:
        async with (
            ExecutionContext(sinks=[sink]),
            session.post(replay.url + "/v1/messages", json=body) as response,
        ):
            answer = await response.json()
        with pytest.raises(LimitExceeded):
            async with ExecutionContext(max_steps=0):
                await session.post(replay.url + "/v1/messages", json=body)
    assert len(replay.requests) == 1
    usage = answer["usage"]
    node = only(sink)
    assert node.tokens_in == (
        usage["input_tokens"]
        + usage["cache_read_input_tokens"]
        + usage["cache_creation_input_tokens"]
    )
    assert node.tokens_out == usage["output_tokens"]


def _sse_chunks(body: bytes) -> list[dict[str, Any]]:
    import json

    lines = [line[5:].strip() for line in body.splitlines() if line.startswith(b"data:")]
    return [json.loads(line) for line in lines if line != b"[DONE]"]


@pytest.mark.parametrize("read", ["lines", "whole", "any", "chunks", "readchunk"])
async def test_aiohttp_stream_without_usage_gets_it_and_hides_the_extra_chunk(
    llm_server: LocalLLMServer, read: str
) -> None:
    import aiohttp

    body = {"model": llm_server.model, "messages": MESSAGES, "max_tokens": 5, "temperature": 0}
    url = llm_server.base_url + "/chat/completions"
    sink = MemorySink()
    async with aiohttp.ClientSession() as session:
        async with session.post(url, json=body) as response:
            plain = (await response.json())["usage"]
        async with (
            ExecutionContext(sinks=[sink]),
            session.post(url, json={**body, "stream": True}) as response,
        ):
            if read == "lines":
                received = b"".join([line async for line in response.content])
            elif read == "whole":
                received = await response.read()
            elif read == "chunks":
                received = b"".join([piece async for piece, _ in response.content.iter_chunks()])
            elif read == "readchunk":
                received = b""
                for _ in range(10_000):  # (b"", False) is aiohttp's end of the body
                    piece, chunk_end = await response.content.readchunk()
                    if (piece, chunk_end) == (b"", False):
                        break
                    received += piece
                else:
                    pytest.fail("readchunk never told the body's end")
            else:
                received = b"".join([piece async for piece in response.content.iter_any()])
    chunks = _sse_chunks(received)
    assert chunks and all(chunk["choices"] for chunk in chunks)  # no usage-only chunk shown
    assert received.rstrip().endswith(b"data: [DONE]")
    node = only(sink)
    assert (node.tokens_in, node.tokens_out) == (plain["prompt_tokens"], plain["completion_tokens"])
    assert node.metadata[META_TRANSPORT] == "aiohttp"
    assert META_USAGE_ESTIMATED not in node.metadata


async def test_aiohttp_stream_that_asked_for_usage_is_passed_on_whole(
    llm_server: LocalLLMServer,
) -> None:
    import aiohttp

    body = {
        "model": llm_server.model,
        "messages": MESSAGES,
        "max_tokens": 5,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    sink = MemorySink()
    async with (
        aiohttp.ClientSession() as session,
        ExecutionContext(sinks=[sink]),
        session.post(llm_server.base_url + "/chat/completions", json=body) as response,
    ):
        received = await response.read()
    usage = [chunk["usage"] for chunk in _sse_chunks(received) if chunk.get("usage")][-1]
    node = only(sink)
    assert (node.tokens_in, node.tokens_out) == (usage["prompt_tokens"], usage["completion_tokens"])


def test_a_stream_whose_done_event_ends_the_body_unclosed_is_ended_before_it_is_handed_out(
    replay: ReplayServer,
) -> None:
    # Usage is asked for (and its event hidden), and the body ends with "data: [DONE]" and no
    # blank line: that last event reaches the caller only when the body is complete. A caller
    # that stops there has read the whole body: the node ends with its usage, not abandoned.
    stream = recorded.openai_chat_stream_usage()
    *events, done = stream.chunks
    replay.script("/v1/chat/completions", replace(stream, chunks=(*events, done.rstrip())))
    sink = MemorySink()
    body = {"model": "gpt-4o-mini", "messages": MESSAGES, "stream": True}
    with ExecutionContext(sinks=[sink]), httpx.Client() as client:
        url = replay.openai_base_url + "/chat/completions"
        with client.stream("POST", url, json=body) as response:
            for piece in response.iter_raw():
                if b"[DONE]" in piece:
                    break
    node = only(sink)
    assert node.status == "success" and node.tokens_in and node.tokens_out
    assert META_USAGE_ESTIMATED not in node.metadata


def test_an_embeddings_request_is_estimated_in_the_contexts_mode(replay: ReplayServer) -> None:
    """An SDK's embeddings request is reserved as any request is, in its context's estimate
    mode: ``learned`` holds its characters' estimate, ``bound`` its bytes (two per "é"), so a
    bound context refuses, before sending it, what a learned one lets through."""
    replay.script("/v1/embeddings", recorded.openai_embeddings())
    client = openai.OpenAI(base_url=replay.openai_base_url, api_key="k", max_retries=0)
    text = "é" * 100
    limits = [Limit(KEY_INPUT_TOKENS, 150)]
    with ExecutionContext(limits=limits, estimate="learned"):
        client.embeddings.create(model="text-embedding-3-small", input=text)
    with ExecutionContext(limits=limits, estimate="bound"), pytest.raises(LimitExceeded):
        client.embeddings.create(model="text-embedding-3-small", input=text)
    assert len(replay.requests) == 1  # the bound context's was never sent
