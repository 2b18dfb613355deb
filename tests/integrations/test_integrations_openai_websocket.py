"""The Responses API's WebSocket mode against a loopback WebSocket server (real SDK, real frames).

The server answers each ``response.create`` with the documented event sequence
(``response.created``, an output text delta, ``response.completed``) around the recorded
Responses object, so the usage the node must end with is known exactly.
"""

from __future__ import annotations

import asyncio
import json
import time
import warnings
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from ampmeter import ExecutionContext, LimitExceeded, Node
from ampmeter.integrations.lifecycle import META_OPERATION, META_TRANSPORT
from ampmeter.keys import KEY_LLM_CALLS
from ampmeter.sinks.memory import MemorySink
from ampmeter.testing import recorded
from support.responses_socket import ResponsesSocket

pytestmark = pytest.mark.usefixtures("instrumented")  # conftest.py


@pytest.fixture
def socket_server() -> Iterator[ResponsesSocket]:
    with ResponsesSocket() as server:
        yield server


def llm_nodes(sink: MemorySink) -> list[Node]:
    return [n for n in sink.nodes if n.kind == "llm"]


def until_done(connection: Any) -> list[Any]:
    events = []
    for event in connection:
        events.append(event)
        if event.type == "response.completed":
            return events
    raise AssertionError("the connection closed before the response completed")


def test_each_response_is_a_node_with_its_usage_and_limits_stop_before_sending(
    socket_server: ResponsesSocket,
) -> None:
    client = openai.OpenAI(base_url=socket_server.base_url, api_key="sk-ws")
    sink = MemorySink()
    usage = recorded.load("openai_responses_usage")["usage"]
    with (
        ExecutionContext(max_steps=1, sinks=[sink]) as ctx,
        client.responses.connect() as connection,
    ):
        connection.response.create(model="o4-mini", input="Look it up.", max_output_tokens=50)
        until_done(connection)
        with pytest.raises(LimitExceeded):
            connection.response.create(model="o4-mini", input="And again.")
    assert len(socket_server.creates) == 1  # the second response never left
    node, halted = llm_nodes(sink)
    assert (node.tokens_in, node.tokens_out) == (usage["input_tokens"], usage["output_tokens"])
    assert node.metadata["cached_tokens"] == usage["input_tokens_details"]["cached_tokens"]
    assert node.metadata[META_TRANSPORT] == "websockets"  # the SDK sends through that client
    assert node.metadata[META_OPERATION] == "responses.connect.create"
    assert node.status == "success" and halted.status == "halt"
    assert ctx.stats.get_counter(KEY_LLM_CALLS) == 1


async def test_async_connection_meters_two_responses(socket_server: ResponsesSocket) -> None:
    client = openai.AsyncOpenAI(base_url=socket_server.base_url, api_key="sk-ws")
    sink = MemorySink()
    usage = recorded.load("openai_responses_usage")["usage"]
    async with ExecutionContext(sinks=[sink]), client.responses.connect() as connection:
        for question in ("One?", "Two?"):
            await connection.response.create(model="o4-mini", input=question)
            async for event in connection:
                if event.type == "response.completed":
                    break
    nodes = llm_nodes(sink)
    assert [(n.tokens_in, n.tokens_out) for n in nodes] == [
        (usage["input_tokens"], usage["output_tokens"])
    ] * 2


def test_a_response_still_open_at_close_ends_as_abandoned(socket_server: ResponsesSocket) -> None:
    client = openai.OpenAI(base_url=socket_server.base_url, api_key="sk-ws")
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]), client.responses.connect() as connection:
        connection.response.create(model="o4-mini", input="Look it up.")
        next(iter(connection))  # read only response.created
    (node,) = llm_nodes(sink)
    assert node.status == "fail" and node.error_class == "StreamAbandoned"


# -- any websockets client: the protocol metered below the SDK ------------------------------------


def socket_url(server: ResponsesSocket) -> str:
    return server.base_url.replace("http://", "ws://") + "/responses"


def create_frame(text: str) -> str:
    return json.dumps(
        {"type": "response.create", "model": "o4-mini", "input": text, "max_output_tokens": 50}
    )


def test_a_raw_websockets_client_is_metered_and_stopped_before_sending(
    socket_server: ResponsesSocket,
) -> None:
    from websockets.sync.client import connect

    sink = MemorySink()
    usage = recorded.load("openai_responses_usage")["usage"]
    with ExecutionContext(max_steps=1, sinks=[sink]), connect(socket_url(socket_server)) as ws:
        ws.send(create_frame("Look it up."))
        ws.send(json.dumps({"type": "session.update"}))  # not a response: not metered
        while json.loads(ws.recv())["type"] != "response.completed":
            pass
        with pytest.raises(LimitExceeded):
            ws.send(create_frame("And again."))
    assert len(socket_server.creates) == 1  # the stopped frame never left
    node, halted = llm_nodes(sink)
    assert (node.status, node.tokens_in, node.tokens_out) == (
        "success",
        usage["input_tokens"],
        usage["output_tokens"],
    )
    assert node.metadata[META_TRANSPORT] == "websockets"
    assert halted.status == "halt"


