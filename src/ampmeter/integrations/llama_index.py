"""LlamaIndex: streams belong to the context they were created in.

LlamaIndex's ``stream_chat()`` / ``astream_chat()`` (and ``stream_complete()``) return a generator
that sends its request only when first read, often after the ``with ExecutionContext()`` block
that created it has ended, or in another thread or task. When LlamaIndex hands such a generator
back (the end of its instrumentation span, still in the caller's context), the context current
there is remembered for it, and the request the generator sends (metered by the SDK patches or
the HTTP layer, as for any client) is metered against that context wherever it is read.
"""

from __future__ import annotations

import inspect
from types import ModuleType
from typing import Any

from ampmeter.context import current_context
from ampmeter.integrations.attach import remember_stream_origin

__all__ = ["instrument_llama_index", "uninstrument_llama_index"]

_handlers: list[tuple[Any, Any]] = []  # (dispatcher, span handler) added by instrument


def _span_handler_type() -> type:
    from llama_index.core.instrumentation.span import BaseSpan
    from llama_index.core.instrumentation.span_handlers import BaseSpanHandler

    class StreamOriginHandler(BaseSpanHandler[BaseSpan]):
        """Keeps no spans; remembers the creating context of each generator a span returns."""

        @classmethod
        def class_name(cls) -> str:
            return "AmpmeterStreamOrigin"

        def new_span(self, *args: Any, **kwargs: Any) -> None:
            return None

        def prepare_to_exit_span(self, *args: Any, result: Any = None, **kwargs: Any) -> None:
            if inspect.isgenerator(result) or inspect.isasyncgen(result):
                ctx = current_context()
                if ctx is not None:
                    remember_stream_origin(result, ctx)

        def prepare_to_drop_span(self, *args: Any, **kwargs: Any) -> None:
            return None

    return StreamOriginHandler


def instrument_llama_index(_module: ModuleType | None = None) -> None:
    """Add the stream-origin span handler to LlamaIndex's root dispatcher (idempotent)."""
    if _handlers:
        return
    from llama_index_instrumentation import get_dispatcher

    dispatcher = get_dispatcher()
    handler = _span_handler_type()()
    dispatcher.add_span_handler(handler)
    _handlers.append((dispatcher, handler))


def uninstrument_llama_index() -> None:
    """Remove the span handler (idempotent)."""
    while _handlers:
        dispatcher, handler = _handlers.pop()
        if handler in dispatcher.span_handlers:
            dispatcher.span_handlers.remove(handler)
