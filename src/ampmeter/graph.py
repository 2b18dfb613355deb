"""The call graph of one agent run: nodes, their lifecycle, and chain aggregates.

Every LLM call, tool call and system step is a :class:`Node`. Nodes hang under a single root and
move one way through ``created -> running -> success | fail | halt`` (or straight from ``created``
to ``fail``/``halt`` when a call is stopped before it is sent). Aggregates are kept up to date as
nodes end, so reading them never scans the graph.
"""

from __future__ import annotations

import gc
import uuid
from dataclasses import replace
from decimal import Decimal
from typing import Any, Final

from ampmeter import _validate
from ampmeter._core.kernel import Kernel, now_ms
from ampmeter._core.views import bind
from ampmeter.node import KINDS, Node, copy_metadata

__all__ = ["ExecutionGraph"]

# Past this many nodes a snapshot pauses the cyclic GC while it copies (see snapshot()).
_SNAPSHOT_GC_PAUSE_NODES: Final = 2_000
_TOKENS: Final = ("tokens_in", "tokens_out")


def check_node(kind: object, name: object, model: object) -> None:
    """A node's kind (one of :data:`KINDS`), name (a str) and model (a str or None), checked in
    one call: TypeError or ValueError naming the first that is not. The usual values, exact
    strs, pass one test; others (a str subclass passes too) are checked one by one."""
    if (
        type(kind) is str
        and kind in KINDS
        and type(name) is str
        and (model is None or type(model) is str)
    ):
        return
    if not isinstance(kind, str):
        raise TypeError(f"kind must be a str, got {type(kind).__name__}")
    if kind not in KINDS:
        raise ValueError(f"unknown node kind {kind!r}; expected one of {sorted(KINDS)}")
    _validate.text(name, "name")
    _validate.optional_text(model, "model")


