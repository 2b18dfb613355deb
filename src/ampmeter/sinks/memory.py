"""A sink that keeps copies of finished nodes in memory (tests, notebooks, small runs)."""

from __future__ import annotations

import threading
from dataclasses import replace

from ampmeter.errors import SinkClosedError
from ampmeter.node import Node, json_copy
from ampmeter.sinks.base import Sink

__all__ = ["MemorySink"]


class MemorySink(Sink):
    """Keeps a copy of every node it receives, root included, in arrival order.

    Copies are taken at :meth:`emit`, so later changes to the emitted node never show here.
    Reading (:attr:`nodes`, :meth:`nodes_for`) still works after :meth:`close`; emitting does not.
    """

    __slots__ = ("_closed", "_lock", "_nodes")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nodes: list[tuple[Node, str]] = []  # (copy, chain id)
        self._closed = False

    def emit(self, node: Node, chain_id: str) -> None:
        """Store a copy of ``node`` (its metadata copied deeply) under ``chain_id``."""
        if not isinstance(node, Node):
            raise TypeError(f"node must be an ampmeter Node, got {type(node).__name__}")
        if not isinstance(chain_id, str):
            raise TypeError(f"chain_id must be a str, got {type(chain_id).__name__}")
        copy = replace(node, metadata=json_copy(node.metadata) if node.metadata else {})
        with self._lock:
            if self._closed:
                raise SinkClosedError("MemorySink is closed; create a new sink to keep more nodes")
            self._nodes.append((copy, chain_id))

    @property
    def nodes(self) -> list[Node]:
        """The stored nodes in arrival order (a new list each time; the nodes are the copies)."""
        with self._lock:
            return [node for node, _ in self._nodes]

    def nodes_for(self, chain_id: str) -> list[Node]:
        """The stored nodes of one chain, in arrival order."""
        with self._lock:
            return [node for node, chain in self._nodes if chain == chain_id]

    def clear(self) -> None:
        """Forget every stored node."""
        with self._lock:
            self._nodes.clear()

    def __len__(self) -> int:
        return len(self._nodes)

    def close(self) -> None:
        """Refuse further nodes; the stored ones stay readable."""
        with self._lock:
            self._closed = True
