"""Prompt estimates that learn: dense text stops being under-reserved after a few calls."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from ampmeter import ExecutionContext, Limit
from ampmeter.keys import KEY_INPUT_TOKENS
from ampmeter.pricing import request_size as estimates

DENSE = "字" * 400  # 400 characters: 100 tokens at four characters a token, 300 in truth
TRUE_TOKENS = 300


@pytest.fixture(autouse=True)
def _fresh_ratios() -> Iterator[None]:
    estimates.forget()
    yield
    estimates.forget()


def _call(ctx: ExecutionContext) -> None:
    with ctx.llm_call("c", model="dense-model", prompt_text=DENSE, estimate_usd=0.0) as call:
        call.record(tokens_in=TRUE_TOKENS, tokens_out=1, cost_usd=0.0)


def test_a_finished_call_teaches_its_model_the_ratio() -> None:
    ctx = ExecutionContext(limits=[Limit(KEY_INPUT_TOKENS, 10**9)])
    first = ctx.llm_call("c", model="dense-model", prompt_text=DENSE, estimate_usd=0.0).start()
    assert ctx.stats.reserved()[KEY_INPUT_TOKENS] == 100  # chars / 4 before any call finished
    first.record(tokens_in=TRUE_TOKENS, tokens_out=1, cost_usd=0.0)
    first.finish()
    second = ctx.llm_call("c", model="dense-model", prompt_text=DENSE, estimate_usd=0.0).start()
    assert ctx.stats.reserved()[KEY_INPUT_TOKENS] == TRUE_TOKENS  # the learned ratio
    second.finish()
    # Another model is not affected; a lower ratio never lowers what was learned.
    assert estimates.prompt_tokens(DENSE, "other-model") == 100
    estimates.learn("dense-model", estimates.RequestSize(400, 400), 50)
    assert estimates.prompt_tokens(DENSE, "dense-model") == TRUE_TOKENS


def test_dense_text_never_overshoots_a_shared_token_cap_once_learned() -> None:
    cap = 30 * TRUE_TOKENS + 150
    ctx = ExecutionContext(limits=[Limit(KEY_INPUT_TOKENS, cap)], admission_timeout_s=30)
    for _ in range(3):
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
