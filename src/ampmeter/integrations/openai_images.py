"""OpenAI image generation (``images.generate``, ``images.edit``): model calls billed in tokens.

The gpt-image models report their usage (input tokens, the images' output tokens) in the
response, or in a stream's ``*.completed`` event. An image's output tokens are set by its
quality and size (OpenAI's published table below), so a request reserves, for each image it
asks for, the tokens of its size at its quality: the highest quality when it says ``auto`` or
nothing, the largest listed size for ``auto`` or none, and a size the table does not list scaled
by its pixels from the square one; plus 100 tokens per partial image a stream asks for.

Images are never sent as text, so a response without usage (a proxy's cut, the dall-e models,
which report none) is charged its reservation; the table does not price the dall-e models,
whose calls are then unpriced, never $0. A request that names no model is the API's default,
dall-e-2. An edit's input images travel as files, which the reservation does not measure: the
response's usage counts them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

from ampmeter.integrations.adapter import Adapter, Tally
from ampmeter.integrations.wire import READERS, counts, first_int
from ampmeter.pricing import request_size, tokenizer
from ampmeter.pricing.request_size import RequestSize

__all__ = ["ImagesAdapter", "image_output_tokens"]

# Output tokens of one image, by quality and size (OpenAI's table for the gpt-image models).
_IMAGE_TOKENS: Final = {
    "low": {"1024x1024": 272, "1024x1536": 408, "1536x1024": 400},
    "medium": {"1024x1024": 1056, "1024x1536": 1584, "1536x1024": 1568},
    "high": {"1024x1024": 4160, "1024x1536": 6240, "1536x1024": 6208},
}
_SQUARE_PIXELS: Final = 1024 * 1024
_PARTIAL_IMAGE_TOKENS: Final = 100  # each partial image a stream sends
_MOST_IMAGES: Final = 10  # the API's most images per request
_COMPLETED: Final = frozenset({"image_generation.completed", "image_edit.completed"})
_PARTIAL: Final = frozenset({"image_generation.partial_image", "image_edit.partial_image"})
_USAGE: Final = ("input_tokens", "output_tokens")
_INPUT_DETAILS: Final = ("cached_tokens", "image_tokens")


def image_output_tokens(quality: object, size: object) -> int:
    """The output tokens one image of ``quality`` and ``size`` (as a request gives them) is
    billed at most (see the module)."""
    by_size = _IMAGE_TOKENS.get(quality) if isinstance(quality, str) else None
    by_size = by_size or _IMAGE_TOKENS["high"]
    listed = by_size.get(size) if isinstance(size, str) else None
    if listed is not None:
        return listed
    width, _, height = size.partition("x") if isinstance(size, str) else ("", "", "")
    # (At most 6 digits a side: a longer one is no size, and no int() of thousands of digits.)
    if width.isdigit() and height.isdigit() and max(len(width), len(height)) <= 6:
        return math.ceil(by_size["1024x1024"] * int(width) * int(height) / _SQUARE_PIXELS)
    return max(by_size.values())  # "auto", or no size


class ImagesAdapter(Adapter):
    """``images.generate`` / ``images.edit``: a prompt in, images out (billed as output)."""

    provider = "openai"
    wire = "completions"  # the prompt is measured as a Completions prompt is

    def measure(
        self, body: Mapping[str, Any], model: str | None
    ) -> tuple[RequestSize, int | None, bool]:
        counter = None if model is None else tokenizer.COUNTERS[model]
        size = request_size.MEASURES["completions"]({"prompt": body.get("prompt")}, counter)
        images = first_int(body.get("n")) or 1
        images = min(max(images, 1), _MOST_IMAGES)
        stream = body.get("stream") is True
        each = image_output_tokens(body.get("quality"), body.get("size"))
        if stream:
            partials = first_int(body.get("partial_images")) or 0
            each += _PARTIAL_IMAGE_TOKENS * min(max(partials, 0), 3)
        return size, images * each, stream

    def model_for(self, path: str, body: Mapping[str, Any]) -> str | None:
        return super().model_for(path, body) or "dall-e-2"  # (the API's default)

    def prompt_text(self, kwargs: Mapping[str, Any]) -> str:
        prompt = kwargs.get("prompt")
        return prompt if isinstance(prompt, str) else ""

    def read_response(self, result: Any, tally: Tally) -> None:
        tally.unseen = True  # the images are output that is never received as text
        usage = READERS[type(result)](result, "usage", None)
        if usage is None:
            return
        read = READERS[type(usage)]
        tally.tokens_in, tally.tokens_out = counts(usage, _USAGE)
        inputs = read(usage, "input_tokens_details", None)
        cached, images = counts(inputs, _INPUT_DETAILS)
        (made,) = counts(read(usage, "output_tokens_details", None), ("image_tokens",))
        tally.cached = cached or 0
        # Images in and out are billed at rates of their own (gpt-image-1.5's output images
        # at $32 a million against $10 for text); output without a breakdown is all image.
        tally.set_part("input_image_tokens", images)
        tally.set_part("output_image_tokens", made if made is not None else tally.tokens_out)

    def read_event(self, event: Any, tally: Tally, hide_usage: bool) -> bool:
        tally.unseen = True
        kind = READERS[type(event)](event, "type", None)
        if kind in _COMPLETED:
            self.read_response(event, tally)
            tally.complete = True
        elif kind in _PARTIAL:
            tally.chunks += 1
        return False
