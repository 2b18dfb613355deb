"""Event logs: the TokenTracker v0 schema, JSONL reading rules and the stream logger."""

from ampmeter.logs.events import event_problem
from ampmeter.logs.reader import (
    JsonlError,
    JsonlReader,
    LogLineError,
    ReadSummary,
    SkippedLinesWarning,
    TruncatedLineWarning,
    iter_lines,
    read_jsonl,
)
from ampmeter.logs.schema import EventSchemaError, event_errors, load_schema, validate_event
from ampmeter.logs.stream import ProblemSink, StreamCumulativeMetrics, StreamMetricsLogger

__all__ = [
    "EventSchemaError",
    "JsonlError",
    "JsonlReader",
    "LogLineError",
    "ProblemSink",
    "ReadSummary",
    "SkippedLinesWarning",
    "StreamCumulativeMetrics",
    "StreamMetricsLogger",
    "TruncatedLineWarning",
    "event_errors",
    "event_problem",
    "iter_lines",
    "load_schema",
    "read_jsonl",
    "validate_event",
]