class ExecutionGraph:
    """A thread-safe call tree for one chain (agent run) with incrementally kept aggregates.

    ``chain_id`` defaults to a random UUID. ``max_nodes`` (0 = unbounded) caps how many nodes are
    kept in memory for long-running chains: past it, the oldest terminal non-root nodes are
    evicted, while the aggregates keep counting them. The root and open nodes are never evicted.
    """

    __slots__ = ("__weakref__", "_kernel", "chain_id")

    def __init__(self, chain_id: str | None = None, *, max_nodes: int = 0) -> None:
        if chain_id is not None and not isinstance(chain_id, str):
            raise TypeError(f"chain_id must be a str or None, got {type(chain_id).__name__}")
        limit = _validate.count(max_nodes, "max_nodes (0 = unbounded)")
        self.chain_id: str = chain_id if chain_id is not None else str(uuid.uuid4())
        self._kernel = Kernel(self.chain_id, limit)
        bind(self, self._kernel)

    # -- structure --------------------------------------------------------------------------

    @property
    def root_id(self) -> str | None:
        """The root's node id, or None before :meth:`create_root`."""
        return self._kernel.root_id

    def __len__(self) -> int:
        return self._kernel.node_count()

    def create_root(self, name: str, metadata: dict[str, Any] | None = None) -> str:
        """Create the chain's single root (``kind="system"``, depth 0, status ``running``)."""
        _validate.text(name, "name")
        return self._kernel.create_root(name, _validate.metadata(metadata)).node_id

    def begin_node(
        self,
        parent_id: str,
        kind: str,
        name: str,
        model: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> str:
        """Create a node under ``parent_id`` in status ``created`` and return its id."""
        check_node(kind, name, model)  # (the table's lookup of the parent checks its id)
        meta = {} if metadata is None else _validate.metadata(metadata)
        return self._kernel.begin(parent_id, kind, name, model, meta).node_id

    def begin(
        self,
        parent_id: str,
        kind: str,
        name: str,
        model: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Node:
        """:meth:`begin_node`, returning a copy of the new node."""
        return self.node(self.begin_node(parent_id, kind, name, model, metadata))

    # -- lifecycle --------------------------------------------------------------------------

    def mark_running(self, node_id: str) -> None:
        """Move a ``created`` node to ``running``; no change for running or terminal nodes."""
        self._kernel.run(self._kernel.node(node_id))

    def mark_success(
        self,
        node_id: str,
        cost_usd: float | Decimal,
        tokens_in: int | None = None,
        tokens_out: int | None = None,
        *,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        """End a node as ``success`` with its cost and tokens; no change if already terminal.

        ``metadata`` (optional) is merged into the node's metadata in the same step. The node of
        a call in flight is its call's to end (``RuntimeError``, nothing changes), as for
        :meth:`mark_failure` and :meth:`mark_halt`.
        """
        self._end(node_id, "success", cost_usd, tokens_in, tokens_out, metadata=metadata)

    def mark_failure(
        self,
        node_id: str,
        error_class: str,
        stop_reason: str | None = None,
        *,
        cost_usd: float | Decimal = 0,
        tokens_in: int | None = None,
        tokens_out: int | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        """End a node as ``fail`` (an error). ``cost_usd`` is for calls billed before failing."""
        _validate.text(error_class, "error_class")
        self._end(
            node_id,
            "fail",
            cost_usd,
            tokens_in,
            tokens_out,
            error_class=error_class,
            stop_reason=stop_reason,
            metadata=metadata,
        )

    def mark_halt(
        self,
        node_id: str,
        stop_reason: str | None = None,
        *,
        cost_usd: float | Decimal = 0,
        tokens_in: int | None = None,
        tokens_out: int | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        """End a node as ``halt`` (stopped by a policy such as a budget); no change if terminal."""
        self._end(
            node_id,
            "halt",
            cost_usd,
            tokens_in,
            tokens_out,
            stop_reason=stop_reason,
            metadata=metadata,
        )

    def _end(
        self,
        node_id: str,
        status: str,
        cost_usd: object,
        tokens_in: object,
        tokens_out: object,
        *,
        error_class: str | None = None,
        stop_reason: str | None = None,
        metadata: object,
    ) -> None:
        # (error_class is checked by the mark_* that takes it; a success has no stop_reason)
        if stop_reason is not None:
            _validate.text(stop_reason, "stop_reason")
        cost = _validate.nano(cost_usd, "cost_usd")
        t_in, t_out = _validate.optional_counts(_TOKENS, tokens_in, tokens_out)
        if metadata is not None and not isinstance(metadata, dict):
            raise TypeError(f"metadata must be a dict or None, got {type(metadata).__name__}")
        ending = (status, cost, t_in, t_out, error_class, stop_reason, metadata)
        if not self._kernel.end_unowned(node_id, ending):
            raise RuntimeError(
                f"node {node_id} ({self.node(node_id).name!r}) belongs to a call in flight, and "
                "only that call ends it: report its usage with call.record(...); mark_* is for "
                "nodes begun with begin_node()"
            )

    def increment_retries(self, node_id: str) -> None:
        """Count one retry on a node; no change once the node is terminal."""
        self._kernel.retry(self._kernel.node(node_id), None)

    def update_metadata(self, node_id: str, values: dict[str, Any]) -> None:
        """Merge ``values`` into an open node's metadata; no change once it is terminal."""
        if not isinstance(values, dict):
            raise TypeError(f"values must be a dict, got {type(values).__name__}")
        self._kernel.update(node_id, values)

    # -- reading ----------------------------------------------------------------------------

    def node(self, node_id: str) -> Node:
        """A copy of one node; changing it never changes the graph."""
        return self._kernel.copy(node_id, _copy)

    def nodes(self) -> list[Node]:
        """Copies of all nodes kept in memory, in creation order."""
        return list(self._kernel.copy_all(_copy)[1].values())

    def aggregates(self) -> dict[str, Any]:
        """The chain aggregates (see :meth:`snapshot`), without the nodes."""
        return self._kernel.aggregates()

    def snapshot(self) -> dict[str, Any]:
        """A JSON-serializable deep copy of the whole graph: nodes, aggregates and a timestamp."""
        kernel = self._kernel
        aggregates = kernel.aggregates()
        # A snapshot allocates two dicts per node. On big graphs those allocations set off full
        # cyclic-GC passes over every live node mid-copy, which doubled the copy time; none of
        # the new dicts can form a cycle, so the collector is paused for the copy and restored.
        pause_gc = kernel.node_count() > _SNAPSHOT_GC_PAUSE_NODES and gc.isenabled()
        if pause_gc:
            gc.disable()
        try:
            root_id, nodes = kernel.copy_all(Node.to_dict)
        finally:
            if pause_gc:
                gc.enable()
        aggregates["total_cost_usd"] = float(aggregates["total_cost_usd"])  # JSON: a number
        return {
            "chain_id": self.chain_id,
            "root_id": root_id,
            "nodes": nodes,
            "aggregates": aggregates,
            "snapshot_ts_ms": now_ms(),
        }


def _copy(node: Node) -> Node:
    return replace(node, metadata=copy_metadata(node.metadata) if node.metadata else {})
