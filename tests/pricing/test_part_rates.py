"""Billed parts priced exactly as genai-prices prices them: each at its own rate where the
table has one, else as its parent kind; checked against the counts they are part of; set by
the user; reserved where a request says it may use them."""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import sys
import wave
from decimal import Decimal
from pathlib import Path
from typing import Any

import genai_prices
import pytest
from genai_prices import Usage
from genai_prices import data as genai_data
from hypothesis import given, settings
from hypothesis import strategies as st

import ampmeter
from ampmeter import ExecutionContext
from ampmeter.pricing import request_size
from ampmeter.pricing.parts import PARTS, UNCAPPED_TOOL_USES, check_parts, fit_parts
from ampmeter.pricing.plan import plan_for
from ampmeter.pricing.source import TABLE
from ampmeter.sinks.memory import MemorySink

# Models whose rows price parts: 1-hour writes and searches (one tiered at 200k tokens), audio
# with cached audio, audio/image/video, search and file search calls.
MODELS = [
    ("claude-sonnet-5", "anthropic"),
    ("claude-sonnet-4-5", "anthropic"),
    ("gpt-realtime", "openai"),
    ("gemini-2.5-flash", "google"),
    ("gemini-live-2.5-flash", "google"),
    ("gpt-4o", "openai"),
]


@st.composite
def usages(draw: st.DrawFn) -> tuple[dict[str, int], dict[str, int]]:
    """Consistent counts and parts: every part within what it is part of."""
    n = st.integers(0, 400_000)
    audio, image, video = draw(n), draw(n), draw(n)
    audio_read, image_read = draw(st.integers(0, audio)), draw(st.integers(0, image))
    cached = audio_read + image_read + draw(n)
    writes, text = draw(n), draw(n)
    one_hour = draw(st.integers(0, writes))
    t_in = cached + writes + text + (audio - audio_read) + (image - image_read) + video
    out_audio, out_image, out_text = draw(n), draw(n), draw(n)
    t_out = out_audio + out_image + out_text
    counts = {
        "input_tokens": t_in,
        "output_tokens": t_out,
        "cached_tokens": cached,
        "cache_write_tokens": writes,
    }
    parts = {
        "cache_write_1h_tokens": one_hour,
        "input_audio_tokens": audio,
        "cache_audio_read_tokens": audio_read,
        "input_image_tokens": image,
        "cache_image_read_tokens": image_read,
        "input_video_tokens": video,
        "output_audio_tokens": out_audio,
        "output_image_tokens": out_image,
        "web_searches": draw(st.integers(0, 50)),
        "storage_searches": draw(st.integers(0, 50)),
    }
    return counts, parts


def table_usage(counts: dict[str, int], parts: dict[str, int]) -> Usage:
    given_counts = {**counts, "cache_read_tokens": counts["cached_tokens"]}
    del given_counts["cached_tokens"]
    return Usage(**given_counts, **parts)


@pytest.mark.parametrize(("model", "provider"), MODELS)
@settings(max_examples=40, deadline=None)
@given(usage=usages())
def test_every_part_is_priced_as_genai_prices_prices_it(
    model: str, provider: str, usage: tuple[dict[str, int], dict[str, int]]
) -> None:
    """To the last digit: before, each part was priced as its parent, searches at 0."""
    counts, parts = usage
    ours = ampmeter.price(model, provider, **counts, parts=parts).cost_usd
    theirs = genai_prices.calc_price(table_usage(counts, parts), model, provider_id=provider)
    assert ours == theirs.total_price


def test_a_part_the_table_does_not_price_is_billed_as_its_parent() -> None:
    """gpt-4o prices no audio: its audio input is input, as genai-prices bills it."""
    counts = {"input_tokens": 5000, "output_tokens": 100}
    with_audio = ampmeter.price("gpt-4o", "openai", **counts, parts={"input_audio_tokens": 4000})
    assert with_audio == ampmeter.price("gpt-4o", "openai", **counts)


