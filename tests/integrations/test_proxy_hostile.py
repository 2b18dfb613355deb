"""The metering proxy at its hostile edges: callers that leave, upstreams that answer oddly.

Whatever happens between the caller and the provider, a request the proxy forwarded ends
charged at its bill (or, when the bill cannot be read, its estimate), never left in flight
or free, and the caller gets the bytes the provider sent.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from aiohttp import web

from ampmeter.context import ExecutionContext
from ampmeter.integrations.lifecycle import META_USAGE_ESTIMATED
from ampmeter.proxy import BudgetFileError, MeteringProxy, read_budget_file
from ampmeter.proxy.budget_file import budgets_from
from ampmeter.proxy.relay import Relay
from ampmeter.testing import recorded
from ampmeter.testing.billing import BillingProvider
from ampmeter.testing.replay import RecordedRequest, ReplayResponse, ReplayServer

PRICES = {"gpt-4o-mini": ("0.15", "0.60")}
PROMPT = [{"role": "user", "content": "Summarise the meeting notes, please. " * 8}]


def proxy_to(upstream: str, route: str = "openai") -> MeteringProxy:
    callers = {"team": {"max_cost_usd": 1.0}}
    return MeteringProxy(budgets_from({"upstreams": {route: upstream}, "callers": callers}))


def settled(ctx: ExecutionContext, calls: int) -> None:
    """Wait (briefly) until ``calls`` calls of ``ctx`` have ended."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        aggregates = ctx.graph.aggregates()
        if aggregates["total_llm_calls"] >= calls and aggregates["in_flight"] == 0:
            return
        time.sleep(0.02)
    pytest.fail(f"the proxy left calls in flight: {ctx.graph.aggregates()}")


def test_a_caller_that_times_out_before_the_answer_is_charged_the_bill() -> None:
    """A client's timeout hangs up while the provider is still working: the provider bills the
    answer all the same, so the proxy reads it to its end and counts it."""
    with (
        BillingProvider(prices=PRICES, output_tokens=40, delay_s=0.4) as bill,
        proxy_to(bill.openai_base_url) as proxy,
    ):
        url = proxy.base_urls()["OPENAI_BASE_URL"] + "/chat/completions"
        for stream in (False, True):
            body = {"model": "gpt-4o-mini", "messages": PROMPT, "stream": stream}
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(url, json=body, timeout=0.1)
        ctx = proxy.context("team")
        settled(ctx, 2)
        assert len(bill.calls) == 2
        assert ctx.stats.total_cost() == bill.billed_usd > 0


def _brotli(data: bytes) -> bytes:
    """``data`` as a brotli stream: one uncompressed meta-block (RFC 7932 9.2), then the last."""
    header = (len(data) - 1) << 4 | 1 << 20  # (window 16, 4 nibbles of length, uncompressed)
    return header.to_bytes(3, "little") + data + b"\x03"


def test_the_upstream_is_asked_only_for_encodings_the_proxy_can_decode() -> None:
    """A CDN-fronted provider compresses with what the client offers (Node's fetch offers br):
    the proxy decodes the body to read its usage, so the caller's offer must not reach the
    upstream. Else a br answer (the proxy has no brotli decoder) was a 502 to the caller and
    its billed request cost nothing."""
    usage = {"prompt_tokens": 1000, "completion_tokens": 20, "total_tokens": 1020}
    answer = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "gpt-4o-mini",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Done."}}],
        "usage": usage,
    }
    document = json.dumps(answer).encode()

    def cdn(request: RecordedRequest) -> ReplayResponse:
        offered = request.headers.get("accept-encoding", "")
        encoding, body = ("br", _brotli(document)) if "br" in offered else ("gzip", b"")
        if encoding == "gzip":
            body = gzip.compress(document)
        headers = (("content-type", "application/json"), ("content-encoding", encoding))
        return ReplayResponse(chunks=(body,), headers=headers)

    with ReplayServer() as replay, proxy_to(replay.openai_base_url) as proxy:
        replay.script("/v1/chat/completions", cdn)
        url = proxy.base_urls()["OPENAI_BASE_URL"] + "/chat/completions"
        body = {"model": "gpt-4o-mini", "messages": PROMPT}
        got = httpx.post(url, json=body, headers={"accept-encoding": "br, gzip, deflate"})
        assert got.status_code == 200, got.text
        assert got.json() == answer
        stats = proxy.context("team").stats
        assert stats.get_counter("amp:input_tokens") == 1000
        assert stats.get_counter("amp:output_tokens") == 20


