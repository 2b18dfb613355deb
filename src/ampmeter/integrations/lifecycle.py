"""The life of one metered request: its node begun and admitted, then ended with its usage.

Every layer (the SDKs' door, streams, raw responses, the HTTP and WebSocket layers) begins
a request's node with :func:`begin_call` before anything is sent (``LimitExceeded`` then stops
it) and ends it with :func:`finish_call`, or :func:`finish_abandoned` for a stream cut short.
:data:`ACTIVE_REQUEST` names the call whose request is running here, so that a lower layer leaves
alone a request an upper one already meters, and the SDK's retry path can count retries on it.
"""

from __future__ import annotations

import contextvars
import weakref
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from ampmeter import redact
from ampmeter.context import Call, ExecutionContext
from ampmeter.errors import LimitExceeded, StreamAbandoned, note_stop
from ampmeter.integrations.adapter import (
    MAX_RESPONSE_ID,
    META_USAGE_CLAMPED,
    Adapter,
    Tally,
)
from ampmeter.integrations.disclosure import META_BUDGET_NOTE, disclose
from ampmeter.integrations.proxy_mark import Marker
from ampmeter.integrations.unreported import (
    charge_unanswered_attempts,
    estimate_cut_stream,
    estimate_unreported,
)
from ampmeter.limits import ExceededLimit
from ampmeter.policies.step import Relief

__all__ = [
    "ACTIVE_REQUEST",
    "HELPER",
    "META_OPERATION",
    "META_PROMPT_TEXT",
    "META_RESPONSE_ID",
    "META_RESPONSE_TEXT",
    "META_SERVICE_TIER",
    "META_TRANSPORT",
    "META_USAGE_ESTIMATED",
    "Admitted",
    "Settings",
    "begin_call",
    "finish_abandoned",
    "finish_call",
    "relieve_pressure",
    "sent_unanswered",
    "settings",
]

META_OPERATION: Final = "operation_name"  # the SDK method, e.g. "chat.completions.create"
META_PROMPT_TEXT: Final = "prompt_text"  # only with instrument(capture_content=True)
META_RESPONSE_TEXT: Final = "response_text"  # only with instrument(capture_content=True)
META_USAGE_ESTIMATED: Final = "usage_estimated"  # a cut stream's usage, partly estimated
META_TRANSPORT: Final = "transport"  # how a request metered below the SDKs went: httpx, ...
META_RESPONSE_ID: Final = "response_id"  # the provider's id of the response ("<provider>:<id>")
META_SERVICE_TIER: Final = "service_tier"  # a tier the table does not price (priced as standard)


@dataclass(slots=True)
class Settings:
    """Process-wide integration settings (set by ``instrument()``)."""

    capture_content: bool = False
    response_id_keys: bool = False  # a caching gateway's response (id, endpoint, usage) is a key
    default_context: ExecutionContext | None = None
    warned_unmetered: bool = False  # the unmetered-call warning was shown (it is shown once)
    marker: Marker = field(default_factory=Marker)  # marks requests to `ampmeter run --proxy`


settings = Settings()

# The admitted request running in this thread or task: the SDK's retry path (which knows
# nothing about ampmeter) counts its retries on it, and the HTTP layer leaves alone a request
# that an SDK patch already meters.
ACTIVE_REQUEST: contextvars.ContextVar[Admitted | None] = contextvars.ContextVar(
    "ampmeter_active_request", default=None
)


# The helper an SDK's own hook says a request comes from, where its headers do not (see
# :mod:`.anthropic`): read by :mod:`.sdk`.
HELPER: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "ampmeter_sdk_helper", default=None
)


