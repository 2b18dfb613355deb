"""The input of an Anthropic Messages request (``"anthropic"``), measured from its body.

Billed text: ``system`` (a string or text blocks); every content block of every message:
text, tool use (name and input JSON), tool results (their text, images and documents),
thinking blocks sent back, search results and server tool results; tool definitions and an
``output_format`` schema as the JSON sent.

Framing: with tools, Anthropic adds a tool-use system prompt whose size its tool-use docs
list per model and ``tool_choice`` (e.g. 346 tokens for ``auto``/``none`` and 313 for
``any``/``tool`` on Claude 4 and 3.7 models). Anthropic documents no per-message framing;
:data:`TOKENS_PER_MESSAGE` and :data:`TOKENS_PER_REQUEST` are stated bounds for the turn
markers. Images follow Anthropic's vision docs: ``width * height / 750`` tokens after the
image is scaled to a long edge of at most 1568 pixels, about 1,600 at most (an image whose
size cannot be read counts that much). PDF pages count their page image plus
:data:`PAGE_TEXT_TOKENS` (the docs give 1,500-3,000 text tokens a page; the top is taken).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Final

from ampmeter.pricing import media
from ampmeter.pricing.names import longest_prefix
from ampmeter.pricing.parts import server_tool_uses
from ampmeter.pricing.request_size import RequestSize, Tally

__all__ = ["image_tokens", "measure_anthropic"]

TOKENS_PER_MESSAGE: Final = 5
TOKENS_PER_REQUEST: Final = 8
PAGE_TEXT_TOKENS: Final = 3_000
MAX_IMAGE_TOKENS: Final = 1_600
UNSEEN_FILE_PAGES: Final = 4  # a document sent by URL or file id cannot be seen before the call
_LONG_EDGE: Final = 1568
# Model prefix -> tool-use system prompt tokens with tool_choice auto/none, with any/tool;
# the longest matching prefix wins; other models take the Claude 4 figures.
_TOOL_PROMPTS: Final = {
    "claude-3-opus": (530, 281),
    "claude-3-sonnet": (159, 235),
    "claude-3-haiku": (264, 340),
    "claude-3-5-haiku": (264, 340),
    "claude-3-5-sonnet": (346, 313),
}
_DEFAULT_TOOL_PROMPT: Final = (346, 313)


def measure_anthropic(
    body: Mapping[str, Any], counter: Callable[[str], int] | None = None
) -> RequestSize:
    """The measure of a Messages ``body`` (``counter``: a tokenizer's count)."""
    tally = Tally()
    tally.framing += TOKENS_PER_REQUEST
    _content(body.get("system"), tally)
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else ():
        if isinstance(message, dict):
            tally.framing += TOKENS_PER_MESSAGE
            _content(message.get("content"), tally)
    tools = body.get("tools")
    if isinstance(tools, list) and tools:
        tally.framing += _tool_prompt(body.get("model"), body.get("tool_choice"))
        for tool in tools:
            tally.json(tool)
        for part, uses in server_tool_uses(tools, _SERVER_TOOLS, "max_uses").items():
            tally.add_part(part, uses)
    tally.json(body.get("output_format"))
    config = body.get("output_config")
    if isinstance(config, dict):
        tally.json(config.get("format"))
    return tally.size(counter)


# Server tools billed per use (web fetch and code execution bill tokens, or time, instead).
_SERVER_TOOLS: Final = {"web_search_": "web_searches"}


def _tool_prompt(model: object, choice: object) -> int:
    found = longest_prefix(_TOOL_PROMPTS, model)
    auto, forced = _DEFAULT_TOOL_PROMPT if found is None else _TOOL_PROMPTS[found]
    kind = choice.get("type") if isinstance(choice, dict) else None
    return forced if kind in ("any", "tool") else auto


def _content(content: object, tally: Tally) -> None:
    """A system prompt's or a message's content: a string, or a list of blocks."""
    blocks = [content] if isinstance(content, str) else content
    for block in blocks if isinstance(blocks, list) else ():
        if isinstance(block, str):
            tally.text(block)
        elif isinstance(block, dict):
            _block(block, tally)


def _block(block: Mapping[str, Any], tally: Tally) -> None:
    kind = block.get("type")
    if kind == "text":
        tally.text(block.get("text"))
    elif kind in ("tool_use", "server_tool_use"):
        tally.text(block.get("name"))
        tally.json(block.get("input"))
    elif kind == "tool_result":
        _content(block.get("content"), tally)
    elif kind == "image":
        tally.media += _image(block.get("source"))
    elif kind == "document":
        tally.text(block.get("title"))
        tally.text(block.get("context"))
        _document(block.get("source"), tally)
    elif kind == "thinking":
        tally.text(block.get("thinking"))
    elif kind == "redacted_thinking":
        tally.text(block.get("data"))
    else:  # search results, server tool results, blocks this module does not know
        tally.any_text({k: v for k, v in block.items() if k not in ("type", "cache_control")})


def image_tokens(size: tuple[int, int] | None) -> int:
    """Tokens of one image of ``size`` (None: unknown) by Anthropic's rule."""
    if size is None or min(size) <= 0:
        return MAX_IMAGE_TOKENS
    width, height = size
    scale = min(1.0, _LONG_EDGE / max(width, height))
    return min(math.ceil(width * scale * height * scale / 750), MAX_IMAGE_TOKENS)


def _image(source: object) -> int:
    if isinstance(source, dict) and source.get("type") == "base64":
        data = source.get("data")
        if isinstance(data, str):
            return image_tokens(media.image_size(media.decode_head(data)))
    return MAX_IMAGE_TOKENS


def _document(source: object, tally: Tally) -> None:
    if not isinstance(source, dict):
        return
    kind = source.get("type")
    if kind == "text":
        tally.text(source.get("data"))
    elif kind == "content":
        _content(source.get("content"), tally)
    else:
        pages = UNSEEN_FILE_PAGES
        data = source.get("data")
        if kind == "base64" and isinstance(data, str):
            pages = media.pdf_pages(media.decode_all(data)) or UNSEEN_FILE_PAGES
        tally.media += pages * (PAGE_TEXT_TOKENS + MAX_IMAGE_TOKENS)
