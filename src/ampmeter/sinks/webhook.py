"""A sink that sends limit events to a webhook: alerts that leave the process.

Sending never slows or fails a metered call: :meth:`~WebhookSink.emit` only puts a small dict
in a bounded queue (a full queue drops the event and counts it), and one worker thread POSTs
over one kept connection, retrying a connection error, a timeout, a 408, a 425, a 429 or a 5xx
with exponential backoff. A redirect is never followed (it would carry the payload and the
``Authorization`` header to a host nobody named). Any error on the worker is counted as the
failure of the event it was sending. A forked child gets the sink afresh (its own queue, counts,
connection and worker) and closes it when it exits, so its events are delivered or reported
there. Payloads hold only named fields of an event, every text scrubbed
(:func:`ampmeter.redact.scrub`); messages name the URL (which may be a secret) only by its
scheme, host and port.
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import json
import os
import queue
import random
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any, Final

from ampmeter import _validate, redact
from ampmeter.errors import SinkClosedError
from ampmeter.node import META_CONTEXT, Node
from ampmeter.policies import META_LIMIT_EVENTS
from ampmeter.sinks._webhook_http import KeptConnection, parse_url
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
        url: an ``http`` or ``https`` URL; ``user:password@`` in it is sent as ``Basic``
            authorization (then ``headers`` must not hold an ``authorization`` of its own).
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
        self._target = parse_url(url)
        self._kinds = _checked_kinds(events)
        self._headers = {"content-type": "application/json", "user-agent": "ampmeter-webhook"}
        for name, value in (headers or {}).items():
            if not isinstance(name, str) or not isinstance(value, str):
                raise TypeError("headers must map header names to string values")
            if any(char in name + value for char in "\r\n\0"):
                # http.client would refuse it on the worker, for every event; say so here
                raise ValueError(f"header {name.strip()!r} must not hold a line break or NUL")
            redact.remember_secret(value)
            self._headers[name.lower()] = value
        if self._target.authorization is not None:
            if "authorization" in self._headers:
                raise ValueError(
                    "url holds credentials and headers an authorization header: give one of them"
                )
            self._headers["authorization"] = self._target.authorization
        self._timeout = _validate.amount(timeout_s, "timeout_s")
        if not self._timeout:
            raise ValueError("timeout_s must be more than 0 seconds, got 0")
        self._backoff = _validate.amount(backoff_s, "backoff_s")
        self._close_timeout = _validate.amount(close_timeout_s, "close_timeout_s")
        self._retries = _validate.count(retries, "retries")
        self._queue_size = _validate.count(queue_size, "queue_size")
        if not self._queue_size:
            raise ValueError("queue_size must be at least 1, got 0")
        self._closed = False
        self._forked = False  # this process was forked from the one that made the sink
        self._worker: threading.Thread | None = None
        self._fresh_state()
        _LIVE.add(self)
        self._start_worker()

    def _fresh_state(self) -> None:
        """An empty queue, zero counts and a connection not yet opened."""
        self._lock = threading.Lock()
        self._queue: queue.Queue[object] = queue.Queue(maxsize=self._queue_size)
        self._giving_up = threading.Event()  # set when close() stops waiting
        self._sent = 0
        self._failed = 0
        self._dropped = 0
        self._last_error: str | None = None
        self._sending = False  # the worker is delivering an event taken from the queue
        self._connection = KeptConnection(self._target, self._timeout)

    def _restart_after_fork(self) -> None:
        """In a forked child: forget the parent's queue, counts, locks and thread (the
        parent delivers and reports its own events), and close the child's copy of the
        parent's socket. The child's worker starts with its first event."""
        self._connection.close()
        self._fresh_state()
        self._worker = None
        self._forked = True

    def _start_worker(self) -> None:
        with self._lock:
            if self._worker is not None:
                return
            self._worker = threading.Thread(target=self._run, name="ampmeter-webhook", daemon=True)
            self._worker.start()
        if self._forked:
            # Nobody in a forked child may close the sink (its owner closes it in the parent):
            # closing it when the child exits delivers what is queued, or says what was not.
            _close_at_exit(self)

    # --- what happened -----------------------------------------------------------------------

    @property
    def sent(self) -> int:
        """Events the receiver accepted (a 2xx answer)."""
        with self._lock:
            return self._sent

    @property
    def failures(self) -> int:
        """Events not delivered: retries used up, refused or redirected by the receiver, lost
        to an error on the sending thread, dropped with the queue full, or still queued when
        :meth:`close` stopped waiting."""
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
            worker = self._worker
        if worker is not None and worker.is_alive():
            deadline = time.monotonic() + self._close_timeout
            with contextlib.suppress(queue.Full):
                self._queue.put(_STOP, timeout=self._close_timeout)
            worker.join(max(deadline - time.monotonic(), 0.0))
            if worker.is_alive():
                self._giving_up.set()  # the attempt under way stops at its next backoff
        self._abandon_queued()
        if worker is not None and worker.is_alive():
            self._queue.put_nowait(_STOP)  # the queue is empty now: let the worker end
        with self._lock:
            failed, dropped, error = self._failed + self._dropped, self._dropped, self._last_error
        if failed:
            why = f"; last error: {error}" if error else ""
            warnings.warn(
                f"ampmeter: WebhookSink did not deliver {failed} limit event(s) to "
                f"{self._target.where} ({dropped} dropped with the queue full){why}",
                RuntimeWarning,
                stacklevel=2,
            )

    def _abandon_queued(self) -> None:
        """Count as failed every event not delivered by now: those still queued, and the one
        being sent (the worker will not count it again)."""
        abandoned = 0
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            abandoned += item is not _STOP
        with self._lock:
            if self._sending:
                self._sending = False
                abandoned += 1
            self._failed += abandoned
            if abandoned and self._last_error is None:
                self._last_error = "the receiver did not answer before close"

    # --- the worker thread -------------------------------------------------------------------

    def _put(self, payload: dict[str, Any]) -> None:
        if self._worker is None:
            self._start_worker()  # the first event of a forked child
        try:
            self._queue.put_nowait(payload)
        except queue.Full:
            with self._lock:
                self._dropped += 1

    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as failed:  # the thread ends here; close() counts what is left
            with self._lock:
                self._last_error = f"the sending thread stopped: {_why(failed)}"
        finally:
            self._connection.close()

    def _serve(self) -> None:
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
            try:
                error = self._deliver(_body(item))
            except Exception as failed:  # an answer or a bug nobody foresaw: this event fails
                error = _why(failed)
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
            try:
                status = self._connection.post(body, self._headers)
            except (OSError, http.client.HTTPException) as failed:
                error = _why(failed)
                continue
            if 200 <= status < 300:
                return None
            error = f"HTTP {status}"
            if 300 <= status < 400:
                return f"{error}, a redirect: not followed (give the sink the URL it points to)"
            if status < 500 and status not in _RETRIED_STATUSES:
                return error  # the receiver refuses this payload: sending it again won't help
        return error


_LIVE: weakref.WeakSet[WebhookSink] = weakref.WeakSet()
"""Every sink not yet collected: a forked child restarts each of them."""


def _restart_in_child() -> None:
    for sink in list(_LIVE):
        sink._restart_after_fork()


if hasattr(os, "register_at_fork"):  # POSIX; elsewhere a process is never forked
    os.register_at_fork(after_in_child=_restart_in_child)


def _close_at_exit(sink: WebhookSink) -> None:
    """Close ``sink`` when this process exits: at interpreter exit, and at the end of a
    ``multiprocessing`` child, which leaves with ``os._exit`` after running its finalizers."""
    ref = weakref.ref(sink)
    atexit.register(_close_if_alive, ref)
    if "multiprocessing" in sys.modules:
        from multiprocessing import util

        util.Finalize(None, _close_if_alive, args=(ref,), exitpriority=0)


def _close_if_alive(ref: weakref.ref[WebhookSink]) -> None:
    sink = ref()
    if sink is not None:
        sink.close()


def _why(failed: BaseException) -> str:
    return redact.scrub(f"{type(failed).__name__}: {failed}")


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
