"""A loopback provider that bills every request the way a real one does.

A :class:`BillingProvider` answers OpenAI's Chat Completions and Responses (stored
conversations: :mod:`.billing_responses`) and Anthropic's Messages, plain and streamed, and
bills each request's input from *everything* in it, not only the message text: every message's
text and content parts in every role (Anthropic's ``system`` too), names, tool calls and tool
results; every tool definition and the ``response_format`` / ``output_format`` as compact JSON;
``media_tokens`` per image, audio or file part; and framing tokens per message, per request and
(``tool_framing``) once for a request that defines tools, as Anthropic's tool-use system prompt
is. Billed text is counted at ``chars_per_token`` characters a token, rounded up (or by a
tokenizer given as ``text_tokens``). The answer is ``output_tokens`` tokens, or ``max_tokens``
when fewer (then ``finish_reason="length"`` / ``stop_reason="max_tokens"``). A stream reports
usage as the provider's does: Anthropic always, OpenAI only with ``stream_options:
{"include_usage": true}`` (it is billed either way).

Every billed request is kept as a :class:`BilledCall`, so a test can compare what the provider
billed with what ampmeter recorded::

    with BillingProvider(chars_per_token=2.5, prices={"gpt-4o-mini": ("0.15", "0.60")}) as bill:
        client = openai.OpenAI(base_url=bill.openai_base_url, api_key="k")
        ...
        assert ctx.stats.total_cost() == bill.billed_usd

It is a :class:`~ampmeter.testing.ReplayServer`: scripted responses (a 429, a cut stream) are
answered first, and only what is left is billed. A request the provider would reject (no model,
messages not a list, Anthropic without ``max_tokens``) gets a 400 in its error shape, unbilled.
"""

from __future__ import annotations

import itertools
import math
import random
import threading
from collections.abc import Callable, Mapping
from decimal import Decimal
from fractions import Fraction
from typing import Any, Final

from ampmeter import _validate, money
from ampmeter.testing.billing_responses import (
    StoredConversations,
    conversations_answer,
    responses_answer,
    responses_parts,
)
from ampmeter.testing.billing_wires import (
    BilledCall,
    BillingWire,
    answer_pieces,
    anthropic_answer,
    billed_parts,
    chat_answer,
    error_answer,
    max_tokens,
)
from ampmeter.testing.replay import RecordedRequest, ReplayResponse, ReplayServer

__all__ = ["BilledCall", "BillingProvider", "BillingWire"]

_ROUTES: Final[Mapping[str, BillingWire]] = {
    "/v1/chat/completions": "chat",
    "/v1/messages": "anthropic",
    "/v1/responses": "responses",
}
_PER_MILLION: Final = Decimal(1_000_000)


