"""The Google Gemini wire format (``models/<model>:generateContent`` and
``:streamGenerateContent``), read at the HTTP layer (google-genai, LiteLLM's Gemini handler).

Gemini reports usage in ``usageMetadata``: ``promptTokenCount`` (cached content included, as
``cachedContentTokenCount``), ``toolUsePromptTokenCount`` (tool results fed back, billed as
input), ``candidatesTokenCount`` and ``thoughtsTokenCount`` (billed as output, reported beside
the candidates). In the subset convention: ``tokens_in = promptTokenCount +
toolUsePromptTokenCount`` with the cached tokens a subset, ``tokens_out = candidatesTokenCount +
thoughtsTokenCount`` with the thoughts as reasoning tokens. Each chunk of a stream carries the
usage so far; the last one is the total.

A thinking model's thoughts are billed as output but reported only in a stream's last chunk
(its ``includeThoughts`` parts are summaries, not every thought token): a stream cut before it
is charged as one whose output is unseen, the most the call could write (``maxOutputTokens``
caps thoughts and text together, where ``thinkingBudget`` is a hint models overrun). Gemini 2.5
and later models think unless ``thinkingBudget`` is 0; models before 2.5, Gemma and 2.5
Flash-Lite (unless given a budget) do not.

Billed parts (:mod:`ampmeter.pricing.parts`), as genai-prices reads them: the audio, image
(documents are billed as images) and video tokens of ``promptTokensDetails`` and
``toolUsePromptTokensDetails`` (input), ``cacheTokensDetails`` (cached input) and
``candidatesTokensDetails`` (output), each a list of ``{"modality", "tokenCount"}``; and the
web searches grounding ran, one per query in ``groundingMetadata.webSearchQueries`` (Gemini 3
bills per query; Gemini 2 per grounded prompt, which this reading never counts less than).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ampmeter.integrations.adapter import Adapter, Tally
from ampmeter.integrations.lifecycle import settings
from ampmeter.integrations.wire import READERS, counts, first_int, get
from ampmeter.pricing import request_size
from ampmeter.pricing.request_size import RequestSize, json_text

__all__ = ["PROVIDER", "EmbedContentAdapter", "GenerateContentAdapter", "model_of_path", "thinks"]

PROVIDER = "google"


def model_of_path(path: str) -> str | None:
    """The model named by a Gemini path (``.../models/gemini-2.0-flash:generateContent``)."""
    _, marker, model = path.rpartition(":")[0].rpartition("/models/")
    return model if marker and model else None


def _parts_text(content: Any) -> list[str]:
    texts = (get(part, "text") for part in get(content, "parts") or ())
    return [text for text in texts if isinstance(text, str) and text]


# Models that do not think (Gemini 2.5 Flash-Lite: unless given a thinking budget); any other
# model on this wire may, failing toward charging.
_NOT_THINKING = ("gemini-1.", "gemini-2.0-", "gemini-pro", "gemma-")
_THINKING_IF_ASKED = ("gemini-2.5-flash-lite",)


def thinks(body: Mapping[str, Any], model: str | None) -> bool:
    """Whether a ``generateContent`` request ``body`` sent to ``model`` makes it think."""
    config = body.get("generationConfig") or body.get("generation_config")
    thinking = get(config, "thinkingConfig") or get(config, "thinking_config")
    budget = first_int(get(thinking, "thinkingBudget"), get(thinking, "thinking_budget"))
    if budget is not None:
        return budget != 0  # -1: as the model decides; 0: off
    name = (model or "").rpartition("/")[2].lower()
    if name.startswith(_NOT_THINKING):
        return "thinking" in name  # gemini-2.0-flash-thinking-exp
    return not name.startswith(_THINKING_IF_ASKED)


_USAGE_COUNTS = (
    "promptTokenCount",
    "toolUsePromptTokenCount",
    "cachedContentTokenCount",
    "candidatesTokenCount",
    "thoughtsTokenCount",
)


class GenerateContentAdapter(Adapter):
    """``generateContent`` and ``streamGenerateContent`` request and response bodies."""

    provider = PROVIDER

    wire = "gemini"

    def measure(
        self, body: Mapping[str, Any], model: str | None
    ) -> tuple[RequestSize, int | None, bool]:
        config = body.get("generationConfig") or body.get("generation_config")
        max_tokens = first_int(get(config, "maxOutputTokens"))
        stream = self.operation == "streamGenerateContent"
        return request_size.measure(self.wire, body), max_tokens, stream

    def model_for(self, path: str, body: Mapping[str, Any]) -> str | None:
        return model_of_path(path) or super().model_for(path, body)

    def prompt_text(self, kwargs: Mapping[str, Any]) -> str:
        system = kwargs.get("systemInstruction") or kwargs.get("system_instruction")
        contents = kwargs.get("contents")
        contents = contents if isinstance(contents, (list, tuple)) else ()
        return "\n".join(text for content in (system, *contents) for text in _parts_text(content))

    def read_response(self, result: Any, tally: Tally) -> None:
        self.read_event(result, tally, False)

    def read_event(self, event: Any, tally: Tally, hide_usage: bool) -> bool:
        read = READERS[type(event)]
        if tally.response_id is None:
            tally.response_id = read(event, "responseId", None)
        usage = read(event, "usageMetadata", None)
        if usage is not None:
            prompt, tool_prompt, cached, candidates, thoughts = counts(usage, _USAGE_COUNTS)
            if prompt is not None:
                tally.tokens_in = prompt + (tool_prompt or 0)
                tally.cached = cached or 0
            if candidates is not None or thoughts:
                tally.tokens_out = (candidates or 0) + (thoughts or 0)
                tally.reasoning = thoughts or 0
            read_usage = READERS[type(usage)]
            for fields, names in _MODALITY_PARTS:
                lists = [read_usage(usage, field, None) for field in fields]
                if any(lists):
                    _read_modalities(lists, names, tally)
        if usage is not None and get(read(event, "promptFeedback", None), "blockReason"):
            tally.complete = True  # the prompt was blocked: nothing more comes
        searches: int | None = None
        for candidate in read(event, "candidates", None) or ():
            read_candidate = READERS[type(candidate)]
            queries = get(read_candidate(candidate, "groundingMetadata", None), "webSearchQueries")
            if isinstance(queries, list):
                searches = (searches or 0) + len(queries)
            if usage is not None and read_candidate(candidate, "finishReason", None):
                tally.complete = True  # the last chunk: why generation stopped, the final usage
            for part in get(read_candidate(candidate, "content", None), "parts") or ():
                read_part = READERS[type(part)]
                function = read_part(part, "functionCall", None)
                if function is not None:
                    tally.tool_calls += 1
                    tally.chars += len(json_text(function))  # written by the model: output
                text = read_part(part, "text", None)
                if isinstance(text, str) and text:
                    tally.chunks += 1
                    tally.chars += len(text)
                    if settings.capture_content and not read_part(part, "thought", None):
                        tally.keep_text(text)
        tally.set_part("web_searches", searches)
        return False

    def hides_output(self, body: Mapping[str, Any], model: str | None) -> bool:
        return thinks(body, model)


class EmbedContentAdapter(Adapter):
    """``embedContent`` and ``batchEmbedContents`` (google-genai's ``models.embed_content``):
    an ``embedding`` node. The Gemini API's answers report no usage: the input is charged as
    measured (``cost_status`` ``"estimated"``), at the model's table rate; a ``usageMetadata``
    (Vertex AI's) gives the count. Each request's content and title are billed input."""

    provider = PROVIDER
    kind = "embedding"
    wire = "gemini"

    def model_for(self, path: str, body: Mapping[str, Any]) -> str | None:
        # (The body names it "models/<model>": the path's is the name.)
        return model_of_path(path) or super().model_for(path, body)

    def measure(
        self, body: Mapping[str, Any], model: str | None
    ) -> tuple[RequestSize, int | None, bool]:
        requests = body.get("requests")
        requests = requests if isinstance(requests, list) else [body]
        contents: list[Any] = []
        for request in requests:
            if isinstance(request, Mapping):
                contents.append(request.get("content"))
                title = request.get("title")
                if isinstance(title, str) and title:
                    contents.append({"parts": [{"text": title}]})
        # Measured as generateContent contents; it writes nothing: a cap of 0.
        return request_size.measure(self.wire, {"contents": contents, "model": model}), 0, False

    def prompt_text(self, kwargs: Mapping[str, Any]) -> str:
        requests = kwargs.get("requests")
        requests = requests if isinstance(requests, list) else [kwargs]
        return "\n".join(text for r in requests for text in _parts_text(get(r, "content")))

    def read_response(self, result: Any, tally: Tally) -> None:
        (prompt,) = counts(get(result, "usageMetadata"), ("promptTokenCount",))
        if prompt is not None:
            tally.tokens_in, tally.tokens_out = prompt, 0

    def read_event(self, event: Any, tally: Tally, hide_usage: bool) -> bool:
        self.read_response(event, tally)
        return False


# The usage fields that break tokens down by modality, and the billed parts their audio,
# image and video tokens are (the prompt's and the tool results' are both input).
_MODALITY_PARTS = (
    (
        ("promptTokensDetails", "toolUsePromptTokensDetails"),
        ("input_audio_tokens", "input_image_tokens", "input_video_tokens"),
    ),
    (
        ("cacheTokensDetails",),
        ("cache_audio_read_tokens", "cache_image_read_tokens", "cache_video_read_tokens"),
    ),
    (
        ("candidatesTokensDetails",),
        ("output_audio_tokens", "output_image_tokens", "output_video_tokens"),
    ),
)
_MODALITIES = {"AUDIO": 0, "IMAGE": 1, "DOCUMENT": 1, "VIDEO": 2}
_TOKEN_COUNT = ("tokenCount",)


def _read_modalities(lists: list[Any], names: tuple[str, str, str], tally: Tally) -> None:
    """Set the parts ``names`` (audio, image, video) from lists of modality counts."""
    found = [0, 0, 0]
    for details in lists:
        for entry in details if isinstance(details, list) else ():
            modality = get(entry, "modality")
            at = _MODALITIES.get(modality) if isinstance(modality, str) else None
            (count,) = counts(entry, _TOKEN_COUNT)
            if at is not None and count is not None:
                found[at] += count
    for name, count in zip(names, found, strict=True):
        tally.set_part(name, count or None)
