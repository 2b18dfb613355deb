"""The call graph of one agent run: nodes, their lifecycle, and chain aggregates.

Every LLM call, tool call and system step is a :class:`Node`. Nodes hang under a single root and
move one way through ``created -> running -> success | fail | halt`` (or straight from ``created``
to ``fail``/``halt`` when a call is stopped before it is sent). Aggregates are kept up to date as
nodes end, so reading them never scans the graph.
"""

from __future__ import annotations

import gc
import math
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, Final

__all__ = [
    "KINDS",
    "META_CACHED_TOKENS",
    "META_CACHE_WRITE_TOKENS",
    "META_COMPONENT",
    "META_CONTEXT",
    "META_COST_STATUS",
    "META_PRICING_VERSION",
    "META_PROVIDER",
    "META_REASONING_TOKENS",
    "META_TOOL_CALLS_MADE",
    "STATUSES",
    "TERMINAL_STATUSES",
    "ExecutionGraph",
    "Node",
]

KINDS: Final = frozenset({"llm", "tool", "system", "embedding", "retrieval", "memory"})
STATUSES: Final = ("created", "running", "success", "fail", "halt")
TERMINAL_STATUSES: Final = frozenset({"success", "fail", "halt"})

# Metadata keys that ampmeter itself writes on nodes (usage without a field of its own).
META_CACHED_TOKENS: Final = "cached_tokens"  # input tokens read from a prompt cache (subset of in)
META_CACHE_WRITE_TOKENS: Final = "cache_write_tokens"  # input tokens written to a prompt cache
META_REASONING_TOKENS: Final = "reasoning_tokens"  # output tokens spent reasoning (subset of out)
META_TOOL_CALLS_MADE: Final = "tool_calls_made"  # tool calls requested in an LLM response
META_COST_STATUS: Final = "cost_status"  # "priced" | "given" | "unpriced" | "estimated"
META_PRICING_VERSION: Final = "pricing_version"  # version of the price table used
META_PROVIDER: Final = "provider"  # "openai", "anthropic", ...
META_CONTEXT: Final = "context"  # True on nodes that stand for a context (root, sub-agent)
META_COMPONENT: Final = "component"  # TokenTracker component (pipeline, auxiliary, ...)

_CREATED: Final = "created"
_RUNNING: Final = "running"
_INF: Final = math.inf
_time_ns = time.time_ns
# Past this many nodes a snapshot pauses the cyclic GC while it copies (see snapshot()).
_SNAPSHOT_GC_PAUSE_NODES: Final = 2_000


def _now_ms() -> int:
    return _time_ns() // 1_000_000


@dataclass(slots=True)
class Node:
    """One operation in a chain: an LLM call, a tool call or a system step.

    The fifteen fields of the execution-graph specification plus ``depth`` (root = 0). Usage
    that has no field of its own (cached and reasoning tokens, tool calls made, pricing status)
    lives in ``metadata``.
    """

    node_id: str
    parent_id: str | None
    kind: str
    name: str
    start_ts_ms: int
    end_ts_ms: int | None = None
    status: str = _CREATED
    model: str | None = None
    retries_used: int = 0
    cost_usd: float = 0.0
    tokens_in: int | None = None
    tokens_out: int | None = None
    stop_reason: str | None = None
    error_class: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    depth: int = 0

    @property
    def is_terminal(self) -> bool:
        """True once the node is ``success``, ``fail`` or ``halt``."""
        return self.status in TERMINAL_STATUSES

    @property
    def latency_ms(self) -> int | None:
        """Milliseconds from creation to the terminal transition, or None while open."""
        if self.end_ts_ms is None:
            return None
        return self.end_ts_ms - self.start_ts_ms

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serializable copy of the node's fields (metadata copied deeply)."""
        return {
            "node_id": self.node_id,
            "parent_id": self.parent_id,
            "kind": self.kind,
            "name": self.name,
            "start_ts_ms": self.start_ts_ms,
            "end_ts_ms": self.end_ts_ms,
            "status": self.status,
            "model": self.model,
            "retries_used": self.retries_used,
            "cost_usd": self.cost_usd,
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
            "stop_reason": self.stop_reason,
            "error_class": self.error_class,
            "metadata": _copy_metadata(self.metadata) if self.metadata else {},
            "depth": self.depth,
        }


