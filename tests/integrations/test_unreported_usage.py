"""A response without usage is charged, never zero (issue 36, point 2).

The billing provider bills every request; here its answers carry no usage (a stream sent with
``include_usage: false``, a proxy that strips ``usage``). Driven through the real openai and
anthropic SDKs under a cost cap, the cap holds: ampmeter charges each call its input estimate
and the output it counted from what it received, marks it ``estimated`` on the node and in the
event log, and stops the next call before it is sent.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from typer.testing import CliRunner

from ampmeter import ExecutionContext, LimitExceeded
from ampmeter.analysis import summarize
from ampmeter.cli import app
from ampmeter.logs import event_problem, validate_event
from ampmeter.pricing import request_size, tokenizer
from ampmeter.report import write_report
from ampmeter.report.charts import dollars
from ampmeter.sinks.jsonl import JsonlSink
from ampmeter.sinks.memory import MemorySink
from ampmeter.testing import BillingProvider, recorded
from ampmeter.testing.replay import ReplayResponse, ReplayServer

pytestmark = pytest.mark.usefixtures("instrumented")  # conftest.py

KEY = "test-key"
PRICES = {"gpt-4o": ("2.5", "10"), "claude-haiku-4-5": ("1", "5")}
MESSAGES = [{"role": "user", "content": "Write a long story about the sea. " * 4}]
CAP = Decimal("0.01")
OUTPUT = 100  # tokens of every answer: about $0.001 a call on gpt-4o


def _chat_stream_without_usage(server: BillingProvider) -> None:
    client = openai.OpenAI(base_url=server.openai_base_url, api_key=KEY, max_retries=0)
    stream = client.chat.completions.create(
        model="gpt-4o",
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=OUTPUT,
        stream=True,
        stream_options={"include_usage": False},
    )
    assert all(chunk.choices for chunk in stream)  # the caller sees the chunks it asked for


def _chat(server: BillingProvider) -> None:
    client = openai.OpenAI(base_url=server.openai_base_url, api_key=KEY, max_retries=0)
    answer = client.chat.completions.create(
        model="gpt-4o",
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=OUTPUT,
    )
    assert answer.usage is None and answer.choices[0].message.content


def _chat_stream(server: BillingProvider) -> None:
    client = openai.OpenAI(base_url=server.openai_base_url, api_key=KEY, max_retries=0)
    stream = client.chat.completions.create(
        model="gpt-4o",
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=OUTPUT,
        stream=True,
    )
    assert all(chunk.choices for chunk in stream)


def _messages(server: BillingProvider) -> None:
    client = anthropic.Anthropic(base_url=server.anthropic_base_url, api_key=KEY, max_retries=0)
    answer = client.messages.create(
        model="claude-haiku-4-5",
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=OUTPUT,
    )
    assert answer.content


def _messages_stream(server: BillingProvider) -> None:
    # (The SDK's messages.stream helper itself needs the usage of message_delta: a proxy that
    # strips it breaks the helper, with or without ampmeter. The raw event stream reads on.)
    client = anthropic.Anthropic(base_url=server.anthropic_base_url, api_key=KEY, max_retries=0)
    events = client.messages.create(
        model="claude-haiku-4-5",
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=OUTPUT,
        stream=True,
    )
    assert [event.type for event in events][-1] == "message_stop"


# name -> (the call, whether the provider strips usage from every answer)
CASES: dict[str, tuple[Callable[[BillingProvider], None], bool]] = {
    "openai stream with include_usage false": (_chat_stream_without_usage, False),
    "openai answer whose usage a proxy stripped": (_chat, True),
    "openai stream whose usage a proxy stripped": (_chat_stream, True),
    "anthropic answer whose usage a proxy stripped": (_messages, True),
    "anthropic stream whose usage a proxy stripped": (_messages_stream, True),
}


@pytest.fixture(autouse=True)
def _nothing_learned() -> Iterator[None]:
    request_size.forget()
    yield
    request_size.forget()


def _teach(openai_model: bool) -> None:
    """Calls of the same model that report their usage first, as a run's earlier calls would:
    its characters-per-token ratio is then learned, and the input of a call without usage is
    charged from it (before, from the cautious prior: about four times the bill)."""
    with BillingProvider(output_tokens=OUTPUT, prices=PRICES) as teacher, ExecutionContext():
        for _ in range(10):
            if openai_model:
                client = openai.OpenAI(base_url=teacher.openai_base_url, api_key=KEY)
                client.chat.completions.create(
                    model="gpt-4o",
                    messages=MESSAGES,
                    max_tokens=OUTPUT,  # type: ignore[arg-type]
                )
            else:
                maker = anthropic.Anthropic(base_url=teacher.anthropic_base_url, api_key=KEY)
                maker.messages.create(
                    model="claude-haiku-4-5",
                    max_tokens=OUTPUT,
                    messages=MESSAGES,  # type: ignore[arg-type]
                )


@pytest.mark.parametrize("case", list(CASES))
def test_calls_without_usage_are_charged_estimated_and_the_cap_holds(
    case: str, tmp_path: Path
) -> None:
    call, strip = CASES[case]
    log = tmp_path / "calls.jsonl"
    sink = MemorySink()
    _teach(case.startswith("openai"))
    with BillingProvider(output_tokens=OUTPUT, prices=PRICES, strip_usage=strip) as server:
        with (
            pytest.raises(LimitExceeded),
            JsonlSink(log) as jsonl,
            ExecutionContext(max_cost_usd=CAP, sinks=[sink, jsonl]) as ctx,
        ):
            for _ in range(100):  # on a $0 count this would never stop
                call(server)
        billed = server.billed_usd
        calls = server.calls
    recorded = ctx.stats.total_cost()
    assert not any(c.usage_reported for c in calls)
    assert len(calls) >= 5  # the cap was spent on calls, not refused at once
    assert billed <= CAP, f"the provider billed {billed} under a {CAP} cap"
    assert recorded >= billed, f"recorded {recorded} < billed {billed}"
    assert recorded <= billed * Decimal("1.25")  # counted from what came back, not a guess
    nodes = [n for n in sink.nodes if n.kind == "llm" and n.status == "success"]
    assert len(nodes) == len(calls)
    assert {n.metadata["cost_status"] for n in nodes} == {"estimated"}
    for node, billed_call in zip(nodes, calls, strict=True):
        assert node.tokens_out == billed_call.output_tokens  # one "tok " a token, as counted
        assert node.tokens_in is not None and node.tokens_in >= billed_call.input_tokens
    events = [json.loads(line) for line in log.read_text().splitlines()]
    llm_events = [
        e
        for e in events
        if e["event_type"] == "llm_completion" and e["metadata"]["status"] == "success"
    ]
    assert llm_events and all(e["metadata"]["cost_status"] == "estimated" for e in llm_events)
    assert sum(e["cost_usd"] for e in llm_events) >= float(billed)


@pytest.mark.parametrize(
    "options",
    [{}, {"stream_options": None}, {"stream_options": {"include_usage": None}}],
    ids=["no stream_options", "stream_options null", "include_usage null"],
)
def test_a_plain_stream_asks_for_usage_and_the_caller_never_sees_the_usage_chunk(
    options: dict[str, Any],
) -> None:
    """Unless the caller set ``include_usage``, ampmeter asks for usage; the usage-only chunk
    (no choices, which frameworks that read ``choices[0]`` would trip on) is kept from the
    caller, and the call is priced from the provider's own count."""
    sink = MemorySink()
    with BillingProvider(output_tokens=7, prices=PRICES) as server:
        client = openai.OpenAI(base_url=server.openai_base_url, api_key=KEY, max_retries=0)
        with ExecutionContext(sinks=[sink]):
            chunks = list(
                client.chat.completions.create(
                    model="gpt-4o",
                    messages=MESSAGES,  # type: ignore[arg-type]
                    stream=True,
                    **options,
                )
            )
        (billed,) = server.calls
        sent = server.requests[0].json()
    assert sent["stream_options"] == {"include_usage": True} and billed.usage_reported
    assert all(chunk.choices and chunk.usage is None for chunk in chunks)
    (node,) = [n for n in sink.nodes if n.kind == "llm"]
    assert node.metadata["cost_status"] == "priced"
    assert (node.tokens_in, node.tokens_out) == (billed.input_tokens, billed.output_tokens)


