"""A loopback HTTP server that answers with scripted, recorded provider responses.

The local llama.cpp model cannot produce every wire shape ampmeter must read (tool calls,
cached and reasoning token details, rate limits), so tests point the real ``openai`` and
``anthropic`` SDKs at a :class:`ReplayServer` and script what each route answers, in order::

    with ReplayServer() as replay:
        replay.script("/v1/chat/completions", recorded.openai_error(429), recorded.openai_chat())
        client = openai.OpenAI(base_url=replay.openai_base_url, api_key="k", max_retries=1)
        client.chat.completions.create(...)   # the SDK retries the 429 and gets the 200

Each request takes the next response queued for its method and path; a queued callable
answers from the :class:`RecordedRequest` (an error body echoing its key or prompt, as real
providers' do). A request with nothing left goes to the ``fallback`` responder (a server that
answers by rule, such as :class:`~ampmeter.testing.BillingProvider`), else gets a 404 that says
so, with ``x-should-retry: false``.

Like a real provider, the server gives every response it sends an id of its own: the recorded
id (``id``, a stream's ``message.id`` or ``response.id``, Gemini's ``responseId``) with a fresh
suffix, the same in every event of one stream. ``verbatim_ids=True`` sends the recorded ids as
they are, to test a response delivered twice.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import socket
import sys
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import MappingProxyType
from typing import Any, Final

from ampmeter import _validate
from ampmeter._scoped import Scoped

__all__ = ["RecordedRequest", "ReplayResponse", "ReplayServer", "Responder"]

_METHODS: Final = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE"})
_NO_HEADERS: Final[Mapping[str, str]] = MappingProxyType({})


def _compact(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"))


def _sse_event(event: str | None, data: Any) -> bytes:
    head = f"event: {event}\n" if event is not None else ""
    return f"{head}data: {data if isinstance(data, str) else _compact(data)}\n\n".encode()


@dataclass(frozen=True)
class ReplayResponse:
    """One scripted HTTP answer.

    ``chunks`` holds the body as the pieces sent one after the other with chunked transfer
    encoding (server-sent events arrive one event per chunk, as from a real provider); a plain
    response is a single chunk sent with a ``Content-Length``. ``cut_after`` closes the
    connection after that many chunks without finishing the body, like a stream dropped
    mid-way. ``delay`` seconds pass before the status line is sent.
    """

    status: int = 200
    chunks: tuple[bytes, ...] = ()
    headers: tuple[tuple[str, str], ...] = ()
    streamed: bool = False
    cut_after: int | None = None
    delay: float = 0.0

    def __post_init__(self) -> None:
        if not 100 <= _validate.count(self.status, "status") <= 599:
            raise ValueError(
                f"status must be an HTTP status code from 100 to 599, got {self.status}"
            )
        if not all(isinstance(chunk, bytes) for chunk in self.chunks):
            raise TypeError("chunks must be bytes")
        for pair in self.headers:
            if len(pair) != 2 or not all(isinstance(part, str) for part in pair):
                raise TypeError(f"headers must be (name, value) string pairs, got {pair!r}")
        if self.cut_after is not None and not (
            isinstance(self.cut_after, int) and 0 <= self.cut_after < len(self.chunks)
        ):
            raise ValueError(
                f"cut_after must be an int from 0 to {len(self.chunks) - 1} (fewer chunks than "
                f"the body has), got {self.cut_after!r}"
            )
        _validate.amount(self.delay, "delay (seconds)")

    @property
    def body(self) -> bytes:
        """The whole body, as the client would receive it if nothing were cut."""
        return b"".join(self.chunks)

    @classmethod
    def json(
        cls,
        payload: Any,
        *,
        status: int = 200,
        headers: Mapping[str, str] | None = None,
        delay: float = 0.0,
    ) -> ReplayResponse:
        """A JSON body (``payload`` is encoded as given)."""
        merged = {"content-type": "application/json", **(headers or {})}
        return cls(
            status=status,
            chunks=(_compact(payload).encode(),),
            headers=tuple(merged.items()),
            delay=delay,
        )

    @classmethod
    def error(
        cls,
        provider: str,
        status: int,
        error: Mapping[str, Any],
        headers: Mapping[str, str] = _NO_HEADERS,
    ) -> ReplayResponse:
        """An error in the shape of ``provider`` (``"anthropic"``, else OpenAI's) that the SDKs
        do not retry; ``error`` holds its ``type``, ``message`` and (OpenAI's) ``code``."""
        kind, message = error["type"], error["message"]
        body: dict[str, Any] = {
            "error": {"message": message, "type": kind, "param": None, "code": error.get("code")}
        }
        if provider == "anthropic":
            details = {"type": kind, "message": message}
            body = {"type": "error", "error": details, "request_id": "req_replay"}
        merged = {**headers, "x-should-retry": "false"}
        return cls.json(body, status=status, headers=merged)

    @classmethod
    def sse(
        cls,
        events: Iterable[tuple[str | None, Any]],
        *,
        headers: Mapping[str, str] | None = None,
        cut_after: int | None = None,
        delay: float = 0.0,
    ) -> ReplayResponse:
        """A ``text/event-stream`` body, one ``(event name or None, data)`` per event.

        ``data`` that is not a string is JSON-encoded; a string is sent as is (``"[DONE]"``).
        """
        merged = {"content-type": "text/event-stream; charset=utf-8", **(headers or {})}
        return cls(
            status=200,
            chunks=tuple(_sse_event(event, data) for event, data in events),
            headers=tuple(merged.items()),
            streamed=True,
            cut_after=cut_after,
            delay=delay,
        )


@dataclass(frozen=True)
class RecordedRequest:
    """A request the replay server received."""

    method: str
    path: str
    query: str
    headers: Mapping[str, str]
    body: bytes = field(repr=False)
    peer: tuple[str, int] = ("", 0)
    """The client's address and port: requests sent on one kept connection share it."""

    def json(self) -> Any:
        """The request body decoded as JSON."""
        return json.loads(self.body)


Responder = Callable[[RecordedRequest], ReplayResponse]
"""A scripted answer computed from the request it answers."""


class ReplayServer(Scoped):
    """A threaded HTTP server on loopback that answers from per-route response queues.

    Args:
        host: address to bind (loopback by default).
        port: TCP port; 0 picks a free one.
        fallback: answers every request that has no scripted response left (None: a 404).
        verbatim_ids: send recorded response ids as they are (by default each response sent
            gets a fresh id, as from a real provider).
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        fallback: Responder | None = None,
        verbatim_ids: bool = False,
    ) -> None:
        _validate.text(host, "host", empty=False)
        if _validate.count(port, "port") > 65535:
            raise ValueError(f"port must be an integer from 0 to 65535, got {port!r}")
        if fallback is not None and not callable(fallback):
            raise TypeError(f"fallback must be callable, got {type(fallback).__name__}")
        if not isinstance(verbatim_ids, bool):
            raise TypeError(f"verbatim_ids must be a bool, got {type(verbatim_ids).__name__}")
        self._verbatim_ids = verbatim_ids
        self._address = (host, port)
        self._fallback = fallback
        self._lock = threading.Lock()
        self._queues: dict[tuple[str, str], deque[ReplayResponse | Responder]] = {}
        self._requests: list[RecordedRequest] = []
        self._httpd: _Server | None = None
        self._stopped = threading.Event()  # set by stop(): answers still delayed are dropped
        self._thread: threading.Thread | None = None

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> ReplayServer:
        """Bind and serve in a background thread. Raises ``RuntimeError`` if already running."""
        if self._httpd is not None:
            raise RuntimeError(f"the replay server is already running at {self.url}")
        httpd = _Server(self._address, _make_handler(self))
        self._stopped.clear()
        thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.02},  # how long stop() waits for the loop to notice
            name="ampmeter-replay",
            daemon=True,
        )
        thread.start()
        self._httpd, self._thread = httpd, thread
        return self

    def stop(self) -> None:
        """Stop serving and close the socket. Calling it when not running does nothing."""
        httpd, thread = self._httpd, self._thread
        self._httpd = self._thread = None
        self._stopped.set()
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
            httpd.close_kept()
        if thread is not None:
            thread.join()

    def wait(self, seconds: float) -> bool:
        """Wait ``seconds`` (an answer's delay), or less if the server is stopped meanwhile:
        True if it was, and then nothing more should be sent."""
        return self._stopped.wait(seconds)

    def _enter(self) -> None:
        self.start()

    def _leave(self, exc: BaseException | None) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """``http://HOST:PORT``: the ``base_url`` for the Anthropic SDK."""
        if self._httpd is None:
            raise RuntimeError("the replay server is not running; call start() first")
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def openai_base_url(self) -> str:
        """``http://HOST:PORT/v1``: the ``base_url`` for the OpenAI SDK."""
        return self.url + "/v1"

    @property
    def anthropic_base_url(self) -> str:
        """The ``base_url`` for the Anthropic SDK (it adds ``/v1`` itself)."""
        return self.url

    # --- scripting ---------------------------------------------------------------------------

    def script(
        self, path: str, *responses: ReplayResponse | Responder, method: str = "POST"
    ) -> None:
        """Queue ``responses`` for ``method path``, answered in the order given.

        A :data:`Responder` (a callable) is called with the request it answers.

        Raises:
            ValueError: the path does not start with ``/`` or the method is unknown.
            TypeError: a response is neither a :class:`ReplayResponse` nor callable.
        """
        key = _route(method, path)
        for response in responses:
            if not isinstance(response, ReplayResponse) and not callable(response):
                raise TypeError(
                    f"expected ReplayResponse or a callable, got {type(response).__name__}"
                )
        with self._lock:
            self._queues.setdefault(key, deque()).extend(responses)

    def pending(self, path: str | None = None, method: str = "POST") -> int:
        """How many scripted responses are still unused (for one route, or in all)."""
        with self._lock:
            if path is None:
                return sum(len(queue) for queue in self._queues.values())
            return len(self._queues.get(_route(method, path), ()))

    @property
    def requests(self) -> list[RecordedRequest]:
        """A copy of the requests received so far, oldest first."""
        with self._lock:
            return list(self._requests)

    def _take(self, request: RecordedRequest) -> ReplayResponse | None:
        with self._lock:
            self._requests.append(request)
            queue = self._queues.get((request.method, request.path))
            scripted = queue.popleft() if queue else self._fallback
        if scripted is None or isinstance(scripted, ReplayResponse):
            answer = scripted
        else:
            answer = scripted(request)
            if not isinstance(answer, ReplayResponse):
                raise TypeError(f"a responder returned {type(answer).__name__}, not ReplayResponse")
        if answer is None or self._verbatim_ids:
            return answer
        return _with_fresh_ids(answer)


def _with_fresh_ids(response: ReplayResponse) -> ReplayResponse:
    """``response`` with each response id it carries given a fresh suffix (the same one in
    every chunk), as a provider never sends one id twice. The bytes are otherwise unchanged."""
    ids: set[str] = set()
    if response.streamed:
        for line in response.body.split(b"\n"):
            if line.startswith(b"data:"):
                _collect_ids(_json_or_none(line[5:]), ids)
    else:
        _collect_ids(_json_or_none(response.body), ids)
    if not ids:
        return response
    suffix = uuid.uuid4().hex[:12]
    swaps = [(json.dumps(old).encode(), json.dumps(f"{old}-{suffix}").encode()) for old in ids]
    chunks = []
    for chunk in response.chunks:
        for old, new in swaps:
            chunk = chunk.replace(old, new)
        chunks.append(chunk)
    return dataclasses.replace(response, chunks=tuple(chunks))


def _json_or_none(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return None


def _collect_ids(document: Any, ids: set[str]) -> None:
    """Add the response ids of a body or stream event (a list: Gemini's array of chunks)."""
    if isinstance(document, list):
        for item in document:
            _collect_ids(item, ids)
        return
    if not isinstance(document, dict):
        return
    for holder in (document, document.get("message"), document.get("response")):
        if isinstance(holder, dict):
            for name in ("id", "responseId"):
                value = holder.get(name)
                if isinstance(value, str) and value:
                    ids.add(value)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # Many clients connect at once in the concurrency tests and benchmarks; with the default
    # backlog of 5 the kernel drops their connection attempts and each waits a second to retry.
    request_queue_size = 256

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(address, handler)
        self._kept_lock = threading.Lock()
        self._kept: set[socket.socket] = set()  # connections open now (kept alive or busy)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._kept_lock:
            self._kept.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._kept_lock:
            self._kept.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that went away (a program killed at its cap, a stream cut off) is what
        # these tests do on purpose; socketserver would print its traceback on stderr, from a
        # thread, into whatever test captures stderr then. Any other error is still printed.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)

    def close_kept(self) -> None:
        """Close every connection still open, so none outlives the server (their handlers,
        waiting for a next request, see the end of the stream and finish)."""
        with self._kept_lock:
            kept = list(self._kept)
        for connection in kept:
            with contextlib.suppress(OSError):  # (closed by its handler meanwhile)
                connection.shutdown(socket.SHUT_RDWR)


def _route(method: str, path: str) -> tuple[str, str]:
    if not isinstance(path, str) or not path.startswith("/"):
        raise ValueError(f"path must be a string starting with '/', got {path!r}")
    if not isinstance(method, str) or method.upper() not in _METHODS:
        raise ValueError(f"method must be one of {sorted(_METHODS)}, got {method!r}")
    return method.upper(), path


def _make_handler(owner: ReplayServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # An idle kept connection is closed by stop(), not by a timer: a server that closes one
        # at the moment the client reuses it (httpx keeps one 5 s, the old timeout here) fails
        # that request with "Server disconnected without sending a response".
        timeout = 300

        def setup(self) -> None:
            super().setup()
            # Headers and body go out in two writes: on a kept connection Nagle's algorithm
            # held the second until the client's delayed ACK, 40 ms an answer.
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def _serve(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length) if length else b""
            path, _, query = self.path.partition("?")
            request = RecordedRequest(
                method=self.command,
                path=path,
                query=query,
                headers={k.lower(): v for k, v in self.headers.items()},
                body=body,
                peer=(str(self.client_address[0]), int(self.client_address[1])),
            )
            response = owner._take(request)
            if response is None:
                gone = f"replay server: no scripted response left for {self.command} {path}"
                response = ReplayResponse.error(
                    "openai", 404, {"type": "replay_exhausted", "message": gone}
                )
            if response.delay and owner.wait(response.delay):
                self.close_connection = True  # stopped while it waited: no answer comes
                return
            self._write(response)

        def _write(self, response: ReplayResponse) -> None:
            self.send_response(response.status)
            for name, value in response.headers:
                self.send_header(name, value)
            if not response.streamed:
                self.send_header("content-length", str(len(response.body)))
                self.end_headers()
                self.wfile.write(response.body)
                return
            self.send_header("transfer-encoding", "chunked")
            self.send_header("cache-control", "no-cache")
            self.end_headers()
            for chunk in response.chunks[: response.cut_after]:  # (None: every chunk)
                self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                self.wfile.flush()
            if response.cut_after is not None:
                self.close_connection = True  # the body is cut off, like a dropped stream
                return
            self.wfile.write(b"0\r\n\r\n")

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

        def log_message(self, format: str, *args: Any) -> None:
            """Stay quiet: tests read the recorded requests instead."""

    return Handler
