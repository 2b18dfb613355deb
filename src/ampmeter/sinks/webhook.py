"""A sink that sends limit events to a webhook: alerts that leave the process.

:class:`WebhookSink` looks at every finished node and POSTs one JSON object per limit event to
a URL: the warnings, soft limits and other events the policies write in the node's
``limit_events`` metadata (pauses and resumes among them), and a ``"stop"`` for every node that
ended ``halt`` (a call refused before it was sent, a context stopped by a limit)::

    hook = WebhookSink("https://alerts.example.com/ampmeter", events=("warning", "stop"))
    with hook, ExecutionContext(limits=[Limit(KEY_COST, 5.0, warn_at=(0.8,))], sinks=[hook]):
        run_agent()

Sending never slows or fails a metered call: :meth:`~WebhookSink.emit` only puts a small dict
in a bounded queue (a full queue drops the event and counts it), and one worker thread POSTs
with ``urllib.request``, retrying a connection error, a timeout, a 408, a 429 or a 5xx answer
with exponential backoff. :meth:`~WebhookSink.close` waits up to ``close_timeout_s`` for what is
queued, then counts every event not delivered in :attr:`~WebhookSink.failures` and warns once.

Payloads hold no secret: only named fields of the event are sent (never the node's metadata
as a whole, the prompt or a header), and every text in them goes through
:func:`ampmeter.redact.scrub`, which replaces API keys, bearer tokens and every secret
registered with :func:`ampmeter.redact.remember_secret` (the SDK integrations register each
client's key). The URL itself may be a secret (many webhook URLs are), so warnings name only
its scheme and host.
"""

from __future__ import annotations

import contextlib
import json
import math
import queue
import random
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import warnings
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any, Final

from ampmeter import redact
from ampmeter.errors import SinkClosedError
from ampmeter.graph import Node
from ampmeter.node import META_CONTEXT
from ampmeter.policies import META_LIMIT_EVENTS
from ampmeter.sinks.base import Sink

__all__ = ["EVENT_KINDS", "WebhookSink"]

EVENT_KINDS: Final = frozenset(
    {"warning", "soft_limit", "unpriced", "input_over_limit", "pause", "resume", "stop"}
)
"""The event kinds a :class:`WebhookSink` can send: the ``kind`` of the policies' limit events,
and ``"stop"`` for a node that ended ``halt``."""

_RETRIED_STATUSES: Final = frozenset({408, 425, 429})
_EVENT_FIELDS: Final = ("key", "limit", "value", "fraction", "threshold", "node_id", "context")
_STOP = object()  # tells the worker thread to end


