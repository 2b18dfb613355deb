"""ampmeter: account for and contain LLM agent runs.

The public API is re-exported here; implementation modules may change without notice.
"""

from ampmeter import keys
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
    BudgetUnavailable,
    ExecutionCanceled,
    HookAbort,
    LimitExceeded,
)
from ampmeter.executor import CONTINUE, AgentLoop, ExecutionResult, Executor
from ampmeter.graph import ExecutionGraph, Node
from ampmeter.limits import ExceededLimit, Limit, LimitType, check_limits, default_limits
from ampmeter.stats import ExecutionStats
from ampmeter.trace import ModelCallTrace, ParseErrorTrace, ToolCallTrace

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
    "Limit",
    "LimitExceeded",
    "LimitType",
    "ModelCallTrace",
    "Node",
    "ParseErrorTrace",
    "TerminationReason",
    "ToolCallTrace",
    "WrapOptions",
    "check_limits",
    "current_context",
    "current_node_id",
    "default_limits",
    "keys",
]

__version__ = "0.1.0"
