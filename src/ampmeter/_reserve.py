"""What a call reserves before it runs: its estimated input and output tokens and their price.

Two estimate modes (a context's ``estimate=``): ``"learned"`` takes the input from the request's
measure corrected per model by finished calls, and the output from ``max_tokens`` (the pricing
layer assumes its default output length when a call sets none); ``"bound"`` reserves a ceiling
no tokenizer can pass: the input's bound from its measure, and the output at ``max_tokens``, else
the model's documented maximum output, else
:data:`~ampmeter.pricing.max_output.DEFAULT_OUTPUT_BOUND`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, Literal

from ampmeter import _validate
from ampmeter._core.usage import Usage
from ampmeter.pricing import request_size
from ampmeter.pricing.max_output import DEFAULT_OUTPUT_BOUND

if TYPE_CHECKING:
    from ampmeter.pricing.plan import PricePlan
    from ampmeter.pricing.request_size import RequestSize

__all__ = ["ESTIMATE_MODES", "model_estimate"]

EstimateMode = Literal["learned", "bound"]
ESTIMATE_MODES: Final = ("learned", "bound")


def model_estimate(
    kind: Literal["llm", "embedding"],
    plan: PricePlan | None,
    model: str | None,
    *,
    estimate_usd: object,
    max_tokens: object,
    prompt_tokens: object,
    prompt_text: object,
    request: object,
    mode: EstimateMode,
) -> tuple[Usage, RequestSize | None, bool]:
    """What an LLM call or an embedding request (``max_tokens`` 0: it writes nothing) of
    ``model`` reserves (see the module docstring) by its price ``plan`` (None without a model),
    the measure of its request to learn from (None when there is none, or it is too short to
    teach anything: :func:`~ampmeter.pricing.request_size.learn`) and whether its model has a
    price. The input is the caller's ``prompt_tokens``, else the estimate from the request's
    measure or the prompt text. An LLM call counts one call and one step; an embedding none."""
    out_tokens = None if max_tokens is None else _validate.count(max_tokens, "max_tokens")
    size: RequestSize | None = None
    if prompt_tokens is not None:
        in_tokens = _validate.count(prompt_tokens, "prompt_tokens")
    elif request is None and prompt_text is None:
        in_tokens = 0
    else:
        if request is None:
            size = request_size.measure_text(_validate.text(prompt_text, "prompt_text"))
        elif isinstance(request, request_size.RequestSize):
            size = request
        else:
            raise TypeError(f"request must be a RequestSize, got {type(request).__name__}")
        in_tokens = request_size.input_tokens(size, model, mode)
        if size.chars < request_size.MIN_LEARN_CHARS:
            size = None  # known now: the call's end need not offer it to learn
    if mode == "bound" and out_tokens is None:
        out_tokens = DEFAULT_OUTPUT_BOUND if plan is None else plan.output_bound
    priced = model != ""  # an empty model name has no price
    if estimate_usd is not None:
        cost = _validate.nano(estimate_usd, "estimate_usd", round_up=True)
        priced = True
    elif plan is not None:
        # Without max_tokens the plan assumes its default output length: a budget must not
        # treat a call of unknown length as free.
        found = plan.estimate_nano(in_tokens, out_tokens)
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