class WebhookSink(Sink):
    """POSTs limit events as JSON to ``url``, off the caller's thread (see the module).

    Each POST carries one event: ``kind``, ``text`` (one line for a person, also what chat
    webhooks display), ``chain_id``, ``node_id``, ``node_kind``, ``node_name``, ``model`` and
    ``ts_ms``, plus the event's own fields (``key``, ``limit``, ``value``, ``fraction``,
    ``threshold``, ``context``) or, for a ``"stop"``, its ``reason``.

    Args:
        url: an ``http`` or ``https`` URL.
        events: the kinds to send (a subset of :data:`EVENT_KINDS`); None sends all.
        headers: extra request headers (a receiver's token); their values are registered with
            :func:`ampmeter.redact.remember_secret` so no payload ever carries them.
        timeout_s: seconds one POST may take.
        retries: further attempts after a failed one.
        backoff_s: wait before the first retry; it doubles for each next one (with jitter).
        queue_size: events waiting to be sent at most; more are dropped and counted.
        close_timeout_s: how long :meth:`close` waits for the queue to be delivered.
    """

    def __init__(
        self,
        url: str,
        *,
        events: Iterable[str] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout_s: float = 5.0,
        retries: int = 3,
        backoff_s: float = 0.5,
        queue_size: int = 1_000,
        close_timeout_s: float = 10.0,
    ) -> None:
        self._url = _checked_url(url)
        self._where = _where(url)
        self._kinds = _checked_kinds(events)
        self._headers = {"content-type": "application/json", "user-agent": "ampmeter-webhook"}
        for name, value in (headers or {}).items():
            if not isinstance(name, str) or not isinstance(value, str):
                raise TypeError("headers must map header names to string values")
            redact.remember_secret(value)
            self._headers[name.lower()] = value
        self._timeout = _seconds(timeout_s, "timeout_s", allow_zero=False)
        self._backoff = _seconds(backoff_s, "backoff_s", allow_zero=True)
        self._close_timeout = _seconds(close_timeout_s, "close_timeout_s", allow_zero=True)
        self._retries = _whole(retries, "retries", 0)
        self._queue: queue.Queue[object] = queue.Queue(maxsize=_whole(queue_size, "queue_size", 1))
        self._lock = threading.Lock()
        self._closed = False
        self._giving_up = threading.Event()  # set when close() stops waiting
        self._sent = 0
        self._failed = 0
        self._dropped = 0
        self._last_error: str | None = None
        self._sending = False  # the worker is delivering an event taken from the queue
        self._worker = threading.Thread(target=self._run, name="ampmeter-webhook", daemon=True)
        self._worker.start()

    # --- what happened -----------------------------------------------------------------------

    @property
    def sent(self) -> int:
        """Events the receiver accepted (a 2xx answer)."""
        with self._lock:
            return self._sent

    @property
    def failures(self) -> int:
        """Events not delivered: retries used up, dropped with the queue full, or still queued
        when :meth:`close` stopped waiting."""
        with self._lock:
            return self._failed + self._dropped

    @property
    def dropped(self) -> int:
        """Of :attr:`failures`, the events dropped because the queue was full."""
        with self._lock:
            return self._dropped

    @property
    def last_error(self) -> str | None:
        """Why the last failed event failed (scrubbed), or None."""
        with self._lock:
            return self._last_error

    # --- the sink ----------------------------------------------------------------------------

    def emit(self, node: Node, chain_id: str) -> None:
        """Queue the node's limit events that this sink sends; never blocks on the network."""
        if self._closed:
            raise SinkClosedError("WebhookSink is closed; create a new sink to send more events")
        listed = node.metadata.get(META_LIMIT_EVENTS) if node.metadata else None
        stopped = node.status == "halt" and "stop" in self._kinds
        if not listed and not stopped:
            return
        base = {
            "chain_id": chain_id,
            "node_id": node.node_id,
            "node_kind": node.kind,
            "node_name": node.name,
            "model": node.model,
            "ts_ms": node.end_ts_ms,
        }
        for event in listed or ():
            if isinstance(event, Mapping) and event.get("kind") in self._kinds:
                found = {name: event.get(name) for name in _EVENT_FIELDS}
                self._put({**base, **found, "kind": event["kind"]})
        if stopped:
            context = node.name if node.metadata.get(META_CONTEXT) is True else None
            self._put({**base, "kind": "stop", "reason": node.stop_reason, "context": context})

    def flush(self) -> None:
        """Nothing to wait for here: a context's close must not wait on the network. Use
        :meth:`close` to deliver what is queued."""

    def close(self) -> None:
        """Stop taking events, wait up to ``close_timeout_s`` for the queued ones to be
        delivered, and warn once if any event was not (see :attr:`failures`). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        deadline = time.monotonic() + self._close_timeout
        with contextlib.suppress(queue.Full):
            self._queue.put(_STOP, timeout=self._close_timeout)
        self._worker.join(max(deadline - time.monotonic(), 0.0))
        if self._worker.is_alive():
            self._give_up()
        with self._lock:
            failed, dropped, error = self._failed + self._dropped, self._dropped, self._last_error
        if failed:
            why = f"; last error: {error}" if error else ""
            warnings.warn(
                f"ampmeter: WebhookSink did not deliver {failed} limit event(s) to "
                f"{self._where} ({dropped} dropped with the queue full){why}",
                RuntimeWarning,
                stacklevel=2,
            )

    def _give_up(self) -> None:
        """Count every event not delivered by now as failed, and let the worker end."""
        self._giving_up.set()  # the attempt under way stops at its next backoff
        abandoned = 0
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            abandoned += item is not _STOP
        with self._lock:
            if self._sending:
                self._sending = False  # counted here; the worker will not count it again
                abandoned += 1
            self._failed += abandoned
            if abandoned and self._last_error is None:
                self._last_error = "the receiver did not answer before close"
        self._queue.put_nowait(_STOP)  # the queue is empty now

    # --- the worker thread -------------------------------------------------------------------

    def _put(self, payload: dict[str, Any]) -> None:
        try:
            self._queue.put_nowait(payload)
        except queue.Full:
            with self._lock:
                self._dropped += 1

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            if not isinstance(item, dict):
                continue
            with self._lock:
                if self._giving_up.is_set():
                    self._failed += 1
                    continue
                self._sending = True
            error = self._deliver(_body(item))
            with self._lock:
                if not self._sending:
                    continue  # close() gave up on it and counted it
                self._sending = False
                if error is None:
                    self._sent += 1
                else:
                    self._failed += 1
                    self._last_error = error

    def _deliver(self, body: bytes) -> str | None:
        """POST ``body`` with retries; None when delivered, else why not."""
        error = "not sent"
        for attempt in range(self._retries + 1):
            if attempt:
                pause = self._backoff * 2 ** (attempt - 1) * random.uniform(0.8, 1.2)
                if self._giving_up.wait(pause):
                    return f"{error} (given up at close)"
            request = urllib.request.Request(self._url, body, self._headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self._timeout) as response:
                    response.read()
                    return None
            except urllib.error.HTTPError as failed:
                error = f"HTTP {failed.code}"
                if failed.code < 500 and failed.code not in _RETRIED_STATUSES:
                    return error  # the receiver refuses this payload: sending it again won't help
            except (OSError, ValueError) as failed:
                error = redact.scrub(f"{type(failed).__name__}: {failed}")
        return error


def _body(payload: dict[str, Any]) -> bytes:
    """The event as JSON, every text scrubbed of credentials, with a line for a person."""
    clean = {name: _clean(value) for name, value in payload.items()}
    clean["text"] = _text(clean)
    return json.dumps(clean, separators=(",", ":")).encode("utf-8")


def _clean(value: object) -> object:
    if isinstance(value, str):
        return redact.scrub(value)
    if isinstance(value, Decimal):
        return float(value)
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return redact.scrub(str(value))


def _text(event: Mapping[str, object]) -> str:
    context = event.get("context")
    where = f" in context {context!r}" if context else ""
    if event["kind"] == "stop":
        reason = event.get("reason") or "halted"
        if context and context == event["node_name"] and event["node_kind"] == "system":
            return f"ampmeter: context {context!r} stopped: {reason}"
        return f"ampmeter: {event['node_kind']} {event['node_name']!r} stopped{where}: {reason}"
    fraction = event.get("fraction")
    share = f" at {fraction:.0%}" if isinstance(fraction, float) else ""
    limit = f" (limit {event.get('limit')})"
    return f"ampmeter: {event['kind']} on {event.get('key')}{share}{limit}{where}"


def _checked_url(url: object) -> str:
    if not isinstance(url, str):
        raise TypeError(f"url must be a str, got {type(url).__name__}")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(
            f"url must be an http:// or https:// URL with a host, got one starting {url[:12]!r}"
        )
    return url


def _where(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{parts.hostname}{port}"


def _checked_kinds(events: Iterable[str] | None) -> frozenset[str]:
    if events is None:
        return EVENT_KINDS
    if isinstance(events, str):
        raise TypeError(f"events must be a collection of kinds, not one string ({events!r})")
    kinds = frozenset(events)
    unknown = sorted(str(kind) for kind in kinds - EVENT_KINDS)
    if unknown or not kinds:
        raise ValueError(
            f"events must name kinds from {sorted(EVENT_KINDS)}, got "
            f"{', '.join(unknown) if unknown else 'none'}"
        )
    return kinds


def _seconds(value: object, name: str, *, allow_zero: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, got {value!r}")
    least = ">=" if allow_zero else ">"
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} must be a finite number of seconds {least} 0, got {value}")
    return float(value)


def _whole(value: object, name: str, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
    return value
