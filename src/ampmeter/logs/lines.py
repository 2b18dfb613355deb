"""How a finished node becomes one TokenTracker v0 line: the one writing rule of every event log.

:func:`node_to_event` builds the event dict and :func:`encode_event` encodes it with ``orjson``;
the JSONL sink and the stream logger both write through them, so every log holds the same lines.
"""

from __future__ import annotations

import time
from typing import Any, Final

import orjson

from ampmeter.money import float_usd
from ampmeter.node import (
    META_CACHED_TOKENS,
    META_COMPONENT,
    META_CONTEXT,
    META_COST_STATUS,
    META_PRICING_VERSION,
    Node,
)

__all__ = ["COMPONENTS", "EVENT_TYPES", "encode_event", "iso_utc", "node_to_event"]

EVENT_TYPES: Final[dict[str, str]] = {
    "llm": "llm_completion",
    "tool": "tool_call",
    "system": "cpu_op",
    "embedding": "embedding",
    "retrieval": "rag_retrieval",
    "memory": "memory_update",
}
COMPONENTS: Final = frozenset({"pipeline", "auxiliary", "rag_infra", "evaluator", "metagraph"})
_OPTS: Final = orjson.OPT_APPEND_NEWLINE


_ts_cache: tuple[int, str] = (-1, "")


def iso_utc(ms: int) -> str:
    """ISO 8601 UTC timestamp with milliseconds (``2026-01-22T08:10:00.123Z``) of epoch ms."""
    global _ts_cache
    sec, frac = divmod(ms, 1000)
    cached = _ts_cache
    if cached[0] != sec:
        cached = (sec, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec)))
        _ts_cache = cached
    return f"{cached[1]}.{frac:03d}Z"


def node_to_event(
    node: Node,
    run_id: str,
    component: str = "pipeline",
    extra_metadata: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Map a terminal node to one TokenTracker v0 event (a dict ready to encode).

    ``parent_id`` is left out for top-level calls (depth 1, whose parent is the root) and for
    parentless nodes; the node's ``component`` metadata wins over ``component`` when it is one
    of the schema's components. ``metadata.context`` names the context the node ran in (a
    sub-agent's own node: that sub-agent), so views show names, not ids. ``extra_metadata`` is
    merged over the node's own metadata; ampmeter's status fields are merged last.
    """
    end = node.end_ts_ms
    if end is None:
        raise ValueError(f"node {node.node_id!r} is not finished (status {node.status!r})")
    event_type = EVENT_TYPES.get(node.kind)
    if event_type is None:
        raise ValueError(f"node {node.node_id!r} has unknown kind {node.kind!r}")
    # Dict literals throughout: this runs once per event on the writer thread.
    meta = node.metadata
    t_in = node.tokens_in or 0
    t_out = node.tokens_out or 0
    usage = {"prompt_tokens": t_in, "completion_tokens": t_out, "total_tokens": t_in + t_out}
    cost = float_usd(node.cost_nano)  # JSONL keeps cost_usd a JSON number
    cost_status = None
    if meta:
        cached = meta.get(META_CACHED_TOKENS)
        if type(cached) is int and cached >= 0:
            usage["tokens_saved"] = cached
        comp = meta.get(META_COMPONENT)
        if type(comp) is str and comp in COMPONENTS:
            component = comp
        cost_status = meta.get(META_COST_STATUS)
        if cost_status == "unpriced":
            cost = 0.0
    if extra_metadata:
        meta = {**meta, **extra_metadata}
    metadata = {
        **meta,
        "pricing_version": meta.get(META_PRICING_VERSION),
        "status": node.status,
        "retries_used": node.retries_used,
        "error_class": node.error_class,
        "stop_reason": node.stop_reason,
        "cost_status": cost_status,
    }
    if metadata.get(META_CONTEXT) is True:  # a sub-agent's own node: its name is the context's
        metadata[META_CONTEXT] = node.name
    event: dict[str, Any] = {"timestamp": iso_utc(end), "run_id": run_id, "span_id": node.node_id}
    parent_id = node.parent_id
    if parent_id is not None and node.depth != 1:
        event["parent_id"] = parent_id
    event |= {
        "event_type": event_type,
        "operation": node.name,
        "component": component,
        "model": node.model or "",
        "usage": usage,
        "cost_usd": cost,
        "latency_ms": int(end - node.start_ts_ms),
        "metadata": metadata,
    }
    return event


def encode_event(event: dict[str, Any]) -> bytes:
    """One JSONL line (with its newline) for ``event``.

    Values JSON cannot hold are written as their ``str()``; if the event still cannot be
    encoded (an integer beyond 64 bits, metadata nesting too deep), the offending values are
    written as strings and ``metadata.encode_error`` says why, so one odd value never loses the
    event.
    """
    try:
        return orjson.dumps(event, default=_text, option=_OPTS)
    except TypeError as exc:  # orjson.JSONEncodeError is a TypeError
        metadata = event.get("metadata")
        safe = {k: _plain(v) if k in _NUMBERS else v for k, v in event.items()}
        usage = event.get("usage")
        if isinstance(usage, dict):
            safe["usage"] = {k: _plain(v) for k, v in usage.items()}
        if isinstance(metadata, dict):
            plain = {str(k): _plain(v) for k, v in metadata.items()}
            plain["encode_error"] = str(exc)
            safe["metadata"] = plain
        return orjson.dumps(safe, default=_text, option=_OPTS | orjson.OPT_NON_STR_KEYS)


_NUMBERS: Final = frozenset({"cost_usd", "latency_ms"})


def _plain(value: object) -> object:
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, float) or (isinstance(value, int) and -(2**63) <= value < 2**64):
        return value
    return _text(value)


def _text(value: object) -> str:
    try:
        return str(value)
    except Exception:
        return f"<unprintable {type(value).__name__}>"
