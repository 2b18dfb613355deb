"""Server-side state is estimated (issue 36, point 6).

A Responses request that continues a stored response (``previous_response_id``) or a
``conversation`` is billed for the whole stored conversation while its body carries one turn.
The billing provider bills it so; ampmeter estimates it with the size of the response it
continues (its input plus its output, remembered when it was read), or, when that is unknown,
with the model's context window (``bound``) or the largest input seen (``learned``).
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from typing import Any, Literal

import openai
import pytest

from ampmeter import ExecutionContext, LimitExceeded
from ampmeter.pricing import request_size, stored_state
from ampmeter.pricing.genai_table import context_window
from ampmeter.pricing.request_size import RequestSize
from ampmeter.sinks.memory import MemorySink
from ampmeter.testing import BillingProvider, recorded
from ampmeter.testing.replay import ReplayResponse, ReplayServer

pytestmark = pytest.mark.usefixtures("instrumented")  # conftest.py

KEY = "test-key"
MODEL = "gpt-4o"
PRICES = {MODEL: ("2.5", "10")}
TURN = "Tell me more about the harbour and the boats in it, please. " * 3
OUTPUT = 60
CAP = Decimal("0.03")


@pytest.fixture(autouse=True)
def _fresh_state() -> Iterator[None]:
    stored_state.forget()
    request_size.forget()
    yield
    stored_state.forget()


def _client(server: BillingProvider) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.openai_base_url, api_key=KEY, max_retries=0)


def _turn(client: openai.OpenAI, stream: bool, **continues: Any) -> str:
    """One turn; the id of its response."""
    if not stream:
        response = client.responses.create(
            model=MODEL, input=TURN, max_output_tokens=OUTPUT, **continues
        )
        return response.id
    events = list(
        client.responses.create(
            model=MODEL, input=TURN, max_output_tokens=OUTPUT, stream=True, **continues
        )
    )
    assert events[-1].type == "response.completed"
    return str(events[-1].response.id)


def _conversation(server: BillingProvider, thread: int, kind: str, stream: bool) -> None:
    """A conversation of up to 30 turns, each continuing the last (stopped by the cap)."""
    client = _client(server)
    previous: str | None = None
    conversation = client.conversations.create().id  # made empty: known to hold nothing
    for _ in range(30):
        if kind == "conversation":
            previous = _turn(client, stream, conversation=conversation)
        elif previous is None:
            previous = _turn(client, stream)
        else:
            previous = _turn(client, stream, previous_response_id=previous)


@pytest.mark.parametrize("mode", ["learned", "bound"])
@pytest.mark.parametrize(
    ("kind", "stream"),
    [("previous_response_id", False), ("conversation", True)],
    ids=["previous_response_id", "conversation streamed"],
)
def test_continued_conversations_from_many_threads_hold_the_cap(
    mode: Literal["learned", "bound"], kind: str, stream: bool
) -> None:
    sink = MemorySink()
    stops = 0
    with (
        BillingProvider(output_tokens=OUTPUT, prices=PRICES) as server,
        ExecutionContext(max_cost_usd=CAP, estimate=mode, sinks=[sink]) as ctx,
        ThreadPoolExecutor(6) as pool,
    ):
        jobs = [pool.submit(_conversation, server, t, kind, stream) for t in range(6)]
        for job in jobs:
            try:
                job.result()
            except LimitExceeded:
                stops += 1
    billed, calls = server.billed_usd, server.calls
    recorded = ctx.stats.total_cost()
    assert stops == 6  # every conversation ran into the cap
    assert max(c.input_tokens for c in calls) > 5 * calls[0].input_tokens  # they grew
    assert billed <= CAP, f"billed {billed} under a {CAP} cap ({mode}, {kind})"
    assert recorded >= billed
    used = billed / CAP
    assert used >= (Decimal("0.8") if mode == "learned" else Decimal("0.3")), used
    nodes = [n for n in sink.nodes if n.kind == "llm" and n.status == "success"]
    assert sorted(n.tokens_in or 0 for n in nodes) == sorted(c.input_tokens for c in calls)
    # The stored part of each bill is not taken for the text's: four characters a token stays.
    assert 0.2 <= request_size.learned_ratio(MODEL) <= 0.3


def test_state_of_unknown_size_reserves_the_context_window_in_bound_mode() -> None:
    """A response ampmeter did not see (made outside any context) is continued: ``bound``
    reserves the model's whole context window, so a cap that window would break stops the
    call before it is sent; ``learned`` reserves the largest input seen for the model."""
    with BillingProvider(output_tokens=OUTPUT, prices=PRICES) as server:
        client = _client(server)
        first = _turn(client, False)  # no context: not metered, its size unknown
        second = _turn(client, False, previous_response_id=first)  # (also unseen)
        window = context_window(MODEL)
        assert window == 128_000
        # $0.32 of input for the window alone: a $0.10 cap cannot hold it.
        with (
            ExecutionContext(max_cost_usd=0.10, estimate="bound") as ctx,
            pytest.raises(LimitExceeded),
        ):
            _turn(client, False, previous_response_id=second)
        assert len(server.calls) == 2 and ctx.stats.total_cost() == 0
        with ExecutionContext(max_cost_usd=0.10, estimate="learned") as ctx:
            with pytest.raises(LimitExceeded):  # nothing seen yet: the window, as in bound
                _turn(client, False, previous_response_id=second)
            _turn(client, False)  # a fresh conversation: now an input of this model is seen
            _turn(client, False, previous_response_id=second)  # reserved at the largest seen
        assert len(server.calls) == 4
        seen = max(c.input_tokens for c in server.calls[2:])
        assert ctx.stats.total_cost() >= server.billed_usd - _cost_of(server.calls[:2])
    size = RequestSize(chars=40, utf8_bytes=40, framing=6, stored=None)
    assert request_size.input_tokens(size, MODEL, "bound") == 40 + 6 + window
    text = request_size.input_tokens(RequestSize(chars=40, utf8_bytes=40, framing=0), MODEL)
    assert request_size.input_tokens(size, MODEL, "learned") == text + 6 + seen


def test_a_known_stored_conversation_is_reserved_at_its_size() -> None:
    """The continued request is reserved (and, unreported, charged) at the stored size."""
    with BillingProvider(output_tokens=OUTPUT, prices=PRICES) as server:
        client = _client(server)
        with ExecutionContext(estimate="bound"):
            first = _turn(client, False)
        stored = server.calls[0].input_tokens + server.calls[0].output_tokens
        assert stored_state.stored_tokens(first, None) == stored
        assert stored_state.stored_tokens(None, {"id": "conv_never_seen"}) is None
        assert stored_state.stored_tokens("resp_never_seen", None) is None
        assert stored_state.stored_tokens(None, None) == 0
        assert stored_state.stored_tokens(42, None) is None  # not an id: unknown, not free


def test_items_added_outside_a_response_make_a_conversation_unknown() -> None:
    """Items added with ``conversations.items.create`` are billed by the next response in the
    conversation, and ampmeter cannot count them: the conversation's size becomes unknown, so
    ``bound`` reserves the context window for it (and a small cap stops the call unsent)."""
    with BillingProvider(output_tokens=OUTPUT, prices=PRICES) as server:
        client = _client(server)
        with ExecutionContext(max_cost_usd=0.10, estimate="bound") as ctx:
            conversation = client.conversations.create().id
            _turn(client, False, conversation=conversation)
            _turn(client, False, conversation=conversation)  # known: reserved at its size
            client.conversations.items.create(
                conversation, items=[{"role": "user", "content": "A long aside. " * 2000}]
            )
            with pytest.raises(LimitExceeded):
                _turn(client, False, conversation=conversation)
        assert len(server.calls) == 2
        assert ctx.stats.total_cost() >= server.billed_usd
        made = client.conversations.create(items=[{"role": "user", "content": "Hello there."}])
        assert stored_state.stored_tokens(None, made.id) is None  # its items: unknown size


def _cost_of(calls: list[Any]) -> Decimal:
    return sum((c.cost_usd for c in calls), Decimal(0))


def test_a_gemini_cached_content_is_state_of_unknown_size(replay: ReplayServer) -> None:
    """Gemini bills a ``cachedContent`` the request names as input; its size is not in the
    body. ``bound`` reserves the model's window for it (a small cap stops the call unsent);
    ``learned`` reserves the largest input seen for the model, once one is seen."""
    from google import genai
    from google.genai import types

    route = "/v1beta/models/gemini-2.5-flash:generateContent"
    options = types.HttpOptions(base_url=replay.url, api_version="v1beta")
    client = genai.Client(api_key="k", http_options=options)
    cached = types.GenerateContentConfig(cached_content="cachedContents/c1", max_output_tokens=50)
    plain = types.GenerateContentConfig(max_output_tokens=50)

    def ask(config: types.GenerateContentConfig) -> None:
        client.models.generate_content(model="gemini-2.5-flash", contents="Go on.", config=config)

    with ExecutionContext(max_cost_usd=0.05, estimate="bound"), pytest.raises(LimitExceeded):
        ask(cached)
    assert replay.requests == []
    replay.script(route, recorded.gemini_generate_content(), recorded.gemini_generate_content())
    with ExecutionContext(max_cost_usd=0.05, estimate="learned"):
        ask(plain)  # 2,150 input tokens billed: the largest seen for the model
        ask(cached)
    assert [r.json().get("cachedContent") for r in replay.requests] == [None, "cachedContents/c1"]
    size = request_size.measure("gemini", replay.requests[1].json())
    assert size.stored is None
    learned = request_size.input_tokens(size, "gemini-2.5-flash", "learned")
    assert learned >= 2_150
    assert request_size.input_tokens(size, "gemini-2.5-flash", "bound") > 1_000_000


async def test_async_conversations_are_followed_too() -> None:
    """The async client's conversations and items: made empty is known, grown is unknown."""
    with BillingProvider(output_tokens=OUTPUT, prices=PRICES) as server:
        client = openai.AsyncOpenAI(base_url=server.openai_base_url, api_key=KEY, max_retries=0)
        conversation = (await client.conversations.create()).id
        assert stored_state.stored_tokens(None, conversation) == 0
        with ExecutionContext(estimate="bound"):
            await client.responses.create(
                model=MODEL, input=TURN, max_output_tokens=OUTPUT, conversation=conversation
            )
        (billed,) = server.calls
        assert stored_state.stored_tokens(None, conversation) == (
            billed.input_tokens + billed.output_tokens
        )
        await client.conversations.items.create(
            conversation_id=conversation, items=[{"role": "user", "content": "More."}]
        )
        assert stored_state.stored_tokens(None, conversation) is None
        await client.close()