class BillingProvider(ReplayServer):
    """A loopback OpenAI and Anthropic provider that bills like a real one (see the module).

    Args:
        chars_per_token: characters of billed text per input token (4 for English prose on
            current tokenizers; 2.5 for code, JSON or non-English text).
        output_tokens: length of every answer, in tokens, before ``max_tokens`` caps it.
        message_framing: tokens billed per message, on top of its text.
        request_framing: tokens billed once per request.
        tool_framing: tokens billed once for a request that defines tools.
        media_tokens: tokens billed per image, audio or file part.
        prices: USD per million input and output tokens per model name, as ``(input,
            output)`` (Decimal, str, int or float, read as written), for :attr:`billed_usd`.
        delay_s: seconds each billed answer waits before it is sent (the provider's time).
        strip_usage: answer without usage, as a proxy that strips it does: ``usage`` is null
            in a whole answer and absent from every event of a stream (the request is billed
            all the same).
        id_pool: how many response ids to draw from, at random (None: every answer has an id
            of its own, as from a real provider). 1 answers every request with the same id,
            as gateways and mock servers do; 999 is Ollama's ``chatcmpl-<0..998>``. Scripted
            responses then keep their recorded ids too.
        answer: the text of every answer (None: ``output_tokens`` words); its length in
            tokens is still ``output_tokens`` (or ``max_tokens`` when fewer), as billed. A
            stream sends it in that many pieces.
        text_tokens: counts the tokens of a piece of billed text, as a provider's own
            tokenizer does (each message's text, each tool's JSON, on its own); None: all
            billed text together at ``chars_per_token``.
        host: address to bind (loopback by default).
        port: TCP port; 0 picks a free one.
    """

    def __init__(
        self,
        *,
        chars_per_token: float = 4.0,
        output_tokens: int = 16,
        message_framing: int = 3,
        request_framing: int = 3,
        tool_framing: int = 0,
        media_tokens: int = 85,
        prices: Mapping[str, tuple[object, object]] | None = None,
        delay_s: float = 0.0,
        strip_usage: bool = False,
        id_pool: int | None = None,
        answer: str | None = None,
        text_tokens: Callable[[str], int] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        if not _validate.amount(chars_per_token, "chars_per_token"):
            raise ValueError("chars_per_token must be more than 0, got 0")
        for name, value in (
            ("output_tokens", output_tokens),
            ("message_framing", message_framing),
            ("request_framing", request_framing),
            ("tool_framing", tool_framing),
            ("media_tokens", media_tokens),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        _validate.amount(delay_s, "delay_s")
        if text_tokens is not None and not callable(text_tokens):
            raise TypeError(f"text_tokens must be callable or None, got {text_tokens!r}")
        if answer is not None and not isinstance(answer, str):
            raise TypeError(f"answer must be a str or None, got {type(answer).__name__}")
        if id_pool is not None and (
            isinstance(id_pool, bool) or not isinstance(id_pool, int) or id_pool < 1
        ):
            raise ValueError(f"id_pool must be an int >= 1 or None, got {id_pool!r}")
        # Repeated ids are sent as they are (scripted responses too: their recorded ids).
        super().__init__(host, port, fallback=self._answer, verbatim_ids=id_pool is not None)
        # Read as written, so 2.5 characters a token divides exactly.
        self.chars_per_token = Fraction(repr(float(chars_per_token)))
        self.output_tokens = output_tokens
        self.message_framing = message_framing
        self.request_framing = request_framing
        self.tool_framing = tool_framing
        self.media_tokens = media_tokens
        self.delay_s = float(delay_s)
        self.strip_usage = bool(strip_usage)
        self.answer = answer
        self.text_tokens = text_tokens
        self._prices = {
            model: (
                money.usd(pair[0], f"prices[{model!r}] input"),
                money.usd(pair[1], f"prices[{model!r}] output"),
            )
            for model, pair in (prices or {}).items()
        }
        self._billed: list[BilledCall] = []
        self._stored = StoredConversations()
        self._billed_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._id_pool = id_pool
        self._id_draws = random.Random(id_pool)  # (seeded: a run's ids are the same each time)
        self._in_flight = 0
        self._peak = 0

    # --- what was billed ---------------------------------------------------------------------

    @property
    def calls(self) -> list[BilledCall]:
        """A copy of the billed calls so far, in the order they were answered."""
        with self._billed_lock:
            return list(self._billed)

    @property
    def peak_in_flight(self) -> int:
        """The most billed requests the provider was working on at once (each takes
        ``delay_s``): how many calls really ran together."""
        with self._billed_lock:
            return self._peak

    @property
    def billed_input_tokens(self) -> int:
        """Input tokens billed so far."""
        return sum(call.input_tokens for call in self.calls)

    @property
    def billed_output_tokens(self) -> int:
        """Output tokens billed so far."""
        return sum(call.output_tokens for call in self.calls)

    @property
    def billed_usd(self) -> Decimal:
        """Dollars billed so far, exactly. ``ValueError`` if a billed model has no price."""
        total = Decimal(0)
        for call in self.calls:
            if call.cost_usd is None:
                raise ValueError(
                    f"the provider has no price for model {call.model!r}; pass it in prices="
                )
            total += call.cost_usd
        return total

    def input_tokens(self, wire: BillingWire, body: Mapping[str, Any]) -> int:
        """The input tokens this provider bills for ``body`` sent on ``wire``.

        A Responses request is also billed the stored conversation it continues. Raises
        ``ValueError`` for a body the provider would reject.
        """
        stored = 0
        if wire == "responses":
            texts, messages, media, tools = responses_parts(body)
            stored = self._stored.billed_for(body)
        else:
            texts, messages, media, tools = billed_parts(wire, body)
        if self.text_tokens is None:
            text = math.ceil(sum(map(len, texts)) / self.chars_per_token)
        else:
            text = sum(map(self.text_tokens, texts))
        return (
            stored
            + text
            + messages * self.message_framing
            + self.request_framing
            + media * self.media_tokens
            + (self.tool_framing if tools else 0)
        )

    def _items_tokens(self, items: list[Any]) -> int:
        return self.input_tokens("responses", {"input": items}) - self.request_framing

    # --- answering ---------------------------------------------------------------------------

    def _answer(self, request: RecordedRequest) -> ReplayResponse:
        wire = _ROUTES.get(request.path) if request.method == "POST" else None
        if wire is None and request.path.startswith("/v1/conversations"):
            return conversations_answer(request, self._stored, self._items_tokens)
        if wire is None:
            return error_answer(
                "chat", 404, f"billing provider: no route {request.method} {request.path}"
            )
        try:
            body = request.json()
            if not isinstance(body, dict):
                raise ValueError("the request body must be a JSON object")
            model = body.get("model")
            if not isinstance(model, str) or not model:
                raise ValueError("model must be a non-empty string")
            tokens_in = self.input_tokens(wire, body)
            tokens_out = min(self.output_tokens, max_tokens(wire, body))
        except ValueError as error:
            return error_answer(wire, 400, str(error))
        stream = body.get("stream") is True
        options = body.get("stream_options")
        told = not self.strip_usage and (
            not stream
            or wire != "chat"  # only Chat Completions streams report usage on request
            or (isinstance(options, dict) and options.get("include_usage") is True)
        )
        call = BilledCall(
            wire,
            model,
            stream,
            tokens_in,
            tokens_out,
            told,
            self._cost(model, tokens_in, tokens_out),
        )
        with self._billed_lock:
            self._billed.append(call)
            self._in_flight += 1
            self._peak = max(self._peak, self._in_flight)
            pool = self._id_pool
            number = next(self._ids) if pool is None else self._id_draws.randrange(pool)
        try:
            if self.delay_s and self.wait(self.delay_s):
                raise ConnectionAbortedError("the provider stopped before it answered")
        finally:
            with self._billed_lock:
                self._in_flight -= 1
        capped = tokens_out < self.output_tokens
        pieces = answer_pieces(self.answer, call.output_tokens)
        if wire == "chat":
            return chat_answer(call, number, capped, pieces)
        if wire == "responses":
            response_id = f"resp_bill{number:06d}"
            self._stored.keep(body, response_id, tokens_in + tokens_out)
            return responses_answer(call, response_id, body, capped)
        return anthropic_answer(call, number, capped, pieces)

    def _cost(self, model: str, tokens_in: int, tokens_out: int) -> Decimal | None:
        rates = self._prices.get(model)
        if rates is None:
            return None
        return (tokens_in * rates[0] + tokens_out * rates[1]) / _PER_MILLION
