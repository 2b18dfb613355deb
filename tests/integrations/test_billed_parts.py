"""Parts a provider bills at rates of their own are charged at those rates, read from the real
SDKs' responses (whole and streamed), at the HTTP layer and through the proxy.

Each call's cost must equal genai-prices' answer for the same response (its own extractor
where it reads the part, else the same counts given to ``calc_price``): before, a 1-hour cache
write was priced at the 5-minute rate, audio as text and a web search at $0.
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import anthropic
import genai_prices
import httpx
import openai
import pytest
from genai_prices import Usage

from ampmeter import ExecutionContext, LimitExceeded, Node
from ampmeter.proxy import MeteringProxy
from ampmeter.proxy.budget_file import budgets_from
from ampmeter.sinks.jsonl import JsonlSink
from ampmeter.sinks.memory import MemorySink
from ampmeter.testing import recorded
from ampmeter.testing.replay import ReplayResponse, ReplayServer
from support.wire import chat_stream

instrumented = pytest.mark.usefixtures("instrumented")  # (conftest.py; not for the proxy)

CLAUDE = "claude-sonnet-5"  # 1-hour writes $4/M beside $2.5/M for 5 minutes; $10 per 1k searches
PROMPT = [{"role": "user", "content": "Find this week's news about the sea."}]
MESSAGES = "/v1/messages"
ANTHROPIC_USAGE = {
    "input_tokens": 412,
    "cache_creation_input_tokens": 3000,
    "cache_read_input_tokens": 2048,
    "cache_creation": {"ephemeral_5m_input_tokens": 1000, "ephemeral_1h_input_tokens": 2000},
    "server_tool_use": {"web_search_requests": 3},
    "output_tokens": 96,
}


def only_call(sink: MemorySink) -> Node:
    (node,) = [node for node in sink.nodes if node.kind == "llm"]
    return node


def table_price(usage: Usage, model: str, provider: str) -> Decimal:
    """genai-prices' price of ``usage``, in whole nano-dollars as ampmeter counts money."""
    total = genai_prices.calc_price(usage, model, provider_id=provider).total_price
    return total.quantize(Decimal("1E-9"))


def anthropic_message() -> dict[str, Any]:
    body = dict(recorded.load("anthropic_message_tool_use"))
    return {**body, "model": CLAUDE, "usage": ANTHROPIC_USAGE}


def anthropic_events() -> list[tuple[str | None, Any]]:
    """The recorded stream with the usage above: the input counts in ``message_start``, the
    output and the searches in ``message_delta`` (as Anthropic sends them)."""
    events = [
        (event["event"], event["data"]) for event in recorded.load("anthropic_message_stream")
    ]
    start_usage = {k: v for k, v in ANTHROPIC_USAGE.items() if k != "server_tool_use"}
    start = events[0][1]
    events[0] = ("message_start", {**start, "message": {**start["message"], "model": CLAUDE}})
    events[0][1]["message"]["usage"] = {**start_usage, "output_tokens": 1}
    delta = events[-2][1]
    usage = {"output_tokens": 96, "server_tool_use": {"web_search_requests": 3}}
    events[-2] = ("message_delta", {**delta, "usage": usage})
    return events


@instrumented
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_anthropic_one_hour_writes_and_web_searches(
    replay: ReplayServer, tmp_path: Path, stream: bool
) -> None:
    """Before, the 2,000 1-hour tokens were priced at the 5-minute rate and 3 searches at 0."""
    answer = anthropic_message()
    replay.script(
        MESSAGES, ReplayResponse.sse(anthropic_events()) if stream else ReplayResponse.json(answer)
    )
    client = anthropic.Anthropic(base_url=replay.anthropic_base_url, api_key="k", max_retries=0)
    sink, log = MemorySink(), tmp_path / "calls.jsonl"
    with ExecutionContext(sinks=[sink, JsonlSink(log)]):
        if stream:
            with client.messages.stream(model=CLAUDE, max_tokens=200, messages=PROMPT) as events:
                events.until_done()
        else:
            client.messages.create(model=CLAUDE, max_tokens=200, messages=PROMPT)
    node = only_call(sink)
    expected = genai_prices.extract_usage(answer, provider_id="anthropic").usage
    assert expected.cache_write_1h_tokens == 2000 and expected.web_searches == 3
    assert node.cost_usd == table_price(expected, CLAUDE, "anthropic")
    # What the parts add: 2,000 1-hour tokens at $4/M, not $2.5/M, and 3 searches at $0.01.
    before = table_price(Usage(**_plain(expected)), CLAUDE, "anthropic")
    assert node.cost_usd - before == Decimal("0.003") + Decimal("0.03")
    assert node.metadata["cache_write_1h_tokens"] == 2000
    assert node.metadata["web_searches"] == 3
    (line,) = [json.loads(text) for text in log.read_text().splitlines()]
    assert line["metadata"]["cache_write_1h_tokens"] == 2000
    assert line["metadata"]["web_searches"] == 3
    assert Decimal(str(line["cost_usd"])) == node.cost_usd