@pytest.mark.parametrize(
    "usage",
    [None, "lots", {"input_tokens": "12", "output_tokens": 3}, {"input_tokens": True}],
    ids=["null", "text", "a string count", "a bool count"],
)
def test_a_response_without_readable_usage_leaves_its_continuation_unknown(
    replay: ReplayServer, usage: Any
) -> None:
    """Its size is not taken as 0 (which would make the next request look free): a request
    continuing it is reserved as continuing state of unknown size."""
    body = {"id": "resp_odd", "object": "response", "status": "completed", "model": MODEL}
    replay.script("/v1/responses", ReplayResponse.json({**body, "output": [], "usage": usage}))
    client = openai.OpenAI(base_url=replay.openai_base_url, api_key=KEY, max_retries=0)
    with ExecutionContext(estimate="bound"):
        answer = client.responses.create(model=MODEL, input=TURN, max_output_tokens=OUTPUT)
    assert stored_state.stored_tokens(answer.id, None) is None
    continued = {"model": MODEL, "input": TURN, "previous_response_id": answer.id}
    assert request_size.measure("responses", continued).stored is None


def test_a_compaction_is_metered_as_the_model_call_it_is_billed_as(replay: ReplayServer) -> None:
    """``responses.compact`` runs the model over a whole conversation and bills its usage as a
    response does; its path was no known route, so a 50,000-token compaction under a $0.01 cap
    was sent and counted $0. Now it is estimated, stopped before it is sent when it does not fit,
    and charged its usage."""
    usage = {
        "input_tokens": 50_000,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 400,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 50_400,
    }
    compacted = {
        "id": "resp_compact1",
        "object": "response.compaction",
        "created_at": 1,
        "output": [{"type": "compaction", "id": "cmp_1", "encrypted_content": "x"}],
        "usage": usage,
    }
    history = "The notes of a long meeting. " * 8_000
    client = openai.OpenAI(base_url=replay.openai_base_url, api_key=KEY, max_retries=0)
    with ExecutionContext(max_cost_usd=0.01), pytest.raises(LimitExceeded):
        client.responses.compact(model="gpt-4o-mini", input=history)
    assert replay.requests == []  # stopped before a byte was sent
    replay.script("/v1/responses/compact", ReplayResponse.json(compacted))
    sink = MemorySink()
    with ExecutionContext(sinks=[sink], max_cost_usd=1) as ctx:
        client.responses.compact(model="gpt-4o-mini", input="A short history.")
    (node,) = [n for n in sink.nodes if n.kind == "llm"]
    assert (node.tokens_in, node.tokens_out, node.model) == (50_000, 400, "gpt-4o-mini")
    assert node.name == node.metadata["operation_name"] == "responses.compact"
    assert node.cost_usd == Decimal("0.00774")  # 50,000 x $0.15/M + 400 x $0.60/M
    assert ctx.stats.total_cost() == node.cost_usd
