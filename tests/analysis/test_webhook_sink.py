"""WebhookSink: limit events POSTed as JSON to a loopback receiver, off the caller's thread."""

from __future__ import annotations

import base64
import contextlib
import json
import multiprocessing
import socket
import threading
import time
import warnings
from collections.abc import Iterator
from typing import Any

import openai
import pytest

import ampmeter
from ampmeter import ExecutionContext, Limit, LimitExceeded
from ampmeter.errors import SinkClosedError
from ampmeter.keys import KEY_COST, KEY_STEPS, KEY_TOOL_CALLS
from ampmeter.sinks.webhook import EVENT_KINDS, WebhookSink
from ampmeter.testing import BillingProvider, RecordedRequest, ReplayResponse, ReplayServer

HOOK = "/hooks/T000/B000/secretpath"


def accepted(request: RecordedRequest) -> ReplayResponse:
    return ReplayResponse.json({"ok": True})


@pytest.fixture
def receiver() -> Iterator[ReplayServer]:
    """A webhook receiver on loopback that accepts every POST (scripted answers come first)."""
    with ReplayServer(fallback=accepted) as server:
        yield server


def received(server: ReplayServer) -> list[dict[str, Any]]:
    return [request.json() for request in server.requests if request.path == HOOK]


def spend(ctx: ExecutionContext, cost: float, name: str = "call") -> None:
    with ctx.llm_call(name, estimate_usd=cost) as call:
        call.record(tokens_in=10, tokens_out=5, cost_usd=cost)


def test_warnings_soft_limits_and_stops_arrive_with_their_fields(receiver: ReplayServer) -> None:
    limits = [
        Limit(KEY_COST, 1.0, warn_at=(0.5,)),
        Limit(KEY_STEPS, 2, soft=True),
    ]
    with WebhookSink(receiver.url + HOOK, backoff_s=0.01) as hook:
        with ExecutionContext("nightly", limits=limits, sinks=[hook]) as ctx:
            spend(ctx, 0.3)
            spend(ctx, 0.3)  # 60% of the cost limit: a warning
            spend(ctx, 0.3)  # 3 steps > 2: the soft limit
            with pytest.raises(LimitExceeded):
                spend(ctx, 0.3, "one too many")  # 1.2 > 1.0: refused before it runs
        chain_id = ctx.graph.chain_id
    # the refused call stopped the run: the context's own node ends halted too
    assert (hook.sent, hook.failures) == (4, 0)
    warning, soft, stop, run_stop = received(receiver)
    assert warning["kind"] == "warning" and warning["threshold"] == 0.5
    assert warning["key"] == KEY_COST and warning["limit"] == "amp:cost > $1.00"
    assert warning["value"] == 0.6 and warning["fraction"] == pytest.approx(0.6)
    assert warning["context"] == "nightly" and warning["chain_id"] == chain_id
    assert warning["node_kind"] == "llm" and warning["node_name"] == "call"
    assert isinstance(warning["ts_ms"], int)
    assert "warning on amp:cost at 60%" in warning["text"]
    assert soft["kind"] == "soft_limit" and soft["key"] == KEY_STEPS and soft["value"] == 3
    assert stop["kind"] == "stop" and stop["node_name"] == "one too many"
    assert stop["reason"].startswith("limit exceeded: amp:cost")
    assert "stopped" in stop["text"] and stop["context"] is None
    assert (run_stop["kind"], run_stop["node_name"], run_stop["context"]) == (
        "stop",
        "nightly",
        "nightly",
    )
    assert run_stop["text"].startswith("ampmeter: context 'nightly' stopped: limit exceeded")
    assert all(
        request.headers["content-type"] == "application/json" for request in receiver.requests
    )


def test_only_the_kinds_asked_for_are_sent(receiver: ReplayServer) -> None:
    limits = [Limit(KEY_COST, 1.0, warn_at=(0.5,))]
    with (
        WebhookSink(receiver.url + HOOK, events=["stop"]) as hook,
        ExecutionContext(limits=limits, sinks=[hook]) as ctx,
    ):
        spend(ctx, 0.6)
        with pytest.raises(LimitExceeded):
            spend(ctx, 0.6)
    # the refused call and the run it stopped; not the warning at 60%
    assert [event["kind"] for event in received(receiver)] == ["stop", "stop"]