def test_a_recorded_call_is_charged_its_parts_and_says_so() -> None:
    sink = MemorySink()
    parts = {"cache_write_1h_tokens": 1000, "web_searches": 2}
    with (
        ExecutionContext(sinks=[sink]) as ctx,
        ctx.llm_call("search", model="claude-sonnet-5") as call,
    ):
        call.record(3000, 100, cache_write_tokens=1000, parts=parts)
    (node,) = [n for n in sink.nodes if n.kind == "llm"]
    # 2,000 input at $2, 1,000 1-hour writes at $4 (not $2.5), 100 out at $10, 2 searches
    assert node.cost_usd == Decimal("0.004") + Decimal("0.004") + Decimal("0.001") + Decimal("0.02")
    assert (node.metadata["cache_write_1h_tokens"], node.metadata["web_searches"]) == (1000, 2)


@pytest.mark.parametrize(
    ("counts", "parts", "message"),
    [
        ((100, 10, 0, 0), {"audio_tokens": 5}, "unknown billed part 'audio_tokens'; known"),
        ((100, 10, 0, 0), {"web_searches": -1}, r"parts\['web_searches'\] must be >= 0"),
        ((100, 10, 0, 0), {"web_searches": 1.5}, "must be an int"),
        ((100, 10, 0, 50), {"cache_write_1h_tokens": 51}, "exceed the cache-write tokens"),
        ((100, 10, 20, 0), {"input_audio_tokens": 81}, "exceed the uncached input"),
        ((100, 10, 20, 0), {"cache_audio_read_tokens": 21, "input_audio_tokens": 30}, "cached"),
        ((100, 10, 20, 0), {"cache_audio_read_tokens": 5, "input_audio_tokens": 4}, "audio"),
        ((100, 10, 0, 0), {"output_audio_tokens": 8, "output_image_tokens": 3}, "output"),
    ],
)
def test_parts_that_do_not_fit_their_counts_are_refused_and_nothing_changes(
    counts: tuple[int, int, int, int], parts: dict[str, Any], message: str
) -> None:
    t_in, t_out, cached, writes = counts
    with ExecutionContext() as ctx, ctx.llm_call("c", model="gpt-realtime") as call:
        with pytest.raises((ValueError, TypeError), match=message):
            call.record(t_in, t_out, cached_tokens=cached, cache_write_tokens=writes, parts=parts)
        assert not call.recorded
        call.record(t_in, t_out)  # (still recordable: nothing was half-written)
    with pytest.raises((ValueError, TypeError), match=message):
        ampmeter.price(
            "gpt-realtime",
            input_tokens=t_in,
            output_tokens=t_out,
            cached_tokens=cached,
            cache_write_tokens=writes,
            parts=parts,
        )


def test_user_prices_take_part_rates_and_parts_without_one_are_their_parent() -> None:
    try:
        ampmeter.set_price(
            "studio-audio",
            input_per_mtok=2,
            output_per_mtok=8,
            cached_input_per_mtok=0,
            part_prices={"input_audio_mtok": 40, "web_searches_kcount": "12.5"},
        )
        counts = {"input_tokens": 10_000, "output_tokens": 0, "cached_tokens": 2_000}
        parts = {"input_audio_tokens": 3_000, "cache_audio_read_tokens": 1_000, "web_searches": 2}
        # 7,000 text at $2 (cached text free), 2,000 uncached audio at $40, cached audio at
        # $40 (its parent, the audio rate, as genai-prices would bill it), 2 searches.
        cost = ampmeter.price("studio-audio", **counts, parts=parts).cost_usd
        text = Decimal(6_000 * 2) / 10**6
        assert cost == text + Decimal(3_000 * 40) / 10**6 + Decimal("0.025")
        # Without part prices every part is its parent kind (free cached input stays free).
        ampmeter.set_price("studio-audio", input_per_mtok=2, output_per_mtok=8)
        assert ampmeter.price("studio-audio", **counts, parts=parts).cost_usd == Decimal("0.02")
        with pytest.raises(ValueError, match="unknown part price 'audio_mtok'; known: "):
            ampmeter.set_price(
                "studio-audio", input_per_mtok=9, output_per_mtok=9, part_prices={"audio_mtok": 1}
            )
        assert ampmeter.price("studio-audio", **counts, parts=parts).cost_usd == Decimal("0.02")
        too_dear = {"web_searches_kcount": 10**7}  # (kept per million uses: past the most)
        with pytest.raises(ValueError, match="at most 1,000,000 USD per thousand uses"):
            ampmeter.set_price(
                "studio-audio", input_per_mtok=1, output_per_mtok=1, part_prices=too_dear
            )
    finally:
        ampmeter.clear_prices()


