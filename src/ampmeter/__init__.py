"""ampmeter: account for and contain LLM agent runs.

The public API is re-exported here; implementation modules may change without notice.
"""

from ampmeter.graph import ExecutionGraph, Node

__all__ = [
    "ExecutionGraph",
    "Node",
]

__version__ = "0.1.0"
