"""The fast path of the JSONL sink: v0 lines from cached byte pieces (see :class:`LineEncoder`).

Compiled with mypyc (``scripts/compile_core.py``), so reading a node's fields costs what it costs
in the compiled graph. :mod:`ampmeter.sinks.jsonl` owns the general path and all the error
handling; this module imports nothing outside the standard library and ampmeter.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

from ampmeter.graph import (
    META_CACHED_TOKENS,
    META_COMPONENT,
    META_COST_STATUS,
    META_PRICING_VERSION,
    Node,
)

__all__ = ["COMPONENTS", "EVENT_TYPES", "LineEncoder"]

EVENT_TYPES: Final[dict[str, str]] = {
    "llm": "llm_completion",
    "tool": "tool_call",
    "system": "cpu_op",
    "embedding": "embedding",
    "retrieval": "rag_retrieval",
    "memory": "memory_update",
}
COMPONENTS: Final = frozenset({"pipeline", "auxiliary", "rag_infra", "evaluator", "metagraph"})
_INT_BITS: Final = 62  # counts beyond this go the general way (orjson stops at 64 bits)
_CACHE_MAX: Final = 4096  # entries in the piece cache before it is emptied
_NESTING_CHECK_BYTES: Final = 256  # shorter metadata cannot nest as deep as orjson's limit
# Metadata keys whose value node_to_event replaces where the caller's metadata has them.
_OVERRIDDEN: Final = frozenset({"status", "retries_used", "error_class", "stop_reason"})
_MILLIS: Final = tuple(b'.%03dZ",' % ms for ms in range(1000))
_LINE: Final = (
    b'{"timestamp":%s%s%s%s%s%d,"completion_tokens":%d,"total_tokens":%d%s'
    b'},"cost_usd":%s,"latency_ms":%d,"metadata":%s%s'
)
# (kind, name, model, component, status, retries_used, error_class, stop_reason,
#  metadata layout, parent_id written, run_id)
_PieceKey = tuple[str, str, "str | None", str, str, int, "str | None", "str | None", int,
                  "str | None", str]  # fmt: skip


class LineEncoder:
    """Builds v0 lines byte-identical to ``orjson.dumps(node_to_event(...))`` without the dict.

    What repeats from event to event (run id, parent, kind, name, component, model and the status
    fields) is encoded once per distinct combination; integers are formatted directly and only
    the node id, the cost and the caller's metadata go through orjson. :meth:`line` returns None
    (or raises) when a node holds anything unusual (a non-int count, a metadata key ampmeter
    overrides, a value orjson refuses); the caller then takes the general path, which also owns
    all the error handling, so both paths write the same bytes.
    """

    def __init__(
        self, run_id: str | None, component: str, dumps: Callable[[object], bytes]
    ) -> None:
        self.run_id = run_id
        self.component = component
        self._dumps = dumps  # orjson.dumps, passed in: this compiled module imports no packages
        # (first ms of the current second, its timestamp text); no ms is in the initial second
        self._sec: tuple[int, bytes] = (-(2**80), b"")
        self._pieces: dict[_PieceKey, tuple[bytes, bytes, bytes]] = {}

    def line(self, node: Node, chain_id: str) -> bytes | None:
        """The line for ``node``, or None when the general path must build it."""
        end = node.end_ts_ms
        start = node.start_ts_ms
        t_in = node.tokens_in or 0
        t_out = node.tokens_out or 0
        retries = node.retries_used
        if (
            type(end) is not int
            or type(start) is not int
            or type(t_in) is not int
            or type(t_out) is not int
            or type(retries) is not int
        ):
            return None
        latency = end - start
        if (t_in | t_out | latency) >> _INT_BITS:  # negative or past 62 bits: the general path
            return None
        cost = node.cost_usd
        component = self.component
        meta = node.metadata
        if meta:
            if type(meta) is not dict or not _OVERRIDDEN.isdisjoint(meta):
                return None  # node_to_event overrides these in place: leave it to the dict
            saved = b""
            cached = meta.get(META_CACHED_TOKENS)
            if type(cached) is int and cached >= 0:
                if cached >> _INT_BITS:
                    return None
                saved = b',"tokens_saved":%d' % cached
            comp = meta.get(META_COMPONENT)
            if type(comp) is str and comp in COMPONENTS:
                component = comp
            cost_status = meta.get(META_COST_STATUS)
            if cost_status == "unpriced":
                cost = 0.0
            body = self._dumps(meta)
            if len(body) > _NESTING_CHECK_BYTES:
                self._dumps((meta,))  # raises if it nests too deep to sit inside the event
            body = body[:-1]
            layout = 1
            if META_PRICING_VERSION not in meta:
                layout |= 2
            if cost_status is None and META_COST_STATUS not in meta:
                layout |= 4
        else:
            saved = b""
            body = b"{"
            layout = 0
        parent_id = node.parent_id
        if node.depth == 1:
            parent_id = None
        key = (
            node.kind, node.name, node.model, component, node.status, retries,
            node.error_class, node.stop_reason, layout, parent_id, self.run_id or chain_id,
        )  # fmt: skip
        pieces = self._pieces.get(key)
        if pieces is None:
            pieces = self._build(key)
            if pieces is None:
                return None
        frac = end - self._sec[0]
        if not 0 <= frac < 1000:
            sec = end // 1000
            text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec))
            self._sec = (sec * 1000, self._dumps(text)[:-1])
            frac = end - sec * 1000
        return _LINE % (
            self._sec[1], _MILLIS[frac], pieces[0], self._dumps(node.node_id), pieces[1],
            t_in, t_out, t_in + t_out, saved, self._dumps(cost), latency, body, pieces[2],
        )  # fmt: skip

    def _build(self, key: _PieceKey) -> tuple[bytes, bytes, bytes] | None:
        """Encode the repeating pieces of ``key``'s lines; None if a value is not a plain str."""
        kind, name, model, component, status, retries, error_class, stop_reason = key[:8]
        layout, parent_id, run = key[8:]
        event_type = EVENT_TYPES.get(kind)
        # Exact str only: an equal non-str value (True == 1) must not share cached bytes.
        for text in (name, component, status, run):
            if type(text) is not str:
                return None
        for optional in (model, error_class, stop_reason, parent_id):
            if optional is not None and type(optional) is not str:
                return None
        if event_type is None:
            return None
        dumps = self._dumps
        run_piece = b'"run_id":%s,"span_id":' % dumps(run)
        head = b',"event_type":%s,"operation":%s,"component":%s,"model":%s,' % (
            dumps(event_type), dumps(name), dumps(component), dumps(model or ""),
        )  # fmt: skip
        if parent_id is not None:
            head = b',"parent_id":%s%s' % (dumps(parent_id), head)
        head += b'"usage":{"prompt_tokens":'
        fields = b'"status":%s,"retries_used":%d,"error_class":%s,"stop_reason":%s' % (
            dumps(status), retries, dumps(error_class), dumps(stop_reason),
        )  # fmt: skip
        if layout == 0:  # empty metadata: only ampmeter's fields
            tail = b'"pricing_version":null,' + fields + b',"cost_status":null}}\n'
        else:  # after the caller's metadata, the fields it did not have, in node_to_event's order
            pricing = b',"pricing_version":null' if layout & 2 else b""
            cost_status = b',"cost_status":null' if layout & 4 else b""
            tail = pricing + b"," + fields + cost_status + b"}}\n"
        if len(self._pieces) >= _CACHE_MAX:  # many distinct names or parents: start over
            self._pieces.clear()
        pieces = self._pieces[key] = (run_piece, head, tail)
        return pieces