@dataclass(slots=True)
class Admitted:
    """One request let through (:func:`begin_call` made it) and the metering of its response,
    which ends its call once: with the usage read into its ``tally``, at the response's end or
    with the error reading it raised (:meth:`end`), or as abandoned when it is closed or
    dropped before (:meth:`abandon`).

    It knows how to read the response (its ``adapter``; ``stream``: it streams, read event by
    event through :meth:`read`) and the JSON ``body`` sent, changed to ask for a stream's usage
    event the caller must not see when ``hide`` says so. ``with admitted:`` around sending it
    makes it the active call meanwhile (:data:`ACTIVE_REQUEST`), and an error raised ends it
    failed: the credentials of the SDK ``client`` that sent it (None: sent below the SDKs) are
    scrubbed from then on (:mod:`ampmeter.redact`), as the error's text, which the node keeps,
    may echo them. ``raw``: an SDK's raw-response wrapper made it (see :mod:`.raw`).
    """

    call: Call
    adapter: Adapter
    stream: bool
    body: Mapping[str, Any]
    tally: Tally = field(default_factory=Tally)
    done: bool = False
    hide: bool = False
    raw: bool = False
    client: object = None
    _token: contextvars.Token[Admitted | None] | None = None
    # A stream's: the weak reference that abandons the call when the stream is dropped unread
    # (see :mod:`.streams`), and whether an event is being read (the reader itself then
    # settles what happens when the response closes).
    dropped: weakref.ref[Any] | None = None
    reading: bool = False
    # The first error a stream event's reader raised: the event goes on to the caller, later
    # events (the usage comes last) are still read, and the call ends failed with it.
    unread: Exception | None = None

    def __enter__(self) -> Call:
        self._token = ACTIVE_REQUEST.set(self)
        return self.call

    def __exit__(self, kind: object, exc: BaseException | None, traceback: object) -> None:
        if self._token is not None:
            ACTIVE_REQUEST.reset(self._token)
        if exc is not None and not self.done:
            redact.remember_client(self.client)
            self.fail(exc)

    def fail(self, exc: BaseException) -> None:
        """End the call failed with ``exc`` and no usage: nothing came back to read (the request
        raised, was not sent, or was answered with an error). One sent and never answered
        (:func:`sent_unanswered`) may have been billed: it is charged its estimate."""
        if self.done:
            return
        if sent_unanswered(exc):
            self.end(exc)
        elif self.tally.unanswered:  # this answer billed nothing; attempts before it may have
            self.tally.tokens_in = self.tally.tokens_out = 0
            self.end(exc)
        else:
            self.done = True
            finish_call(self.call, None, exc)

    def read_whole(self, result: Any) -> None:
        """End the call of a whole response (not a stream) with the usage read from it (once
        its request returned: nothing ended the call before).

        A body the reader cannot take (a provider's ``"choices": 5``) ends the call failed with
        that error, charged what was read (else its estimate, as a response without usage), and
        the caller still gets the response it paid for."""
        try:
            self.adapter.read_response(result, self.tally)
        except Exception as exc:
            self.end(exc)
            return
        self.done = True
        finish_call(self.call, self.tally, None)

    def end(self, exc: BaseException | None) -> None:
        """End the call with the usage read (``exc``: the error reading the response raised;
        one that cut a stream before its last event ends it as a cut stream). A stream that
        ended before its usage report, or a whole answer without usage, from a request whose
        output may be unseen (:meth:`.Adapter.hides_output`), is charged as one whose output
        is."""
        if not self.done:
            self.done = True
            if self.tally.complete:
                finish_call(self.call, self.tally, exc or self.unread)
            elif exc is not None:
                self._cut(exc)
            elif (self.stream or self.tally.tokens_in is None) and self.adapter.hides_output(
                self.body, self.call.model
            ):  # a stream before its usage report, or a whole answer without usage
                self.tally.unseen = True
                meta = None
                if self.stream and estimate_cut_stream(self.call, self.tally):
                    meta = {META_USAGE_ESTIMATED: True}
                finish_call(self.call, self.tally, self.unread, meta)
            else:
                finish_call(self.call, self.tally, self.unread)

    def abandon(self) -> None:
        """End the call of a response closed or dropped before its end."""
        if not self.done:
            self.done = True
            self._cut(None)

    def _cut(self, exc: BaseException | None) -> None:
        # Output the request may have written unseen (a thinking model's thoughts, reported
        # only in the usage the cut stream never delivered) is charged as unseen output.
        if self.adapter.hides_output(self.body, self.call.model):
            self.tally.unseen = True
        finish_abandoned(self.call, self.tally, exc)

    def response_closed(self) -> None:
        """The stream's response was closed: abandoned, unless the stream is ending it itself."""
        if not self.reading:
            self.abandon()

    def read(self, event: Any) -> bool:
        """Read one stream event; True if the caller must not see it. An event the reader cannot
        take (a provider's ``"choices": 5``) is passed on unread, and noted (``unread``)."""
        try:
            hidden = self.adapter.read_event(event, self.tally, self.hide)
        except Exception as exc:
            if self.unread is None:
                self.unread = exc
            return False
        if self.tally.complete:
            self.end(None)
        return hidden

    def events(self, inner: Iterator[Any]) -> Iterator[Any]:
        """``inner``'s events, read on their way out."""
        try:
            while True:
                self.reading = True
                try:
                    event = next(inner)
                finally:
                    self.reading = False
                if not self.read(event):
                    yield event
        except StopIteration:
            self.end(None)
        except GeneratorExit:
            self.abandon()
            close = getattr(inner, "close", None)
            if close is not None:
                close()
            raise
        except BaseException as exc:
            self.end(exc)
            raise

    async def async_events(self, inner: AsyncIterator[Any]) -> AsyncIterator[Any]:
        """:meth:`events` of an async stream."""
        try:
            while True:
                self.reading = True
                try:
                    event = await inner.__anext__()
                finally:
                    self.reading = False
                if not self.read(event):
                    yield event
        except StopAsyncIteration:
            self.end(None)
        except GeneratorExit:
            self.abandon()
            aclose = getattr(inner, "aclose", None)
            if aclose is not None:
                await aclose()
            raise
        except BaseException as exc:
            self.end(exc)
            raise