def test_a_context_stopped_by_a_limit_is_a_stop_of_the_context(receiver: ReplayServer) -> None:
    with (
        WebhookSink(receiver.url + HOOK, events=["stop"]) as hook,
        pytest.raises(LimitExceeded),
        ExecutionContext("crawler", max_cost_usd=0.5, sinks=[hook]) as ctx,
    ):
        spend(ctx, 0.4)
        spend(ctx, 0.4)
    call, context = received(receiver)
    assert call["node_kind"] == "llm" and call["context"] is None
    assert context["node_name"] == "crawler" and context["context"] == "crawler"
    assert context["text"].startswith("ampmeter: context 'crawler' stopped")


def test_a_receiver_failing_twice_gets_the_event_on_the_third_try(receiver: ReplayServer) -> None:
    receiver.script(
        HOOK, ReplayResponse.json({"error": "busy"}, status=500), ReplayResponse(status=503)
    )
    limits = [Limit(KEY_COST, 1.0, warn_at=(0.5,))]
    with WebhookSink(receiver.url + HOOK, retries=3, backoff_s=0.05) as hook:
        with ExecutionContext(limits=limits, sinks=[hook]) as ctx:
            spend(ctx, 0.6)  # one warning
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # nothing failed: no warning at close
            hook.close()
    bodies = [request.body for request in receiver.requests]
    assert len(bodies) == 3 and len(set(bodies)) == 1  # the same event, three times
    assert (hook.sent, hook.failures, hook.last_error) == (1, 0, None)


def test_a_receiver_that_refuses_the_payload_is_not_asked_again(receiver: ReplayServer) -> None:
    receiver.script(HOOK, ReplayResponse.json({"error": "bad"}, status=400))
    hook = WebhookSink(receiver.url + HOOK, retries=3, backoff_s=0.01)
    with ExecutionContext(limits=[Limit(KEY_COST, 1.0, warn_at=(0.5,))], sinks=[hook]) as ctx:
        spend(ctx, 0.6)
    with pytest.warns(RuntimeWarning, match="did not deliver 1 limit event"):
        hook.close()
    assert len(receiver.requests) == 1
    assert (hook.failures, hook.last_error) == (1, "HTTP 400")


