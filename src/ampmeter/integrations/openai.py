"""OpenAI wire formats (Chat Completions, Responses, embeddings, legacy completions) and the
``openai`` SDK's instrumentation: its requests are metered at the client's one door
(:mod:`.sdk`), so clients made before and after :func:`instrument_openai` are covered, sync and
async, plain, streamed, through the helpers and the raw-response wrappers alike.

Streamed Chat Completions get ``stream_options={"include_usage": True}`` unless the caller set
``include_usage`` (to false: the call is then charged an estimate, see :mod:`.unreported`);
the extra usage-only chunk this makes the server send is consumed here and not shown to the
caller, so the caller sees the same chunks as without ampmeter.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import Any, Final

from ampmeter._validate import MAX_COUNT
from ampmeter.integrations import gemini
from ampmeter.integrations.adapter import MAX_TIER, STANDARD_TIERS, Adapter, Tally
from ampmeter.integrations.lifecycle import settings
from ampmeter.integrations.wire import READERS, counts, first_int, get, ints, text_of
from ampmeter.pricing import request_size, stored_state, tokenizer
from ampmeter.pricing.request_size import RequestSize

__all__ = ["instrument_openai", "is_instrumented", "uninstrument_openai"]

PROVIDER = "openai"


def _joined_text(value: object) -> str:
    """A string, or the strings of a list, joined by line breaks."""
    if isinstance(value, (list, tuple)):
        return "\n".join(p for p in value if isinstance(p, str))
    return value if isinstance(value, str) else ""


class ChatAdapter(Adapter):
    """``chat.completions.create`` / ``parse``."""

    provider = PROVIDER

    max_tokens_fields: tuple[str, ...] = ("max_completion_tokens", "max_tokens")

    def prompt_text(self, kwargs: Mapping[str, Any]) -> str:
        messages = kwargs.get("messages")
        if not isinstance(messages, (list, tuple)):
            return ""
        return "\n".join([text_of(get(m, "content")) for m in messages])

    def prepare_stream(self, kwargs: dict[str, Any]) -> bool:
        # Usage is asked for unless the caller said whether they want it (a stream without
        # it is charged an estimate); stream_options of null is no options (bodies hold dicts).
        options = kwargs.get("stream_options")
        if isinstance(options, dict):
            if options.get("include_usage") is not None:
                return False
            kwargs["stream_options"] = {**options, "include_usage": True}
            return True
        kwargs["stream_options"] = {"include_usage": True}
        return True

    def hides_output(self, body: Mapping[str, Any], model: str | None) -> bool:
        return reasons(body, model)

    def read_response(self, result: Any, tally: Tally) -> None:
        read = READERS[type(result)]
        tally.response_id = read(result, "id", None)
        usage = read(result, "usage", None)
        if usage is not None:
            _read_usage(usage, _CHAT_USAGE, tally)
        tier = read(result, "service_tier", None)
        if tier.__class__ is str and tier not in STANDARD_TIERS:
            tally.service_tier = tier[:MAX_TIER]
        capture = settings.capture_content
        # No output count (a proxy's cut, a count no int): the output is counted from the text.
        unreported = tally.tokens_out is None
        for choice in read(result, "choices", None) or ():
            message = READERS[type(choice)](choice, "message", None)
            read_message = READERS[type(message)]
            tools = read_message(message, "tool_calls", None)
            if isinstance(tools, list):  # a hostile body's number or text is no list of calls
                tally.tool_calls += len(tools)
            function = read_message(message, "function_call", None)
            if function is not None:
                tally.tool_calls += 1
            if capture or unreported:
                content = read_message(message, "content", None)
                if isinstance(content, str):
                    if capture:
                        tally.keep_text(content)
                    if unreported:
                        tally.receive(content)
            if unreported:
                for tool in [*(tools if isinstance(tools, list) else ()), {"function": function}]:
                    tally.receive(_arguments_text(get(tool, "function")))

    def read_event(self, event: Any, tally: Tally, hide_usage: bool) -> bool:
        """A chunk: its id, usage, and each choice's delta (a legacy completion's: its text)."""
        read = READERS[type(event)]
        if tally.response_id is None:
            tally.response_id = read(event, "id", None)
        usage = read(event, "usage", None)
        if usage is not None:
            _read_usage(usage, _CHAT_USAGE, tally)
            tier = read(event, "service_tier", None)  # (read once: with the usage)
            if tier.__class__ is str and tier not in STANDARD_TIERS:
                tally.service_tier = tier[:MAX_TIER]
        choices = read(event, "choices", None)
        if not choices:
            return hide_usage and usage is not None
        for choice in choices:
            read_choice = READERS[type(choice)]
            delta = read_choice(choice, "delta", None)
            if delta is None:
                text = read_choice(choice, "text", None)
            else:
                read_delta = READERS[type(delta)]
                tools = read_delta(delta, "tool_calls", None)
                if tools and isinstance(tools, list):
                    _count_tool_calls(read_choice(choice, "index", None), tools, tally)
                text = read_delta(delta, "content", None)
                if not text:  # reasoning some servers stream (DeepSeek, vLLM): output too
                    thought = _reasoning_of(delta)
                    if thought and isinstance(thought, str):
                        tally.chunks += 1
                        tally.chars += len(thought)
            if text and isinstance(text, str):
                tally.chunks += 1
                tally.chars += len(text)
                if settings.capture_content:
                    tally.keep_text(text)
        return False


def _reasoning_of(delta: Any) -> object:
    """The reasoning text a compatible server streams in a chunk's ``delta``
    (``reasoning_content``, or OpenRouter's ``reasoning``), from a JSON object, or from the
    fields of an SDK's model that it does not declare: read where pydantic keeps them, since a
    getattr that misses runs the model's ``__getattr__`` (see :data:`.wire.READERS`)."""
    fields = delta if isinstance(delta, dict) else getattr(delta, "__pydantic_extra__", None)
    if not isinstance(fields, dict):
        fields = getattr(delta, "__dict__", None)
        if not isinstance(fields, dict):
            return None
    return fields.get("reasoning_content") or fields.get("reasoning")


# Model families that reason before they answer: on Chat Completions their reasoning is
# billed as output and never sent (its count comes only in the usage chunk, last).
_REASONING: Final = ("o1", "o3", "o4", "gpt-5", "gpt-oss", "deepseek-reasoner", "deepseek-r1")


def reasons(body: Mapping[str, Any], model: str | None) -> bool:
    """Whether a Chat Completions request ``body`` sent to ``model`` may write reasoning it
    does not stream: it asks for a reasoning effort other than ``"none"``, or the model is of a
    reasoning family (:data:`_REASONING`; a chat variant does not reason), or a Gemini model
    that thinks (through Gemini's compatible API)."""
    effort = body.get("reasoning_effort")
    if isinstance(effort, str):
        return effort != "none"
    name = (model or "").rpartition("/")[2].lower()
    if name.startswith("gemini"):
        return gemini.thinks({}, name)
    return name.startswith(_REASONING) and "-chat" not in name


def _count_tool_calls(choice: object, tools: list[Any], tally: Tally) -> None:
    """Count the streamed tool calls not seen yet (a call's later deltas repeat its index; an
    index that is not an int, which no provider sends, reads as 0)."""
    keys = tally.tool_keys
    if keys is None:
        keys = tally.tool_keys = set()
    at = first_int(choice) or 0
    for tool in tools:
        key = (at, first_int(get(tool, "index")) or 0)
        if key not in keys:
            keys.add(key)
            tally.tool_calls += 1
        tally.chars += len(_arguments_text(get(tool, "function")))


def _arguments_text(function: object) -> str:
    """A tool call's name and arguments (output the model wrote), as far as they are text."""
    name, arguments = get(function, "name"), get(function, "arguments")
    return (name if isinstance(name, str) else "") + (
        arguments if isinstance(arguments, str) else ""
    )


# The names of an OpenAI usage report's parts: its input and output totals, and the details
# of each (cached and cache-write tokens of the input, reasoning tokens of the output).
_CHAT_USAGE = (
    "prompt_tokens",
    "completion_tokens",
    "prompt_tokens_details",
    "completion_tokens_details",
)
_RESPONSES_USAGE = (
    "input_tokens",
    "output_tokens",
    "input_tokens_details",
    "output_tokens_details",
)


def _read_usage(usage: Any, names: tuple[str, str, str, str], tally: Tally) -> None:
    """Read an OpenAI usage report (``names``: its parts, :data:`_CHAT_USAGE` or
    :data:`_RESPONSES_USAGE`) into ``tally``. The details are read with a reader of their
    own: an older SDK keeps them as a plain dict inside its model."""
    total_in, total_out, details_in, details_out = names
    read = READERS[type(usage)]
    inputs = read(usage, details_in, None)
    outputs = read(usage, details_out, None)
    read_inputs, read_outputs = READERS[type(inputs)], READERS[type(outputs)]
    tally.tokens_in, tally.tokens_out, cached, writes, reasoning, audio_in, audio_out = ints(
        read(usage, total_in, None),
        read(usage, total_out, None),
        read_inputs(inputs, "cached_tokens", None),
        read_inputs(inputs, "cache_write_tokens", None),
        read_outputs(outputs, "reasoning_tokens", None),
        read_inputs(inputs, "audio_tokens", None),
        read_outputs(outputs, "audio_tokens", None),
    )
    tally.cached = cached or 0
    tally.cache_write = writes or 0
    tally.reasoning = reasoning or 0
    if audio_in or audio_out:
        _read_audio(tally, audio_in, audio_out, read_inputs(inputs, "cached_tokens_details", None))


_AUDIO = ("audio_tokens",)


def _read_audio(
    tally: Tally, audio_in: int | None, audio_out: int | None, cached_details: object
) -> None:
    """Note a response's audio tokens, billed at audio rates (gpt-4o-audio, gpt-realtime).
    Chat Completions does not say how many of the cached tokens are audio; without that
    breakdown the cached tokens are taken as text as far as the counts allow, the dearer
    reading (a cached audio token's discount is deeper than a text one's in every price)."""
    tally.set_part("input_audio_tokens", audio_in)
    tally.set_part("output_audio_tokens", audio_out)
    (cached_audio,) = counts(cached_details, _AUDIO)
    if cached_audio is None and audio_in and tally.tokens_in is not None:
        uncached_room = tally.tokens_in - tally.cached - tally.cache_write
        cached_audio = max(audio_in - uncached_room, 0) or None
    tally.set_part("cache_audio_read_tokens", cached_audio)


class CompletionsAdapter(ChatAdapter):
    """The legacy ``completions`` endpoint: a ``prompt`` in, ``choices[].text`` out (read as
    :class:`ChatAdapter` reads a chunk)."""

    wire = "completions"

    max_tokens_fields = ("max_tokens",)

    def prompt_text(self, kwargs: Mapping[str, Any]) -> str:
        return _joined_text(kwargs.get("prompt"))

    def read_response(self, result: Any, tally: Tally) -> None:
        self.read_event(result, tally, False)  # a whole completion reads as one chunk


_PROMPT_TOKENS = ("prompt_tokens",)


class EmbeddingsAdapter(Adapter):
    """``embeddings``: the input's tokens are the whole usage (there is no output)."""

    provider = PROVIDER
    kind = "embedding"

    def measure(
        self, body: Mapping[str, Any], model: str | None
    ) -> tuple[RequestSize, int | None, bool]:
        # The input has a Completions prompt's shapes: text, texts, token ids or lists of them
        # (LangChain sends ids), the ids counted exactly. It writes nothing: a cap of 0.
        counter = None if model is None else tokenizer.COUNTERS[model]
        prompt = {"prompt": body.get("input")}
        return request_size.MEASURES["completions"](prompt, counter), 0, False

    def prompt_text(self, kwargs: Mapping[str, Any]) -> str:
        return _joined_text(kwargs.get("input"))

    def read_response(self, result: Any, tally: Tally) -> None:
        usage = get(result, "usage")
        if usage is not None:
            (tally.tokens_in,) = counts(usage, _PROMPT_TOKENS)
            tally.tokens_out = 0

    def read_event(self, event: Any, tally: Tally, hide_usage: bool) -> bool:
        self.read_response(event, tally)
        return False


_RESPONSE_ENDS = frozenset({"response.completed", "response.incomplete", "response.failed"})
# Events that carry output the model writes (their ``delta`` text).
_OUTPUT_DELTAS = frozenset(
    {
        "response.output_text.delta",
        "response.function_call_arguments.delta",
        "response.custom_tool_call_input.delta",
        "response.refusal.delta",
    }
)


# Output items of built-in tools billed per call, and the billed part each is.
_SEARCH_CALLS = {"web_search_call": "web_searches", "file_search_call": "storage_searches"}


class ResponsesAdapter(Adapter):
    """``responses.create`` / ``parse`` (and the ``responses.stream`` helper through create)."""

    provider = PROVIDER

    wire = "responses"

    max_tokens_fields = ("max_output_tokens",)

    def prompt_text(self, kwargs: Mapping[str, Any]) -> str:
        parts: list[str] = []
        instructions = kwargs.get("instructions")
        if isinstance(instructions, str):
            parts.append(instructions)
        given = kwargs.get("input")
        if isinstance(given, str):
            parts.append(given)
        elif isinstance(given, (list, tuple)):
            parts.extend(text_of(get(item, "content")) for item in given)
        return "\n".join(parts)

    def read_response(self, result: Any, tally: Tally) -> None:
        read = READERS[type(result)]
        response_id = read(result, "id", None)
        if tally.response_id is None:  # a stream's is its first (``response.created``)
            tally.response_id = response_id
        tier = read(result, "service_tier", None)
        if tier.__class__ is str and tier not in STANDARD_TIERS:
            tally.service_tier = tier[:MAX_TIER]
        usage = read(result, "usage", None)
        if usage is not None:
            _read_usage(usage, _RESPONSES_USAGE, tally)
            if tally.tokens_in is not None and tally.tokens_out is not None:
                # The state a request continuing this response (or its conversation) is
                # billed for: what this one read and wrote.
                conversation = read(result, "conversation", None)
                stored = min(max(tally.tokens_in, 0) + max(tally.tokens_out, 0), MAX_COUNT)
                stored_state.remember(response_id, conversation, stored)
        # No output count (a proxy's cut, a count no int): the output is counted from the
        # text, unless a stream's deltas counted it already.
        unreported = tally.tokens_out is None and not tally.chunks
        calls = 0
        texts: list[str] = []
        searches: dict[str, int] | None = None
        for item in read(result, "output", None) or ():
            read_item = READERS[type(item)]
            kind = read_item(item, "type", None)
            if isinstance(kind, str) and kind.endswith("_call"):
                calls += 1
                if unreported:
                    tally.receive(_arguments_text(item))
                part = _SEARCH_CALLS.get(kind)
                if part is not None:  # a built-in tool billed per call
                    searches = searches or {}
                    searches[part] = searches.get(part, 0) + 1
            elif kind == "reasoning":
                tally.unseen = True  # its tokens are output, and never all sent
            elif kind == "message":
                if settings.capture_content:
                    texts.append(text_of(read_item(item, "content", None)))
                if unreported:
                    tally.receive(text_of(read_item(item, "content", None)))
        tally.tool_calls = calls
        for part, count in (searches or {}).items():
            tally.set_part(part, count)
        if texts:
            tally.text = texts

    def read_event(self, event: Any, tally: Tally, hide_usage: bool) -> bool:
        read = READERS[type(event)]
        kind = read(event, "type", None)
        if kind in _RESPONSE_ENDS:
            self.read_response(read(event, "response", None), tally)
            tally.complete = True
        elif kind in _OUTPUT_DELTAS:
            tally.chunks += 1
            delta = read(event, "delta", None)
            if isinstance(delta, str):
                tally.chars += len(delta)
        elif kind == "response.created":  # the id, also for a stream cut before its end
            tally.response_id = get(read(event, "response", None), "id")
        elif kind == "response.output_item.added" and (
            get(read(event, "item", None), "type") == "reasoning"
        ):
            tally.unseen = True  # its tokens are output, and never all sent
        return False


def instrument_openai(_module: ModuleType | None = None) -> bool:
    """Patch the installed ``openai`` SDK (idempotent); False if it is not installed."""
    from ampmeter.integrations import sdk  # (it reads this module's adapters)

    return sdk.instrument_sdk(PROVIDER)


def uninstrument_openai() -> None:
    """Restore every patched ``openai`` attribute exactly (idempotent)."""
    from ampmeter.integrations import sdk

    sdk.uninstrument_sdk(PROVIDER)


def is_instrumented() -> bool:
    """Whether the ``openai`` SDK is currently patched."""
    from ampmeter.integrations import sdk

    return sdk.is_instrumented(PROVIDER)
