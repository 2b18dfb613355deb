"""ampmeter: account for and contain LLM agent runs.

The public API is re-exported here; implementation modules may change without notice.
"""

from ampmeter import keys, pricing
from ampmeter.context import (
    Call,
    Decision,
    ExecutionContext,
    TerminationReason,
    WrapOptions,
    current_context,
    current_node_id,
    use_pricing,
)
from ampmeter.errors import (
    AmpmeterError,
    BudgetUnavailable,
    ExecutionCanceled,
    HookAbort,
    LimitExceeded,
    find_limit_exceeded,
)
from ampmeter.executor import CONTINUE, AgentLoop, ExecutionResult, Executor
from ampmeter.graph import ExecutionGraph, Node
from ampmeter.integrations import (
    instrument,
    instrument_anthropic,
    instrument_openai,
    uninstrument,
)
from ampmeter.ledgers import InMemoryLedger, Ledger, LedgerUnavailable, Reservation
from ampmeter.limits import ExceededLimit, Limit, LimitType, check_limits, default_limits
from ampmeter.logs import (
    JsonlError,
    StreamCumulativeMetrics,
    StreamMetricsLogger,
    event_errors,
    read_jsonl,
    validate_event,
)
from ampmeter.metrics import LLMCallMetrics, TaskResult
from ampmeter.pricing import PriceResult, clear_prices, estimate, price, remove_price, set_price
from ampmeter.sinks import JsonlSink, MemorySink, Sink, SinkClosedError, SinkWriteError
from ampmeter.stats import ExecutionStats
from ampmeter.trace import ModelCallTrace, ParseErrorTrace, ToolCallTrace

# Calls recorded without a cost are priced from the genai-prices table (imported on first use).
use_pricing(pricing)

__all__ = [
    "CONTINUE",
    "AgentLoop",
    "AmpmeterError",
    "BudgetUnavailable",
    "Call",
    "Decision",
    "ExceededLimit",
    "ExecutionCanceled",
    "ExecutionContext",
    "ExecutionGraph",
    "ExecutionResult",
    "ExecutionStats",
    "Executor",
    "HookAbort",
    "InMemoryLedger",
    "JsonlError",
    "JsonlSink",
    "LLMCallMetrics",
    "Ledger",
    "LedgerUnavailable",
    "Limit",
    "LimitExceeded",
    "LimitType",
    "MemorySink",
    "ModelCallTrace",
    "Node",
    "ParseErrorTrace",
    "PriceResult",
    "Reservation",
    "Sink",
    "SinkClosedError",
    "SinkWriteError",
    "StreamCumulativeMetrics",
    "StreamMetricsLogger",
    "TaskResult",
    "TerminationReason",
    "ToolCallTrace",
    "WrapOptions",
    "check_limits",
    "clear_prices",
    "current_context",
    "current_node_id",
    "default_limits",
    "estimate",
    "event_errors",
    "find_limit_exceeded",
    "instrument",
    "instrument_anthropic",
    "instrument_openai",
    "keys",
    "price",
    "pricing",
    "read_jsonl",
    "remove_price",
    "set_price",
    "uninstrument",
    "use_pricing",
    "validate_event",
]

__version__ = "0.1.0"
