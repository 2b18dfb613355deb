"""The Anthropic Messages wire format and the ``anthropic`` SDK's instrumentation: its requests
are metered at the client's one door (:mod:`.sdk`): sync and async, plain, streamed, and the
``messages.stream`` helper, whose deferred request is checked when it is sent. Older SDKs (0.40)
build the helper's stream anew over that request's response, so their managers' ``__enter__``
/ ``__aenter__`` move the metering to the stream they hand out.

Anthropic reports cache tokens beside the input (``input_tokens`` counts only the uncached
part); they are normalised to the subset convention here: ``tokens_in = input_tokens +
cache_read_input_tokens + cache_creation_input_tokens``, with the cache reads as
``cached_tokens`` and the cache writes as ``cache_write_tokens``. Thinking tokens
(``output_tokens_details.thinking_tokens``) are the reasoning subset of the output. Billed
parts (:mod:`ampmeter.pricing.parts`): the 1-hour share of the cache writes
(``cache_creation.ephemeral_1h_input_tokens``, twice the input rate where the 5-minute one is
1.25 times) and the web searches the server ran (``server_tool_use.web_search_requests``).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Generator, Mapping
from types import ModuleType
from typing import Any

from ampmeter.integrations.adapter import MAX_TIER, STANDARD_TIERS, Adapter, Tally
from ampmeter.integrations.lifecycle import HELPER, settings
from ampmeter.integrations.patching import Patch, around
from ampmeter.integrations.streams import meter_rebuilt_stream
from ampmeter.integrations.wire import READERS, counts, get, text_of
from ampmeter.pricing.request_size import json_text

__all__ = ["instrument_anthropic", "is_instrumented", "uninstrument_anthropic"]

PROVIDER = "anthropic"
_TOOL_BLOCKS = frozenset({"tool_use", "server_tool_use"})
# Blocks of thinking, billed in full as output, sent summarized (Claude 4) or redacted.
_THINKING_BLOCKS = frozenset({"thinking", "redacted_thinking"})


class MessagesAdapter(Adapter):
    """``messages.create`` / ``parse`` / ``stream``."""

    provider = PROVIDER

    wire = "anthropic"

    def prompt_text(self, kwargs: Mapping[str, Any]) -> str:
        parts = [text_of(kwargs.get("system"))]  # an SDK's omit sentinel has no text
        messages = kwargs.get("messages")
        if isinstance(messages, (list, tuple)):
            parts.extend(text_of(get(m, "content")) for m in messages)
        return "\n".join(p for p in parts if p)

    def read_response(self, result: Any, tally: Tally) -> None:
        read = READERS[type(result)]
        tally.response_id = read(result, "id", None)
        _read_usage(read(result, "usage", None), tally)
        # No output count (a proxy's cut, a count no int): the output is counted from the text.
        unreported = tally.tokens_out is None
        for block in read(result, "content", None) or ():
            read_block = READERS[type(block)]
            kind = read_block(block, "type", None)
            if kind in _TOOL_BLOCKS:
                tally.tool_calls += 1
            elif kind in _THINKING_BLOCKS:
                tally.unseen = True
            elif kind == "text" and settings.capture_content:
                text = read_block(block, "text", None)
                if isinstance(text, str):
                    tally.keep_text(text)
            if unreported:
                tally.chars += _block_length(block, read_block)

    def read_event(self, event: Any, tally: Tally, hide_usage: bool) -> bool:
        read = READERS[type(event)]
        kind = read(event, "type", None)
        if kind == "message_start":
            message = read(event, "message", None)
            read_message = READERS[type(message)]
            tally.response_id = read_message(message, "id", None)
            _read_usage(read_message(message, "usage", None), tally)
            # Its output count is the output so far (a token), not the output: that comes
            # last, in message_delta. Until then it is only the least the stream wrote, so a
            # stream cut before that counts what it received.
            tally.chunks, tally.tokens_out = max(tally.chunks, tally.tokens_out or 0), None
        elif kind == "message_delta":
            _read_usage(read(event, "usage", None), tally)
            # The delta that gives the stop reason carries the final usage, and only
            # message_stop follows: LiteLLM's stream stops reading here, never to close it.
            if get(read(event, "delta", None), "stop_reason") is not None:
                tally.complete = True
        elif kind == "content_block_start":
            block = get(read(event, "content_block", None), "type")
            if block in _TOOL_BLOCKS:
                tally.tool_calls += 1
            elif block in _THINKING_BLOCKS:
                tally.unseen = True
        elif kind == "content_block_delta":
            tally.chunks += 1
            delta = read(event, "delta", None)
            read_delta = READERS[type(delta)]
            text = read_delta(delta, "text", None)
            if isinstance(text, str):
                tally.chars += len(text)
                if settings.capture_content:
                    tally.keep_text(text)
            else:
                for name in _DELTA_TEXTS:
                    written = read_delta(delta, name, None)
                    if isinstance(written, str):
                        tally.chars += len(written)
        elif kind == "message_stop":
            tally.complete = True
        return False


# The fields of a content delta other than ``text`` that carry what the model wrote.
_DELTA_TEXTS = ("partial_json", "thinking")


def _block_length(block: Any, read: Any) -> int:
    """The characters the model wrote in one content block (text, thinking, a tool's input)."""
    texts = (read(block, name, None) for name in ("text", "thinking", "name"))
    written = sum(len(text) for text in texts if isinstance(text, str))
    tool_input = read(block, "input", None)
    if tool_input is not None:
        written += len(json_text(tool_input))
    return written


_USAGE_COUNTS = (
    "input_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "output_tokens",
)
_THINKING = ("thinking_tokens",)


def _read_usage(usage: Any, tally: Tally) -> None:
    """Merge an Anthropic usage object (a full one, or a stream delta's partial one)."""
    if usage is None:
        return
    raw_in, reads, writes, out = counts(usage, _USAGE_COUNTS)
    if raw_in is not None:
        # Deltas repeat the input counts when they carry them; they are cumulative, not extra.
        tally.cached = reads if reads is not None else tally.cached
        tally.cache_write = writes if writes is not None else tally.cache_write
        tally.tokens_in = raw_in + tally.cached + tally.cache_write
    if out is not None:
        tally.tokens_out = out
    (thinking,) = counts(get(usage, "output_tokens_details"), _THINKING)
    if thinking is not None:
        tally.reasoning = thinking
    read = READERS[type(usage)]
    tier = read(usage, "service_tier", None)
    if tier.__class__ is str and tier not in STANDARD_TIERS:
        tally.service_tier = tier[:MAX_TIER]
    creation = read(usage, "cache_creation", None)
    if creation is not None:
        tally.set_part("cache_write_1h_tokens", *counts(creation, _ONE_HOUR))
    server = read(usage, "server_tool_use", None)
    if server is not None:
        tally.set_part("web_searches", *counts(server, _WEB_SEARCHES))


_ONE_HOUR = ("ephemeral_1h_input_tokens",)
_WEB_SEARCHES = ("web_search_requests",)


# These SDKs name no helper in their request's headers: the managers name theirs.


def _rebuilding(manager: Any, *, is_async: bool) -> Generator[None, Any, Any]:
    """Around a manager's ``__enter__`` / ``__aenter__``: the request it sends names the
    helper, and the stream it hands out is metered."""
    token = HELPER.set("stream")
    try:
        stream = yield
    finally:
        HELPER.reset(token)
    meter_rebuilt_stream(stream, is_async=is_async)
    return stream


def _patch_rebuilding_managers() -> list[Patch]:
    """Patch the stream helpers' managers of an SDK whose helper stream takes the response
    (it reads it through a stream of its own, not the one the request returned)."""
    try:
        from anthropic.lib import streaming
    except ImportError:  # an SDK without the helpers
        return []
    if "response" not in inspect.signature(streaming.MessageStream.__init__).parameters:
        return []
    sync, asynchronous = streaming.MessageStreamManager, streaming.AsyncMessageStreamManager
    enter = around(sync.__enter__, functools.partial(_rebuilding, is_async=False))
    aenter = around(asynchronous.__aenter__, functools.partial(_rebuilding, is_async=True))
    return [
        Patch.apply(sync, "__enter__", enter),
        Patch.apply(asynchronous, "__aenter__", aenter),
    ]


def instrument_anthropic(_module: ModuleType | None = None) -> bool:
    """Patch the installed ``anthropic`` SDK (idempotent); False if it is not installed."""
    from ampmeter.integrations import sdk  # (it reads this module's adapter)

    return sdk.instrument_sdk(PROVIDER, _patch_rebuilding_managers)


def uninstrument_anthropic() -> None:
    """Restore every patched ``anthropic`` attribute exactly (idempotent)."""
    from ampmeter.integrations import sdk

    sdk.uninstrument_sdk(PROVIDER)


def is_instrumented() -> bool:
    """Whether the ``anthropic`` SDK is currently patched."""
    from ampmeter.integrations import sdk

    return sdk.is_instrumented(PROVIDER)