def _plain(usage: Usage) -> dict[str, int]:
    """The six counts of ``usage`` alone, as ampmeter priced it before parts."""
    names = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")
    return {name: int(getattr(usage, name)) for name in names}


AUDIO_MODEL = "gpt-audio"  # input audio $32/M beside $2.5/M text; output audio $64/M beside $10/M
CHAT_USAGE = {
    "prompt_tokens": 1500,
    "completion_tokens": 700,
    "total_tokens": 2200,
    "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 1200},
    "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 600},
}


@instrumented
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_openai_chat_audio_tokens(replay: ReplayServer, stream: bool) -> None:
    """Before, 1,200 audio input tokens were priced as text ($2.5/M, not $32/M)."""
    whole = {
        "id": "chatcmpl-audio",
        "object": "chat.completion",
        "created": 1700000000,
        "model": AUDIO_MODEL,
        "choices": [
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": ""}}
        ],
        "usage": CHAT_USAGE,
    }
    chunk = {
        "id": "chatcmpl-audio",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": AUDIO_MODEL,
        "choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}],
    }
    answer = chat_stream(chunk, CHAT_USAGE) if stream else ReplayResponse.json(whole)
    replay.script("/v1/chat/completions", answer)
    client = openai.OpenAI(base_url=replay.openai_base_url, api_key="k", max_retries=0)
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        result = client.chat.completions.create(
            model=AUDIO_MODEL, messages=PROMPT, max_tokens=700, stream=stream
        )
        if stream:
            list(result)
    node = only_call(sink)
    expected = genai_prices.extract_usage(whole, provider_id="openai", api_flavor="chat").usage
    assert (expected.input_audio_tokens, expected.output_audio_tokens) == (1200, 600)
    assert node.cost_usd == table_price(expected, AUDIO_MODEL, "openai")
    # What the parts add: 1,200 tokens at $32/M, not $2.5/M, and 600 at $64/M, not $10/M.
    before = table_price(Usage(**_plain(expected)), AUDIO_MODEL, "openai")
    assert node.cost_usd - before == Decimal("0.0354") + Decimal("0.0324")
    assert (node.metadata["input_audio_tokens"], node.metadata["output_audio_tokens"]) == (
        1200,
        600,
    )


WEB_MODEL = "gpt-4o"  # web search calls $10 per 1k, file search calls $2.5 per 1k


def responses_body(model: str) -> dict[str, Any]:
    body = dict(recorded.load("openai_responses_usage"))
    search = {"id": "ws_1", "type": "web_search_call", "status": "completed"}
    files = {"id": "fs_1", "type": "file_search_call", "status": "completed", "queries": []}
    output = [search, {**search, "id": "ws_2"}, files, *body["output"][1:]]
    return {**body, "model": model, "output": output}


@instrumented
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_openai_responses_search_calls(replay: ReplayServer, stream: bool) -> None:
    """Before, the two web searches and the file search were charged nothing."""
    body = responses_body(WEB_MODEL)
    if stream:
        created = {"type": "response.created", "response": {**body, "output": [], "usage": None}}
        completed = {"type": "response.completed", "response": body}
        replay.script("/v1/responses", ReplayResponse.sse([(None, created), (None, completed)]))
    else:
        replay.script("/v1/responses", ReplayResponse.json(body))
    client = openai.OpenAI(base_url=replay.openai_base_url, api_key="k", max_retries=0)
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        result = client.responses.create(
            model=WEB_MODEL,
            input="News about the sea?",
            tools=[{"type": "web_search"}, {"type": "file_search", "vector_store_ids": ["vs"]}],
            max_tool_calls=3,
            stream=stream,
        )
        if stream:
            list(result)
    node = only_call(sink)
    tokens = genai_prices.extract_usage(body, provider_id="openai", api_flavor="responses").usage
    expected = Usage(**_plain(tokens), web_searches=2, storage_searches=1)
    assert node.cost_usd == table_price(expected, WEB_MODEL, "openai")
    searches = node.cost_usd - table_price(Usage(**_plain(tokens)), WEB_MODEL, "openai")
    assert searches == Decimal("0.02") + Decimal("0.0025")
    assert (node.metadata["web_searches"], node.metadata["storage_searches"]) == (2, 1)


