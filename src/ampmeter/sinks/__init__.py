"""Sinks: where finished nodes go (memory, TokenTracker JSONL, OpenTelemetry)."""

from ampmeter.sinks.base import Sink

__all__ = ["Sink"]