def hanging_receiver() -> socket.socket:
    """A port that accepts connections and never answers: the worst receiver to wait for."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(512)
    return listener


def refused_calls(ctx: ExecutionContext, count: int) -> float:
    """Seconds taken by ``count`` calls that a limit refuses (each one a stop event)."""
    started = time.perf_counter()
    for index in range(count):
        with pytest.raises(LimitExceeded):
            spend(ctx, 1.0, f"call {index}")
    return time.perf_counter() - started


@pytest.mark.parametrize("dead", ["hangs", "refuses connections"])
def test_a_dead_receiver_never_slows_or_fails_the_calls(dead: str) -> None:
    listener = hanging_receiver()
    port = listener.getsockname()[1]
    if dead == "refuses connections":
        listener.close()
    url = f"http://127.0.0.1:{port}{HOOK}"
    hook = WebhookSink(
        url, timeout_s=2.0, retries=2, backoff_s=0.2, queue_size=50, close_timeout_s=0.5
    )
    with ExecutionContext(max_cost_usd=0.5) as plain:
        baseline = refused_calls(plain, 300)
    with ExecutionContext(max_cost_usd=0.5, sinks=[hook]) as ctx:
        spend(ctx, 0.25)
        elapsed = refused_calls(ctx, 300)
    assert ctx.sink_errors == ()
    # One POST to this receiver takes up to 2 s: had a single emit waited for it, the 300 calls
    # would take longer than that. They take about as long as without the sink.
    assert elapsed < 1.0 + 3 * baseline, (elapsed, baseline)
    started = time.perf_counter()
    # 300 refused calls and the run they stopped: 301 stops, none delivered
    with pytest.warns(RuntimeWarning, match=r"did not deliver 301 limit event\(s\)") as caught:
        hook.close()
    assert time.perf_counter() - started < 0.5 + 2.0 + 1.0  # its wait, plus one attempt at most
    assert hook.failures == 301 and hook.sent == 0
    assert hook.dropped >= 301 - 50 - 1  # the queue holds 50, the worker one more
    message = str(caught[0].message)
    assert f"http://127.0.0.1:{port}" in message and "secretpath" not in message
    listener.close()


def test_an_api_key_never_reaches_the_payload(receiver: ReplayServer) -> None:
    """The key a client was built with, echoed into names and a stop reason, is scrubbed."""
    key = "sk-proj-webhooktest0123456789abcdef"
    ampmeter.instrument()
    try:
        with BillingProvider(prices={"gpt-4o-mini": ("0.15", "0.60")}) as provider:
            client = openai.OpenAI(base_url=provider.openai_base_url, api_key=key, max_retries=0)
            with WebhookSink(
                receiver.url + HOOK, headers={"authorization": "Bearer hooktoken123"}
            ) as hook:
                limits = [Limit(KEY_COST, 0.00002, warn_at=(0.1,)), Limit(KEY_TOOL_CALLS, 0)]
                with ExecutionContext(f"run for {key}", limits=limits, sinks=[hook]) as ctx:
                    messages: Any = [{"role": "user", "content": f"my key is {key}"}]
                    client.chat.completions.create(
                        model="gpt-4o-mini", messages=messages, max_tokens=20
                    )
                    with pytest.raises(LimitExceeded):
                        client.chat.completions.create(
                            model="gpt-4o-mini", messages=messages, max_tokens=20
                        )
                    with pytest.raises(LimitExceeded), ctx.tool_call(f"tool {key}"):
                        pass
    finally:
        ampmeter.uninstrument()
    events = received(receiver)
    assert {event["kind"] for event in events} >= {"warning", "stop"}
    assert len(events) == 4  # a warning, the refused call, the refused tool, the run's stop
    for request in receiver.requests:
        assert key.encode() not in request.body
        assert b"hooktoken123" not in request.body
        assert request.headers["authorization"] == "Bearer hooktoken123"
    assert any("[REDACTED]" in event["node_name"] for event in events)


def test_emit_after_close_is_an_error_and_close_is_idempotent(receiver: ReplayServer) -> None:
    hook = WebhookSink(receiver.url + HOOK)
    hook.close()
    hook.close()
    with (
        pytest.warns(RuntimeWarning, match="WebhookSink is closed"),
        pytest.raises(SinkClosedError),
        ExecutionContext(max_cost_usd=0.1, sinks=[hook]) as ctx,
    ):
        spend(ctx, 0.05)


def warn_on(ctx: ExecutionContext) -> None:
    """One call at 60% of a $1.00 cost limit with a warning at half: one warning event."""
    spend(ctx, 0.6)


def test_events_share_one_kept_connection(receiver: ReplayServer) -> None:
    limits = [Limit(KEY_COST, 1.0, warn_at=(0.5,))]
    with WebhookSink(receiver.url + HOOK) as hook:
        for _ in range(3):
            with ExecutionContext(limits=limits, sinks=[hook]) as ctx:
                warn_on(ctx)
            wait_for(lambda: hook.sent == len(receiver.requests))
    assert (hook.sent, hook.failures) == (3, 0)
    assert len({request.peer for request in receiver.requests}) == 1  # one connection


def test_a_redirect_is_a_failure_and_never_followed(receiver: ReplayServer) -> None:
    with ReplayServer(fallback=accepted) as elsewhere:
        moved = ReplayResponse(status=302, headers=(("location", elsewhere.url + "/stolen"),))
        receiver.script(HOOK, moved)
        hook = WebhookSink(
            receiver.url + HOOK, headers={"authorization": "Bearer hooktoken123"}, backoff_s=0.01
        )
        with ExecutionContext(limits=[Limit(KEY_COST, 1.0, warn_at=(0.5,))], sinks=[hook]) as ctx:
            warn_on(ctx)
        with pytest.warns(RuntimeWarning, match=r"did not deliver 1 .*HTTP 302, a redirect"):
            hook.close()
        assert elsewhere.requests == []  # neither the event nor the token went there
    assert len(receiver.requests) == 1  # a redirect is not retried either
    assert (hook.sent, hook.failures) == (0, 1)
    assert hook.last_error is not None and "not followed" in hook.last_error


def test_credentials_in_the_url_are_sent_as_basic_authorization(receiver: ReplayServer) -> None:
    host = receiver.url.removeprefix("http://")
    url = f"http://hook-user:pa%40ss-word-1234@{host}{HOOK}"
    limits = [Limit(KEY_COST, 1.0, warn_at=(0.5,))]
    with WebhookSink(url) as hook, ExecutionContext(limits=limits, sinks=[hook]) as ctx:
        warn_on(ctx)
    assert (hook.sent, hook.failures) == (1, 0)
    (request,) = receiver.requests
    assert request.path == HOOK
    expected = base64.b64encode(b"hook-user:pa@ss-word-1234").decode()
    assert request.headers["authorization"] == f"Basic {expected}"
    assert b"pa@ss" not in request.body and b"hook-user" not in request.body


def test_credentials_without_a_port_never_show_and_the_failure_is_counted(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Port 80 of loopback: whatever answers there (most often nothing), the event is counted
    once and the password is in no message, warning or output."""
    password = "hunter2-webhook-password"
    hook = WebhookSink(f"http://user:{password}@127.0.0.1/hook", retries=0, timeout_s=1.0)
    with ExecutionContext(limits=[Limit(KEY_COST, 1.0, warn_at=(0.5,))], sinks=[hook]) as ctx:
        warn_on(ctx)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hook.close()
    assert hook.sent + hook.failures == 1
    texts = [str(warning.message) for warning in caught] + [str(hook.last_error)]
    texts.extend(capfd.readouterr())
    assert all(password not in text for text in texts), texts
    if hook.failures:
        assert "http://127.0.0.1 " in str(caught[0].message)


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("http://user:s3cret-pass@127.0.0.1:notaport/x", "port is not a number"),
        ("http://user:s3cret-pass@127.0.0.1:99999/x", "port is not a number"),
        ("http://user:s3cret-pass@[::1/x", "cannot be read"),
        ("http://user:s3cret-pass@127.0.0.1/a b", "spaces or control characters"),
        ("ftp://user:s3cret-pass@127.0.0.1/x", "got a ftp:// URL"),
    ],
)
def test_a_bad_url_is_refused_in_one_line_without_its_credentials(url: str, match: str) -> None:
    with pytest.raises(ValueError, match=match) as refused:
        WebhookSink(url)
    assert "s3cret" not in str(refused.value) and "\n" not in str(refused.value)