# -- reservations --------------------------------------------------------------------------


def _measure(wire: request_size.Wire, body: dict[str, Any]) -> dict[str, int] | None:
    return request_size.measure(wire, body).parts


def test_server_tools_a_request_allows_are_reserved_as_stated() -> None:
    messages = [{"role": "user", "content": "hi"}]
    tool = {"type": "web_search_20250305", "name": "web_search"}
    anthropic = {"model": "claude-sonnet-5", "messages": messages}
    assert _measure("anthropic", {**anthropic, "tools": [{**tool, "max_uses": 3}]}) == {
        "web_searches": 3
    }
    uncapped = {"web_searches": UNCAPPED_TOOL_USES}
    assert _measure("anthropic", {**anthropic, "tools": [tool]}) == uncapped
    assert _measure("anthropic", {**anthropic, "tools": [{**tool, "max_uses": True}]}) == uncapped
    assert _measure("anthropic", {**anthropic, "tools": [{"type": "web_fetch_20250910"}]}) is None
    responses = {"model": "gpt-4o", "input": "hi", "tools": [{"type": "web_search"}]}
    assert _measure("responses", responses) == uncapped
    both = [{"type": "web_search_preview"}, {"type": "file_search", "vector_store_ids": ["v"]}]
    capped = {**responses, "tools": both, "max_tool_calls": 2}
    assert _measure("responses", capped) == {"web_searches": 2, "storage_searches": 2}
    grounded = {"contents": "hi", "tools": [{"googleSearch": {}}, {"functionDeclarations": []}]}
    assert _measure("gemini", grounded) == uncapped
    assert _measure("gemini", {**grounded, "tools": [{"google_search_retrieval": {}}]}) == uncapped


def _wav(seconds: int) -> str:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(8000)
        out.writeframes(b"\0\0" * 8000 * seconds)
    return base64.b64encode(buffer.getvalue()).decode()


def test_audio_input_is_reserved_at_the_audio_rate() -> None:
    """gpt-audio bills audio input at $32/M, text at $2.5/M: before, it was reserved as text."""
    audio = {"type": "input_audio", "input_audio": {"data": _wav(4), "format": "wav"}}
    body = {"model": "gpt-audio", "messages": [{"role": "user", "content": [audio]}]}
    size = request_size.measure("chat", body)
    assert size.parts is not None and size.parts["input_audio_tokens"] > 0
    plan = plan_for(TABLE, "gpt-audio", "openai")
    reserved = plan.reserve(max_tokens=0, prompt_tokens=None, request=size, mode="bound")
    as_text = plan.reserve(
        max_tokens=0, prompt_tokens=None, request=size._replace(parts=None), mode="bound"
    )
    extra = size.parts["input_audio_tokens"] * (Decimal(32) - Decimal("2.5")) * 1000
    assert reserved[2] - as_text[2] == extra  # nano-dollars
    gemini = {"contents": [{"parts": [{"inlineData": {"mimeType": "audio/wav", "data": _wav(2)}}]}]}
    measured = request_size.measure("gemini", gemini)
    assert measured.parts == {"input_audio_tokens": measured.media} and measured.media >= 64


def test_part_rates_resolve_over_the_whole_table() -> None:
    """Every priced row of the providers that bill parts: one usage of every part, priced as
    genai-prices prices it (which rows price which parts, and which fall back to a parent)."""
    usage_counts = {
        "input_tokens": 10_000,
        "output_tokens": 1_000,
        "cached_tokens": 2_000,
        "cache_write_tokens": 500,
    }
    parts = dict.fromkeys(PARTS, 100)
    compared = 0
    for provider in ("anthropic", "openai", "google"):
        (found,) = [p for p in genai_data.providers if p.id == provider]
        for model in found.models:
            ours = ampmeter.price(model.id, provider, **usage_counts, parts=parts).cost_usd
            if ours is None:  # (priced per audio hour or page: no token rates)
                continue
            usage = table_usage(usage_counts, parts)
            theirs = genai_prices.calc_price(usage, model.id, provider_id=provider)
            assert ours == theirs.total_price, model.id
            compared += 1
    assert compared >= 150


