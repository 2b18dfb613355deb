"""Amazon Bedrock's runtime API, metered at the HTTP layer (boto3's ``bedrock-runtime`` client,
LiteLLM's ``bedrock/`` models, anything that sends to it).

Two wire formats, the model named in the path (``/model/<id>/<operation>``, the id
URL-encoded):

- **Converse** (``converse``, ``converse-stream``): Bedrock's own messages format. Usage is
  ``inputTokens`` (without the cache's tokens), ``cacheReadInputTokens``,
  ``cacheWriteInputTokens`` (``cacheDetails`` splits them by time to live: 1-hour writes are
  a billed part) and ``outputTokens``; a stream's comes in its last event, ``metadata``.
- **InvokeModel** (``invoke``, ``invoke-with-response-stream``) with an Anthropic Messages body
  (``anthropic_version``): read as the Messages API is; a stream's events come inside
  Bedrock's frames as base64 ``bytes``. Other vendors' bodies are not read here.

Streams are ``application/vnd.amazon.eventstream``: binary frames (botocore's decoder, there
whenever Bedrock is called from Python, reads them), each an event type and a JSON payload,
handed to the adapter as ``{type: payload}``, as boto3 hands them to its caller. Calls are
priced at the table's ``aws`` provider, which lists Bedrock's model ids (``anthropic.claude-…``,
``us.anthropic.claude-…``).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterator, Mapping
from typing import Any, Final
from urllib.parse import unquote

import orjson

from ampmeter.integrations.adapter import Adapter, Tally
from ampmeter.integrations.anthropic import MessagesAdapter
from ampmeter.integrations.wire import READERS, counts, first_int, get
from ampmeter.pricing import tokenizer
from ampmeter.pricing.request_size import RequestSize, json_text
from ampmeter.pricing.wire_anthropic import measure_anthropic

__all__ = ["ConverseAdapter", "EventFrames", "InvokeAdapter", "bedrock_model"]

PROVIDER = "aws"
EVENT_STREAM: Final = "application/vnd.amazon.eventstream"
_USAGE: Final = ("inputTokens", "cacheReadInputTokens", "cacheWriteInputTokens", "outputTokens")


def bedrock_model(path: str) -> str | None:
    """The model id a Bedrock runtime path names (``/model/<id>/converse``), or None."""
    _, marker, rest = path.rpartition("/model/")
    model = rest.partition("/")[0]
    return unquote(model) if marker and model else None


class EventFrames:
    """Bedrock's binary event stream, decoded as it arrives: each complete frame becomes
    ``{event type: JSON payload}``. Without botocore nothing is decoded (the call is then
    charged as a stream whose usage never came)."""

    def __init__(self) -> None:
        try:
            from botocore.eventstream import EventStreamBuffer
        except ImportError:
            self._buffer: Any = None
        else:
            self._buffer = EventStreamBuffer()

    def feed(self, piece: bytes) -> Iterator[dict[str, Any]]:
        """The events ``piece`` completes. A frame botocore refuses (a checksum that does not
        match) ends the decoding: the caller still gets every byte, and the call, its usage
        never read, is charged as a stream whose usage never came."""
        if self._buffer is None or not piece:
            return
        self._buffer.add_data(piece)
        try:
            messages = list(self._buffer)
        except Exception:  # (botocore's ParserError and its kinds)
            self._buffer = None
            return
        for message in messages:
            headers = message.headers
            kind = headers.get(":event-type") or headers.get(":exception-type") or "error"
            try:
                payload = orjson.loads(message.payload) if message.payload else {}
            except orjson.JSONDecodeError:
                payload = {}
            yield {str(kind): payload}


def _blocks(content: object) -> list[dict[str, Any]]:
    """Converse content blocks as the Messages blocks they bill as (the measure's shapes)."""
    blocks: list[dict[str, Any]] = []
    for block in content if isinstance(content, list) else ():
        if not isinstance(block, dict):
            continue
        if isinstance(block.get("text"), str):
            blocks.append({"type": "text", "text": block["text"]})
        elif isinstance(block.get("image"), dict):
            data = get(get(block["image"], "source"), "bytes")
            source = {"type": "base64", "data": data} if isinstance(data, str) else None
            blocks.append({"type": "image", "source": source})
        elif isinstance(block.get("toolUse"), dict):
            use = block["toolUse"]
            blocks.append({"type": "tool_use", "name": use.get("name"), "input": use.get("input")})
        elif isinstance(block.get("toolResult"), dict):
            inner = block["toolResult"].get("content")
            blocks.append({"type": "tool_result", "content": _blocks(inner) or inner})
        elif "cachePoint" not in block:  # (documents, reasoning, JSON results: their text)
            blocks.append({"type": "other", **block})
    return blocks


def _as_messages(body: Mapping[str, Any]) -> dict[str, Any]:
    """A Converse request as the Messages request it bills as."""
    messages = body.get("messages")
    config = body.get("toolConfig")
    tools = get(config, "tools") if isinstance(config, dict) else None
    specs = [get(tool, "toolSpec") for tool in tools if isinstance(tool, dict)] if tools else []
    return {
        "system": _blocks(body.get("system")),
        "messages": [
            {"role": get(message, "role"), "content": _blocks(get(message, "content"))}
            for message in (messages if isinstance(messages, list) else ())
            if isinstance(message, dict)
        ],
        "tools": [spec for spec in specs if isinstance(spec, dict)],
    }


class ConverseAdapter(Adapter):
    """``converse`` / ``converse-stream``."""

    provider = PROVIDER

    def __init__(self, operation: str, *, streams: bool) -> None:
        super().__init__(operation)
        self.streams = streams

    def model_for(self, path: str, body: Mapping[str, Any]) -> str | None:
        return bedrock_model(path)

    def measure(
        self, body: Mapping[str, Any], model: str | None
    ) -> tuple[RequestSize, int | None, bool]:
        counter = None if model is None else tokenizer.COUNTERS[model]
        cap = first_int(get(body.get("inferenceConfig"), "maxTokens"))
        return measure_anthropic(_as_messages(body), counter), cap, self.streams

    def read_response(self, result: Any, tally: Tally) -> None:
        read = READERS[type(result)]
        _read_usage(read(result, "usage", None), tally)
        unreported = tally.tokens_out is None
        for block in get(get(read(result, "output", None), "message"), "content") or ():
            read_block = READERS[type(block)]
            use = read_block(block, "toolUse", None)
            if use is not None:
                tally.tool_calls += 1
            if unreported:
                text = read_block(block, "text", None)
                tally.receive(text if isinstance(text, str) else json_text(use or block))
        tally.complete = True

    def read_event(self, event: Any, tally: Tally, hide_usage: bool) -> bool:
        read = READERS[type(event)]
        delta = get(read(event, "contentBlockDelta", None), "delta")
        if delta is not None:
            tally.chunks += 1
            text = get(delta, "text")
            tally.chars += len(text) if isinstance(text, str) else len(json_text(delta))
        elif (start := read(event, "contentBlockStart", None)) is not None:
            if get(get(start, "start"), "toolUse") is not None:
                tally.tool_calls += 1
        elif (metadata := read(event, "metadata", None)) is not None:
            _read_usage(get(metadata, "usage"), tally)
            tally.complete = True
        return False


def _read_usage(usage: Any, tally: Tally) -> None:
    if usage is None:
        return
    uncached, cached, written, output = counts(usage, _USAGE)
    if uncached is not None:
        tally.cached, tally.cache_write = cached or 0, written or 0
        tally.tokens_in = uncached + tally.cached + tally.cache_write
    tally.tokens_out = output
    # The writes by time to live: a 1-hour write is billed at twice the input rate.
    hour = None
    for detail in get(usage, "cacheDetails") or ():
        (tokens,) = counts(detail, ("inputTokens",))
        if get(detail, "ttl") == "1h" and tokens is not None:
            hour = (hour or 0) + tokens
    tally.set_part("cache_write_1h_tokens", hour)


class InvokeAdapter(MessagesAdapter):
    """``invoke`` / ``invoke-with-response-stream`` with an Anthropic Messages body."""

    provider = PROVIDER

    def __init__(self, operation: str, *, streams: bool) -> None:
        super().__init__(operation)
        self.streams = streams

    def model_for(self, path: str, body: Mapping[str, Any]) -> str | None:
        # Only an Anthropic Messages body is read here (other vendors' go unread).
        return bedrock_model(path) if "anthropic_version" in body else None

    def measure(
        self, body: Mapping[str, Any], model: str | None
    ) -> tuple[RequestSize, int | None, bool]:
        size, cap, _ = super().measure(body, model)
        return size, cap, self.streams

    def read_event(self, event: Any, tally: Tally, hide_usage: bool) -> bool:
        chunk = get(event, "chunk")
        if chunk is None:  # a whole response, or an event boto3 already unwrapped
            return super().read_event(event, tally, hide_usage)
        data = get(chunk, "bytes")
        try:
            inner = orjson.loads(base64.b64decode(data, validate=True))
        except (TypeError, ValueError, binascii.Error, orjson.JSONDecodeError):
            return False
        return super().read_event(inner, tally, hide_usage)