GEMINI_MODEL = "gemini-2.5-flash"  # audio input $1/M beside $0.3/M; cached audio $0.1/M


def gemini_usage() -> dict[str, Any]:
    return {
        "promptTokenCount": 5000,
        "cachedContentTokenCount": 1000,
        "candidatesTokenCount": 300,
        "totalTokenCount": 5300,
        "promptTokensDetails": [
            {"modality": "TEXT", "tokenCount": 3500},
            {"modality": "AUDIO", "tokenCount": 1500},
        ],
        "cacheTokensDetails": [
            {"modality": "TEXT", "tokenCount": 600},
            {"modality": "AUDIO", "tokenCount": 400},
        ],
        "candidatesTokensDetails": [{"modality": "TEXT", "tokenCount": 300}],
    }


def gemini_client(replay: ReplayServer) -> Any:
    from google import genai
    from google.genai import types

    options = types.HttpOptions(base_url=replay.url, api_version="v1beta")
    return genai.Client(api_key="gemini-secret", http_options=options)


@instrumented
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_gemini_audio_modalities_and_grounding_queries(replay: ReplayServer, stream: bool) -> None:
    """Through google-genai, metered at the HTTP layer. Before, the 1,100 uncached audio
    tokens were priced as text and the two grounding searches at 0."""
    grounding = {"webSearchQueries": ["sea news", "tides this week"]}
    candidate = {
        "content": {"parts": [{"text": "The tides are high."}], "role": "model"},
        "finishReason": "STOP",
        "index": 0,
        "groundingMetadata": grounding,
    }
    body = {"candidates": [candidate], "usageMetadata": gemini_usage(), "responseId": "g-1"}
    if stream:
        first = {**body, "candidates": [{**candidate, "finishReason": None}]}
        first["usageMetadata"] = {"promptTokenCount": 5000, "candidatesTokenCount": 3}
        del first["candidates"][0]["groundingMetadata"]
        path = f"/v1beta/models/{GEMINI_MODEL}:streamGenerateContent"
        replay.script(path, ReplayResponse.sse([(None, first), (None, body)]))
    else:
        replay.script(f"/v1beta/models/{GEMINI_MODEL}:generateContent", ReplayResponse.json(body))
    client = gemini_client(replay)
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        if stream:
            list(client.models.generate_content_stream(model=GEMINI_MODEL, contents="Tides?"))
        else:
            client.models.generate_content(model=GEMINI_MODEL, contents="Tides?")
    node = only_call(sink)
    usage = genai_prices.extract_usage(body, provider_id="google").usage
    assert (usage.input_audio_tokens, usage.cache_audio_read_tokens) == (1500, 400)
    usage.web_searches = 2  # (genai-prices' extractor does not read grounding)
    assert node.cost_usd == table_price(usage, GEMINI_MODEL, "google")
    assert node.metadata["input_audio_tokens"] == 1500
    assert node.metadata["cache_audio_read_tokens"] == 400
    assert node.metadata["web_searches"] == 2


@instrumented
def test_anthropic_at_the_http_layer(replay: ReplayServer) -> None:
    """A request sent with httpx (no SDK) is read by the same reader."""
    answer = anthropic_message()
    replay.script(MESSAGES, ReplayResponse.json(answer))
    sink = MemorySink()
    body = {"model": CLAUDE, "max_tokens": 200, "messages": PROMPT}
    with ExecutionContext(sinks=[sink]), httpx.Client() as client:
        client.post(f"{replay.anthropic_base_url}/v1/messages", json=body)
    node = only_call(sink)
    expected = genai_prices.extract_usage(answer, provider_id="anthropic").usage
    assert node.cost_usd == table_price(expected, CLAUDE, "anthropic")
    assert node.metadata["cache_write_1h_tokens"] == 2000


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_anthropic_through_the_proxy(stream: bool) -> None:
    answer = anthropic_message()
    with ReplayServer() as replay:
        replay.script(
            MESSAGES,
            ReplayResponse.sse(anthropic_events()) if stream else ReplayResponse.json(answer),
        )
        upstreams = {"openai": replay.openai_base_url, "anthropic": replay.url}
        callers = {"team": {"max_cost_usd": 1.0}}
        with MeteringProxy(budgets_from({"upstreams": upstreams, "callers": callers})) as proxy:
            client = anthropic.Anthropic(
                base_url=proxy.base_urls()["ANTHROPIC_BASE_URL"], api_key="sk-ant", max_retries=0
            )
            body = {"model": CLAUDE, "max_tokens": 200, "messages": PROMPT}
            if stream:
                with client.messages.stream(**body) as events:  # type: ignore[arg-type]
                    events.until_done()
            else:
                client.messages.create(**body)  # type: ignore[arg-type]
            spent = proxy.context("team").stats.total_cost()
            (node,) = [n for n in proxy.context("team").graph.nodes() if n.kind == "llm"]
    expected = genai_prices.extract_usage(answer, provider_id="anthropic").usage
    assert spent == node.cost_usd == table_price(expected, CLAUDE, "anthropic")
    assert node.metadata["web_searches"] == 3


