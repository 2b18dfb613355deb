"""The input of a Gemini ``generateContent`` request (``"gemini"``), measured from its body.

Both spellings of the REST body are read (``systemInstruction`` and ``system_instruction``).
Billed text: the system instruction and every part of every content in every role: text
(thoughts included), function calls (name and args JSON) and responses (JSON), executable
code and its results; function declarations and the response schema as the JSON sent.

Media follow Gemini's token docs ("Understand and count tokens"): an image no larger than
384 pixels a side is 258 tokens, a larger one 258 per 768x768 tile; Gemini 3 models bill an
image at its media resolution, 1,120 tokens at the default (high), which is taken for them;
audio is 32 tokens a second and video 263; a PDF page is billed as an image
(:data:`PAGE_TOKENS`, the larger of the documented per-page counts). Gemini documents no
framing; :data:`TOKENS_PER_CONTENT` is a stated bound for the turn markers, and each text part
counts one token more than its bytes could need (a word-boundary marker). A
``cachedContent`` the request names is billed as (cached) input but is not in the body: the
measure says it continues stored state of unknown size (see
:mod:`~ampmeter.pricing.stored_state`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Final

from ampmeter.pricing import media
from ampmeter.pricing.parts import UNCAPPED_TOOL_USES
from ampmeter.pricing.request_size import RequestSize, Tally

__all__ = ["measure_gemini"]

TOKENS_PER_CONTENT: Final = 4
IMAGE_TILE_TOKENS: Final = 258
GEMINI_3_IMAGE_TOKENS: Final = 1_120
AUDIO_TOKENS_PER_SECOND: Final = 32
VIDEO_TOKENS_PER_SECOND: Final = 263
PAGE_TOKENS: Final = 560
# Media that cannot be seen before the call (a file URI), as stated nominal sizes: an image of
# 4 tiles, a PDF of 4 pages, a minute of audio or video.
UNSEEN_IMAGE_TILES: Final = 4
UNSEEN_PAGES: Final = 4
UNSEEN_SECONDS: Final = 60
# Video of unknown duration is taken to run at least at this many bytes a second (100 kbit/s).
_MIN_VIDEO_BYTES_PER_SECOND: Final = 12_500


def _get(mapping: Mapping[str, Any], camel: str, snake: str) -> Any:
    value = mapping.get(camel)
    return mapping.get(snake) if value is None else value


def measure_gemini(
    body: Mapping[str, Any], counter: Callable[[str], int] | None = None
) -> RequestSize:
    """The measure of a ``generateContent`` ``body`` (``counter``: a tokenizer's count);
    ``body["model"]`` (not part of the REST body, which names it in the URL) selects the
    Gemini 3 image rule when given."""
    tally = Tally()
    model = body.get("model")
    gemini_3 = isinstance(model, str) and "gemini-3" in model.lower()
    contents = body.get("contents")
    contents = [contents] if isinstance(contents, str) else contents
    system = _get(body, "systemInstruction", "system_instruction")
    for content in [system, *(contents if isinstance(contents, list) else ())]:
        if isinstance(content, dict):
            _content(content, gemini_3, tally)
        elif isinstance(content, str):
            tally.framing += TOKENS_PER_CONTENT
            tally.text(content)
    tools = body.get("tools")
    for tool in tools if isinstance(tools, list) else ():
        tally.json(tool)
        if isinstance(tool, dict) and not _SEARCH_TOOLS.isdisjoint(tool):
            # Grounding with Google Search is billed per query (or grounded request), and the
            # request states no cap on the queries: the stated bound.
            tally.add_part("web_searches", UNCAPPED_TOOL_USES)
    config = _get(body, "generationConfig", "generation_config")
    if isinstance(config, dict):
        tally.json(_get(config, "responseSchema", "response_schema"))
        tally.json(_get(config, "responseJsonSchema", "response_json_schema"))
    size = tally.size(counter)
    if _get(body, "cachedContent", "cached_content") is not None:
        # Billed as input, its size not in the body: stored state of unknown size.
        return size._replace(stored=None)
    return size


def _content(content: Mapping[str, Any], gemini_3: bool, tally: Tally) -> None:
    tally.framing += TOKENS_PER_CONTENT
    parts = content.get("parts")
    for part in parts if isinstance(parts, list) else ():
        if isinstance(part, dict):
            _part(part, gemini_3, tally)
        elif isinstance(part, str):
            tally.text(part)


def _part(part: Mapping[str, Any], gemini_3: bool, tally: Tally) -> None:
    text = part.get("text")
    if isinstance(text, str) and text:
        # A SentencePiece tokenizer may open a piece of text with a lone word-boundary token
        # before its first byte: one more than its bytes, at most.
        tally.framing += 1
        tally.text(text)
    call = _get(part, "functionCall", "function_call")
    if isinstance(call, dict):
        tally.text(call.get("name"))
        tally.json(call.get("args"))
    answer = _get(part, "functionResponse", "function_response")
    if isinstance(answer, dict):
        tally.text(answer.get("name"))
        tally.json(answer.get("response"))
    code = _get(part, "executableCode", "executable_code")
    if isinstance(code, dict):
        tally.text(code.get("code"))
    result = _get(part, "codeExecutionResult", "code_execution_result")
    if isinstance(result, dict):
        tally.text(result.get("output"))
    inline = _get(part, "inlineData", "inline_data")
    if isinstance(inline, dict):
        mime = str(_get(inline, "mimeType", "mime_type") or "")
        data = inline.get("data")
        if mime.startswith("text/") and isinstance(data, str):  # sent as its text
            tally.text(media.decode_all(data).decode("utf-8", "replace"))
        else:
            _add_media(tally, mime, _inline(mime, data, gemini_3))
    file = _get(part, "fileData", "file_data")
    if isinstance(file, dict):
        mime = str(_get(file, "mimeType", "mime_type") or "")
        _add_media(tally, mime, _unseen(mime, gemini_3))


def _add_media(tally: Tally, mime: str, tokens: int) -> None:
    """Count ``tokens`` of media of type ``mime``, and the billed part they are (audio and
    video at their own rates where the model has them; images and documents as images)."""
    tally.media += tokens
    kind = mime.partition("/")[0]
    part = _MEDIA_PARTS.get("image" if mime == "application/pdf" else kind)
    if part is not None:
        tally.add_part(part, tokens)


_SEARCH_TOOLS: Final = frozenset(
    {"googleSearch", "google_search", "googleSearchRetrieval", "google_search_retrieval"}
)
_MEDIA_PARTS: Final = {
    "audio": "input_audio_tokens",
    "image": "input_image_tokens",
    "video": "input_video_tokens",
}


def image_tokens(size: tuple[int, int] | None, gemini_3: bool) -> int:
    """Tokens of one image of ``size`` (None: unknown) by Gemini's rule."""
    if gemini_3:
        return GEMINI_3_IMAGE_TOKENS
    if size is None or min(size) <= 0:
        return IMAGE_TILE_TOKENS * UNSEEN_IMAGE_TILES
    width, height = size
    if width <= 384 and height <= 384:
        return IMAGE_TILE_TOKENS
    return IMAGE_TILE_TOKENS * math.ceil(width / 768) * math.ceil(height / 768)


def _inline(mime: str, data: object, gemini_3: bool) -> int:
    if not isinstance(data, str):
        return _unseen(mime, gemini_3)
    if mime.startswith("image/"):
        return image_tokens(media.image_size(media.decode_head(data)), gemini_3)
    if mime == "application/pdf":
        return PAGE_TOKENS * (media.pdf_pages(media.decode_all(data)) or UNSEEN_PAGES)
    if mime.startswith("audio/"):
        seconds = media.audio_seconds(media.decode_head(data, 64), media.b64_bytes(data))
        return math.ceil(seconds * AUDIO_TOKENS_PER_SECOND)
    if mime.startswith("video/"):
        seconds = media.b64_bytes(data) / _MIN_VIDEO_BYTES_PER_SECOND
        return math.ceil(seconds * VIDEO_TOKENS_PER_SECOND)
    return _unseen(mime, gemini_3)  # a kind without a documented rule: its nominal size


def _unseen(mime: str, gemini_3: bool) -> int:
    if mime.startswith("audio/"):
        return UNSEEN_SECONDS * AUDIO_TOKENS_PER_SECOND
    if mime.startswith("video/"):
        return UNSEEN_SECONDS * VIDEO_TOKENS_PER_SECOND
    if mime == "application/pdf":
        return UNSEEN_PAGES * PAGE_TOKENS
    return image_tokens(None, gemini_3)
