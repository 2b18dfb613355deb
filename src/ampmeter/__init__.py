"""ampmeter: account for and contain LLM agent runs.

The public API is re-exported here (``__all__``: what a user needs); implementation modules may
change without notice. Wiring (``ampmeter.keys``, ``ampmeter.pricing``, ``ampmeter.propagation``,
``ampmeter.ledgers.Reservation``, ``ampmeter._core.usage.Usage``) is imported by its path. The
accounting core is imported with the package; everything else (pricing, sinks, logs, ledgers,
integrations, metrics) is imported the first time one of its names is used, so ``import
ampmeter`` stays cheap for programs that only meter.
"""

from typing import TYPE_CHECKING

from ampmeter._lazy import lazy_names
from ampmeter.budget import Budget
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
    StreamOutlivedContext,
    find_limit_exceeded,
)
from ampmeter.executor import CONTINUE, AgentLoop, ExecutionResult, Executor
from ampmeter.graph import ExecutionGraph
from ampmeter.limits import ExceededLimit, Limit, LimitType, default_limits
from ampmeter.node import Node
from ampmeter.policies import LimitEvent, Policies, final_call
from ampmeter.sinks.base import Sink
from ampmeter.stats import ExecutionStats, check_limits
from ampmeter.trace import ModelCallTrace, ParseErrorTrace, ToolCallTrace

if TYPE_CHECKING:
    from ampmeter.integrations import (
        instrument,
        instrument_anthropic,
        instrument_openai,
        set_default_context,
        uninstrument,
    )
    from ampmeter.ledgers import InMemoryLedger, Ledger, SqliteLedger
    from ampmeter.logs import (
        StreamCumulativeMetrics,
        StreamMetricsLogger,
        event_errors,
        read_jsonl,
        validate_event,
    )
    from ampmeter.metrics import LLMCallMetrics, TaskResult
    from ampmeter.pricing import (
        PriceResult,
        clear_prices,
        estimate,
        price,
        remove_price,
        set_price,
        set_tool_price,
    )
    from ampmeter.sinks import JsonlSink, MemorySink, WebhookSink

# Each module's names, imported on first use (PEP 562). The wiring modules (out of __all__)
# are reachable as attributes, as a submodule import makes them.
_LAZY_NAMES = {
    "ampmeter.pricing": (
        "pricing",
        "PriceResult",
        "clear_prices",
        "estimate",
        "price",
        "remove_price",
        "set_price",
        "set_tool_price",
    ),
    "ampmeter.propagation": ("propagation",),
    "ampmeter.integrations": (
        "instrument",
        "instrument_anthropic",
        "instrument_openai",
        "set_default_context",
        "uninstrument",
    ),
    "ampmeter.ledgers": ("InMemoryLedger", "Ledger", "SqliteLedger"),
    "ampmeter.logs": (
        "StreamCumulativeMetrics",
        "StreamMetricsLogger",
        "event_errors",
        "read_jsonl",
        "validate_event",
    ),
    "ampmeter.metrics": ("LLMCallMetrics", "TaskResult"),
    "ampmeter.sinks": ("JsonlSink", "MemorySink", "WebhookSink"),
}
_LAZY = {name: module for module, names in _LAZY_NAMES.items() for name in names}


__getattr__ = lazy_names(__name__, _LAZY)


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "CONTINUE",
    "AgentLoop",
    "AmpmeterError",
    "AnalysisError",
    "Budget",
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
    "LimitEvent",
    "LimitExceeded",
    "LimitType",
    "LogLineError",
    "MemorySink",
    "ModelCallTrace",
    "Node",
    "ParseErrorTrace",
    "Policies",
    "PriceResult",
    "Sink",
    "SinkClosedError",
    "SinkWriteError",
    "SqliteLedger",
    "StreamAbandoned",
    "StreamCumulativeMetrics",
    "StreamMetricsLogger",
    "StreamOutlivedContext",
    "TaskResult",
    "TerminationReason",
    "ToolCallTrace",
    "WebhookSink",
    "WrapOptions",
    "check_limits",
    "clear_prices",
    "current_context",
    "current_node_id",
    "default_limits",
    "estimate",
    "event_errors",
    "final_call",
    "find_limit_exceeded",
    "instrument",
    "instrument_anthropic",
    "instrument_openai",
    "price",
    "read_jsonl",
    "remove_price",
    "set_default_context",
    "set_price",
    "set_tool_price",
    "uninstrument",
    "validate_event",
]

__version__ = "0.1.0"