@pytest.mark.parametrize(
    "path",
    [
        "/openai/../../tenant-b/v1/chat/completions",
        "/openai/%2e%2e/%2E%2E/tenant-b/v1/chat/completions",
        "/openai/..%2F..%2Ftenant-b/v1/chat/completions",
        "/openai/./../../tenant-b/v1/chat/completions",
        "/openai/%252e%252e/%252e%252e/tenant-b/v1/chat/completions",
    ],
)
def test_a_path_cannot_leave_the_upstreams_base_url(path: str) -> None:
    """The upstream is a base URL (a gateway's tenant, an Azure deployment): a caller's dot
    segments must not reach a path beside it, where another deployment bills another price."""
    with (
        ReplayServer() as replay,
        proxy_to(replay.url + "/tenant-a/v1") as proxy,
        socket.create_connection(("127.0.0.1", int(proxy.url.rsplit(":", 1)[1]))) as sent,
    ):
        body = json.dumps({"model": "gpt-4o-mini", "messages": PROMPT}).encode()
        sent.sendall(  # (a raw request: HTTP clients resolve dot segments before sending)
            f"POST {path} HTTP/1.1\r\nHost: proxy\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        answer = b"".join(iter(lambda: sent.recv(65536), b""))
        assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
        assert b"leaves the upstream" in answer
        assert replay.requests == []


def test_a_request_in_flight_when_the_proxy_stops_is_charged_its_reservation() -> None:
    """Stopping waits for requests in flight, then cancels them: one cancelled while the
    provider was still working was sent and billed, so it is charged at its reservation
    (unsettled), not dropped with the task."""
    body = {"model": "gpt-4o-mini", "messages": PROMPT, "max_tokens": 40}

    async def stop_while_the_provider_works(ctx: ExecutionContext, upstream: str) -> None:
        relay = Relay({None: ctx}, {"openai": upstream})
        await relay.open()
        app = web.Application()
        app.router.add_route("*", "/{route:openai}/{tail:.*}", relay.handle)
        runner = web.AppRunner(app, shutdown_timeout=0.2)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}/openai/chat/completions"
        async with httpx.AsyncClient() as client:
            sending = asyncio.create_task(client.post(url, json=body))
            while not bill.calls:  # it reached the provider
                await asyncio.sleep(0.01)
            await runner.cleanup()
            await relay.close()
            with pytest.raises(httpx.HTTPError):
                await sending

    with (
        BillingProvider(prices=PRICES, delay_s=5) as bill,
        ExecutionContext("team", max_cost_usd=1) as ctx,
    ):
        asyncio.run(stop_while_the_provider_works(ctx, bill.openai_base_url))
        (node,) = [node for node in ctx.graph.nodes() if node.kind == "llm"]
        assert node.status == "fail" and node.metadata["cost_status"] == "unsettled"
        assert ctx.stats.total_cost() == node.cost_usd > 0


def test_a_stream_the_upstream_cuts_is_cut_for_the_caller_too_and_charged() -> None:
    """Anthropic's first usage report counts one output token; a stream cut after two text
    deltas was charged that one token, though the provider bills all it wrote. A stream an
    error cuts is charged as any cut stream: at least the output received. The caller's body
    is broken off too: it ended cleanly, a cut answer that read as a whole one."""
    with ReplayServer() as replay, proxy_to(replay.url, "anthropic") as proxy:
        replay.script("/v1/messages", recorded.anthropic_message_stream(cut_after=5))
        url = proxy.base_urls()["ANTHROPIC_BASE_URL"] + "/v1/messages"
        body = {"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": PROMPT}
        with pytest.raises(httpx.RemoteProtocolError):  # the caller sees the cut as well
            httpx.post(url, json={**body, "stream": True})
        ctx = proxy.context("team")
        settled(ctx, 1)
    (node,) = [node for node in ctx.graph.nodes() if node.kind == "llm"]
    received = "Budgets hold under load."  # (the two deltas before the cut)
    assert node.status == "fail" and node.error_class == "ClientPayloadError"
    assert node.tokens_out == len(received)  # (a token per character, at most max_tokens)
    assert node.metadata[META_USAGE_ESTIMATED] is True


def test_an_upstream_that_hangs_up_before_it_answers_is_charged_the_estimate() -> None:
    """The provider took the request and closed the connection without an answer: it may have
    billed it, so the call is charged its estimate (the bill is unknown), not nothing. One that
    cannot be reached at all is not billed (test_proxy.py)."""
    with ReplayServer() as replay, proxy_to(replay.openai_base_url) as proxy:
        replay.script("/v1/chat/completions", ReplayResponse.json({}, delay=5))
        url = proxy.base_urls()["OPENAI_BASE_URL"] + "/chat/completions"
        body = {"model": "gpt-4o-mini", "messages": PROMPT, "max_tokens": 40}
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(httpx.post, url, json=body, timeout=10)
            while not replay.requests:
                time.sleep(0.01)
            replay.stop()  # (it hangs up on the request it holds)
            assert answer.result().status_code == 502
            assert "took the request and gave no answer" in answer.result().text
        ctx = proxy.context("team")
        (node,) = [node for node in ctx.graph.nodes() if node.kind == "llm"]
    assert node.status == "fail" and node.error_class == "ServerDisconnectedError"
    assert node.tokens_out == 40 and node.metadata[META_USAGE_ESTIMATED] is True
    assert ctx.stats.total_cost() == node.cost_usd > 0


@pytest.mark.parametrize("flag", ["true", 1, {"on": True}])
def test_a_stream_flag_that_is_no_bool_is_refused_before_it_is_sent(flag: object) -> None:
    """The readers take only ``true`` as a stream (so the proxy asks for its usage); an
    upstream that reads ``"true"`` or ``1`` as one too (a lenient OpenAI-compatible server)
    would stream without it, billed at a usage the proxy never sees."""
    with ReplayServer() as replay, proxy_to(replay.openai_base_url) as proxy:
        url = proxy.base_urls()["OPENAI_BASE_URL"] + "/chat/completions"
        body = {"model": "gpt-4o-mini", "messages": PROMPT, "stream": flag}
        refused = httpx.post(url, json=body)
        assert refused.status_code == 400
        assert "'stream' must be true, false or null" in refused.json()["error"]["message"]
        assert replay.requests == []


def test_two_callers_without_a_key_are_a_budget_file_mistake(tmp_path: Path) -> None:
    """Requests that name no key go to the one caller without a key: with two, the first one's
    budget was silently never used."""
    path = tmp_path / "budgets.toml"
    path.write_text("[callers.team]\nmax_cost_usd = 10.0\n[callers.ci]\nmax_cost_usd = 1.0\n")
    with pytest.raises(BudgetFileError, match="callers ci and team have no key"):
        read_budget_file(path)