def test_a_response_that_cannot_be_counted_is_charged_its_most_output() -> None:
    """A whole answer with no usage and nothing in it to count (no text, no tool call) is
    charged its input estimate and its ``max_tokens``."""
    sink = MemorySink()
    with BillingProvider(output_tokens=0, prices=PRICES, strip_usage=True) as server:
        client = openai.OpenAI(base_url=server.openai_base_url, api_key=KEY, max_retries=0)
        with ExecutionContext(sinks=[sink]):
            client.chat.completions.create(
                model="gpt-4o",
                messages=MESSAGES,  # type: ignore[arg-type]
                max_tokens=321,
            )
    (node,) = [n for n in sink.nodes if n.kind == "llm"]
    assert node.tokens_out == 321 and node.metadata["cost_status"] == "estimated"
    assert node.cost_usd > 0


def test_estimated_spend_is_shown_by_summary_report_and_watch(tmp_path: Path) -> None:
    """One call billed without its usage beside one with it: every reader shows the estimated
    part of the spend as its own figure (both summary engines alike) and the log stays valid."""
    log = tmp_path / "calls.jsonl"
    with JsonlSink(log) as jsonl, ExecutionContext("mixed", sinks=[jsonl]) as ctx:
        with BillingProvider(output_tokens=OUTPUT, prices=PRICES) as server:
            client = openai.OpenAI(base_url=server.openai_base_url, api_key=KEY, max_retries=0)
            client.chat.completions.create(
                model="gpt-4o",
                messages=MESSAGES,  # type: ignore[arg-type]
                max_tokens=OUTPUT,
            )
        with BillingProvider(output_tokens=OUTPUT, prices=PRICES, strip_usage=True) as server:
            _chat(server)
            (billed,) = server.calls
    events = [json.loads(line) for line in log.read_text().splitlines()]
    for event in events:
        validate_event(event)
        assert event_problem(event) is None
    statuses = [e["metadata"]["cost_status"] for e in events]
    assert statuses == ["priced", "estimated"]
    estimated = events[1]["cost_usd"]
    assert estimated >= float(billed.cost_usd or 0) > 0
    (run,) = summarize([log], engine="python").runs
    assert run.estimated_cost_usd == pytest.approx(estimated)
    assert run.cost_usd == pytest.approx(float(ctx.stats.total_cost()))
    assert summarize([log], engine="duckdb").runs == [run]
    runner = CliRunner()
    out = runner.invoke(app, ["summary", "--wide", str(log)], env={"COLUMNS": "250"})
    assert out.exit_code == 0, out.output
    assert "estimated" in out.output and dollars(estimated) in out.output
    html = Path(write_report([log], tmp_path / "report.html")).read_text()
    shown = dollars(estimated)
    assert f'<b class="estimated">{shown}</b> estimated' in html
    assert f'<span class="badge estimated">{shown} estimated</span>' in html
    watched = runner.invoke(app, ["watch", "--once", str(log)], env={"COLUMNS": "160"})
    assert watched.exit_code == 0, watched.output
    assert "estimated" in watched.stdout


