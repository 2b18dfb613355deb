"""Instrumentation: every LLM request made inside a context becomes a node (``llm``, or
``embedding`` for an embeddings request); docs/integrations.md says what each library meters.

The ``openai`` and ``anthropic`` SDKs are metered at their clients' one door
(:mod:`ampmeter.integrations.sdk`), any other client that speaks a known wire format at the HTTP
layer (:mod:`ampmeter.integrations.http`): a request is metered once, by the first layer that
sees it. No API key, header or (unless ``capture_content=True``) prompt or response text is
put on a node; a failed call's error text is scrubbed by :mod:`ampmeter.redact`.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
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


@dataclass(frozen=True, slots=True)
class Integration:
    """One integration: the library module whose import patches it, the :func:`instrument`
    switches that turn it on (any of them), and its patch and undo, each ``"module:function"``
    (the module is imported only when the library is: a program pays nothing for libraries it
    does not use). A new provider is its own module and one row of :data:`INTEGRATIONS`."""

    trigger: str
    switches: tuple[str, ...]
    patch: str  # called with the imported library module
    undo: str  # called with nothing; idempotent

    def arm(self, module: ModuleType) -> None:
        """Patch the library ``module`` (imported now)."""
        _resolve(self.patch)(module)


def _resolve(target: str) -> Callable[..., object]:
    """The function ``"module:function"`` names."""
    module, _, name = target.partition(":")
    function: Callable[..., object] = getattr(importlib.import_module(module), name)
    return function


def _row(trigger: str, switches: str, patch: str, undo: str = "") -> Integration:
    """A row whose patch is ``"module:function"`` in this package; its undo is the module's
    ``un``-prefixed function unless named."""
    module, _, function = patch.partition(":")
    where = f"ampmeter.integrations.{module}"
    return Integration(
        trigger,
        tuple(switches.split()),
        f"{where}:{function}",
        f"{where}:{undo or 'un' + function}",
    )


# Every integration, in the order instrument() arms them.
INTEGRATIONS: tuple[Integration, ...] = (
    _row("openai", "openai", "openai:instrument_openai"),
    _row("anthropic", "anthropic", "anthropic:instrument_anthropic"),
    _row("httpx", "http", "http:instrument_httpx"),
    _row("httpx2", "http", "http:instrument_httpx"),
    _row("aiohttp", "http", "http_aiohttp:instrument_aiohttp"),
    _row("http.client", "http", "http_client:instrument_http_client"),
    _row("botocore.httpsession", "http", "botocore_stops:instrument_botocore"),
    _row("urllib3", "http", "http_client:instrument_urllib3", "uninstrument_http_client"),
    _row("llama_index.core", "llama_index", "llama_index:instrument_llama_index"),
    _row("mcp", "mcp", "mcp_tools:instrument_mcp"),
    _row("litellm", "openai http", "litellm_retries:instrument_litellm"),
    _row("dspy.clients.engines.lm15_engine", "http", "dspy_engine:instrument_dspy"),
    _row("websockets", "openai http", "websocket_client:instrument_websockets"),
    _row(
        "websockets.legacy.client",
        "openai http",
        "websocket_client:instrument_websockets_legacy",
        "uninstrument_websockets",
    ),
    _row("threading", "threads", "threads:instrument_threads"),
    _row(
        "concurrent.futures.thread",
        "threads",
        "threads:instrument_thread_pools",
        "uninstrument_threads",
    ),
)
_armed: set[str] = set()  # the triggers instrument() patches (now, or when imported)


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
    httpx2, aiohttp and ``http.client``, which ``urllib`` and ``requests`` use) whenever they
    are imported; idempotent. docs/integrations.md says what each library meters. With
    ``openai`` or ``http``: the Responses WebSocket protocol over the ``websockets`` clients,
    and LiteLLM's own ``num_retries`` gives a budget stop back instead of retrying it; with
    ``http``: DSPy's native engine. ``llama_index``: lazy streams are metered against the
    context they were created in; ``threads``: work submitted to a ``ThreadPoolExecutor`` or
    started as a ``threading.Thread`` runs in the submitter's context; ``mcp``: each MCP tool
    call is a ``tool`` node.

    A library already imported is patched at once, the others right after their own import.
    Returns the names patched now. ``capture_content=True`` also stores the prompt and response
    text on each node (off: logs hold no conversation text, and a provider error's message, which
    may echo the prompt, is withheld). ``response_id_keys=True`` keys a call by its response's id,
    endpoint and usage, for a caching gateway that delivers one stored response again (by
    default a repeated id is another billed call). Calling ``instrument`` again only updates
    these two settings.
    """
    if not isinstance(response_id_keys, bool):
        raise TypeError(f"response_id_keys must be a bool, got {type(response_id_keys).__name__}")
    redact.configure(capture_content=capture_content)  # first: it refuses a value not a bool
    settings.capture_content = capture_content
    settings.response_id_keys = response_id_keys
    settings.marker = Marker.from_env()
    switches = {
        "openai": openai,
        "anthropic": anthropic,
        "http": http,
        "llama_index": llama_index,
        "threads": threads,
        "mcp": mcp,
    }
    chosen = [row for row in INTEGRATIONS if any(switches[name] for name in row.switches)]
    done = [row.trigger for row in chosen if row.trigger in sys.modules]
    for row in chosen:
        if row.trigger not in _armed:
            _armed.add(row.trigger)
            _hooks.when_imported(row.trigger, row.arm)
    return done


def uninstrument() -> None:
    """Put every patched attribute back exactly as it was and stop waiting for imports
    (idempotent)."""
    _armed.clear()
    _hooks.cancel_all()
    for undo in dict.fromkeys(row.undo for row in INTEGRATIONS):
        if undo.partition(":")[0] in sys.modules:  # never imported: nothing was patched
            _resolve(undo)()
    settings.capture_content = False
    settings.response_id_keys = False
    redact.configure(capture_content=False)


def is_instrumented() -> bool:
    """Whether :func:`instrument` is in effect (or an SDK was patched on its own)."""
    modules = (sys.modules.get(row.patch.partition(":")[0]) for row in INTEGRATIONS)
    probes = (getattr(module, "is_instrumented", None) for module in modules)
    return bool(_armed) or any(probe is not None and probe() for probe in probes)


def set_default_context(context: ExecutionContext | None) -> None:
    """A context for SDK calls made where no context is current (e.g. threads of a program run
    under ``ampmeter run``); None removes it."""
    if context is not None and not isinstance(context, ExecutionContext):
        raise TypeError(
            f"context must be an ExecutionContext or None, got {type(context).__name__}"
        )
    settings.default_context = context
