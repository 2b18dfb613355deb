"""The input of an OpenAI Responses request (``"responses"``), measured from its body.

Billed text: ``instructions``; every input item: messages in every role and their text parts,
function and custom tool calls (name and arguments) and their outputs, reasoning items sent
back (summaries and their encrypted content, whose length grows with the reasoning they
carry), and the strings of items this module does not know; tool definitions and
``text.format`` (JSON schemas) as the JSON sent; a stored prompt's variables. Framing is
Chat Completions' (OpenAI's cookbook: 3 tokens per message, 3 that prime the reply; 7 per
function and 12 for the tool block), as both render to the same model input. Images, audio
and files follow :mod:`ampmeter.pricing.openai_media`.

The conversation a ``previous_response_id`` or ``conversation`` continues is billed as input
but not in the body: its size is the measure's ``stored`` tokens, known from the responses
ampmeter saw (:mod:`ampmeter.pricing.stored_state`), else unknown. Not measured: a stored
prompt's template.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from ampmeter.pricing import openai_media, stored_state
from ampmeter.pricing.parts import server_tool_uses
from ampmeter.pricing.request_size import RequestSize, Tally
from ampmeter.pricing.wire_chat import (
    REPLY_PRIMING,
    TOKENS_PER_FUNCTION,
    TOKENS_PER_MESSAGE,
    TOOLS_BLOCK,
)

__all__ = ["measure_responses"]


# Built-in tools billed per call, and the billed part their calls are.
_BUILT_IN_TOOLS: Final = {"web_search": "web_searches", "file_search": "storage_searches"}


def measure_responses(
    body: Mapping[str, Any], counter: Callable[[str], int] | None = None
) -> RequestSize:
    """The measure of a Responses ``body`` (``counter``: a tokenizer's count)."""
    tally = Tally()
    model = body.get("model")  # any value: add_content reads only a str
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        tally.framing += TOKENS_PER_MESSAGE
        tally.text(instructions)
    items = body.get("input")
    for item in [items] if isinstance(items, str) else items if isinstance(items, list) else ():
        if isinstance(item, dict):
            _item(item, model, tally)
        elif isinstance(item, str):
            tally.framing += TOKENS_PER_MESSAGE
            tally.text(item)
    tally.framing += REPLY_PRIMING
    tools = body.get("tools")
    if isinstance(tools, list) and tools:
        tally.framing += TOOLS_BLOCK + TOKENS_PER_FUNCTION * len(tools)
        for tool in tools:
            tally.json(tool)
        cap = body.get("max_tool_calls")  # (all built-in tools' calls together)
        for part, uses in server_tool_uses(tools, _BUILT_IN_TOOLS, None, cap).items():
            tally.add_part(part, uses)
    text = body.get("text")
    if isinstance(text, dict):
        tally.json(text.get("format"))
    prompt = body.get("prompt")
    if isinstance(prompt, dict):
        tally.any_text(prompt.get("variables"))
    size = tally.size(counter)
    stored = stored_state.stored_tokens(body.get("previous_response_id"), body.get("conversation"))
    return size if stored == 0 else size._replace(stored=stored)


def _item(item: Mapping[str, Any], model: object, tally: Tally) -> None:
    kind = item.get("type", "message")
    tally.framing += TOKENS_PER_MESSAGE
    if kind == "message":
        openai_media.add_content(item.get("content"), model, tally)
    elif kind in ("function_call", "custom_tool_call", "mcp_call"):
        tally.text(item.get("name"))
        tally.json(item.get("arguments"))
        tally.json(item.get("input"))
        openai_media.add_content(item.get("output"), model, tally)
    elif kind in ("function_call_output", "custom_tool_call_output"):
        openai_media.add_content(item.get("output"), model, tally)
    elif kind == "reasoning":
        for key in ("summary", "content"):
            openai_media.add_content(item.get(key), model, tally)
        tally.text(item.get("encrypted_content"))
    else:  # items this module does not know: every string in them is sent
        tally.any_text({k: v for k, v in item.items() if k not in openai_media.NOT_SENT_TO_MODEL})
