"""Sinks: where finished nodes go (memory, TokenTracker JSONL, OpenTelemetry, webhooks).

Each sink module is imported on first use (``OtelSink`` needs the ``ampmeter[otel]`` extra).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ampmeter.errors import SinkClosedError, SinkWriteError
from ampmeter.sinks.base import Sink

if TYPE_CHECKING:
    from ampmeter.sinks.jsonl import COMPONENTS, EVENT_TYPES, JsonlSink, node_to_event
    from ampmeter.sinks.memory import MemorySink
    from ampmeter.sinks.otel import OtelSink
    from ampmeter.sinks.webhook import WebhookSink

_LAZY = {
    **dict.fromkeys(("COMPONENTS", "EVENT_TYPES", "JsonlSink", "node_to_event"), "jsonl"),
    "MemorySink": "memory",
    "OtelSink": "otel",
    "WebhookSink": "webhook",
}

__all__ = [
    "COMPONENTS",
    "EVENT_TYPES",
    "JsonlSink",
    "MemorySink",
    "OtelSink",
    "Sink",
    "SinkClosedError",
    "SinkWriteError",
    "WebhookSink",
    "node_to_event",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ampmeter.sinks' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"ampmeter.sinks.{module}"), name)
    globals()[name] = value
    return value
