"""The HTTP side of :class:`~ampmeter.sinks.webhook.WebhookSink`: its URL and one kept connection.

The standard library's ``http.client`` does all a webhook needs, so the core's dependencies stay
few: one connection kept open between events (a TLS handshake per alert would cost more than the
alert), and no redirect ever followed (it would carry the ``Authorization`` header and the
payload to a host the user did not name). A URL's ``user:password@`` becomes a ``Basic``
authorization header, as curl sends it, and never appears in a message.
"""

from __future__ import annotations

import base64
import http.client
import re
import urllib.parse
from dataclasses import dataclass, field

from ampmeter import redact

__all__ = ["KeptConnection", "Target", "parse_url"]

# A space or control character in a URL would be refused by http.client on the sending thread;
# refusing it when the sink is made names the problem where the caller can fix it.
_UNSENDABLE = re.compile(r"[\x00-\x20\x7f]")


@dataclass(frozen=True)
class Target:
    """Where the sink POSTs: the parts of its URL ``http.client`` needs."""

    https: bool
    host: str
    port: int | None
    path: str  # with its query
    where: str  # scheme, host and port: how messages name the receiver
    authorization: str | None = field(default=None, repr=False)  # from the URL's credentials


def parse_url(url: object) -> Target:
    """The :class:`Target` of a webhook URL, or ``TypeError``/``ValueError`` naming what is
    wrong without quoting the URL (its credentials, path or query may be secret)."""
    if not isinstance(url, str):
        raise TypeError(f"url must be a str, got {type(url).__name__}")
    if _UNSENDABLE.search(url):
        raise ValueError("url must not contain spaces or control characters (percent-encode them)")
    try:
        parts = urllib.parse.urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError as error:  # a bad IPv6 literal, a port that is not a number
        reason = "its port is not a number from 0 to 65535" if "Port" in str(error) else error
        raise ValueError(f"url cannot be read: {reason}") from None
    if parts.scheme not in ("http", "https") or not host:
        shown = f"a {parts.scheme}:// URL" if parts.scheme else "no scheme"
        raise ValueError(f"url must be an http:// or https:// URL with a host, got {shown}")
    shown_host = f"[{host}]" if ":" in host else host
    where = f"{parts.scheme}://{shown_host}" + (f":{port}" if port is not None else "")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Target(parts.scheme == "https", host, port, path, where, _basic(parts))


def _basic(parts: urllib.parse.SplitResult) -> str | None:
    """The ``Basic`` authorization of the URL's ``user:password``, registered as secrets."""
    if parts.username is None and parts.password is None:
        return None
    user = urllib.parse.unquote(parts.username or "")
    password = urllib.parse.unquote(parts.password or "")
    token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
    for secret in (user, password, token):
        redact.remember_secret(secret)
    return f"Basic {token}"


class KeptConnection:
    """One HTTP(S) connection to ``target``, opened when first needed and kept between POSTs.

    Used by one thread at a time (the sink's worker). Any error closes it, so the next POST
    starts on a fresh connection; a kept connection the receiver closed while idle is retried
    once at once on a new one.
    """

    def __init__(self, target: Target, timeout_s: float) -> None:
        self._target = target
        self._timeout = timeout_s
        self._connection: http.client.HTTPConnection | None = None

    def post(self, body: bytes, headers: dict[str, str]) -> int:
        """POST ``body`` and return the status; the answer's body is read and dropped."""
        reused = self._connection is not None
        try:
            return self._post(body, headers)
        except (ConnectionError, http.client.CannotSendRequest):
            if not reused:
                raise
        return self._post(body, headers)  # the receiver closed the idle connection

    def close(self) -> None:
        """Close the connection (a forked child closes only its copy of the socket)."""
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()

    def _post(self, body: bytes, headers: dict[str, str]) -> int:
        connection = self._connection or self._open()
        try:
            connection.request("POST", self._target.path, body, headers)
            response = connection.getresponse()
            response.read()
        except BaseException:
            self.close()
            raise
        if response.will_close:
            self.close()
        return response.status

    def _open(self) -> http.client.HTTPConnection:
        target = self._target
        kind = http.client.HTTPSConnection if target.https else http.client.HTTPConnection
        self._connection = kind(target.host, target.port, timeout=self._timeout)
        return self._connection