@settings(max_examples=200, deadline=None)
@given(
    counts=st.tuples(*[st.integers(0, 1_000)] * 5),
    reported=st.dictionaries(st.sampled_from(PARTS), st.integers(-50, 2_000)),
)
def test_parts_a_provider_reports_beyond_their_counts_are_cut_until_they_fit(
    counts: tuple[int, int, int, int, int], reported: dict[str, int]
) -> None:
    """What Tally.fit does to a hostile report before the call is recorded: afterwards the
    parts always pass the check (else recording would fail the caller's call)."""
    t_in, t_out, cached, writes, reasoning = counts
    cached, reasoning = min(cached, t_in), min(reasoning, t_out)
    checked = (t_in, t_out, cached, min(writes, t_in - cached), reasoning, 0)
    parts = {name: max(count, 0) for name, count in reported.items()}
    fit_parts(parts, checked)
    assert check_parts(parts, checked) == {name: n for name, n in parts.items() if n}
    assert all(parts[name] <= max(count, 0) for name, count in reported.items())


def test_a_pricing_of_its_own_is_given_the_parts() -> None:
    """The module ``ampmeter.pricing`` (or an embedder's object) as a context's pricing was
    asked for the six counts only: the parts were charged nothing."""
    parts = {"cache_write_1h_tokens": 1000, "web_searches": 2}
    costs = []
    for pricing in (TABLE, ampmeter.pricing):
        ctx = ExecutionContext(pricing=pricing)
        with ctx, ctx.llm_call("search", model="claude-sonnet-5") as call:
            call.record(3000, 100, cache_write_tokens=1000, parts=parts)
        costs.append(ctx.stats.total_cost())
    assert costs[0] == costs[1] == Decimal("0.029")


_ONE_HOUR_SCRIPT = (
    "import sys, ampmeter.pricing as p\n"
    "r = p.price('claude-sonnet-5', input_tokens=1000, output_tokens=0,\n"
    "            cache_write_tokens=1000, parts={'cache_write_1h_tokens': 1000})\n"
    "print(r.cost_usd, 'genai_prices' in sys.modules)\n"
)


def _one_hour_writes_priced_afresh(index: Path) -> tuple[Decimal, bool]:
    """1,000 1-hour writes to claude-sonnet-5 priced by a fresh process with its disk index
    in ``index``, and whether it loaded the table (else the index answered)."""
    env = {**os.environ, "AMPMETER_CACHE_DIR": str(index)}
    done = subprocess.run(
        [sys.executable, "-c", _ONE_HOUR_SCRIPT], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    cost, loaded = done.stdout.split()
    return Decimal(cost), loaded == "True"


def test_the_disk_index_keeps_part_rates_and_an_index_from_before_them_is_not_trusted(
    tmp_path: Path,
) -> None:
    """A fresh process prices parts from the index as the table does; an entry written before
    part rates were kept (no ``"parts"``) would price a 1-hour write as a 5-minute one: it is
    read as a miss, and the table answers."""
    at_one_hour = Decimal("0.004")  # 1,000 at $4/M, not $2.5/M
    assert _one_hour_writes_priced_afresh(tmp_path) == (at_one_hour, True)  # writes the index
    assert _one_hour_writes_priced_afresh(tmp_path) == (at_one_hour, False)  # reads it
    (index,) = tmp_path.glob("prices-*.json")
    entries = json.loads(index.read_text())
    (key,) = [key for key in entries if key.startswith("claude-sonnet-5\x00")]
    del entries[key]["parts"]
    index.write_text(json.dumps(entries))
    assert _one_hour_writes_priced_afresh(tmp_path) == (at_one_hour, True)