# The errors, by class name (their libraries are not imported here), that come after a request
# was sent and before its answer: a read that timed out, a server that hung up (httpx's, which
# the SDKs raise theirs from; aiohttp's, whose connecting errors have names of their own;
# http.client's).
_UNANSWERED: Final = frozenset(
    {
        "ReadTimeout",
        "ReadError",
        "RemoteProtocolError",
        "ServerDisconnectedError",
        "SocketTimeoutError",
        "ClientOSError",
        "RemoteDisconnected",
    }
)


def sent_unanswered(exc: BaseException) -> bool:
    """Whether ``exc``, or an error it was raised from, says its request was sent and never
    answered: the provider may have billed it (a long answer the client gave up on), so its
    bill is unknown. An error connecting, or an answer with an error status, says nothing was
    billed."""
    cause: BaseException | None = exc
    for _ in range(8):  # (a chain of causes is short; a cycle must not hang)
        if cause is None:
            return False
        if type(cause).__name__ in _UNANSWERED:
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def begin_call(
    ctx: ExecutionContext,
    adapter: Adapter,
    body: Mapping[str, Any],
    model: str | None,
    extra: Mapping[str, Any] | None = None,
    *,
    operation: str | None = None,
    refused: ExceededLimit | None = None,
    ask_usage: dict[str, Any] | None = None,
) -> Admitted:
    """Measure a request (its JSON ``body`` for ``model``: :meth:`Adapter.measure`), begin its
    node and admit it (``LimitExceeded`` if it does not fit).

    ``extra``: more metadata for the node. The context's policies see what is sent (the loop
    guard); ``refused`` is a budget-pressure hook's refusal to report (:func:`relieve_pressure`).
    ``operation`` names the node (else the adapter's operation). ``ask_usage``: the body that
    will be sent, changed in place once admitted so that a stream asks for its usage
    (``Admitted.hide``: the caller must not see that event); None leaves it as it is.
    """
    size, cap, stream = adapter.measure(body, model)
    if operation is None:
        operation = adapter.operation
    meta: dict[str, Any] = {META_OPERATION: operation}
    if extra:
        meta.update(extra)
    if settings.capture_content:
        meta[META_PROMPT_TEXT] = adapter.prompt_text(body)
    call = ctx.model_call(
        adapter.kind,
        meta,
        (operation, model, adapter.provider),
        max_tokens=cap,  # (an embeddings request's is 0: it writes nothing)
        request=size,
        final=None,
        sent=body,
        refused=refused,
    )
    try:
        call.start()
    except LimitExceeded as stop:
        note_stop(stop)  # frameworks may re-raise it as their own error: see find_limit_exceeded
        raise
    admitted = Admitted(call, adapter, stream, body)
    if stream and ask_usage is not None:
        admitted.hide = adapter.prepare_stream(ask_usage)
    return admitted