async def test_an_asyncio_websockets_client_is_metered(socket_server: ResponsesSocket) -> None:
    from websockets.asyncio.client import connect

    sink = MemorySink()
    usage = recorded.load("openai_responses_usage")["usage"]
    async with ExecutionContext(sinks=[sink]), connect(socket_url(socket_server)) as ws:
        for question in ("One?", "Two?"):
            await ws.send(create_frame(question).encode())  # a binary frame is read the same
            async for message in ws:
                if json.loads(message)["type"] == "response.completed":
                    break
        await ws.send(create_frame("Three?"))
        # closing at once could beat the frame to the server; the point is a response still
        # open (never read) when the connection closes
        deadline = time.monotonic() + 10
        while len(socket_server.creates) < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
    # the third, still open when the connection closed, ends as an abandoned stream
    assert len(socket_server.creates) == 3
    first, second, third = llm_nodes(sink)
    assert [(n.tokens_in, n.tokens_out) for n in (first, second)] == [
        (usage["input_tokens"], usage["output_tokens"])
    ] * 2
    assert third.status == "fail" and third.error_class == "StreamAbandoned"


def test_the_sdks_connection_is_not_metered_twice(socket_server: ResponsesSocket) -> None:
    client = openai.OpenAI(base_url=socket_server.base_url, api_key="sk-ws")
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]), client.responses.connect() as connection:
        connection.response.create(model="o4-mini", input="Look it up.")
        until_done(connection)
    (node,) = llm_nodes(sink)
    assert node.metadata[META_TRANSPORT] == "websockets"  # one layer meters it, once
    assert node.status == "success"


def legacy_client() -> Any:
    """``websockets.legacy.client``: deprecated since websockets 14 (importing it warns), still
    shipped, and what ``websockets.client.connect`` returns."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import websockets.client
        import websockets.legacy.client

        assert websockets.client.connect is websockets.legacy.client.connect
    return websockets.legacy.client


async def test_the_legacy_websockets_client_is_metered_and_stopped_before_sending(
    socket_server: ResponsesSocket,
) -> None:
    client = legacy_client()
    sink = MemorySink()
    usage = recorded.load("openai_responses_usage")["usage"]
    async with (
        ExecutionContext(max_steps=2, sinks=[sink]),
        client.connect(socket_url(socket_server)) as ws,
    ):
        assert isinstance(ws, client.WebSocketClientProtocol)
        for question in ("One?", "Two?"):
            await ws.send(create_frame(question))
            await ws.send(json.dumps({"type": "session.update"}))  # not a response: not metered
            async for message in ws:
                if json.loads(message)["type"] == "response.completed":
                    break
        with pytest.raises(LimitExceeded):
            await ws.send(create_frame("Three?"))
    assert len(socket_server.creates) == 2  # the stopped frame never left
    first, second, halted = llm_nodes(sink)
    assert [(n.status, n.tokens_in, n.tokens_out) for n in (first, second)] == [
        ("success", usage["input_tokens"], usage["output_tokens"])
    ] * 2
    assert first.metadata[META_TRANSPORT] == "websockets"
    assert halted.status == "halt"


async def test_a_legacy_response_open_at_close_ends_as_abandoned(
    socket_server: ResponsesSocket,
) -> None:
    client = legacy_client()
    sink = MemorySink()
    async with ExecutionContext(sinks=[sink]), client.connect(socket_url(socket_server)) as ws:
        await ws.send(create_frame("Look it up."))
        assert json.loads(await ws.recv())["type"] == "response.created"
    (node,) = llm_nodes(sink)
    assert node.status == "fail" and node.error_class == "StreamAbandoned"


def test_an_error_event_mid_response_charges_what_the_response_was_billed() -> None:
    """The server named the response (``response.created``) and streamed output, then sent an
    ``error`` event: the response had been generating, billed, and was charged nothing (its
    call ended ``fail`` with no usage). Now it is charged its input estimate and the output
    received, ``estimated``."""
    sink = MemorySink()
    with ResponsesSocket(error_mid_response=True) as server, ExecutionContext(sinks=[sink]):
        client = openai.OpenAI(base_url=server.base_url, api_key="sk-ws")
        with client.responses.connect() as connection:
            connection.response.create(model="o4-mini", input="Look it up.", max_output_tokens=50)
            kinds = []
            for event in connection:
                kinds.append(event.type)
                if event.type == "error":
                    break
    assert kinds == ["response.created", "response.output_text.delta", "error"]
    (node,) = llm_nodes(sink)
    assert (node.status, node.error_class) == ("fail", "ResponseFailed")
    assert node.tokens_in and node.tokens_out == len("Looking")
    assert node.cost_nano > 0 and node.metadata["cost_status"] == "estimated"
