"""The graph's nodes, their ids and metadata, and the aggregates kept as they end: the base of
the :class:`~ampmeter._core.kernel.Kernel`, which adds stats, calls in flight, the limit check."""

from __future__ import annotations

import itertools
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar

from ampmeter import money
from ampmeter._core.outcome import Ending, Outcome
from ampmeter.node import ROOT_NODE_ID, TERMINAL_STATUSES, Node

__all__ = ["NodeTable", "now_ms"]

_CREATED: Final = "created"
_RUNNING: Final = "running"
_NS_PER_MS: Final = 1_000_000
_T = TypeVar("_T")


def now_ms() -> int:
    """Milliseconds since the epoch."""
    return time.time_ns() // _NS_PER_MS


class NodeTable:
    """The nodes of one graph and its aggregates, behind one lock taken only with ``with``."""

    __slots__ = (
        "_evictable",
        "_in_flight",
        "_lock",
        "_max_depth",
        "_max_nodes",
        "_nodes",
        "_numbers",
        "_total_cost_usd",
        "_total_llm_calls",
        "_total_retries",
        "_total_tokens_in",
        "_total_tokens_out",
        "_total_tool_calls",
        "_unstarted",
        "chain_id",
    )

    def __init__(self, chain_id: str, max_nodes: int = 0) -> None:
        self.chain_id = chain_id
        self._lock = threading.Lock()
        self._nodes: dict[str, Node] = {}
        self._numbers = itertools.count(2)  # the numbers of the nodes begun under the root
        self._max_nodes = max_nodes
        self._evictable: deque[str] = deque()
        # node id -> its owner, for calls made and not yet admitted: one whose owner is gone
        # (interrupted before it started) is ended by the next sweep.
        self._unstarted: dict[str, Callable[[], Any]] = {}
        self._total_cost_usd = 0  # nano-dollars
        self._total_llm_calls = 0
        self._total_tool_calls = 0
        self._total_retries = 0
        self._total_tokens_in = 0
        self._total_tokens_out = 0
        self._max_depth = 0
        self._in_flight = 0

    @property
    def root_id(self) -> str | None:
        """The root's node id, or None before :meth:`create_root`."""
        return ROOT_NODE_ID if ROOT_NODE_ID in self._nodes else None

    def number_from(self, number: int) -> None:
        """Number the next node ``number`` (tests reach long ids without a million nodes)."""
        with self._lock:
            self._numbers = itertools.count(number)

    def node_count(self) -> int:
        """How many nodes are kept in memory."""
        return len(self._nodes)

    def create_root(self, name: str, metadata: dict[str, Any]) -> Node:
        """Make the single root (``system``, depth 0, ``running``); RuntimeError if one exists."""
        start = now_ms()
        with self._lock:
            if ROOT_NODE_ID in self._nodes:
                raise RuntimeError(
                    f"graph {self.chain_id!r} already has a root ({ROOT_NODE_ID}); "
                    "a graph has exactly one root"
                )
            node = Node(
                ROOT_NODE_ID, None, "system", name, start, status=_RUNNING, metadata=metadata
            )
            self._nodes[ROOT_NODE_ID] = node
        return node

    def begin(
        self,
        parent_id: str,
        kind: str,
        name: str,
        model: str | None,
        metadata: dict[str, Any],
        owner: object | None = None,
    ) -> Node:
        """Make a ``created`` node under ``parent_id``: KeyError naming an unknown parent,
        TypeError for an id that is no str. With an ``owner`` (a call), the node ends as
        ``halt`` if the owner is dropped before the call is admitted or ended."""
        with self._lock:
            try:
                depth = self._nodes[parent_id].depth + 1
            except (KeyError, TypeError):  # (TypeError: an unhashable id)
                raise self._missing(parent_id, "parent_id") from None
            node = Node(
                "n" + str(next(self._numbers)).zfill(6),
                parent_id,
                kind,
                name,
                time.time_ns() // _NS_PER_MS,
                model=model,
                metadata=metadata,
                depth=depth,
            )
            self._nodes[node.node_id] = node
            if owner is not None:
                self._unstarted[node.node_id] = weakref.ref(owner)
            if depth > self._max_depth:
                self._max_depth = depth
            if self._max_nodes and len(self._nodes) > self._max_nodes:
                self._evict()
        return node

    def node(self, node_id: str) -> Node:
        """The kernel's own node object, for the facade to pass back in: KeyError naming the id
        when unknown or evicted, TypeError when it is no str. Never handed to users: they get
        :meth:`copy`."""
        try:
            return self._nodes[node_id]
        except (KeyError, TypeError):  # (TypeError: an unhashable id)
            raise self._missing(node_id, "node_id") from None

    def _missing(self, node_id: object, what: str) -> Exception:
        # A lookup is the check of an id: one that is no str is never found, and only then is
        # its type looked at, to say which error it is.
        if not isinstance(node_id, str):
            return TypeError(f"{what} must be a str, got {type(node_id).__name__}")
        evicted = " (unknown or evicted)" if self._max_nodes and node_id.startswith("n") else ""
        return KeyError(f"{what} {node_id!r} is not in graph {self.chain_id!r}{evicted}")

    def copy(self, node_id: str, copier: Callable[[Node], _T]) -> _T:
        """``copier`` applied to one node under the lock (a copy a user may keep)."""
        with self._lock:
            return copier(self.node(node_id))

    def copy_all(self, copier: Callable[[Node], _T]) -> tuple[str | None, dict[str, _T]]:
        """The root id and ``copier`` applied to every node kept, under the lock."""
        with self._lock:
            return self.root_id, {node_id: copier(n) for node_id, n in self._nodes.items()}

    def run(self, node: Node) -> None:
        """``created`` -> ``running``; no change otherwise (the root runs from the start)."""
        with self._lock:
            if node.status == _CREATED:
                node.status = _RUNNING
                self._in_flight += 1

    def end(self, node: Node, outcome: Outcome) -> bool:
        """End an open node; False (and no change) if it had ended already."""
        with self._lock:
            if node.status in TERMINAL_STATUSES:
                return False
            self._end_locked(node, outcome)
        return True

    def _end_locked(self, node: Node, outcome: Ending) -> None:
        # Plain assignments and additions from the clock read to the metadata merge: an
        # interrupt, which CPython raises only at calls and loop back-edges, cannot land between
        # them. The outcome's fields are, in order, the node's.
        if self._unstarted:  # (an admitted call left it when it was admitted)
            self._unstarted.pop(node.node_id, None)
        previous = node.status
        # A wall clock set back during the call (an NTP step) must not end it before it began:
        # a negative latency makes its log line one no reader takes, dropping its cost.
        now = time.time_ns() // _NS_PER_MS
        node.end_ts_ms = now if now >= node.start_ts_ms else node.start_ts_ms
        (
            node.status,
            node.cost_nano,
            node.tokens_in,
            node.tokens_out,
            node.error_class,
            node.stop_reason,
            metadata,
        ) = outcome
        if node.parent_id is not None:
            if previous == _RUNNING:
                self._in_flight -= 1
            self._total_cost_usd += node.cost_nano
            if node.retries_used:  # (most nodes never retry)
                self._total_retries += node.retries_used
            self._total_tokens_in += node.tokens_in or 0
            self._total_tokens_out += node.tokens_out or 0
            kind = node.kind
            if kind == "llm":
                self._total_llm_calls += 1
            elif kind == "tool":
                self._total_tool_calls += 1
        if metadata:
            node.metadata.update(metadata)
        if self._max_nodes and node.parent_id is not None:
            self._evictable.append(node.node_id)
            self._evict()

    def _evict(self) -> None:
        nodes, evictable = self._nodes, self._evictable
        while len(nodes) > self._max_nodes and evictable:
            nodes.pop(evictable.popleft(), None)

    def update(self, node_id: str, values: Mapping[str, Any]) -> None:
        """Merge ``values`` into an open node's metadata (KeyError naming an unknown id)."""
        with self._lock:
            node = self.node(node_id)
            if node.status not in TERMINAL_STATUSES:
                node.metadata.update(values)

    def append_metadata(self, node: Node, key: str, values: list[Any]) -> None:
        """Add ``values`` to the list under ``key`` in a node's metadata (also once it ended:
        what its settlement reported, before sinks see it)."""
        with self._lock:
            node.metadata[key] = [*node.metadata.get(key, ()), *values]

    def add_handed_off(
        self, llm_calls: int, tool_calls: int, tokens_in: int, tokens_out: int, cost: Any
    ) -> None:
        """Count in the aggregates what a handed-off child (another process) spent: its calls
        are no nodes of this graph, yet the chain's totals include them."""
        with self._lock:
            self._total_llm_calls += llm_calls
            self._total_tool_calls += tool_calls
            self._total_tokens_in += tokens_in
            self._total_tokens_out += tokens_out
            self._total_cost_usd += cost

    def aggregates(self) -> dict[str, Any]:
        """The chain aggregates (see :meth:`ampmeter.ExecutionGraph.snapshot`)."""
        with self._lock:
            return {
                "total_cost_usd": money.from_nano(self._total_cost_usd),
                "total_llm_calls": self._total_llm_calls,
                "total_tool_calls": self._total_tool_calls,
                "total_retries": self._total_retries,
                "total_tokens_in": self._total_tokens_in,
                "total_tokens_out": self._total_tokens_out,
                "max_depth": self._max_depth,
                "in_flight": self._in_flight,
                # one root per graph; the per-root fields stay floats
                "llm_calls_per_root": float(self._total_llm_calls),
                "tool_calls_per_root": float(self._total_tool_calls),
                "retries_per_root": float(self._total_retries),
            }
