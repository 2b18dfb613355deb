"""The content parts Chat Completions and Responses send (text, refusals, images, audio, files),
and OpenAI's documented token counts of their media.

Images follow OpenAI's vision guide ("Calculating costs"):

- *Tile* models scale an image to fit 2048x2048, then its shortest side down to 768, and bill a
  base count plus a count per 512-pixel tile; ``detail="low"`` bills the base only. The base
  and tile counts differ by model (gpt-4o-mini bills 2833 + 5667 per tile at a lower price).
- *Patch* models (gpt-4.1-mini/nano, o4-mini, gpt-5-mini/nano) bill one token per 32-pixel
  patch, at most 1536 patches, times a model multiplier.

An image whose size cannot be read (a URL, a file id) is billed at the most its model's rule
allows (8 tiles: 768x2048; 1536 patches). Audio and files have no published per-unit rule
for input, so they are counted by stated bounds (see the constants).
"""

from __future__ import annotations

import math
from typing import Any, Final

from ampmeter.pricing import media
from ampmeter.pricing.names import longest_prefix
from ampmeter.pricing.request_size import Tally

__all__ = ["NOT_SENT_TO_MODEL", "add_content", "image_tokens"]

# Keys of a part or an input item that are bookkeeping, not model input.
NOT_SENT_TO_MODEL: Final = frozenset({"type", "id", "call_id", "status", "role"})
_TEXT_PARTS: Final = frozenset(
    {"text", "input_text", "output_text", "summary_text", "reasoning_text"}
)

# Model prefix -> (base tokens, tokens per tile); the longest matching prefix wins.
_TILE_RULES: Final = {
    "gpt-4o-mini": (2833, 5667),
    "gpt-5": (70, 140),
    "o1": (75, 150),
    "o3": (75, 150),
    "computer-use": (65, 129),
}
_DEFAULT_TILE: Final = (85, 170)  # gpt-4o, gpt-4.1, gpt-4.5 and models not listed
# Model prefix -> tokens per 32-pixel patch
_PATCH_RULES: Final = {
    "gpt-4.1-mini": 1.62,
    "gpt-4.1-nano": 2.46,
    "gpt-5-mini": 1.62,
    "gpt-5-nano": 2.46,
    "o4-mini": 1.72,
}
_MAX_PATCHES: Final = 1536
_MAX_TILES: Final = 8  # the largest image after scaling is 768x2048: 2 x 4 tiles

# OpenAI publishes no input rate for audio tokens; measured counts are about 10 a second.
# 25 a second is a stated bound above that.
AUDIO_TOKENS_PER_SECOND: Final = 25
# A file is read as its extracted text and an image of each page. The text of a page has no
# fixed count; 1,500 tokens a page (a dense page of small print) is the stated bound, plus
# the page image at high detail.
PAGE_TEXT_TOKENS: Final = 1_500
# A file sent by id or URL cannot be seen before the call: counted as this many pages.
UNSEEN_FILE_PAGES: Final = 4


def image_tokens(model: str | None, detail: object, size: tuple[int, int] | None) -> int:
    """Tokens of one image of ``size`` (None: unknown) sent to ``model`` at ``detail``."""
    patch_rule = longest_prefix(_PATCH_RULES, model)
    if patch_rule is not None:
        return math.ceil(_patches(size) * _PATCH_RULES[patch_rule])
    tile_rule = longest_prefix(_TILE_RULES, model)
    base, per_tile = _DEFAULT_TILE if tile_rule is None else _TILE_RULES[tile_rule]
    if detail == "low":
        return base
    return base + per_tile * _tiles(size)


def _tiles(size: tuple[int, int] | None) -> int:
    if size is None or min(size) <= 0:
        return _MAX_TILES
    width, height = float(size[0]), float(size[1])
    scale = min(1.0, 2048 / max(width, height))  # fit in 2048x2048
    width, height = width * scale, height * scale
    scale = min(1.0, 768 / min(width, height))  # then the shortest side down to 768
    width, height = width * scale, height * scale
    return math.ceil(width / 512) * math.ceil(height / 512)


def _patches(size: tuple[int, int] | None) -> int:
    if size is None or min(size) <= 0:
        return _MAX_PATCHES
    width, height = size
    return min(math.ceil(width / 32) * math.ceil(height / 32), _MAX_PATCHES)


def _url_image_tokens(model: str | None, url: object, detail: object) -> int:
    """Tokens of an image given by URL: a ``data:`` URL's size is read, any other is unknown."""
    found = media.data_url(url)
    size = None if found is None else media.image_size(media.decode_head(found[1]))
    return image_tokens(model, detail, size)


def _audio_tokens(data: object) -> int:
    """Tokens of base64 audio ``data`` (see :data:`AUDIO_TOKENS_PER_SECOND`)."""
    if not isinstance(data, str):
        return 0
    seconds = media.audio_seconds(media.decode_head(data, 64), media.b64_bytes(data))
    return math.ceil(seconds * AUDIO_TOKENS_PER_SECOND)


def _file_tokens(model: str | None, file_data: object) -> int:
    """Tokens of a file sent inline (a ``data:`` URL or bare base64), or by id when None."""
    pages = UNSEEN_FILE_PAGES
    if isinstance(file_data, str):
        found = media.data_url(file_data)
        payload = media.decode_all(found[1] if found is not None else file_data)
        pages = media.pdf_pages(payload) or UNSEEN_FILE_PAGES
    return pages * (PAGE_TEXT_TOKENS + image_tokens(model, "high", None))


def add_content(content: object, model: object, tally: Tally) -> None:
    """Content as both APIs send it: a string, or a list of parts (either API's spelling)."""
    name = model if isinstance(model, str) else None
    parts = [content] if isinstance(content, str) else content
    for part in parts if isinstance(parts, list) else ():
        if isinstance(part, dict):
            _add_part(part, name, tally)
        else:
            tally.text(part)


def _add_part(part: dict[str, Any], model: str | None, tally: Tally) -> None:
    kind = part.get("type")
    if kind in _TEXT_PARTS:
        tally.text(part.get("text"))
    elif kind == "refusal":
        tally.text(part.get("refusal"))
    elif kind in ("image_url", "input_image"):
        image: object = part.get("image_url")
        detail: object = part.get("detail")
        if isinstance(image, dict):  # Chat Completions: {"url": ..., "detail": ...}
            detail = image.get("detail")
            image = image.get("url")
        tally.media += _url_image_tokens(model, image, detail)
    elif kind == "input_audio":
        audio = part.get("input_audio")
        data = audio.get("data") if isinstance(audio, dict) else part.get("data")
        tokens = _audio_tokens(data)
        tally.media += tokens
        tally.add_part("input_audio_tokens", tokens)  # reserved at the audio rate
    elif kind in ("file", "input_file"):
        file = part.get("file") if kind == "file" else part  # Chat Completions nests it
        if isinstance(file, dict):
            tally.text(file.get("filename"))
            tally.media += _file_tokens(model, file.get("file_data"))
    else:  # a part this module does not know: every string in it is sent
        tally.any_text({k: v for k, v in part.items() if k not in NOT_SENT_TO_MODEL})
