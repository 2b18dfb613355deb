"""Error text never carries a credential, nor (unless content capture is on) the request.

The real openai and anthropic SDKs talk to the replay server, which answers every error path
with a body quoting the request's API key and prompt, as real providers' bodies do; every
output (the JSONL log, ``ctx.snapshot()``, the OpenTelemetry spans, the HTML report) is then
searched for both.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ampmeter import ExecutionContext, redact
from ampmeter.integrations import instrument, uninstrument
from ampmeter.report import write_report
from ampmeter.sinks.jsonl import JsonlSink
from ampmeter.sinks.otel import OtelSink
from ampmeter.testing import recorded
from ampmeter.testing.replay import ReplayResponse, ReplayServer, Responder

CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"
PROMPT = "tangerine-protocol: the launch code is 7731"
# An sk- shaped key is caught by its shape; the other only because the client was built with it.
KEYS = {
    "openai": ["sk-proj-PLANTED0penaiKey0123456789", "PLANTEDproxyKeyWithoutPrefix42"],
    "anthropic": ["sk-ant-api03-PLANTEDanthropicKey0123", "PLANTEDproxyKeyWithoutPrefix42"],
}


@pytest.fixture(params=[False, True], ids=["capture-off", "capture-on"])
def capture(request: pytest.FixtureRequest) -> Iterator[bool]:
    instrument(capture_content=request.param)
    yield request.param
    uninstrument()


def _openai_call(replay: ReplayServer, key: str, stream: bool) -> None:
    client = openai.OpenAI(base_url=replay.openai_base_url, api_key=key, max_retries=0)
    messages: Any = [{"role": "user", "content": PROMPT}]
    if stream:
        for _ in client.chat.completions.create(
            model="gpt-4o-mini", messages=messages, stream=True
        ):
            pass
    else:
        client.chat.completions.create(model="gpt-4o-mini", messages=messages)


def _anthropic_call(replay: ReplayServer, key: str, stream: bool) -> None:
    client = anthropic.Anthropic(base_url=replay.anthropic_base_url, api_key=key, max_retries=0)
    messages: Any = [{"role": "user", "content": PROMPT}]
    if stream:
        with client.messages.stream(
            model="claude-haiku-4-5", max_tokens=64, messages=messages
        ) as events:
            for _ in events:
                pass
    else:
        client.messages.create(model="claude-haiku-4-5", max_tokens=64, messages=messages)


# (provider, route, what the server answers, streamed request, the answer quotes the request)
CASES: list[tuple[str, str, Callable[[], Responder | ReplayResponse], bool, bool]] = [
    *[
        ("openai", CHAT, lambda s=s: recorded.openai_error_echoing(s), False, True)
        for s in (400, 401, 429, 500)
    ],
    ("openai", CHAT, recorded.openai_stream_error_echoing, True, True),
    ("openai", CHAT, lambda: recorded.openai_chat_stream_usage(cut_after=2), True, False),
    *[
        ("anthropic", MESSAGES, lambda s=s: recorded.anthropic_error_echoing(s), False, True)
        for s in (400, 401, 429, 500, 529)
    ],
    ("anthropic", MESSAGES, recorded.anthropic_stream_error_echoing, True, True),
    ("anthropic", MESSAGES, lambda: recorded.anthropic_message_stream(cut_after=3), True, False),
]
IDS = [
    "openai-400",
    "openai-401",
    "openai-429",
    "openai-500",
    "openai-stream-error",
    "openai-stream-cut",
    "anthropic-400",
    "anthropic-401",
    "anthropic-429",
    "anthropic-500",
    "anthropic-529",
    "anthropic-stream-error",
    "anthropic-stream-cut",
]


def _outputs(tmp_path: Path, run: Callable[[], None]) -> dict[str, str]:
    """Run ``run`` (expected to raise) in a context with every output, and return them."""
    log = tmp_path / "run.jsonl"
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    sink = JsonlSink(log)
    with (
        pytest.raises(Exception),  # noqa: B017 - each path raises its own SDK error
        ExecutionContext("agent", sinks=[sink, OtelSink(tracer_provider=provider)]) as ctx,
    ):
        run()
    snapshot = json.dumps(ctx.snapshot(), default=str)
    spans = []
    for span in exporter.get_finished_spans():
        spans.append(f"{span.status.description} {dict(span.attributes or {})}")
        spans += [f"{e.name} {dict(e.attributes or {})}" for e in span.events]
    report = tmp_path / "report.html"
    write_report([log], report)
    failed = [n for n in ctx.graph.nodes() if n.kind == "llm"]
    assert failed and all(n.status == "fail" for n in failed), snapshot
    return {
        "jsonl": log.read_text("utf-8"),
        "snapshot": snapshot,
        "spans": "\n".join(spans),
        "report": report.read_text("utf-8"),
    }


@pytest.mark.parametrize(("provider", "route", "answer", "stream", "echoes"), CASES, ids=IDS)
@pytest.mark.parametrize("key_index", [0, 1], ids=["sk-shaped-key", "opaque-key"])
def test_no_output_holds_the_key_nor_without_capture_the_prompt(
    replay: ReplayServer,
    tmp_path: Path,
    capture: bool,
    provider: str,
    route: str,
    answer: Callable[[], Responder | ReplayResponse],
    stream: bool,
    echoes: bool,
    key_index: int,
) -> None:
    key = KEYS[provider][key_index]
    replay.script(route, answer())
    call = _openai_call if provider == "openai" else _anthropic_call
    outputs = _outputs(tmp_path, lambda: call(replay, key, stream))
    for name, text in outputs.items():
        assert key not in text, f"the API key reached the {name}"
        assert key[:12] not in text, f"part of the API key reached the {name}"
        if not capture:
            assert "tangerine" not in text, f"the prompt reached the {name}"
    (llm,) = [
        e for e in map(json.loads, outputs["jsonl"].splitlines()) if e["event_type"] != "cpu_op"
    ]
    reason = llm["metadata"]["stop_reason"]
    assert reason.startswith(llm["metadata"]["error_class"])
    if echoes and not capture:
        assert reason.endswith("(message withheld: content capture is off)")
    if echoes and capture:
        assert "tangerine" in reason  # with capture on, the provider's message is kept
        assert "[REDACTED]" in reason


def test_the_error_class_status_and_provider_codes_are_kept(replay: ReplayServer) -> None:
    instrument()
    try:
        replay.script(CHAT, recorded.openai_error_echoing(401))
        with pytest.raises(openai.AuthenticationError), ExecutionContext("agent") as ctx:
            _openai_call(replay, KEYS["openai"][0], stream=False)
    finally:
        uninstrument()
    (node,) = [n for n in ctx.graph.nodes() if n.kind == "llm"]
    assert node.error_class == "AuthenticationError"
    assert node.stop_reason == (
        "AuthenticationError (HTTP 401): invalid_request_error, invalid_api_key "
        "(message withheld: content capture is off)"
    )


@pytest.mark.parametrize(
    ("text", "leak"),
    [
        ("Authorization: Bearer abc.DEF-123", "abc.DEF"),
        ("header authorization=Basic dXNlcjpwYXNz", "dXNlcjpw"),
        ("got bearer eyJhbGciOi.payload.sig from proxy", "eyJhbGciOi"),
        ("key sk-ant-api03-AAAABBBBCCCC rejected", "AAAABBBB"),
        ("Incorrect API key provided: sk-proj-****wxyz", "wxyz"),
        ("url?api_key=hunter22secret&x=1", "hunter22"),
        ('{"api-key": "s3cr3t-value"}', "s3cr3t"),
        ("x-api-key: abcdefgh12345", "abcdefgh"),
        ("password=correcthorse", "correcthorse"),
    ],
)
def test_scrub_removes_credentials_by_shape(text: str, leak: str) -> None:
    scrubbed = redact.scrub(text)
    assert leak not in scrubbed and redact.REDACTED in scrubbed


def test_scrub_keeps_ordinary_text() -> None:
    text = "invalid x-api-key; the skill sk- was missing; bearer of bad news"
    assert redact.scrub("connection reset by peer") == "connection reset by peer"
    assert "invalid x-api-key" in redact.scrub(text)


def test_remembered_secrets_are_scrubbed_whole_and_short_ones_ignored() -> None:
    redact.remember_secret("opaque-SECRET-value-1")
    redact.remember_secret("opaque-SECRET-value-1-longer")
    redact.remember_secret("k")  # too short to scrub without eating ordinary words
    text = redact.error_text(ValueError("a opaque-SECRET-value-1-longer b opaque-SECRET-value-1"))
    assert text == "ValueError: a [REDACTED] b [REDACTED]"
    assert redact.error_text(ValueError("keep k")) == "ValueError: keep k"


def test_error_text_of_a_plain_exception_is_one_line() -> None:
    assert (
        redact.error_text(RuntimeError("two\nlines\x1b[31m")) == "RuntimeError: two lines\x1b[31m"
    )
    assert redact.error_text(KeyError()) == "KeyError"


def test_a_client_key_changed_after_its_first_call_is_scrubbed_too() -> None:
    """A metered client's key is read when the client is first seen and again whenever a text is
    scrubbed, so a key set on the client later (with or without a call since), or a second
    client's, is scrubbed as well."""
    first, second, third, fourth = (f"PLANTEDrotatedKey{n}WithoutPrefix0123" for n in range(4))
    client = openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key=first, max_retries=0)
    redact.remember_client(client)
    redact.remember_client(client)
    client.api_key = second
    redact.remember_client(client)
    other = anthropic.Anthropic(base_url="http://127.0.0.1:9", auth_token=third, max_retries=0)
    redact.remember_client(other)
    assert "PLANTED" not in redact.scrub(f"echo {first} {second} {third}")
    client.api_key = fourth  # no call since: read when the text is scrubbed
    assert "PLANTED" not in redact.scrub(f"echo {fourth} {first}")
