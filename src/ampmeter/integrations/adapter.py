"""The request model an SDK or wire-format module describes its requests with.

An :class:`Adapter` says what a request asks for (:meth:`Adapter.measure`) and how to read
usage from a whole response or from one stream event into a :class:`Tally`; the lifecycle, the
SDK door, streams and HTTP layers do the rest the same way for every wire format.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

from ampmeter._validate import MAX_COUNT
from ampmeter.pricing import request_size, tokenizer
from ampmeter.pricing.parts import fit_parts
from ampmeter.pricing.request_size import RequestSize, Wire

__all__ = [
    "MAX_RESPONSE_ID",
    "MAX_TIER",
    "META_USAGE_CLAMPED",
    "STANDARD_TIERS",
    "Adapter",
    "Tally",
]

MAX_RESPONSE_ID: Final = 256  # longer ids are no provider's: ignored, never stored or shared
META_USAGE_CLAMPED: Final = "usage_clamped"  # a reported count was outside 0..2**53
# The service tiers a response reports that the price table's rates are for; any other (OpenAI
# priority or flex, Anthropic priority or batch) is noted on the node (Tally.service_tier).
STANDARD_TIERS: Final = frozenset({"default", "standard", "auto"})
MAX_TIER: Final = 32  # a longer tier name is no provider's: kept cut to this


class Tally:
    """Usage seen so far in one response (or stream), in the subset convention: ``tokens_in``
    includes cache reads and writes, ``tokens_out`` reasoning tokens. The token counts are the
    provider's, each an int or None (the readers of :mod:`.wire` make them so), checked where
    they are recorded (:func:`.lifecycle.finish_call`); the other counts are what the adapter
    saw itself. A tally starts empty (every field the class's value): an adapter sets only what
    the response reports, and a list or set is made only when something goes in it.
    """

    tokens_in: int | None = None
    tokens_out: int | None = None
    cached: int = 0
    cache_write: int = 0
    reasoning: int = 0
    tool_calls: int = 0
    chunks: int = 0  # events that carried generated content (a cut stream's output estimate)
    # Characters of generated text and tool arguments: only where the provider may not report
    # usage (in streams, and in a whole response without it).
    chars: int = 0
    received: list[str] | None = None  # that text, from a whole response without usage
    estimated: bool = False  # some counts are ampmeter's estimate: the provider reported none
    # The response wrote output it does not send (reasoning): what was received is not all of
    # it, so output it did not report is estimated at the most the call could write.
    unseen: bool = False
    text: list[str] | None = None  # the response's text (with capture_content)
    tool_keys: set[tuple[int, int]] | None = None  # (choice, tool) indexes of streamed tool calls
    # The provider's id of the response as read (a stream's first), checked when the call ends:
    # the node's ``response_id``, an idempotency key only through :meth:`gateway_key`.
    response_id: object = None
    complete: bool = False  # the stream's last event was read (callers often stop there)
    # Attempts the SDK sent, got no answer to (a read timeout) and retried: each may be billed.
    unanswered: int = 0
    # Billed parts the response reports (1-hour cache writes, audio, server tool uses: see
    # ampmeter.pricing.parts), by name; None until one is read.
    parts: dict[str, int] | None = None
    # The service tier the response reports when it is not a standard one (STANDARD_TIERS):
    # the table has no prices for it, so the node says the call was priced at standard rates.
    service_tier: str | None = None

    def set_part(self, name: str, count: int | None) -> None:
        """Note the count of the billed part ``name`` the response reports (None: it reports
        none); a later report (a stream's final usage) replaces an earlier one."""
        if count is not None:
            if self.parts is None:
                self.parts = {}
            self.parts[name] = count

    def receive(self, text: str) -> None:
        """Count the output text of a whole response that reported no usage (kept, so that
        the offline tokenizer can count it where it knows the model)."""
        if text:
            self.chars += len(text)
            if self.received is None:
                self.received = [text]
            else:
                self.received.append(text)

    def fit(self) -> bool:
        """Fit counts ``Call.record`` refused to what the accounting holds: totals to 0..2**53
        (True: one was outside), negative details to 0, details cut to their totals."""
        t_in, t_out = self.tokens_in or 0, self.tokens_out or 0
        clamped = not (0 <= t_in <= MAX_COUNT and 0 <= t_out <= MAX_COUNT)
        self.tokens_in = t_in = min(max(t_in, 0), MAX_COUNT)
        self.tokens_out = t_out = min(max(t_out, 0), MAX_COUNT)
        self.cached = min(max(self.cached, 0), t_in)
        self.cache_write = min(max(self.cache_write, 0), t_in - self.cached)
        self.reasoning = min(max(self.reasoning, 0), t_out)
        self.tool_calls = min(max(self.tool_calls, 0), MAX_COUNT)
        if self.parts:
            parts = {name: min(max(count, 0), MAX_COUNT) for name, count in self.parts.items()}
            fit_parts(parts, (t_in, t_out, self.cached, self.cache_write, self.reasoning, 0))
            self.parts = parts
        return clamped

    def gateway_key(self, response_key: str, endpoint: str) -> str:
        """The idempotency key of this response under ``instrument(response_id_keys=True)``:
        its id (``response_key``, ``"<provider>:<id>"``), the ``endpoint`` it came from (the SDK
        operation) and every count it reports. A caching gateway that delivers one stored
        response again repeats all of them; a server that only repeats ids (a mock, Ollama's
        ``chatcmpl-<0..998>``) does not, and each of its answers with other usage, or from
        another endpoint, is another call."""
        return (
            f"{response_key} {endpoint} in={self.tokens_in} out={self.tokens_out} "
            f"cached={self.cached} written={self.cache_write} reasoning={self.reasoning}"
        )

    def keep_text(self, text: str) -> None:
        """Keep a piece of the response's text (with ``instrument(capture_content=True)``)."""
        if self.text is None:
            self.text = [text]
        else:
            self.text.append(text)


class Adapter:
    """One SDK operation's wire format. Provider modules subclass it."""

    provider: str = ""
    operation: str = ""
    kind: Literal["llm", "embedding"] = "llm"  # the node kind (embedding: an embeddings endpoint)
    wire: Wire = "chat"  # the wire format its requests are measured in
    max_tokens_fields: tuple[str, ...] = ("max_tokens",)  # where a request caps its output

    def __init__(self, operation: str, sdk_method: str = "create") -> None:
        self.operation = operation
        # The SDK method a request on this route comes from when no helper names another.
        self.sdk_method = sdk_method

    def measure(
        self, body: Mapping[str, Any], model: str | None
    ) -> tuple[RequestSize, int | None, bool]:
        """What a request's ``body`` for ``model`` asks for: its measure, everything it sends
        that is billed as input (:func:`ampmeter.pricing.request_size.measure`), its output cap
        (the first of :attr:`max_tokens_fields` given as an int, else None) and whether it
        streams."""
        counter = None if model is None else tokenizer.COUNTERS[model]
        for field in self.max_tokens_fields:
            cap = body.get(field)
            if isinstance(cap, int) and not isinstance(cap, bool):  # (no bool, no SDK sentinel)
                break
        else:
            cap = None
        return request_size.MEASURES[self.wire](body, counter), cap, body.get("stream") is True

    def model_for(self, path: str, body: Mapping[str, Any]) -> str | None:
        """The model a request to ``path`` with ``body`` is for: the body's ``model`` here
        (Gemini and Bedrock name it in the path; an API may have a default); None: not a model
        call this adapter reads."""
        model = body.get("model")
        return model if isinstance(model, str) else None

    def prompt_text(self, kwargs: Mapping[str, Any]) -> str:
        """The request's text, kept on the node with ``instrument(capture_content=True)``."""
        return ""

    def prepare_stream(self, kwargs: dict[str, Any]) -> bool:
        """Adjust a streaming request in place; True if the usage event must be hidden."""
        return False

    def hides_output(self, body: Mapping[str, Any], model: str | None) -> bool:
        """Whether the response to ``body`` sent to ``model`` may write output it never sends
        although nothing in the response says so before its usage report (a thinking model's
        thoughts): asked only of a stream cut before that report, charged then as one whose
        output is unseen (:attr:`Tally.unseen`)."""
        return False

    def read_response(self, result: Any, tally: Tally) -> None:
        """Read usage (and, if captured, text) from a complete response."""
        raise NotImplementedError

    def read_event(self, event: Any, tally: Tally, hide_usage: bool) -> bool:
        """Read one stream event (the last one sets ``tally.complete``); True if the caller must
        not see it."""
        raise NotImplementedError
