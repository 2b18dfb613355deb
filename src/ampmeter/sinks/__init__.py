"""Sinks: where finished nodes go (memory, TokenTracker JSONL, OpenTelemetry).

``OtelSink`` needs the ``ampmeter[otel]`` extra and is imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ampmeter.sinks.base import Sink
from ampmeter.sinks.jsonl import (
    COMPONENTS,
    EVENT_TYPES,
    JsonlSink,
    SinkClosedError,
    SinkWriteError,
    node_to_event,
)
from ampmeter.sinks.memory import MemorySink

if TYPE_CHECKING:
    from ampmeter.sinks.otel import OtelSink

__all__ = [
    "COMPONENTS",
    "EVENT_TYPES",
    "JsonlSink",
    "MemorySink",
    "OtelSink",
    "Sink",
    "SinkClosedError",
    "SinkWriteError",
    "node_to_event",
]


def __getattr__(name: str) -> Any:
    if name == "OtelSink":
        from ampmeter.sinks.otel import OtelSink

        return OtelSink
    raise AttributeError(f"module 'ampmeter.sinks' has no attribute {name!r}")
