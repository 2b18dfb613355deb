"""ampmeter: account for and contain LLM agent runs.

The public API is re-exported here; implementation modules may change without notice.
"""

from ampmeter import keys, pricing, propagation
from ampmeter.context import (
    Call,
    Decision,
    ExecutionContext,
    TerminationReason,
    WrapOptions,
    current_context,
    current_node_id,
)
from ampmeter.errors import (
    AmpmeterError,
    AnalysisError,
    BudgetBusy,
    BudgetUnavailable,
    EventSchemaError,
    ExecutionCanceled,
    HandoffError,
    HookAbort,
    JsonlError,
    LimitExceeded,
    LogLineError,
    SinkClosedError,
    SinkWriteError,
    StreamAbandoned,
)
from ampmeter.executor import CONTINUE, AgentLoop, ExecutionResult, Executor
from ampmeter.graph import ExecutionGraph, Node
from ampmeter.integrations import (
    instrument,
    instrument_anthropic,
    instrument_openai,
    set_default_context,
    uninstrument,
)
from ampmeter.ledgers import InMemoryLedger, Ledger, Reservation, SqliteLedger
from ampmeter.limits import ExceededLimit, Limit, LimitType, check_limits, default_limits
from ampmeter.logs import (
    StreamCumulativeMetrics,
    StreamMetricsLogger,
    event_errors,
    read_jsonl,
    validate_event,
)
from ampmeter.metrics import LLMCallMetrics, TaskResult
from ampmeter.pricing import PriceResult, clear_prices, estimate, price, remove_price, set_price
from ampmeter.sinks import JsonlSink, MemorySink, Sink
from ampmeter.stats import ExecutionStats
from ampmeter.trace import ModelCallTrace, ParseErrorTrace, ToolCallTrace
from ampmeter.usage import Usage

__all__ = [
    "CONTINUE",
    "AgentLoop",
    "AmpmeterError",
    "AnalysisError",
    "BudgetBusy",
    "BudgetUnavailable",
    "Call",
    "Decision",
    "EventSchemaError",
    "ExceededLimit",
    "ExecutionCanceled",
    "ExecutionContext",
    "ExecutionGraph",
    "ExecutionResult",
    "ExecutionStats",
    "Executor",
    "HandoffError",
    "HookAbort",
    "InMemoryLedger",
    "JsonlError",
    "JsonlSink",
    "LLMCallMetrics",
    "Ledger",
    "Limit",
    "LimitExceeded",
    "LimitType",
    "LogLineError",
    "MemorySink",
    "ModelCallTrace",
    "Node",
    "ParseErrorTrace",
    "PriceResult",
    "Reservation",
    "Sink",
    "SinkClosedError",
    "SinkWriteError",
    "SqliteLedger",
    "StreamAbandoned",
    "StreamCumulativeMetrics",
    "StreamMetricsLogger",
    "TaskResult",
    "TerminationReason",
    "ToolCallTrace",
    "Usage",
    "WrapOptions",
    "check_limits",
    "clear_prices",
    "current_context",
    "current_node_id",
    "default_limits",
    "estimate",
    "event_errors",
    "instrument",
    "instrument_anthropic",
    "instrument_openai",
    "keys",
    "price",
    "pricing",
    "propagation",
    "read_jsonl",
    "remove_price",
    "set_default_context",
    "set_price",
    "uninstrument",
    "validate_event",
]

__version__ = "0.1.0"
