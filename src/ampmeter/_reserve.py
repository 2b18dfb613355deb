"""What a call reserves before it runs: its estimated input and output tokens and their price.

Two estimate modes (a context's ``estimate=``): ``"learned"`` takes the input from the request's
measure corrected per model by finished calls, and the output from ``max_tokens`` (the pricing
layer assumes its default output length when a call sets none); ``"bound"`` reserves a ceiling
no tokenizer can pass: the input's bound from its measure, and the output at ``max_tokens``, else
the model's documented maximum output, else :data:`BOUND_OUTPUT_TOKENS`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, Literal

from ampmeter import _validate
from ampmeter._core.usage import Usage
from ampmeter.pricing import request_size
from ampmeter.pricing.max_output import max_output_tokens

if TYPE_CHECKING:
    from ampmeter.pricing.request_size import RequestSize
    from ampmeter.pricing.source import NanoPricing

__all__ = [
    "BOUND_OUTPUT_TOKENS",
    "ESTIMATE_MODES",
    "model_estimate",
    "prompt_estimate",
]

EstimateMode = Literal["learned", "bound"]
ESTIMATE_MODES: Final = ("learned", "bound")

BOUND_OUTPUT_TOKENS: Final = 32_768
"""Output tokens ``estimate="bound"`` reserves for a call that sets no ``max_tokens`` to a model
whose maximum output is not known: more than any common model writes in one answer."""


def prompt_estimate(
    prompt_tokens: object,
    prompt_text: object,
    request: object,
    model: str | None,
    mode: EstimateMode = "learned",
) -> tuple[int, RequestSize | None]:
    """A call's estimated input tokens (the caller's count, else the estimate from the
    request's measure or the prompt text) and the measure (None without one)."""
    if prompt_tokens is not None:
        return _validate.count(prompt_tokens, "prompt_tokens"), None
    if request is None and prompt_text is None:
        return 0, None
    if request is not None:
        if not isinstance(request, request_size.RequestSize):
            raise TypeError(f"request must be a RequestSize, got {type(request).__name__}")
        size = request
    else:
        size = request_size.measure_text(_validate.text(prompt_text, "prompt_text"))
    return request_size.input_tokens(size, model, mode), size


def model_estimate(
    kind: Literal["llm", "embedding"],
    pricing: NanoPricing,
    model: str | None,
    provider: str | None,
    *,
    estimate_usd: object,
    max_tokens: object,
    prompt_tokens: object,
    prompt_text: object,
    request: object,
    mode: EstimateMode,
) -> tuple[Usage, RequestSize | None, bool]:
    """What an LLM call or an embedding request (``max_tokens`` 0: it writes nothing) reserves
    (see the module docstring), the measure of its request to learn from (None when there is
    none, or it is too short to teach anything: :func:`~ampmeter.pricing.request_size.learn`)
    and whether its model has a price. An LLM call counts one call and one step; an embedding
    none."""
    out_tokens = None if max_tokens is None else _validate.count(max_tokens, "max_tokens")
    in_tokens, size = prompt_estimate(prompt_tokens, prompt_text, request, model, mode)
    if size is not None and size.chars < request_size.MIN_LEARN_CHARS:
        size = None  # known now: the call's end need not offer it to learn
    if mode == "bound" and out_tokens is None:
        out_tokens = (max_output_tokens(model) if model else None) or BOUND_OUTPUT_TOKENS
    priced = model != ""  # an empty model name has no price
    if estimate_usd is not None:
        cost = _validate.nano(estimate_usd, "estimate_usd", round_up=True)
        priced = True
    elif model:
        # Without max_tokens the pricing layer assumes its default output length: a budget
        # must not treat a call of unknown length as free.
        found = pricing.estimate_nano(model, provider, in_tokens, out_tokens)
        priced = found is not None
        cost = found or 0
    else:
        cost = 0
    counted = int(kind == "llm")
    usage = Usage(
        kind,
        model or "",
        tokens_in=in_tokens,
        tokens_out=out_tokens or 0,
        cost_nano=cost,
        calls=counted,
        steps=counted,
    )
    return usage, size, priced
