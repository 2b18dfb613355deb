"""The sink interface: where finished nodes go."""

from __future__ import annotations

from ampmeter._scoped import Closeable
from ampmeter.node import Node

__all__ = ["Sink"]


class Sink(Closeable):
    """Receives every node of a run when it reaches a terminal status.

    Contexts call :meth:`emit` right after a node ends (and with the root when the context
    closes), passing the graph's own node object: sinks must treat it as read-only and must not
    keep a reference they later mutate. :meth:`flush` is called when a context closes; whoever
    created a sink closes it (one sink may serve many contexts). Sinks are context managers.
    """

    def emit(self, node: Node, chain_id: str) -> None:
        """Take one terminal node of chain ``chain_id``."""
        raise NotImplementedError

    def flush(self) -> None:
        """Push out anything buffered; raise ``OSError`` if earlier writes failed."""

    def close(self) -> None:
        """Flush and release resources; further :meth:`emit` calls are errors."""
