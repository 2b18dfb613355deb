"""Instrumentation: every LLM request made inside a context becomes a node (``llm``, or
``embedding`` for an embeddings request).

::

    import ampmeter
    from ampmeter.integrations import instrument

    instrument()                                   # each SDK and HTTP library when imported
    with ampmeter.ExecutionContext(max_cost_usd=0.50):
        client.chat.completions.create(...)        # reserved, checked, recorded

The ``openai`` and ``anthropic`` SDKs are patched at their resource methods; any other client
that speaks a known wire format over ``httpx`` or ``httpx2`` (LiteLLM, google-genai, mistralai,
plain httpx) is metered at the HTTP layer (:mod:`ampmeter.integrations.http`). A request is
metered once, by the first layer that sees it. Outside a context the libraries behave exactly
as without ampmeter. No API key, header or (unless ``capture_content=True``) prompt or response
text is put on a node; a failed call's error text is scrubbed by :mod:`ampmeter.redact` (the
client's API key included).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import ModuleType

from ampmeter import redact
from ampmeter.context import ExecutionContext
from ampmeter.errors import StreamAbandoned
from ampmeter.integrations import _hooks
from ampmeter.integrations.anthropic import instrument_anthropic, uninstrument_anthropic
from ampmeter.integrations.lifecycle import settings
from ampmeter.integrations.openai import instrument_openai, uninstrument_openai
from ampmeter.integrations.proxy_mark import Marker

__all__ = [
    "StreamAbandoned",
    "instrument",
    "instrument_anthropic",
    "instrument_openai",
    "is_instrumented",
    "set_default_context",
    "uninstrument",
    "uninstrument_anthropic",
    "uninstrument_openai",
]


def _instrument_http_library(module: ModuleType) -> None:
    # Imported here: a program that never imports httpx pays nothing for the HTTP layer.
    from ampmeter.integrations.http import instrument_httpx

    instrument_httpx(module)


def _instrument_aiohttp(module: ModuleType) -> None:
    from ampmeter.integrations.http_aiohttp import instrument_aiohttp

    instrument_aiohttp(module)


def _instrument_llama_index(module: ModuleType) -> None:
    from ampmeter.integrations.llama_index import instrument_llama_index

    instrument_llama_index(module)


def _instrument_http_client(module: ModuleType) -> None:
    from ampmeter.integrations.http_client import instrument_http_client

    instrument_http_client(module)


def _instrument_urllib3(module: ModuleType) -> None:
    from ampmeter.integrations.http_client import instrument_urllib3

    instrument_urllib3(module)


def _instrument_websockets(module: ModuleType) -> None:
    from ampmeter.integrations.websocket_client import instrument_websockets

    instrument_websockets(module)


def _instrument_websockets_legacy(module: ModuleType) -> None:
    from ampmeter.integrations.websocket_client import instrument_websockets_legacy

    instrument_websockets_legacy(module)


def _instrument_litellm(module: ModuleType) -> None:
    from ampmeter.integrations.litellm_retries import instrument_litellm

    instrument_litellm(module)


def _instrument_dspy(module: ModuleType) -> None:
    from ampmeter.integrations.dspy_engine import instrument_dspy

    instrument_dspy(module)


def _instrument_mcp(module: ModuleType) -> None:
    from ampmeter.integrations.mcp_tools import instrument_mcp

    instrument_mcp(module)


def _instrument_threads(_module: ModuleType) -> None:
    from ampmeter.integrations.threads import instrument_threads

    instrument_threads()


def _instrument_thread_pools(module: ModuleType) -> None:
    from ampmeter.integrations.threads import instrument_thread_pools

    instrument_thread_pools(module)


# What instrument() patches, by the module whose import triggers the patch.
_TARGETS: dict[str, Callable[[ModuleType], object]] = {
    "openai": lambda _module: instrument_openai(),
    "anthropic": lambda _module: instrument_anthropic(),
    "httpx": _instrument_http_library,
    "httpx2": _instrument_http_library,
    "aiohttp": _instrument_aiohttp,
    "http.client": _instrument_http_client,
    "urllib3": _instrument_urllib3,
    "llama_index.core": _instrument_llama_index,
    "mcp": _instrument_mcp,
    "litellm": _instrument_litellm,
    "dspy.clients.engines.lm15_engine": _instrument_dspy,
    "websockets": _instrument_websockets,
    "websockets.legacy.client": _instrument_websockets_legacy,
    "threading": _instrument_threads,
    "concurrent.futures.thread": _instrument_thread_pools,
}
_armed: set[str] = set()  # the modules instrument() patches (now, or when imported)


def instrument(
    *,
    capture_content: bool = False,
    response_id_keys: bool = False,
    openai: bool = True,
    anthropic: bool = True,
    http: bool = True,
    llama_index: bool = True,
    threads: bool = True,
    mcp: bool = True,
) -> list[str]:
    """Meter the SDKs (``openai``, ``anthropic``) and the HTTP libraries (``http``: httpx,
    httpx2, aiohttp and ``http.client``, which ``urllib`` and ``requests`` use, and the
    Responses WebSocket protocol over the ``websockets`` clients, the legacy one included)
    whenever they are imported; idempotent.

    With ``llama_index``, the lazy streams LlamaIndex returns are metered against the context
    they were created in (:mod:`ampmeter.integrations.llama_index`). With ``threads``, work
    submitted to a ``ThreadPoolExecutor`` or started as a ``threading.Thread`` inside a
    context runs in that context (:mod:`ampmeter.integrations.threads`). With ``mcp``, each
    MCP tool call is a ``tool`` node (:mod:`ampmeter.integrations.mcp_tools`). With ``openai``
    or ``http``, LiteLLM's own ``num_retries`` gives a budget stop back instead of retrying it
    (:mod:`ampmeter.integrations.litellm_retries`). With ``http``, DSPy's native engine (its own
    client over stdlib sockets) is metered at its request/response boundary
    (:mod:`ampmeter.integrations.dspy_engine`).

    A library already imported is patched at once, the others right after their own import, so
    a program pays nothing for libraries it does not use. Returns the names patched now.
    ``capture_content=True`` also stores the prompt and response text on each node (off by
    default: logs then hold no conversation text, and the message of a provider error, which may
    echo the prompt, is withheld from error text).

    Each node keeps the provider's id of its response as ``response_id``, written
    ``"<provider>:<id>"`` (``openai:chatcmpl-…``, ``anthropic:msg_…``, ``google:<responseId>``).
    Ids are never trusted to deduplicate calls by default: gateways and mock servers answer
    every request with one id and Ollama draws its ids from 999 values, so a repeated id is
    another billed call and counts. Only a key the caller gives (``idempotency_key=``) or one
    ampmeter makes itself makes a call count once. ``response_id_keys=True`` is for a caching
    gateway that delivers one stored response again: a call is then keyed by its response's id,
    its endpoint (the SDK operation) and every count of its usage together, so only the same
    stored response from the same endpoint counts once (per run and per shared ledger scope);
    its node says ``duplicate_of``. Calling ``instrument`` again only updates these two
    settings.
    """
    for name, flag in (
        ("capture_content", capture_content),
        ("response_id_keys", response_id_keys),
    ):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
    settings.capture_content = capture_content
    settings.response_id_keys = response_id_keys
    settings.marker = Marker.from_env()
    redact.configure(capture_content=capture_content)
    chosen = {
        "openai": openai,
        "anthropic": anthropic,
        "httpx": http,
        "httpx2": http,
        "aiohttp": http,
        "http.client": http,
        "urllib3": http,
        "llama_index.core": llama_index,
        "mcp": mcp,
        "litellm": openai or http,
        "dspy.clients.engines.lm15_engine": http,
        "websockets": http,
        "websockets.legacy.client": http,
        "threading": threads,
        "concurrent.futures.thread": threads,
    }
    done = [name for name, wanted in chosen.items() if wanted and name in sys.modules]
    for name, patch in _TARGETS.items():
        if chosen[name] and name not in _armed:
            _armed.add(name)
            _hooks.when_imported(name, patch)
    return done


def uninstrument() -> None:
    """Put every patched attribute back exactly as it was and stop waiting for imports
    (idempotent)."""
    _armed.clear()
    _hooks.cancel_all()
    uninstrument_openai()
    uninstrument_anthropic()
    for name, undo in (
        ("http", "uninstrument_httpx"),
        ("http_aiohttp", "uninstrument_aiohttp"),
        ("http_client", "uninstrument_http_client"),
        ("llama_index", "uninstrument_llama_index"),
        ("threads", "uninstrument_threads"),
        ("mcp_tools", "uninstrument_mcp"),
        ("websocket_client", "uninstrument_websockets"),
        ("litellm_retries", "uninstrument_litellm"),
        ("dspy_engine", "uninstrument_dspy"),
    ):
        module = sys.modules.get(f"ampmeter.integrations.{name}")
        if module is not None:
            getattr(module, undo)()
    settings.capture_content = False
    settings.response_id_keys = False
    redact.configure(capture_content=False)


def is_instrumented() -> bool:
    """Whether :func:`instrument` is in effect (or an SDK was patched on its own)."""
    from ampmeter.integrations import anthropic as _anthropic
    from ampmeter.integrations import http as _http
    from ampmeter.integrations import openai as _openai

    return (
        bool(_armed)
        or _openai.is_instrumented()
        or _anthropic.is_instrumented()
        or (_http.is_instrumented())
    )


def set_default_context(context: ExecutionContext | None) -> None:
    """A context for SDK calls made where no context is current (e.g. threads of a program run
    under ``ampmeter run``); None removes it."""
    if context is not None and not isinstance(context, ExecutionContext):
        raise TypeError(
            f"context must be an ExecutionContext or None, got {type(context).__name__}"
        )
    settings.default_context = context
