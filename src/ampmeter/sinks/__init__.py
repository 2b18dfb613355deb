"""Sinks: where finished nodes go (memory, TokenTracker JSONL, OpenTelemetry, webhooks).

Each sink module is imported on first use (``OtelSink`` needs the ``ampmeter[otel]`` extra).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ampmeter._lazy import lazy_names
from ampmeter.errors import SinkClosedError, SinkWriteError
from ampmeter.sinks.base import Sink

if TYPE_CHECKING:
    from ampmeter.sinks.jsonl import COMPONENTS, EVENT_TYPES, JsonlSink, node_to_event
    from ampmeter.sinks.memory import MemorySink
    from ampmeter.sinks.otel import OtelSink
    from ampmeter.sinks.webhook import WebhookSink

_LAZY = {
    **dict.fromkeys(
        ("COMPONENTS", "EVENT_TYPES", "JsonlSink", "node_to_event"), "ampmeter.sinks.jsonl"
    ),
    "MemorySink": "ampmeter.sinks.memory",
    "OtelSink": "ampmeter.sinks.otel",
    "WebhookSink": "ampmeter.sinks.webhook",
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


__getattr__ = lazy_names(__name__, _LAZY)