def test_a_gemini_answer_without_usage_metadata_is_estimated(replay: ReplayServer) -> None:
    """google-genai, read at the HTTP layer: an answer without ``usageMetadata`` is charged
    its input estimate and the output counted from its text and function calls (thinking
    off: a thinking model's is charged its unseen thoughts, test_gemini_thinking.py)."""
    from google import genai
    from google.genai import types

    body = recorded.load("gemini_generate_content")
    del body["usageMetadata"]
    replay.script("/v1beta/models/gemini-2.5-flash:generateContent", ReplayResponse.json(body))
    options = types.HttpOptions(base_url=replay.url, api_version="v1beta")
    client = genai.Client(api_key="k", http_options=options)
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        client.models.generate_content(
            model="gemini-2.5-flash",
            contents="Weather in Paris and Oslo?",
            config=types.GenerateContentConfig(
                max_output_tokens=300, thinking_config=types.ThinkingConfig(thinking_budget=0)
            ),
        )
    (node,) = [n for n in sink.nodes if n.kind == "llm"]
    assert node.metadata["cost_status"] == "estimated" and node.cost_usd > 0
    assert node.tokens_in is not None and node.tokens_in > 0
    # "Checking the weather in both cities." and two calls of get_weather, at 4 characters a
    # token: counted, not the 300 the call could have written.
    assert node.tokens_out is not None and 20 <= node.tokens_out < 300


def test_with_the_tokenizer_a_whole_answer_without_usage_is_counted_by_it() -> None:
    """Switched on, the offline tokenizer counts the text of an OpenAI model's answer that
    came without its usage (dense text the characters would undercount)."""
    pytest.importorskip("bpe_openai")
    dense = "東京の天気は晴れです。" * 20  # about a token a character, not four characters
    sink = MemorySink()
    tokenizer.use(True)
    try:
        with BillingProvider(output_tokens=1, prices=PRICES, strip_usage=True) as server:
            server.script(
                "/v1/chat/completions",
                ReplayResponse.json(
                    {
                        "id": "chatcmpl-dense",
                        "object": "chat.completion",
                        "model": "gpt-4o",
                        "choices": [
                            {
                                "index": 0,
                                "message": {"role": "assistant", "content": dense},
                                "finish_reason": "stop",
                            }
                        ],
                        "usage": None,
                    }
                ),
            )
            client = openai.OpenAI(base_url=server.openai_base_url, api_key=KEY, max_retries=0)
            with ExecutionContext(sinks=[sink]):
                client.chat.completions.create(
                    model="gpt-4o",
                    messages=MESSAGES,  # type: ignore[arg-type]
                    max_tokens=1000,
                )
        counted = tokenizer.COUNTERS["gpt-4o"]
        assert counted is not None
        (node,) = [n for n in sink.nodes if n.kind == "llm"]
        assert node.tokens_out == counted(dense) > len(dense) // 4 + 20
        assert node.metadata["cost_status"] == "estimated"
    finally:
        tokenizer.use(False)