# -- reservations: a request that allows billed server tool uses reserves them ----------------

SEARCH_TOOL = {"type": "web_search_20250305", "name": "web_search", "max_uses": 5}


@instrumented
def test_an_anthropic_request_reserves_the_searches_its_tool_allows(replay: ReplayServer) -> None:
    """A cap that fits the tokens but not 5 searches at $0.01 refuses the request before it is
    sent; before, the searches were not reserved and the cap was passed by them."""
    client = anthropic.Anthropic(base_url=replay.anthropic_base_url, api_key="k", max_retries=0)
    body = {"model": CLAUDE, "max_tokens": 100, "messages": PROMPT}
    with ExecutionContext(max_cost_usd=0.045) as ctx:  # tokens ~$0.002: room for 4 searches
        with pytest.raises(LimitExceeded):
            client.messages.create(**body, tools=[SEARCH_TOOL])  # type: ignore[arg-type]
        assert replay.requests == []
        replay.script(MESSAGES, ReplayResponse.json({**anthropic_message(), "usage": _small()}))
        client.messages.create(**body, tools=[{**SEARCH_TOOL, "max_uses": 2}])  # type: ignore[arg-type]
        assert ctx.stats.total_cost() > Decimal("0.02")  # its 2 searches, charged


def _small() -> dict[str, Any]:
    return {"input_tokens": 50, "output_tokens": 10, "server_tool_use": {"web_search_requests": 2}}


@instrumented
def test_parts_beyond_their_counts_are_cut_to_them_and_the_caller_gets_its_answer(
    replay: ReplayServer,
) -> None:
    """A provider reporting more 1-hour writes than writes: the call still succeeds, charged
    every write at the 1-hour rate (the most the counts allow)."""
    usage = {**ANTHROPIC_USAGE, "cache_creation": {"ephemeral_1h_input_tokens": 9000}}
    replay.script(MESSAGES, ReplayResponse.json({**anthropic_message(), "usage": usage}))
    client = anthropic.Anthropic(base_url=replay.anthropic_base_url, api_key="k", max_retries=0)
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        message = client.messages.create(model=CLAUDE, max_tokens=200, messages=PROMPT)
    assert message.content
    node = only_call(sink)
    assert node.status == "success" and node.metadata["cache_write_1h_tokens"] == 3000
    fitted = {**ANTHROPIC_USAGE, "cache_creation": {"ephemeral_1h_input_tokens": 3000}}
    expected = genai_prices.extract_usage(
        {**anthropic_message(), "usage": fitted}, provider_id="anthropic"
    )
    assert node.cost_usd == table_price(expected.usage, CLAUDE, "anthropic")


@instrumented
@pytest.mark.parametrize(("tier", "noted"), [("priority", "priority"), ("default", None)])
def test_a_tier_the_table_does_not_price_is_noted_on_the_node(
    replay: ReplayServer, tier: str, noted: str | None
) -> None:
    """OpenAI's priority tier costs more than the table's rates, which are the standard
    tier's: the node says which tier the call was billed at (no price is made up for it)."""
    body = {**recorded.load("openai_chat_tool_calls"), "service_tier": tier}
    replay.script("/v1/chat/completions", ReplayResponse.json(body))
    client = openai.OpenAI(base_url=replay.openai_base_url, api_key="k", max_retries=0)
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        client.chat.completions.create(model="gpt-4o-mini", messages=PROMPT, service_tier="auto")
    assert only_call(sink).metadata.get("service_tier") == noted
