"""Prompt estimates that learn on the whole request: dense text stops being under-reserved
after a few calls, and a tool-heavy call cannot inflate later plain prompts."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from ampmeter import ExecutionContext, Limit
from ampmeter.keys import KEY_INPUT_TOKENS
from ampmeter.pricing import request_size as estimates
from ampmeter.pricing.request_size import input_tokens, learn, measure
from support.request_bodies import chat_tools, json_chars

DENSE = "字" * 400  # 400 characters: 100 tokens at four characters a token, 300 in truth
TRUE_TOKENS = 300
PROSE = ("The quarterly report shows revenue up four percent on strong demand in Europe. " * 42)[
    :3300
]


@pytest.fixture(autouse=True)
def _fresh_ratios() -> Iterator[None]:
    estimates.forget()
    yield
    estimates.forget()


def chat(prompt: str, tools: int = 0) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "gpt-4o",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 40,
    }
    if tools:
        body["tools"] = chat_tools(tools)
    return body


def billed(prompt: str, tools: int = 0) -> int:
    """What a provider that bills tool schemas charges: prose at 3,300 characters for 830
    tokens, tool JSON at 3.13 characters a token (the issue's 8 KB of tools for 2,616 tokens),
    and the documented framing."""
    framing = 3 + 3 + (12 + 7 * tools if tools else 0)
    schemas = math.ceil(json_chars(chat_tools(tools)) / 3.13) if tools else 0
    return math.ceil(len(prompt) * 830 / 3300) + schemas + framing


def test_tool_heavy_calls_leave_a_plain_prompt_within_one_and_a_half_times() -> None:
    plain_real = billed(PROSE)
    assert 830 <= plain_real <= 840
    for tools, prompt in [(10, "x" * 43), (20, "y" * 400)] * 3:
        body = chat(prompt.replace("x", "Lyon? ").replace("y", "word ")[: len(prompt)], tools)
        learn("gpt-4o", measure("chat", body), billed(body["messages"][0]["content"], tools))
    estimate = input_tokens(measure("chat", chat(PROSE)), "gpt-4o")
    assert plain_real <= estimate <= 1.5 * plain_real, (estimate, plain_real)


def test_one_call_whose_tools_were_not_measured_moves_the_ratio_at_most_a_step() -> None:
    """The issue's poisoning: 10 tools billed but only a 43-character prompt measured."""
    prose = measure("chat", chat(PROSE))
    for _ in range(8):  # prose's ratio learned first
        learn("gpt-4o", prose, billed(PROSE))
    before = input_tokens(prose, "gpt-4o")
    assert before <= 1.05 * billed(PROSE)
    learn("gpt-4o", estimates.measure_text("What is the weather in Lyon today, please?!"), 2616)
    after = input_tokens(measure("chat", chat(PROSE)), "gpt-4o")
    assert after <= math.ceil(before * estimates.MAX_STEP_UP)
    assert after <= 1.5 * billed(PROSE)
    for _ in range(50):  # however often: never past a token per byte
        learn("gpt-4o", estimates.measure_text("What is the weather in Lyon today, please?!"), 2616)
    assert estimates.learned_ratio("gpt-4o") <= 1.0


def test_dense_text_is_reserved_in_full_from_the_first_call() -> None:
    """The prior (a token a character) covers text billed 3x characters/4 before any call
    settled; learning comes down to the truth from above, never under it."""
    size = estimates.measure_text(DENSE)
    seen = []
    for _ in range(4):
        seen.append(input_tokens(size, "dense-model"))
        learn("dense-model", size, TRUE_TOKENS)
    assert seen == [400, 320, 300, 300]  # at most /1.25 a call, never below what was billed
    assert all(estimate >= TRUE_TOKENS for estimate in seen)
    assert input_tokens(size, "other-model") == 400  # each model learns its own
    learn("dense-model", size, 50)  # a lower observation lowers the ratio by at most 1.25
    assert input_tokens(size, "dense-model") in (240, 241)  # 300 / 1.25, rounded up


@pytest.mark.parametrize("density", [1.0, 1.6, 2.5])
def test_prose_comes_down_to_its_rate_and_no_density_is_under_reserved(density: float) -> None:
    """Text billed ``density`` times characters/4: every estimate before and while learning
    holds it, and prose (density 1) is reserved at its own rate after seven calls."""
    size = estimates.measure_text(PROSE)
    truth = math.ceil(len(PROSE) * density / 4)
    seen = []
    for _ in range(8):
        seen.append(input_tokens(size, "m"))
        learn("m", size, truth)
    assert all(estimate >= truth for estimate in seen)
    assert seen[-1] == truth


def test_observations_that_cannot_teach_are_ignored() -> None:
    size = estimates.RequestSize(chars=1000, utf8_bytes=1000, framing=10, media=5000)
    learn("m", size, 4000)  # billed less than the media bound: nothing to learn about text
    learn("m", estimates.measure_text("short"), 900)  # too short
    learn("", estimates.measure_text(DENSE), 900)  # no model
    learn("m", estimates.measure_text(DENSE), 0)
    assert estimates.learned_ratio("m") == estimates.PRIOR_RATIO == 1.0


def test_learned_never_exceeds_bound() -> None:
    size = estimates.measure_text("abcd" * 100)
    for _ in range(20):
        learn("m", size, 10_000)
    assert input_tokens(size, "m") == input_tokens(size, "m", "bound") == 400


def _call(ctx: ExecutionContext) -> None:
    with ctx.llm_call("c", model="dense-model", prompt_text=DENSE, estimate_usd=0.0) as call:
        call.record(tokens_in=TRUE_TOKENS, tokens_out=1, cost_usd=0.0)


def test_dense_text_never_overshoots_a_shared_token_cap_once_learned() -> None:
    cap = 30 * TRUE_TOKENS + 150
    ctx = ExecutionContext(limits=[Limit(KEY_INPUT_TOKENS, cap)], admission_timeout_s=30)
    for _ in range(4):
        _call(ctx)  # a few calls teach the ratio
    barrier = threading.Barrier(32)

    def worker() -> None:
        barrier.wait()
        try:
            while True:
                _call(ctx)
        except Exception:
            return

    threads = [threading.Thread(target=worker) for _ in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    spent = ctx.stats.total_input_tokens()
    assert spent <= cap  # with chars/4 the 32 workers would have overshot by up to 3x
    assert spent >= cap - TRUE_TOKENS  # and the cap was used
