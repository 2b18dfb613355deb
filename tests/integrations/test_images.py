"""OpenAI image generation is a model call billed in tokens: metered, reserved and capped.

``images.generate`` / ``images.edit`` went out unmetered: a gpt-image-1 image at high quality is
4,160 output tokens at $40 a million ($0.17), counted as nothing and passing every cap.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import genai_prices
import httpx
import openai
import pytest

from ampmeter import ExecutionContext, LimitExceeded, Node
from ampmeter.integrations.openai_images import image_output_tokens
from ampmeter.keys import KEY_LLM_CALLS
from ampmeter.sinks.memory import MemorySink
from ampmeter.testing.replay import ReplayResponse, ReplayServer

pytestmark = pytest.mark.usefixtures("instrumented")  # conftest.py

GENERATIONS = "/v1/images/generations"
USAGE = {
    "input_tokens": 50,
    "input_tokens_details": {"text_tokens": 50, "image_tokens": 0},
    "output_tokens": 4160,
    "total_tokens": 4210,
}
IMAGE = {"created": 1764460800, "data": [{"b64_json": "aW1hZ2U="}], "usage": USAGE}


def table_cost(
    model: str, tokens_in: int, tokens_out: int, parts: dict[str, int] | None = None
) -> Decimal:
    usage = genai_prices.Usage(input_tokens=tokens_in, output_tokens=tokens_out, **(parts or {}))
    price = genai_prices.calc_price(usage, model, provider_id="openai")
    return price.total_price


def calls(sink: MemorySink) -> list[Node]:
    return [node for node in sink.nodes if node.kind == "llm"]


def client_of(replay: ReplayServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=replay.openai_base_url, api_key="k", max_retries=0)


def test_an_image_generation_is_charged_its_usage_at_the_tables_price(
    replay: ReplayServer,
) -> None:
    replay.script(GENERATIONS, ReplayResponse.json(IMAGE))
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]) as ctx:
        made = client_of(replay).images.generate(
            model="gpt-image-1", prompt="A lighthouse at dawn", quality="high", size="1024x1024"
        )
    assert made.data is not None and made.data[0].b64_json == "aW1hZ2U="
    (node,) = calls(sink)
    assert (node.kind, node.name, node.model) == ("llm", "images.generate", "gpt-image-1")
    assert (node.tokens_in, node.tokens_out, node.status) == (50, 4160, "success")
    assert node.cost_usd == table_cost("gpt-image-1", 50, 4160) == Decimal("0.16665")
    assert ctx.stats.total_cost() == node.cost_usd
    assert ctx.stats.get_counter(KEY_LLM_CALLS) == 1


def test_an_image_edit_sent_as_a_form_is_metered_at_the_door(replay: ReplayServer) -> None:
    """An edit's image travels as a file in a multipart form: the SDK's door still reads the
    request's fields, and the response's usage counts the input image."""
    usage = {**USAGE, "input_tokens": 373, "input_tokens_details": {"image_tokens": 323}}
    replay.script("/v1/images/edits", ReplayResponse.json({**IMAGE, "usage": usage}))
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        client_of(replay).images.edit(
            model="gpt-image-1", image=("cat.png", b"\x89PNG\r\n", "image/png"), prompt="A hat"
        )
    (node,) = calls(sink)
    assert (node.name, node.tokens_in, node.tokens_out) == ("images.edit", 373, 4160)
    # The input image's 323 tokens at the image rate ($10 a million), not the text rate ($5).
    parts = {"input_image_tokens": 323, "output_image_tokens": 4160}
    assert node.cost_usd == table_cost("gpt-image-1", 373, 4160, parts)
    assert replay.requests[0].headers["content-type"].startswith("multipart/form-data")


def test_image_output_is_charged_at_the_image_rate(replay: ReplayServer) -> None:
    """gpt-image-1.5 bills output image tokens at $32 a million, text output at $10."""
    usage = {**USAGE, "output_tokens_details": {"image_tokens": 4000, "text_tokens": 160}}
    replay.script(GENERATIONS, ReplayResponse.json({**IMAGE, "usage": usage}))
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        client_of(replay).images.generate(model="gpt-image-1.5", prompt="A harbour")
    (node,) = calls(sink)
    parts = {"output_image_tokens": 4000}
    assert node.cost_usd == table_cost("gpt-image-1.5", 50, 4160, parts)
    assert node.cost_usd > table_cost("gpt-image-1.5", 50, 4160)


def test_an_image_that_would_pass_the_cap_is_refused_before_it_is_sent(
    replay: ReplayServer,
) -> None:
    """Four high-quality portrait images reserve 4 × 6,240 output tokens ($1.00): refused
    under a $0.50 cap, nothing sent; one low-quality square image fits."""
    replay.script(GENERATIONS, ReplayResponse.json(IMAGE))
    client = client_of(replay)
    with ExecutionContext(max_cost_usd=0.50):
        with pytest.raises(LimitExceeded):
            client.images.generate(
                model="gpt-image-1", prompt="Four posters", n=4, quality="high", size="1024x1536"
            )
        assert replay.requests == []
        client.images.generate(model="gpt-image-1", prompt="A stamp", quality="low")
    assert len(replay.requests) == 1


def test_an_image_response_without_usage_is_charged_its_reservation(
    replay: ReplayServer,
) -> None:
    """A response cut of its usage (a proxy's) still billed the images: charged the
    reservation, the output of two medium landscape images."""
    replay.script(GENERATIONS, ReplayResponse.json({"created": 1, "data": [{"url": "u"}] * 2}))
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        client_of(replay).images.generate(
            model="gpt-image-1", prompt="Two maps", n=2, quality="medium", size="1536x1024"
        )
    (node,) = calls(sink)
    assert node.tokens_out == 2 * 1568 and node.tokens_in is not None and node.tokens_in > 0
    assert node.metadata["cost_status"] == "estimated" and node.cost_usd > 0


def test_a_request_naming_no_model_is_the_apis_default_and_never_free(
    replay: ReplayServer,
) -> None:
    """dall-e-2 (the API's default) reports no usage and the table has no price for it: the
    call counts, unpriced, not as $0 and not unseen."""
    replay.script(GENERATIONS, ReplayResponse.json({"created": 1, "data": [{"url": "u"}]}))
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]) as ctx:
        client_of(replay).images.generate(prompt="A cat")
    (node,) = calls(sink)
    assert node.model == "dall-e-2" and node.metadata["cost_status"] == "unpriced"
    assert ctx.stats.get_counter(KEY_LLM_CALLS) == 1


def test_a_streamed_image_reads_its_usage_from_the_completed_event(
    replay: ReplayServer,
) -> None:
    partial = {
        "type": "image_generation.partial_image",
        "b64_json": "cA==",
        "partial_image_index": 0,
    }
    done = {"type": "image_generation.completed", "b64_json": "aW1hZ2U=", "usage": USAGE}
    replay.script(
        GENERATIONS, ReplayResponse.sse([(partial["type"], partial), (done["type"], done)])
    )
    sink = MemorySink()
    with ExecutionContext(sinks=[sink]):
        events = client_of(replay).images.generate(
            model="gpt-image-1", prompt="A kite", stream=True, partial_images=1
        )
        assert [event.type for event in events][-1] == "image_generation.completed"
    (node,) = calls(sink)
    assert (node.tokens_in, node.tokens_out, node.status) == (50, 4160, "success")


def test_a_raw_http_image_request_is_metered(
    replay: ReplayServer,
) -> None:
    replay.script(GENERATIONS, ReplayResponse.json(IMAGE))
    sink = MemorySink()
    body: dict[str, Any] = {"model": "gpt-image-1", "prompt": "A boat"}
    with ExecutionContext(sinks=[sink]), httpx.Client() as client:
        client.post(replay.openai_base_url + "/images/generations", json=body)
    (node,) = calls(sink)
    assert (node.tokens_in, node.tokens_out) == (50, 4160)


@pytest.mark.parametrize(
    ("quality", "size", "tokens"),
    [
        ("low", "1024x1024", 272),
        ("medium", "1024x1536", 1584),
        ("high", "1536x1024", 6208),
        ("auto", "auto", 6240),
        (None, None, 6240),
        ("high", "2048x2048", 4 * 4160),
        ("low", "not a size", 408),
        ("high", "9" * 5000 + "x1", 6240),  # no size: no int() of 5,000 digits
    ],
)
def test_an_images_output_is_reserved_by_its_quality_and_size(
    quality: object, size: object, tokens: int
) -> None:
    assert image_output_tokens(quality, size) == tokens
