"""Error text safe to log: an exception or message scrubbed of credentials and request content.

Every place where an error's text reaches a node (its ``stop_reason``), a log line, a span or
the report goes through this module:

* :func:`error_text` gives an exception's class name, its HTTP status code when it has one
  (the OpenAI and Anthropic SDK errors carry ``status_code``) and its message;
* credentials are replaced by ``[REDACTED]`` in that message: bearer tokens, ``sk-...`` and
  ``sk-ant-...`` keys, ``api_key=...`` / ``api-key: ...`` style pairs, ``Authorization:``
  values, every secret registered with :func:`remember_secret`, and the credentials of every
  SDK client registered with :func:`remember_client` (the SDK integrations register a client
  when a request of it fails or streams) as they are when the text is scrubbed;
* a provider's error body often echoes the request (the prompt, a tool argument): unless
  content capture is on (:func:`configure`, set by ``instrument(capture_content=...)``), the
  message of an error that carries a provider response is withheld and only its error type and
  code (identifier-shaped strings such as ``invalid_api_key``) are kept.

The message of any other exception (a tool's ``ValueError``, a dropped connection) is kept,
credentials scrubbed. Secrets shorter than :data:`MIN_SECRET_LENGTH` characters are not
remembered: replacing them would scrub ordinary words.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from ampmeter.errors import AmpmeterError

if TYPE_CHECKING:
    import re

__all__ = [
    "MIN_SECRET_LENGTH",
    "REDACTED",
    "configure",
    "error_text",
    "remember_client",
    "remember_secret",
    "scrub",
]

REDACTED: Final = "[REDACTED]"
MIN_SECRET_LENGTH: Final = 8
MAX_TEXT_CHARS: Final = 2000  # longer messages are cut: an error text is a summary, not a dump


@functools.cache
def _patterns() -> tuple[tuple[re.Pattern[str], ...], re.Pattern[str]]:
    """The credential shapes and the safe-token pattern, compiled when first needed (``re``
    costs ``import ampmeter`` time that most processes never use)."""
    import re

    shapes = (
        # "Authorization: Bearer abc", "authorization=Basic abc": the scheme and its credential
        re.compile(r"(?i)(\bauthorization\b[\"']?\s*[:=]\s*[\"']?)(?:[A-Za-z-]+\s+)?[^\s\"',;}]+"),
        # "Bearer abc.def" anywhere else
        re.compile(r"(?i)(\bbearer\s+)[A-Za-z0-9._~+/=-]+"),
        # api_key=..., "api-key": "...", x-api-key: ..., access_token=..., secret: ..., password=...
        re.compile(
            r"(?i)(\b(?:x-)?(?:api[_-]?key|access[_-]?token|auth[_-]?token|secret|password)\b"
            r"[\"']?\s*[:=]\s*[\"']?)[^\s\"'&,;}]+"
        ),
        # OpenAI (sk-..., sk-proj-...) and Anthropic (sk-ant-...) style keys, masked ones too
        re.compile(r"()\bsk-[A-Za-z0-9_*.\-]{6,}"),
    )
    return shapes, re.compile(r"[A-Za-z0-9_.\-]{1,64}")


_lock = threading.Lock()
_secrets: set[str] = set()
_secret_pattern: re.Pattern[str] | None = None
_capture_content = False

# The SDK clients whose credentials are scrubbed, by id, held weakly (an entry goes when its
# client does): their credentials are read when the client is registered and again before every
# scrub, so a key that changes later is scrubbed too.
_clients: dict[int, weakref.ref[Any]] = {}
_CREDENTIALS: Final = ("api_key", "auth_token")  # the attributes the Stainless SDKs keep them in


def configure(*, capture_content: bool) -> None:
    """Whether provider error messages (which may echo the request) are kept in error text."""
    global _capture_content
    if not isinstance(capture_content, bool):
        raise TypeError(f"capture_content must be a bool, got {type(capture_content).__name__}")
    _capture_content = capture_content


def remember_secret(value: object) -> None:
    """Scrub ``value`` from every error text from now on (non-strings and short ones ignored).

    The secret is held only in this module's set, for the life of the process.
    """
    global _secret_pattern
    if not isinstance(value, str) or len(value) < MIN_SECRET_LENGTH or value in _secrets:
        return
    with _lock:
        _secrets.add(value)
        # Longest first, so a secret containing another is replaced whole.
        ordered = sorted(_secrets, key=len, reverse=True)
        import re

        _secret_pattern = re.compile("|".join(re.escape(s) for s in ordered))


def remember_client(client: object) -> None:
    """Scrub the credentials of SDK client ``client`` (its ``api_key`` and ``auth_token``) from
    every error text from now on, as they are whenever a text is scrubbed: a key the client
    changes (openai's can come from a refreshing provider) is scrubbed too. A client already
    registered costs one lookup; None is ignored."""
    if client is None or id(client) in _clients:
        return
    _read_credentials(client)
    key = id(client)

    def forget(ref: weakref.ref[Any]) -> None:
        if _clients.get(key) is ref:
            del _clients[key]

    try:
        ref = weakref.ref(client, forget)
    except TypeError:  # a client that cannot be held weakly is read again at its next call
        return
    with _lock:
        _clients[key] = ref


def _read_credentials(client: object) -> None:
    for name in _CREDENTIALS:
        remember_secret(getattr(client, name, None))


def scrub(text: str) -> str:
    """``text`` with every credential replaced by ``[REDACTED]`` (and cut to a sane length)."""
    if len(text) > MAX_TEXT_CHARS:
        text = text[:MAX_TEXT_CHARS] + "…"
    for ref in list(_clients.values()):
        client = ref()
        if client is not None:
            _read_credentials(client)
    pattern = _secret_pattern
    if pattern is not None:
        text = pattern.sub(REDACTED, text)
    for shape in _patterns()[0]:
        text = shape.sub(lambda m: m.group(1) + REDACTED, text)
    return text


def error_text(exc: BaseException) -> str:
    """One safe line describing ``exc``: class, HTTP status, scrubbed message or error codes.

    ``AuthenticationError (HTTP 401): invalid_request_error, invalid_api_key (message withheld:
    content capture is off)`` for a provider error; ``ValueError: bad input`` otherwise.
    """
    head = type(exc).__name__
    ours = isinstance(exc, AmpmeterError)  # ampmeter's own words: no provider body inside
    status = getattr(exc, "status_code", None)
    if type(status) is int and not ours:
        head += f" (HTTP {status})"
    if not ours and _carries_provider_body(exc) and not _capture_content:
        codes = _safe_codes(exc)
        detail = ", ".join(codes) + " " if codes else ""
        return f"{head}: {detail}(message withheld: content capture is off)"
    try:
        message = str(exc)
    except Exception:
        message = ""
    message = " ".join(message.split())  # one line: no newlines or control-character layout
    return f"{head}: {scrub(message)}" if message else head


def _carries_provider_body(exc: BaseException) -> bool:
    """Whether ``exc`` holds a provider's answer (whose text may echo the request)."""
    status = getattr(exc, "status_code", None)
    return type(status) is int or getattr(exc, "body", None) is not None


def _safe_codes(exc: BaseException) -> list[str]:
    """The identifier-shaped error type / code fields of a provider error, without repeats."""
    candidates: list[object] = [getattr(exc, "type", None), getattr(exc, "code", None)]
    body = getattr(exc, "body", None)
    if isinstance(body, Mapping):
        candidates += [body.get("type"), body.get("code")]
        inner = body.get("error")
        if isinstance(inner, Mapping):
            candidates += [inner.get("type"), inner.get("code")]
    found: list[str] = []
    for value in candidates:
        if (
            isinstance(value, str)
            and value != "error"  # the Anthropic envelope's own type
            and _patterns()[1].fullmatch(value)
            and value not in found
        ):
            found.append(value)
    return found