def json_copy(value: Any) -> Any:
    """Deep-copy ``value`` into plain JSON types.

    Dicts, lists and tuples are copied; JSON scalars are kept; anything else (a datetime, an
    exception, a user object) becomes its ``str()``, so a snapshot always serializes.
    """
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {str(k): json_copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_copy(v) for v in value]
    return str(value)


_FLAT = frozenset({str, int, bool, type(None)})


def _copy_metadata(metadata: dict[str, Any]) -> dict[str, Any]:
    """``json_copy`` of a metadata dict, with a fast path for the usual flat str-keyed dict."""
    for key, value in metadata.items():
        kind = type(value)
        if type(key) is not str or (
            kind not in _FLAT and (kind is not float or not math.isfinite(value))
        ):
            copied: dict[str, Any] = json_copy(metadata)
            return copied
    return metadata.copy()


def check_cost(cost_usd: object, what: str = "cost_usd") -> float:
    """Return ``cost_usd`` as a float, or raise if it is not a finite, non-negative number."""
    if type(cost_usd) is not float:
        if isinstance(cost_usd, bool) or not isinstance(cost_usd, (int, float)):
            raise TypeError(f"{what} must be a number, got {type(cost_usd).__name__}")
        try:
            cost_usd = float(cost_usd)
        except OverflowError:
            raise ValueError(f"{what} must be a finite number >= 0, got {cost_usd!r}") from None
    if not 0.0 <= cost_usd < math.inf:
        raise ValueError(f"{what} must be a finite number >= 0, got {cost_usd!r}")
    return cost_usd


def _check_kind(kind: object) -> str:
    if not isinstance(kind, str):
        raise TypeError(f"kind must be a str, got {type(kind).__name__}")
    if kind not in KINDS:
        raise ValueError(f"unknown node kind {kind!r}; expected one of {sorted(KINDS)}")
    return kind


def check_tokens(tokens: object, what: str) -> int | None:
    """Return ``tokens`` (None or an int >= 0), or raise naming the bad argument."""
    if tokens is None:
        return None
    if type(tokens) is not int:
        if isinstance(tokens, bool) or not isinstance(tokens, int):
            raise TypeError(f"{what} must be an int or None, got {type(tokens).__name__}")
        tokens = int(tokens)
    if tokens < 0:
        raise ValueError(f"{what} must be >= 0, got {tokens}")
    return tokens


