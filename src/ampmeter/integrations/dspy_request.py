"""DSPy's native engine (:mod:`.dspy_engine`): its requests as the wire bodies they are measured
in, and the usage of its responses in ampmeter's convention.

To reserve, a ``dspy.lm15.Request`` is written out as the body its provider's wire format
would carry (:func:`request_body`): every text part, tool call and result, tool definition,
system prompt and response schema, and each media part in its wire shape, so the estimators of
:mod:`ampmeter.pricing.request_size` measure it as they measure any request. The Anthropic
dialect is measured as Anthropic Messages (its tool prompt is billed), every other dialect as
Chat Completions. Parts are read by their ``type`` name (the vendored classes are not imported).

lm15 reports usage as each provider does (:func:`read_usage`): Anthropic's input excludes its
cache reads and writes, Gemini's and xAI's output excludes reasoning; ampmeter's convention
includes both.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Final

from ampmeter.integrations.adapter import Tally
from ampmeter.integrations.wire import counts
from ampmeter.pricing.request_size import Wire, json_text

__all__ = ["USAGE_FAMILIES", "read_usage", "request_body", "wire_of"]

# lm15's LM class of a dialect (``Resolution.adapter``) -> how its usage is counted.
USAGE_FAMILIES: Final = {"AnthropicLM": "anthropic", "GeminiLM": "gemini", "XaiLM": "xai"}
_TEXT_PARTS: Final = frozenset({"text", "thinking", "refusal"})
_USAGE_COUNTS: Final = (
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
)


def wire_of(adapter_name: str) -> Wire:
    """The wire format a dialect's requests are measured in."""
    return "anthropic" if adapter_name == "AnthropicLM" else "chat"


def request_body(wire: Wire, model: str, request: Any) -> dict[str, Any]:
    """``request`` (a ``dspy.lm15.Request``) as a ``wire`` body for ``model``."""
    config = request.config
    if wire == "anthropic":
        body = _anthropic_body(request)
        if config.response_format is not None:
            body["output_format"] = {"type": "json_schema", "schema": config.response_format}
    else:
        body = _chat_body(request)
        if config.response_format is not None:
            body["response_format"] = config.response_format
    if request.tools:
        body["tools"] = [_tool(tool, wire) for tool in request.tools]
    body["model"] = model
    if config.max_tokens is not None:
        body["max_tokens"] = config.max_tokens
    return body


def _text(text: str) -> SimpleNamespace:
    """A plain string where lm15 accepts one in place of a text part."""
    return SimpleNamespace(type="text", text=text)


def _parts(content: object) -> tuple[Any, ...]:
    """A system prompt or a tool result's content (a string, one part, or a sequence of both;
    None: nothing) as parts."""
    if content is None:
        return ()
    if isinstance(content, str):
        return (_text(content),)
    if isinstance(content, (list, tuple)):
        return tuple(_text(item) if isinstance(item, str) else item for item in content)
    return (content,)


def _text_of(part: Any) -> str:
    """The billed text of a part that is not media nor a tool call or result."""
    kind = getattr(part, "type", None)
    if kind in _TEXT_PARTS:
        text = getattr(part, "text", "")
        return text if isinstance(text, str) else ""
    if kind == "citation":
        pieces = (getattr(part, name, None) for name in ("text", "title", "url"))
        return " ".join(piece for piece in pieces if isinstance(piece, str))
    if kind == "data":
        return json_text(getattr(part, "value", None))
    return json_text(getattr(part, "__dict__", None) or repr(part))  # a part lm15 added since


def _media_url(part: Any) -> str:
    data = getattr(part, "data", None)
    if isinstance(data, str):
        return f"data:{part.media_type};base64,{data}"
    url = getattr(part, "url", None) or getattr(part, "file_id", None)
    return url if isinstance(url, str) else ""


# --- Chat Completions ---------------------------------------------------------------------------


