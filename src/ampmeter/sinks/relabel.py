"""A sink that places one process's nodes inside a run that spans many processes.

Every process numbers its nodes from ``n000001``; in a run that crosses processes (a hand-off,
``ampmeter run`` over a process tree) those numbers collide. :class:`RelabeledSink` gives the
nodes of this process ids of their own (``prefix`` + the local id), hangs this process's root
under the node that started it elsewhere (``attach_to``), moves depths down by ``depth_offset``
and passes the result on, so the logs of every process read as one tree.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ampmeter.node import Node
from ampmeter.sinks.base import Sink

__all__ = ["RelabeledSink"]


class RelabeledSink(Sink):
    """Pass nodes to ``sink`` with ids prefixed and the local root re-parented.

    ``attach_to`` is the id (as logged) of the node this process's root belongs under, or None
    for the top of the run. With ``keep_root=False`` the local root itself is not passed on and
    its children hang directly under ``attach_to`` (a worker process is not a step of its own).
    ``metadata`` is merged into every node's metadata (e.g. the process id).
    """

    def __init__(
        self,
        sink: Sink,
        *,
        prefix: str,
        attach_to: str | None,
        depth_offset: int = 0,
        keep_root: bool = True,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        if not callable(getattr(sink, "emit", None)):
            raise TypeError(f"sink must be a Sink, got {type(sink).__name__}")
        if isinstance(depth_offset, bool) or not isinstance(depth_offset, int) or depth_offset < 0:
            raise ValueError(f"depth_offset must be an int >= 0, got {depth_offset!r}")
        if not keep_root and attach_to is None:
            raise ValueError("keep_root=False needs attach_to: the nodes must hang somewhere")
        self.sink = sink
        self.prefix = prefix
        self.attach_to = attach_to
        self.depth_offset = depth_offset
        self.keep_root = keep_root
        self.metadata = dict(metadata or {})

    def emit(self, node: Node, chain_id: str) -> None:
        """Relabel ``node`` and pass it on (a dropped local root is not passed on)."""
        parent = node.parent_id
        if parent is None and not self.keep_root:
            return
        if parent is None or (node.depth == 1 and not self.keep_root):
            new_parent = self.attach_to
        else:
            new_parent = self.prefix + parent
        depth = node.depth + self.depth_offset - (0 if self.keep_root else 1)
        meta = {**node.metadata, **self.metadata} if self.metadata else node.metadata
        relabeled = dataclasses.replace(
            node,
            node_id=self.prefix + node.node_id,
            parent_id=new_parent,
            depth=depth,
            metadata=meta,
        )
        self.sink.emit(relabeled, chain_id)

    def flush(self) -> None:
        """Flush the wrapped sink."""
        self.sink.flush()

    def close(self) -> None:
        """Close the wrapped sink."""
        self.sink.close()