def test_credentials_and_an_authorization_header_are_refused_together() -> None:
    with pytest.raises(ValueError, match="give one of them"):
        WebhookSink("http://u:password1@127.0.0.1:9/x", headers={"Authorization": "Bearer t"})


class OneAnswerReceiver:
    """A port that reads one whole request per connection, answers ``answer`` and hangs up:
    bytes that are not HTTP, or a 200 that does not say it closes the connection."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self.connections = 0
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}{HOOK}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return  # closed
            self.connections += 1
            with connection:
                if self._read_request(connection):
                    connection.sendall(self.answer)

    @staticmethod
    def _read_request(connection: socket.socket) -> bool:
        """Read one whole request (unread bytes would reset the answer); False at EOF."""
        request = b""
        while b"\r\n\r\n" not in request:
            chunk = connection.recv(65536)
            if not chunk:
                return False
            request += chunk
        head, _, body = request.partition(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        while len(body) < length:
            chunk = connection.recv(65536)
            if not chunk:
                return False
            body += chunk
        return True

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() under way
        self.listener.close()
        self.thread.join(5)


def test_a_kept_connection_the_receiver_closed_is_replaced_at_once() -> None:
    """No retries allowed: the second event still arrives, on a new connection."""
    receiver = OneAnswerReceiver(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
    try:
        hook = WebhookSink(receiver.url, retries=0)
        for _ in range(2):
            with ExecutionContext(
                limits=[Limit(KEY_COST, 1.0, warn_at=(0.5,))], sinks=[hook]
            ) as ctx:
                warn_on(ctx)
            wait_for(lambda: hook.sent + hook.failures == receiver.connections)
        hook.close()
    finally:
        receiver.close()
    assert (hook.sent, hook.failures, receiver.connections) == (2, 0, 2)


def test_an_error_on_the_sending_thread_is_counted_and_the_thread_goes_on() -> None:
    garbage = OneAnswerReceiver(b"NOT HTTP AT ALL\r\n\r\n")
    try:
        hook = WebhookSink(garbage.url, retries=1, backoff_s=0.01)
        for _ in range(2):
            with ExecutionContext(
                limits=[Limit(KEY_COST, 1.0, warn_at=(0.5,))], sinks=[hook]
            ) as ctx:
                warn_on(ctx)
        with pytest.warns(RuntimeWarning, match=r"did not deliver 2 .*BadStatusLine"):
            hook.close()
    finally:
        garbage.close()
    assert (hook.sent, hook.failures) == (0, 2)


def _warn_in_child(hook: WebhookSink) -> None:
    limits = [Limit(KEY_COST, 1.0, warn_at=(0.5,))]
    with ExecutionContext("child", limits=limits, sinks=[hook]) as ctx:
        warn_on(ctx)
    # no close(): the child closes its copy of the sink when it exits


def test_a_forked_child_sends_its_own_events_on_its_own_connection(
    receiver: ReplayServer,
) -> None:
    limits = [Limit(KEY_COST, 1.0, warn_at=(0.5,))]
    with WebhookSink(receiver.url + HOOK) as hook:
        with ExecutionContext("parent", limits=limits, sinks=[hook]) as ctx:
            warn_on(ctx)
        wait_for(lambda: hook.sent == 1)  # the parent's connection is open when it forks
        child = multiprocessing.get_context("fork").Process(target=_warn_in_child, args=(hook,))
        child.start()
        child.join(timeout=60)
        assert child.exitcode == 0
        with ExecutionContext("parent", limits=limits, sinks=[hook]) as ctx:
            warn_on(ctx)
    contexts = [event["context"] for event in received(receiver)]
    assert sorted(contexts) == ["child", "parent", "parent"]
    assert (hook.sent, hook.failures) == (2, 0)  # the parent counts its own events only
    parent_peers = {r.peer for r in receiver.requests if r.json()["context"] == "parent"}
    child_peers = {r.peer for r in receiver.requests if r.json()["context"] == "child"}
    assert len(parent_peers) == 1 and not parent_peers & child_peers


def wait_for(condition: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


@pytest.mark.parametrize(
    ("arguments", "error", "match"),
    [
        ({"url": "ftp://example.com/x"}, ValueError, "http:// or https://"),
        ({"url": "http:///nohost"}, ValueError, "with a host"),
        ({"url": b"http://x"}, TypeError, "url must be a str"),
        ({"events": ["warnings"]}, ValueError, "warnings"),
        ({"events": "stop"}, TypeError, "collection of kinds"),
        ({"events": []}, ValueError, "got none"),
        ({"retries": -1}, ValueError, "retries"),
        ({"queue_size": 0}, ValueError, "queue_size"),
        ({"timeout_s": 0}, ValueError, "timeout_s"),
        ({"backoff_s": float("nan")}, ValueError, "backoff_s"),
        ({"headers": {"x": 1}}, TypeError, "headers"),
        ({"headers": {"x-token": "t\r\nx-evil: 1"}}, ValueError, "'x-token' must not hold"),
    ],
)
def test_bad_arguments_are_refused(
    arguments: dict[str, Any], error: type[Exception], match: str
) -> None:
    options = {"url": "http://127.0.0.1:9/hook", **arguments}
    with pytest.raises(error, match=match):
        WebhookSink(**options)


def test_every_kind_is_known() -> None:
    assert {"warning", "soft_limit", "stop", "pause", "resume"} <= EVENT_KINDS
    assert ampmeter.WebhookSink is WebhookSink
    assert json.loads(json.dumps(sorted(EVENT_KINDS)))