def finish_call(
    call: Call, tally: Tally | None, exc: BaseException | None, meta: dict[str, Any] | None = None
) -> None:
    """End a request's node with the usage read from its response (None: nothing was read)
    and what was read about it (``meta``), merged into the node's metadata as it ends: all in
    one step. Counts the response did not report are estimated (:mod:`.unreported`).

    The node keeps the provider's id of the response as ``response_id`` (``"<provider>:<id>"``)
    when it is printable text of at most :data:`.adapter.MAX_RESPONSE_ID` characters (else it
    could not be a ledger key). The id is no idempotency key (servers repeat ids: see
    ``instrument(response_id_keys=...)``), except for a caching gateway, keyed by
    :meth:`Tally.gateway_key` when the response reported its usage.

    The counts are checked once, by ``call.record``: the readers made each an int or None, and
    the usual ones pass. A provider's odd numbers must not break the caller's call, so counts
    it refuses are fitted (:meth:`Tally.fit`) and recorded so (``meta`` then saying
    ``usage_clamped`` when a total was outside 0..2**53)."""
    if tally is not None:
        meta = {} if meta is None else meta
        response_id = tally.response_id
        if (
            isinstance(response_id, str)
            and 0 < len(response_id) <= MAX_RESPONSE_ID
            and response_id.isprintable()
        ):
            key = meta[META_RESPONSE_ID] = f"{call.provider}:{response_id}"
            # Only a response that reported its usage: without it, one billed answer that
            # repeats an id cannot be told from a stored one delivered again.
            if settings.response_id_keys and None not in (tally.tokens_in, tally.tokens_out):
                call.offer_idempotency_key(tally.gateway_key(key, call.name))
        if tally.tokens_in is None or tally.tokens_out is None:  # billed all the same
            estimate_unreported(call, tally)
        if tally.unanswered:
            charge_unanswered_attempts(call, tally)
        if tally.tokens_in is None and tally.tokens_out is None:  # no usage (nor an estimate)
            if tally.tool_calls:
                call.note_tool_calls(tally.tool_calls)
        else:
            for fitted in (False, True):
                try:
                    call.record(
                        tally.tokens_in or 0,
                        tally.tokens_out or 0,
                        cached_tokens=tally.cached,
                        cache_write_tokens=tally.cache_write,
                        reasoning_tokens=tally.reasoning,
                        tool_calls_made=tally.tool_calls,
                        estimated=tally.estimated,
                        parts=tally.parts,
                    )
                    break
                except ValueError:  # refused before any change: fitted, record() takes them
                    if fitted:
                        raise
                    if tally.fit():
                        meta[META_USAGE_CLAMPED] = True
        if tally.text:
            meta[META_RESPONSE_TEXT] = "".join(tally.text)
        if tally.service_tier is not None:
            meta[META_SERVICE_TIER] = tally.service_tier
    call.finish(exc, meta)


def finish_abandoned(call: Call, tally: Tally, cut: BaseException | None = None) -> None:
    """End the node of a stream closed (or ``cut``, the error that cut it) before its last
    event.

    The provider bills a cut stream but its usage report (OpenAI's comes last; Anthropic's
    first one counts a single output token) may not have arrived: count the request's input
    estimate (its reservation's, in the context's estimate mode) and the output received (at
    least one token per content event), and say so on the node (``usage_estimated``, and
    ``cost_status`` ``"estimated"``).
    """
    meta = {META_USAGE_ESTIMATED: True} if estimate_cut_stream(call, tally) else None
    if cut is None:
        cut = StreamAbandoned("the stream was closed before its last event was read")
    finish_call(call, tally, cut, meta)


def relieve_pressure(
    ctx: ExecutionContext, reliefs: tuple[Relief, ...], adapter: Adapter, kwargs: dict[str, Any]
) -> tuple[ExceededLimit | None, dict[str, Any] | None]:
    """Under budget pressure, let the context's ``on_budget_pressure`` hook or downgrade ladder
    change the request (``kwargs``, in place) or refuse it. An LLM request is told the budget
    first, in the place its wire format keeps system text, when the context asks for it
    (``disclose_budget``).

    Returns the refusal, to report when the call is admitted, and the node's metadata for what
    was done (the budget line told, the model asked for before a downgrade): the ``refused``
    and ``extra`` of :func:`begin_call`. Called only when the context has either configured
    (its policies' ``shapes_requests``; ``reliefs`` are their ``reliefs``)."""
    notes: dict[str, Any] = {}
    told = disclose(ctx, kwargs, adapter.wire if adapter.kind == "llm" else None)
    if told is not None:
        notes[META_BUDGET_NOTE] = told
    refused = None
    for relief in reliefs:
        refused = relief.relieve(ctx, kwargs, notes)
        if refused is not None:
            break
    return refused, notes or None
