"""The replay server, read by the real openai and anthropic SDKs.

Expected values always come from the recorded bodies (``recorded.load``), so each assertion
checks that the SDK parsed the wire shape into the fields ampmeter will read.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import anthropic
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ampmeter.testing import RecordedRequest, ReplayResponse, ReplayServer, recorded
from support.stopping import stop_while_answering

CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"
USER: list[Any] = [{"role": "user", "content": "hi"}]


def _openai(replay: ReplayServer, max_retries: int = 0) -> openai.OpenAI:
    return openai.OpenAI(base_url=replay.openai_base_url, api_key="k", max_retries=max_retries)


def _anthropic(replay: ReplayServer, max_retries: int = 0) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=replay.anthropic_base_url, api_key="k", max_retries=max_retries
    )


def _post_raw(url: str, payload: Any) -> tuple[int, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


# --- OpenAI shapes -----------------------------------------------------------------------------


def test_openai_chat_tool_calls_and_usage_details(replay: ReplayServer) -> None:
    wire = recorded.load("openai_chat_tool_calls")
    replay.script(CHAT, recorded.openai_chat_tool_calls())
    response = _openai(replay).chat.completions.create(model="gpt-4o-mini", messages=USER, tools=[])
    usage = response.usage
    assert usage is not None
    assert usage.model_dump(exclude_none=True) == wire["usage"]
    assert usage.prompt_tokens_details is not None and usage.completion_tokens_details is not None
    assert (
        usage.prompt_tokens_details.cached_tokens
        == wire["usage"]["prompt_tokens_details"]["cached_tokens"]
    )
    assert (
        usage.completion_tokens_details.reasoning_tokens
        == wire["usage"]["completion_tokens_details"]["reasoning_tokens"]
    )
    calls = response.choices[0].message.tool_calls or []
    wire_calls = wire["choices"][0]["message"]["tool_calls"]
    assert [(c.id, c.function.name, c.function.arguments) for c in calls] == [  # type: ignore[union-attr]
        (c["id"], c["function"]["name"], c["function"]["arguments"]) for c in wire_calls
    ]
    assert response.choices[0].finish_reason == "tool_calls"
    [sent] = replay.requests
    assert sent.method == "POST" and sent.path == CHAT
    assert sent.json()["model"] == "gpt-4o-mini"
    assert sent.headers["authorization"] == "Bearer k"


def test_openai_stream_last_chunk_carries_usage(replay: ReplayServer) -> None:
    wire = recorded.load("openai_chat_stream_usage")
    replay.script(CHAT, recorded.openai_chat_stream_usage())
    chunks = list(
        _openai(replay).chat.completions.create(
            model="gpt-4o-mini",
            messages=USER,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert len(chunks) == len(wire)
    *body, last = chunks
    assert last.choices == []
    assert last.usage is not None
    assert last.usage.model_dump(exclude_none=True) == wire[-1]["usage"]
    assert all(chunk.usage is None for chunk in body)
    text = "".join(c.choices[0].delta.content or "" for c in body)
    assert text == "".join(c["choices"][0]["delta"].get("content") or "" for c in wire[:-1])
    assert replay.requests[0].json()["stream_options"] == {"include_usage": True}


def test_openai_stream_cut_midway_raises_after_partial_chunks(replay: ReplayServer) -> None:
    replay.script(CHAT, recorded.openai_chat_stream_usage(cut_after=2))
    seen = []
    stream = _openai(replay).chat.completions.create(model="m", messages=USER, stream=True)
    with pytest.raises(openai.APIConnectionError):
        for chunk in stream:
            seen.append(chunk)
    assert len(seen) == 2
    assert all(chunk.usage is None for chunk in seen)


def test_anthropic_stream_cut_midway_keeps_message_start_usage(replay: ReplayServer) -> None:
    start_usage, _ = _wire_stream_usage()
    replay.script(MESSAGES, recorded.anthropic_message_stream(cut_after=3))
    seen = []
    stream = _anthropic(replay).messages.create(
        model="c", max_tokens=64, messages=USER, stream=True
    )
    # anthropic 2.x lets the transport's own error through here (openai wraps it)
    with pytest.raises(Exception) as caught:
        for event in stream:
            seen.append(event)
    assert not isinstance(caught.value, AssertionError)
    sent = [e["event"] for e in recorded.load("anthropic_message_stream")[:3]]
    assert [e.type for e in seen] == [name for name in sent if name != "ping"]  # SDK drops pings
    assert seen[0].message.usage.input_tokens == start_usage["input_tokens"]  # type: ignore[union-attr]


def test_openai_responses_usage_details(replay: ReplayServer) -> None:
    wire = recorded.load("openai_responses_usage")
    replay.script(RESPONSES, recorded.openai_responses_usage())
    response = _openai(replay).responses.create(model="o4-mini", input="hi")
    assert response.usage is not None
    assert response.usage.model_dump(exclude_none=True) == wire["usage"]
    assert (
        response.usage.input_tokens_details.cached_tokens
        == wire["usage"]["input_tokens_details"]["cached_tokens"]
    )
    assert (
        response.usage.output_tokens_details.reasoning_tokens
        == wire["usage"]["output_tokens_details"]["reasoning_tokens"]
    )
    calls = [item for item in response.output if item.type == "function_call"]
    assert len(calls) == sum(1 for item in wire["output"] if item["type"] == "function_call")
    assert response.output_text == wire["output"][-1]["content"][0]["text"]


@pytest.mark.parametrize("status", [429, 500])
def test_openai_retries_error_then_succeeds(replay: ReplayServer, status: int) -> None:
    wire = recorded.load("openai_chat_tool_calls")
    replay.script(CHAT, recorded.openai_error(status), recorded.openai_chat_tool_calls())
    raw = _openai(replay, max_retries=2).chat.completions.with_raw_response.create(
        model="gpt-4o-mini", messages=USER
    )
    assert raw.retries_taken == 1
    assert raw.parse().usage.total_tokens == wire["usage"]["total_tokens"]  # type: ignore[union-attr]
    assert len(replay.requests) == 2
    assert replay.pending() == 0


def test_openai_rate_limit_error_without_retries(replay: ReplayServer) -> None:
    wire = recorded.load("openai_error_429")
    replay.script(CHAT, recorded.openai_error(429, retry_after=7))
    with pytest.raises(openai.RateLimitError) as caught:
        _openai(replay).chat.completions.create(model="gpt-4o-mini", messages=USER)
    error = caught.value
    assert error.status_code == 429
    assert error.code == wire["error"]["code"]
    assert error.body == wire["error"]
    assert error.response.headers["retry-after"] == "7"
    assert error.response.headers["retry-after-ms"] == "7000"
    assert len(replay.requests) == 1


def test_openai_server_error_when_retries_run_out(replay: ReplayServer) -> None:
    replay.script(CHAT, recorded.openai_error(500), recorded.openai_error(500))
    with pytest.raises(openai.InternalServerError) as caught:
        _openai(replay, max_retries=1).chat.completions.create(model="m", messages=USER)
    assert caught.value.status_code == 500
    assert len(replay.requests) == 2


async def test_async_openai_retries_then_streams(replay: ReplayServer) -> None:
    wire = recorded.load("openai_chat_stream_usage")
    replay.script(CHAT, recorded.openai_error(429), recorded.openai_chat_stream_usage())
    async with openai.AsyncOpenAI(
        base_url=replay.openai_base_url, api_key="k", max_retries=1
    ) as client:
        stream = await client.chat.completions.create(
            model="m", messages=USER, stream=True, stream_options={"include_usage": True}
        )
        usages = [chunk.usage async for chunk in stream if chunk.usage is not None]
    assert [u.model_dump(exclude_none=True) for u in usages] == [wire[-1]["usage"]]
    assert len(replay.requests) == 2


# --- Anthropic shapes --------------------------------------------------------------------------


def test_anthropic_tool_use_and_cache_usage(replay: ReplayServer) -> None:
    wire = recorded.load("anthropic_message_tool_use")
    replay.script(MESSAGES, recorded.anthropic_message_tool_use())
    message = _anthropic(replay).messages.create(
        model="claude-replay", max_tokens=256, messages=USER
    )
    usage = message.usage
    for key in (
        "input_tokens",
        "output_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
    ):
        assert getattr(usage, key) == wire["usage"][key]
    uses = [block for block in message.content if block.type == "tool_use"]
    assert [(b.id, b.name, b.input) for b in uses] == [
        (b["id"], b["name"], b["input"]) for b in wire["content"] if b["type"] == "tool_use"
    ]
    assert message.stop_reason == "tool_use"
    [sent] = replay.requests
    assert sent.path == MESSAGES
    assert sent.headers.get("x-api-key") == "k" or sent.headers["authorization"] == "Bearer k"
    assert "anthropic-version" in sent.headers


def _wire_stream_usage() -> tuple[dict[str, Any], dict[str, Any]]:
    events = recorded.load("anthropic_message_stream")
    start = next(e["data"] for e in events if e["event"] == "message_start")
    delta = next(e["data"] for e in events if e["event"] == "message_delta")
    return start["message"]["usage"], delta["usage"]


def test_anthropic_raw_stream_usage(replay: ReplayServer) -> None:
    start_usage, delta_usage = _wire_stream_usage()
    replay.script(MESSAGES, recorded.anthropic_message_stream())
    events = list(
        _anthropic(replay).messages.create(
            model="claude-replay", max_tokens=64, messages=USER, stream=True
        )
    )
    [start] = [e for e in events if e.type == "message_start"]
    [delta] = [e for e in events if e.type == "message_delta"]
    assert start.message.usage.input_tokens == start_usage["input_tokens"]
    assert start.message.usage.cache_read_input_tokens == start_usage["cache_read_input_tokens"]
    assert delta.usage.output_tokens == delta_usage["output_tokens"]
    assert events[-1].type == "message_stop"


def test_anthropic_stream_helper_accumulates_usage(replay: ReplayServer) -> None:
    start_usage, delta_usage = _wire_stream_usage()
    replay.script(MESSAGES, recorded.anthropic_message_stream())
    with _anthropic(replay).messages.stream(
        model="claude-replay", max_tokens=64, messages=USER
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert final.usage.output_tokens == delta_usage["output_tokens"]
    assert final.usage.input_tokens == start_usage["input_tokens"]
    assert final.usage.cache_read_input_tokens == start_usage["cache_read_input_tokens"]
    assert text == final.content[0].text  # type: ignore[union-attr]
    assert final.stop_reason == "end_turn"


@pytest.mark.parametrize("status", [429, 500, 529])
def test_anthropic_retries_error_then_succeeds(replay: ReplayServer, status: int) -> None:
    wire = recorded.load("anthropic_message_tool_use")
    replay.script(MESSAGES, recorded.anthropic_error(status), recorded.anthropic_message_tool_use())
    raw = _anthropic(replay, max_retries=2).messages.with_raw_response.create(
        model="claude-replay", max_tokens=64, messages=USER
    )
    assert raw.retries_taken == 1
    assert [r.headers.get("x-stainless-retry-count") for r in replay.requests] == ["0", "1"]
    assert raw.parse().usage.output_tokens == wire["usage"]["output_tokens"]
    assert len(replay.requests) == 2


@pytest.mark.parametrize(
    ("status", "error_class"),
    [
        (429, anthropic.RateLimitError),
        (500, anthropic.InternalServerError),
        (529, anthropic.OverloadedError),
    ],
)
def test_anthropic_error_classes_without_retries(
    replay: ReplayServer, status: int, error_class: type[anthropic.APIStatusError]
) -> None:
    wire = recorded.load(f"anthropic_error_{status}")
    replay.script(MESSAGES, recorded.anthropic_error(status, retry_after=3))
    with pytest.raises(error_class) as caught:
        _anthropic(replay).messages.create(model="c", max_tokens=8, messages=USER)
    error = caught.value
    assert error.status_code == status
    assert error.body == wire
    assert error.request_id == wire["request_id"]
    assert error.response.headers["retry-after"] == "3"


async def test_async_anthropic_overloaded_then_stream(replay: ReplayServer) -> None:
    _, delta_usage = _wire_stream_usage()
    replay.script(MESSAGES, recorded.anthropic_error(529), recorded.anthropic_message_stream())
    async with (
        anthropic.AsyncAnthropic(
            base_url=replay.anthropic_base_url, api_key="k", max_retries=1
        ) as client,
        client.messages.stream(model="c", max_tokens=64, messages=USER) as stream,
    ):
        final = await stream.get_final_message()
    assert final.usage.output_tokens == delta_usage["output_tokens"]
    assert len(replay.requests) == 2


# --- the server itself -------------------------------------------------------------------------


def test_exhausted_route_is_a_clear_non_retried_404(replay: ReplayServer) -> None:
    with pytest.raises(openai.NotFoundError, match="no scripted response left for POST"):
        _openai(replay, max_retries=3).chat.completions.create(model="m", messages=USER)
    assert len(replay.requests) == 1


def test_routes_have_separate_queues(replay: ReplayServer) -> None:
    replay.script(CHAT, recorded.openai_chat_tool_calls())
    replay.script(RESPONSES, recorded.openai_responses_usage(), recorded.openai_error(500))
    replay.script("/v1/models", ReplayResponse.json({"data": []}), method="get")
    assert replay.pending() == 4
    assert replay.pending(RESPONSES) == 2
    assert replay.pending("/v1/models", method="GET") == 1
    assert replay.pending("/v1/models") == 0  # POST has nothing queued
    status, body = _post_raw(replay.url + RESPONSES + "?trace=1", {"input": "x"})
    wire = recorded.load("openai_responses_usage")
    assert body["id"].startswith(wire["id"] + "-")  # a fresh id, as from a provider
    assert (status, {**body, "id": wire["id"]}) == (200, wire)
    assert replay.pending(RESPONSES) == 1 and replay.pending(CHAT) == 1
    request = replay.requests[-1]
    assert isinstance(request, RecordedRequest)
    assert (request.path, request.query, request.json()) == (RESPONSES, "trace=1", {"input": "x"})


@settings(max_examples=15, deadline=None)
@given(
    script=st.lists(
        st.tuples(
            st.sampled_from([200, 201, 400, 404, 409, 422, 500, 503]),
            st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_responses_come_back_in_scripted_order(script: list[tuple[int, dict[str, int]]]) -> None:
    with ReplayServer() as server:
        server.script("/echo", *(ReplayResponse.json(body, status=code) for code, body in script))
        answers = [_post_raw(server.url + "/echo", {"n": i}) for i in range(len(script))]
        assert answers == script
        assert [r.json() for r in server.requests] == [{"n": i} for i in range(len(script))]
        assert server.pending() == 0


def test_lifecycle() -> None:
    server = ReplayServer()
    with pytest.raises(RuntimeError, match="not running"):
        _ = server.url
    server.stop()  # harmless before start
    with server:
        url = server.url
        assert url.startswith("http://127.0.0.1:")
        with pytest.raises(RuntimeError, match="already running"):
            server.start()
    with pytest.raises(RuntimeError, match="not running"):
        _ = server.openai_base_url
    with pytest.raises(urllib.error.URLError):
        _post_raw(url + CHAT, {})


def test_delay_is_applied_before_answering(replay: ReplayServer) -> None:
    replay.script("/slow", ReplayResponse.json({"ok": True}, delay=0.01))
    assert _post_raw(replay.url + "/slow", {}) == (200, {"ok": True})


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda s: s.script("v1/chat", recorded.openai_chat_tool_calls()), ValueError, "path"),
        (
            lambda s: s.script(CHAT, recorded.openai_chat_tool_calls(), method="BREW"),
            ValueError,
            "method",
        ),
        (lambda s: s.script(CHAT, {"status": 200}), TypeError, "ReplayResponse"),
        (lambda s: s.pending("no-slash"), ValueError, "path"),
    ],
)
def test_script_rejects_bad_input(
    replay: ReplayServer, call: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        call(replay)
    assert replay.pending() == 0


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: ReplayResponse(status=99), ValueError, "status"),
        (lambda: ReplayResponse(status=600), ValueError, "status"),
        (lambda: ReplayResponse(status=True), TypeError, "status"),
        (lambda: ReplayResponse(chunks=("text",)), TypeError, "bytes"),  # type: ignore[arg-type]
        (lambda: ReplayResponse(headers=(("a",),)), TypeError, "pairs"),  # type: ignore[arg-type]
        (lambda: ReplayResponse(chunks=(b"a",), cut_after=1), ValueError, "cut_after"),
        (lambda: ReplayResponse(delay=-1), ValueError, "delay"),
        (lambda: ReplayResponse(delay=float("nan")), ValueError, "delay"),
        (lambda: recorded.load("nope"), KeyError, "nope"),
        (lambda: recorded.openai_error(404), ValueError, "404"),
        (lambda: recorded.anthropic_error(503), ValueError, "503"),
        (lambda: recorded.openai_error(429, retry_after=-1), ValueError, "retry_after"),
        (
            lambda: recorded.anthropic_error(429, retry_after=float("inf")),
            ValueError,
            "retry_after",
        ),
        (lambda: ReplayServer(port=70000), ValueError, "port"),
        (lambda: ReplayServer(host=""), ValueError, "host"),
    ],
)
def test_bad_values_are_rejected(make: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        make()


def test_retry_after_none_omits_the_headers() -> None:
    response = recorded.openai_error(429, retry_after=None)
    names = {name for name, _ in response.headers}
    assert "retry-after" not in names and "retry-after-ms" not in names
    assert json.loads(response.body) == recorded.load("openai_error_429")


def test_every_recorded_body_is_valid_json() -> None:
    for name in recorded.WIRE_NAMES:
        first, second = recorded.load(name), recorded.load(name)
        assert first == second and first is not second  # a fresh copy each time


def test_every_response_gets_a_fresh_id_unless_asked_for_the_recorded_one() -> None:
    """As a provider does, every response sent has an id of its own (the same in every event
    of one stream); ``verbatim_ids=True`` sends the recorded ids, to re-deliver a response."""
    stream = recorded.load("anthropic_message_stream")
    with ReplayServer() as fresh, ReplayServer(verbatim_ids=True) as verbatim:
        for server in (fresh, verbatim):
            server.script(
                CHAT, recorded.openai_chat_tool_calls(), recorded.openai_chat_tool_calls()
            )
            server.script(RESPONSES, recorded.openai_responses_usage())
            server.script(MESSAGES, recorded.anthropic_message_stream())
        ids = {}
        for server in (fresh, verbatim):
            client = _openai(server)
            chats = [client.chat.completions.create(model="m", messages=USER) for _ in range(2)]
            response = client.responses.create(model="m", input="x")
            with _anthropic(server).messages.stream(
                model="claude", max_tokens=10, messages=USER
            ) as events:
                message_ids = {e.message.id for e in events if e.type == "message_start"}
                final = events.get_final_message()
            ids[server] = ([c.id for c in chats], response.id, message_ids, final.id)
    wire_chat = recorded.load("openai_chat_tool_calls")["id"]
    wire_response = recorded.load("openai_responses_usage")["id"]
    wire_message = next(e["data"]["message"]["id"] for e in stream if "message" in e["data"])
    chat_ids, response_id, message_ids, final_id = ids[fresh]
    assert len(set(chat_ids)) == 2 and all(i.startswith(wire_chat + "-") for i in chat_ids)
    assert response_id.startswith(wire_response + "-")
    assert message_ids == {final_id} and final_id.startswith(wire_message + "-")
    assert ids[verbatim] == ([wire_chat, wire_chat], wire_response, {wire_message}, wire_message)
    with pytest.raises(TypeError, match="verbatim_ids"):
        ReplayServer(verbatim_ids="yes")  # type: ignore[arg-type]


def test_a_body_without_ids_is_sent_as_it_is(replay: ReplayServer) -> None:
    odd = ReplayResponse(chunks=(b"not json {", b'{"id": 7}'), headers=(("x", "y"),))
    replay.script(CHAT, odd, ReplayResponse.json({"id": ""}), ReplayResponse.json([1, "id"]))
    for body in (b'not json {{"id": 7}', b'{"id":""}', b'[1,"id"]'):
        with urllib.request.urlopen(
            urllib.request.Request(replay.url + CHAT, data=b"{}"), timeout=5
        ) as response:
            assert response.read() == body


def _kept_connection(replay: ReplayServer) -> http.client.HTTPConnection:
    """An HTTP/1.1 connection that made one request and is kept alive."""
    host, port = replay.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    assert _asks(connection) == 200
    return connection


def _asks(connection: http.client.HTTPConnection) -> int:
    """One request on ``connection`` (reusing its socket once it has one): the status."""
    connection.request("GET", "/ping")
    response = connection.getresponse()
    response.read()
    return response.status


def test_an_idle_kept_connection_outlives_a_clients_keep_alive() -> None:
    # httpx keeps an idle connection 5 s: a server closing it after the same 5 s fails the
    # request a client sends on it at that moment ("Server disconnected").
    with ReplayServer(fallback=lambda request: ReplayResponse.json({})) as replay:
        connection = _kept_connection(replay)
        kept = connection.sock
        time.sleep(5.3)
        assert _asks(connection) == 200
        assert connection.sock is kept  # the same connection, not a new one
        connection.close()


def test_stopping_closes_the_connections_clients_keep() -> None:
    replay = ReplayServer(fallback=lambda request: ReplayResponse.json({})).start()
    connection = _kept_connection(replay)
    kept = connection.sock
    replay.stop()
    kept.settimeout(2)
    assert kept.recv(1) == b""  # the end of the stream, at once
    connection.close()


def test_stopping_drops_a_delayed_answer_at_once_and_quietly(
    capfd: pytest.CaptureFixture[str],
) -> None:
    before = set(threading.enumerate())
    replay = ReplayServer().start()
    replay.script(CHAT, ReplayResponse.json({"late": True}, delay=60))
    errors = stop_while_answering(
        replay, lambda: _post_raw(replay.url + CHAT, {}), lambda: bool(replay.requests), before
    )
    assert errors  # no answer came
    assert "Traceback" not in capfd.readouterr().err  # a client gone is no error to print