class ExecutionGraph:
    """A thread-safe call tree for one chain (agent run) with incrementally kept aggregates.

    ``chain_id`` defaults to a random UUID. ``max_nodes`` (0 = unbounded) caps how many nodes are
    kept in memory for long-running chains: past it, the oldest terminal non-root nodes are
    evicted, while the aggregates keep counting them. The root and open nodes are never evicted.
    """

    __slots__ = (
        "_evictable",
        "_in_flight",
        "_lock",
        "_max_depth",
        "_max_nodes",
        "_next_id",
        "_nodes",
        "_root_id",
        "_total_cost_usd",
        "_total_llm_calls",
        "_total_retries",
        "_total_tokens_in",
        "_total_tokens_out",
        "_total_tool_calls",
        "chain_id",
    )

    def __init__(self, chain_id: str | None = None, *, max_nodes: int = 0) -> None:
        if chain_id is not None and not isinstance(chain_id, str):
            raise TypeError(f"chain_id must be a str or None, got {type(chain_id).__name__}")
        if isinstance(max_nodes, bool) or not isinstance(max_nodes, int):
            raise TypeError(f"max_nodes must be an int, got {type(max_nodes).__name__}")
        max_nodes = int(max_nodes)
        if max_nodes < 0:
            raise ValueError(f"max_nodes must be >= 0 (0 = unbounded), got {max_nodes}")
        self.chain_id: str = chain_id if chain_id is not None else str(uuid.uuid4())
        self._lock = threading.Lock()
        self._nodes: dict[str, Node] = {}
        self._root_id: str | None = None
        self._next_id = 1
        self._max_nodes: int = max_nodes
        self._evictable: deque[str] = deque()
        self._total_cost_usd = 0.0
        self._total_llm_calls = 0
        self._total_tool_calls = 0
        self._total_retries = 0
        self._total_tokens_in = 0
        self._total_tokens_out = 0
        self._max_depth = 0
        self._in_flight = 0

    # -- structure --------------------------------------------------------------------------

    @property
    def root_id(self) -> str | None:
        """The root's node id, or None before :meth:`create_root`."""
        return self._root_id

    def __len__(self) -> int:
        return len(self._nodes)

    def create_root(self, name: str, metadata: dict[str, Any] | None = None) -> str:
        """Create the chain's single root (``kind="system"``, depth 0, status ``running``)."""
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {type(name).__name__}")
        meta = _own_metadata(metadata)
        with self._lock:
            if self._root_id is not None:
                raise RuntimeError(
                    f"graph {self.chain_id!r} already has a root ({self._root_id}); "
                    "a graph has exactly one root"
                )
            number = self._next_id
            self._next_id = number + 1
            node_id = f"n{number:06d}"
            self._nodes[node_id] = Node(
                node_id, None, "system", name, _now_ms(), status=_RUNNING, metadata=meta
            )
            self._root_id = node_id
        return node_id

    def begin_node(
        self,
        parent_id: str,
        kind: str,
        name: str,
        model: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> str:
        """Create a node under ``parent_id`` in status ``created`` and return its id."""
        return self._begin(parent_id, kind, name, model, metadata).node_id

    def _begin(
        self,
        parent_id: str,
        kind: str,
        name: str,
        model: str | None,
        metadata: dict[str, Any] | None,
    ) -> Node:
        """:meth:`begin_node`, returning the graph's own node (for contexts)."""
        # Hot path: the cheap exact-type tests run first, the full checks only when they fail.
        kind_ = kind if type(kind) is str and kind in KINDS else _check_kind(kind)
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {type(name).__name__}")
        if model is not None and not isinstance(model, str):
            raise TypeError(f"model must be a str or None, got {type(model).__name__}")
        if not isinstance(parent_id, str):
            raise TypeError(f"parent_id must be a str, got {type(parent_id).__name__}")
        meta = {} if metadata is None else _own_metadata(metadata)
        lock = self._lock
        lock.acquire()  # acquire/release costs half of a ``with`` block on this hot path
        try:
            nodes = self._nodes
            parent = nodes.get(parent_id)
            if parent is None:
                raise KeyError(self._unknown(parent_id, "parent_id"))
            depth = parent.depth + 1
            number = self._next_id
            self._next_id = number + 1
            node_id = "n" + str(number).zfill(6)
            node = Node(node_id, parent_id, kind_, name, _time_ns() // 1_000_000, None, _CREATED,
                        model, 0, 0.0, None, None, None, None, meta, depth)  # fmt: skip
            nodes[node_id] = node
            if depth > self._max_depth:
                self._max_depth = depth
            if self._max_nodes and len(nodes) > self._max_nodes:
                self._evict()
        finally:
            lock.release()
        return node

    # -- lifecycle --------------------------------------------------------------------------

    def mark_running(self, node_id: str) -> None:
        """Move a ``created`` node to ``running``; no change for running or terminal nodes."""
        lock = self._lock
        lock.acquire()
        try:
            node = self._get(node_id)
            if node.status == _CREATED:  # _run_locked, inlined: a step of every lifecycle
                node.status = _RUNNING
                if node.parent_id is not None:
                    self._in_flight += 1
        finally:
            lock.release()

    def _run_locked(self, node: Node) -> None:
        """:meth:`mark_running` for a caller that holds the lock and the graph's own node."""
        if node.status == _CREATED:
            node.status = _RUNNING
            if node.parent_id is not None:
                self._in_flight += 1

    def mark_success(
        self,
        node_id: str,
        cost_usd: float,
        tokens_in: int | None = None,
        tokens_out: int | None = None,
        *,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        """End a node as ``success`` with its cost and tokens; no change if already terminal.

        ``metadata`` (optional) is merged into the node's metadata in the same step.
        """
        # The most frequent call of a run: exact-type fast paths, full checks only on a miss.
        cost = (
            cost_usd if type(cost_usd) is float and 0.0 <= cost_usd < _INF else check_cost(cost_usd)
        )
        t_in = (
            tokens_in
            if tokens_in is None or (type(tokens_in) is int and tokens_in >= 0)
            else check_tokens(tokens_in, "tokens_in")
        )
        t_out = (
            tokens_out
            if tokens_out is None or (type(tokens_out) is int and tokens_out >= 0)
            else check_tokens(tokens_out, "tokens_out")
        )
        if metadata is not None and not isinstance(metadata, dict):
            raise TypeError(f"metadata must be a dict or None, got {type(metadata).__name__}")
        lock = self._lock
        lock.acquire()
        try:
            node = self._get(node_id)
            if (
                node.parent_id is None
                and (cost or t_in or t_out)
                and node.status not in TERMINAL_STATUSES
            ):
                raise ValueError("the root node carries no cost or tokens of its own")
            self._succeed_locked(node, cost, t_in, t_out, metadata)
        finally:
            lock.release()

    def _succeed_locked(
        self,
        node: Node,
        cost_usd: float,
        tokens_in: int | None,
        tokens_out: int | None,
        metadata: dict[str, Any] | None,
    ) -> None:
        """:meth:`mark_success` for a caller that holds the lock, with checked values."""
        previous = node.status
        if previous != _CREATED and previous != _RUNNING:
            return
        node.status = "success"
        end = _time_ns() // 1_000_000
        start = node.start_ts_ms
        # A node shorter than 1 ms shares its start's int object: 32 bytes less per node.
        node.end_ts_ms = start if end == start else end
        node.cost_usd = cost_usd
        node.tokens_in = tokens_in
        node.tokens_out = tokens_out
        if metadata:
            node.metadata.update(metadata)
        if node.parent_id is not None:
            self._count_end(node, previous, cost_usd, tokens_in, tokens_out)

    def mark_failure(
        self,
        node_id: str,
        error_class: str,
        stop_reason: str | None = None,
        *,
        cost_usd: float = 0.0,
        tokens_in: int | None = None,
        tokens_out: int | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        """End a node as ``fail`` (an error). ``cost_usd`` is for calls billed before failing."""
        if not isinstance(error_class, str):
            raise TypeError(f"error_class must be a str, got {type(error_class).__name__}")
        self._end(
            node_id, "fail", cost_usd, tokens_in, tokens_out, error_class, stop_reason, metadata
        )

    def mark_halt(
        self,
        node_id: str,
        stop_reason: str | None = None,
        *,
        cost_usd: float = 0.0,
        tokens_in: int | None = None,
        tokens_out: int | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        """End a node as ``halt`` (stopped by a policy such as a budget); no change if terminal."""
        self._end(node_id, "halt", cost_usd, tokens_in, tokens_out, None, stop_reason, metadata)

    def increment_retries(self, node_id: str) -> None:
        """Count one retry on a node; no change once the node is terminal."""
        with self._lock:
            node = self._get(node_id)
            if node.status not in TERMINAL_STATUSES:
                node.retries_used += 1

    def update_metadata(self, node_id: str, values: dict[str, Any]) -> None:
        """Merge ``values`` into an open node's metadata; no change once it is terminal."""
        if not isinstance(values, dict):
            raise TypeError(f"values must be a dict, got {type(values).__name__}")
        with self._lock:
            node = self._get(node_id)
            if node.status not in TERMINAL_STATUSES:
                node.metadata.update(values)

    def _end(
        self,
        node_id: str,
        status: str,
        cost_usd: object,
        tokens_in: object,
        tokens_out: object,
        error_class: str | None,
        stop_reason: object,
        metadata: object,
    ) -> None:
        cost = check_cost(cost_usd)
        t_in = check_tokens(tokens_in, "tokens_in")
        t_out = check_tokens(tokens_out, "tokens_out")
        if stop_reason is not None and not isinstance(stop_reason, str):
            raise TypeError(f"stop_reason must be a str or None, got {type(stop_reason).__name__}")
        if metadata is not None and not isinstance(metadata, dict):
            raise TypeError(f"metadata must be a dict or None, got {type(metadata).__name__}")
        with self._lock:
            node = self._get(node_id)
            previous = node.status
            if previous in TERMINAL_STATUSES:
                return
            is_root = node.parent_id is None
            if is_root and (cost or t_in or t_out):
                raise ValueError("the root node carries no cost or tokens of its own")
            node.status = status
            end = _now_ms()
            start = node.start_ts_ms
            node.end_ts_ms = start if end == start else end
            node.cost_usd = cost
            node.tokens_in = t_in
            node.tokens_out = t_out
            node.error_class = error_class
            node.stop_reason = stop_reason
            if metadata:
                node.metadata.update(metadata)
            if not is_root:
                self._count_end(node, previous, cost, t_in, t_out)

    def _count_end(
        self, node: Node, previous: str, cost: float, t_in: int | None, t_out: int | None
    ) -> None:
        """Fold a non-root node that just ended into the aggregates (called under the lock)."""
        if previous == _RUNNING:
            self._in_flight -= 1
        self._total_cost_usd += cost
        if node.retries_used:
            self._total_retries += node.retries_used
        if t_in:
            self._total_tokens_in += t_in
        if t_out:
            self._total_tokens_out += t_out
        kind = node.kind
        if kind == "llm":
            self._total_llm_calls += 1
        elif kind == "tool":
            self._total_tool_calls += 1
        if self._max_nodes:
            self._evictable.append(node.node_id)
            self._evict()

    def _evict(self) -> None:
        nodes = self._nodes
        evictable = self._evictable
        while len(nodes) > self._max_nodes and evictable:
            nodes.pop(evictable.popleft(), None)

    # -- reading ----------------------------------------------------------------------------

    def _get(self, node_id: str) -> Node:
        node = self._nodes.get(node_id) if isinstance(node_id, str) else None
        if node is None:
            raise KeyError(self._unknown(node_id, "node_id"))
        return node

    def _unknown(self, node_id: object, what: str) -> str:
        """The message for an id that is not in the graph; raises TypeError for a non-str id."""
        if not isinstance(node_id, str):
            raise TypeError(f"{what} must be a str, got {type(node_id).__name__}")
        if self._max_nodes > 0 and node_id.startswith("n"):
            return f"{what} {node_id!r} is not in graph {self.chain_id!r} (unknown or evicted)"
        return f"{what} {node_id!r} is not in graph {self.chain_id!r}"

    def _ref(self, node_id: str) -> Node:
        """The graph's own node object (for contexts and sinks: read-only once terminal)."""
        with self._lock:
            return self._get(node_id)

    def node(self, node_id: str) -> Node:
        """A copy of one node; changing it never changes the graph."""
        with self._lock:
            node = self._get(node_id)
            return replace(node, metadata=_copy_metadata(node.metadata) if node.metadata else {})

    def nodes(self) -> list[Node]:
        """Copies of all nodes kept in memory, in creation order."""
        with self._lock:
            return [
                replace(n, metadata=_copy_metadata(n.metadata) if n.metadata else {})
                for n in self._nodes.values()
            ]

    def aggregates(self) -> dict[str, Any]:
        """The chain aggregates (see :meth:`snapshot`), without the nodes."""
        with self._lock:
            return self._aggregates()

    def _aggregates(self) -> dict[str, Any]:
        divisor = 1.0  # one root per graph; the per-root fields stay floats, 0.0 before any call
        return {
            "total_cost_usd": self._total_cost_usd,
            "total_llm_calls": self._total_llm_calls,
            "total_tool_calls": self._total_tool_calls,
            "total_retries": self._total_retries,
            "total_tokens_in": self._total_tokens_in,
            "total_tokens_out": self._total_tokens_out,
            "max_depth": self._max_depth,
            "in_flight": self._in_flight,
            "llm_calls_per_root": self._total_llm_calls / divisor,
            "tool_calls_per_root": self._total_tool_calls / divisor,
            "retries_per_root": self._total_retries / divisor,
        }

    def snapshot(self) -> dict[str, Any]:
        """A JSON-serializable deep copy of the whole graph: nodes, aggregates and a timestamp."""
        # A snapshot allocates two dicts per node. On big graphs those allocations set off full
        # cyclic-GC passes over every live node mid-copy, which doubled the copy time; none of
        # the new dicts can form a cycle, so the collector is paused for the copy and restored.
        pause_gc = len(self._nodes) > _SNAPSHOT_GC_PAUSE_NODES and gc.isenabled()
        if pause_gc:
            gc.disable()
        try:
            with self._lock:
                nodes = {node_id: n.to_dict() for node_id, n in self._nodes.items()}
                aggregates = self._aggregates()
                root_id = self._root_id
        finally:
            if pause_gc:
                gc.enable()
        return {
            "chain_id": self.chain_id,
            "root_id": root_id,
            "nodes": nodes,
            "aggregates": aggregates,
            "snapshot_ts_ms": _now_ms(),
        }


def _own_metadata(metadata: dict[str, Any] | None) -> dict[str, Any]:
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise TypeError(f"metadata must be a dict or None, got {type(metadata).__name__}")
    return dict(metadata)