def _chat_body(request: Any) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    system = _parts(request.system)
    if system:
        messages.append({"role": "system", "content": [_chat_part(p) for p in system]})
    for message in request.messages:
        content: list[dict[str, Any]] = []
        calls: list[dict[str, Any]] = []
        for part in message.parts:
            kind = getattr(part, "type", None)
            if kind == "tool_call":
                function = {"name": part.name, "arguments": json_text(part.input)}
                calls.append({"id": part.id, "type": "function", "function": function})
            elif kind == "tool_result":
                result = [_chat_part(p) for p in _parts(part.content)]
                messages.append({"role": "tool", "tool_call_id": part.id, "content": result})
            else:
                content.append(_chat_part(part))
        if content or calls:
            row: dict[str, Any] = {"role": message.role, "content": content}
            if calls:
                row["tool_calls"] = calls
            messages.append(row)
    body: dict[str, Any] = {"messages": messages}
    return body


def _chat_part(part: Any) -> dict[str, Any]:
    kind = getattr(part, "type", None)
    if kind == "image":
        image = {"url": _media_url(part), "detail": getattr(part, "detail", None) or "auto"}
        return {"type": "image_url", "image_url": image}
    if kind == "audio":
        audio = {"data": getattr(part, "data", None) or "", "format": _subtype(part)}
        return {"type": "input_audio", "input_audio": audio}
    if kind in ("video", "document", "binary"):
        return {"type": "file", "file": {"file_data": _media_url(part)}}
    return {"type": "text", "text": _text_of(part)}


def _subtype(part: Any) -> str:
    media_type = getattr(part, "media_type", "")
    return media_type.rpartition("/")[2] if isinstance(media_type, str) else ""


def _tool(tool: Any, wire: Wire) -> dict[str, Any]:
    """A function tool's definition (or a built-in tool with its configuration) as ``wire``
    writes it."""
    if getattr(tool, "type", None) != "function":
        named = {"name": tool.name} if wire == "anthropic" else {}
        return {"type": tool.name, **named, **(getattr(tool, "config", None) or {})}
    schema = "input_schema" if wire == "anthropic" else "parameters"
    found = {"name": tool.name, schema: tool.parameters}
    if tool.description is not None:
        found["description"] = tool.description
    return found if wire == "anthropic" else {"type": "function", "function": found}


# --- Anthropic Messages -------------------------------------------------------------------------


def _anthropic_body(request: Any) -> dict[str, Any]:
    messages = []
    for message in request.messages:
        blocks = [_anthropic_block(part) for part in message.parts]
        role = "assistant" if message.role == "assistant" else "user"
        messages.append({"role": role, "content": blocks})
    body: dict[str, Any] = {"messages": messages}
    system = _parts(request.system)
    if system:
        body["system"] = [_anthropic_block(part) for part in system]
    return body


def _anthropic_block(part: Any) -> dict[str, Any]:
    kind = getattr(part, "type", None)
    if kind == "tool_call":
        return {"type": "tool_use", "id": part.id, "name": part.name, "input": part.input}
    if kind == "tool_result":
        content = [_anthropic_block(p) for p in _parts(part.content)]
        return {"type": "tool_result", "tool_use_id": part.id, "content": content}
    if kind in ("image", "document", "video", "audio", "binary"):
        source = {"type": "url", "url": _media_url(part)}
        return {"type": "image" if kind == "image" else "document", "source": source}
    return {"type": "text", "text": _text_of(part)}


# --- usage ------------------------------------------------------------------------------------


def read_usage(usage: object, family: str | None, tally: Tally) -> None:
    """Put an lm15 ``Usage`` (as its provider counts, ``family``: :data:`USAGE_FAMILIES`)
    on ``tally`` in the subset convention (input with its cache reads and writes, output with
    its reasoning). Nothing when the provider reported neither input nor output; a count it
    did not report stays None."""
    tokens_in, tokens_out, cached, writes, reasoning = counts(usage, _USAGE_COUNTS)
    if tokens_in is None and tokens_out is None:
        return
    cached, writes, reasoning = cached or 0, writes or 0, reasoning or 0
    # A count not reported stays None (then estimated), never 0: lm15 ends an Anthropic
    # stream with message_delta's usage, which has the output alone.
    if family == "anthropic" and tokens_in is not None:
        tokens_in += cached + writes
    if family in ("gemini", "xai") and (tokens_out is not None or reasoning):
        tokens_out = (tokens_out or 0) + reasoning
    tally.tokens_in, tally.tokens_out = tokens_in, tokens_out
    tally.cached, tally.cache_write, tally.reasoning = cached, writes, reasoning
