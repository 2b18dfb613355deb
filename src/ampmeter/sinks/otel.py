"""OpenTelemetry export: nodes become GenAI spans, plus the GenAI client metrics.

Spans follow the OpenTelemetry GenAI semantic conventions. A node is emitted only when it
ends, and children end before their parents, so a parent span cannot be started first. Every
node therefore gets a deterministic span id (a hash of chain id and node id) and every chain a
deterministic trace id (the chain id's UUID value, or a hash of it): a child span is started
under a non-recording stand-in for its parent's span context, and the parent span, emitted
later, is created with exactly that span id. Setting span ids needs the OpenTelemetry SDK's
tracer (it exposes ``id_generator``); with another tracer implementation, spans are still
exported but the parent links cannot be guaranteed.
"""

from __future__ import annotations

import contextvars
import hashlib
import threading
import uuid
from typing import Any, Final

try:
    from opentelemetry import metrics, trace
    from opentelemetry.trace import (
        NonRecordingSpan,
        SpanContext,
        SpanKind,
        Status,
        StatusCode,
        TraceFlags,
    )
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("OtelSink needs OpenTelemetry: pip install 'ampmeter[otel]'") from exc

from ampmeter import redact
from ampmeter.node import (
    META_CACHE_WRITE_TOKENS,
    META_CACHED_TOKENS,
    META_CONTEXT,
    META_PROVIDER,
    META_REASONING_TOKENS,
    Node,
)
from ampmeter.sinks.base import Sink

__all__ = [
    "DURATION_BUCKETS_S",
    "TOKEN_BUCKETS",
    "OtelSink",
    "span_id_for",
    "trace_id_for",
]

_SCOPE: Final = "ampmeter"

# Explicit bucket boundaries the semantic conventions give for the two client histograms:
# powers of 4 from 1 to 4**13 tokens, and 0.01 s doubled thirteen times.
TOKEN_BUCKETS: Final = tuple(4**i for i in range(14))
DURATION_BUCKETS_S: Final = tuple(0.01 * 2**i for i in range(14))

# gen_ai.operation.name per node kind (well-known values where the conventions have one)
_OPERATIONS: Final = {
    "llm": "chat",
    "tool": "execute_tool",
    "embedding": "embeddings",
    "retrieval": "retrieval",
    "memory": "memory",
    "system": "system",
}
_MODEL_KINDS: Final = frozenset({"llm", "embedding"})
_INVOKE_AGENT: Final = "invoke_agent"

# (trace id, span id) the next span created on this thread/task must get; None = random ids
_pending_ids: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar(
    "ampmeter_otel_pending_ids", default=None
)


def trace_id_for(chain_id: str) -> int:
    """The 128-bit trace id of a chain: its UUID value, else a hash of the id (never 0)."""
    try:
        value = uuid.UUID(chain_id).int
    except ValueError:
        value = int.from_bytes(hashlib.blake2b(chain_id.encode(), digest_size=16).digest(), "big")
    return value or 1


def span_id_for(chain_id: str, node_id: str) -> int:
    """The 64-bit span id of node ``node_id`` of chain ``chain_id`` (a hash, never 0)."""
    key = f"{chain_id}\x00{node_id}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") or 1


class _NodeIds:
    """An SDK ``IdGenerator`` that hands out the pending node ids, else defers to the original."""

    def __init__(self, fallback: Any) -> None:
        self.fallback = fallback

    def generate_span_id(self) -> int:
        pending = _pending_ids.get()
        return pending[1] if pending is not None else int(self.fallback.generate_span_id())

    def generate_trace_id(self) -> int:
        pending = _pending_ids.get()
        return pending[0] if pending is not None else int(self.fallback.generate_trace_id())

    def is_trace_id_random(self) -> bool:
        if _pending_ids.get() is not None:
            return False
        check = getattr(self.fallback, "is_trace_id_random", None)
        return bool(check()) if check is not None else False


_install_lock = threading.Lock()


class OtelSink(Sink):
    """Export nodes as OpenTelemetry spans and GenAI client metrics.

    ``tracer_provider`` / ``meter_provider`` default to the global providers. How spans leave
    the process (batching, exporter) is the provider's configuration: use a
    ``BatchSpanProcessor`` so exporting never blocks the agent. :meth:`flush` and
    :meth:`close` do not flush or shut down those providers, since they belong to the caller.
    """

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
    ) -> None:
        self._tracer_provider = tracer_provider
        self._tracer: trace.Tracer | None = None
        self._closed = False
        meter = metrics.get_meter(_SCOPE, meter_provider=meter_provider)
        self._token_usage = meter.create_histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Number of input and output tokens used.",
            explicit_bucket_boundaries_advisory=[float(b) for b in TOKEN_BUCKETS],
        )
        self._duration = meter.create_histogram(
            "gen_ai.client.operation.duration",
            unit="s",
            description="GenAI operation duration.",
            explicit_bucket_boundaries_advisory=list(DURATION_BUCKETS_S),
        )

    def _get_tracer(self) -> trace.Tracer:
        if self._tracer is not None:
            return self._tracer
        provider = self._tracer_provider or trace.get_tracer_provider()
        tracer = provider.get_tracer(_SCOPE)
        with _install_lock:
            current = getattr(tracer, "id_generator", None)
            if current is not None and not isinstance(current, _NodeIds):
                setattr(tracer, "id_generator", _NodeIds(current))  # noqa: B010 - SDK Tracer only
        if not isinstance(provider, trace.ProxyTracerProvider):
            self._tracer = tracer  # the global provider may still be set later: ask again
        return tracer

    def emit(self, node: Node, chain_id: str) -> None:
        """Export one terminal node of chain ``chain_id`` as a span (and metrics)."""
        if self._closed:
            raise RuntimeError("OtelSink is closed; create a new sink to emit more nodes")
        if not isinstance(node, Node):
            raise TypeError(f"node must be a Node, got {type(node).__name__}")
        if not isinstance(chain_id, str):
            raise TypeError(f"chain_id must be a str, got {type(chain_id).__name__}")
        if node.end_ts_ms is None or not node.is_terminal:
            raise ValueError(f"node {node.node_id} is {node.status!r}; only ended nodes export")
        operation, span_name = _names(node)
        attributes = _attributes(node, chain_id, operation)
        self._span(node, chain_id, span_name, attributes)
        if node.kind in _MODEL_KINDS:
            self._metrics(node, operation)

    def _span(self, node: Node, chain_id: str, name: str, attributes: dict[str, Any]) -> None:
        trace_id = trace_id_for(chain_id)
        if node.parent_id is not None:
            parent = SpanContext(
                trace_id,
                span_id_for(chain_id, node.parent_id),
                is_remote=False,
                trace_flags=TraceFlags(TraceFlags.SAMPLED),
            )
            parent_context = trace.set_span_in_context(NonRecordingSpan(parent))
        else:
            # a root: no parent, not even the caller's current span
            parent_context = trace.set_span_in_context(trace.INVALID_SPAN)
        kind = SpanKind.CLIENT if node.kind in _MODEL_KINDS else SpanKind.INTERNAL
        token = _pending_ids.set((trace_id, span_id_for(chain_id, node.node_id)))
        try:
            span = self._get_tracer().start_span(
                name,
                context=parent_context,
                kind=kind,
                attributes=attributes,
                start_time=node.start_ts_ms * 1_000_000,
            )
        finally:
            _pending_ids.reset(token)
        if node.status != "success":
            # Scrubbed again: a node built outside the context (a replayed graph) may not be.
            reason = redact.scrub(node.stop_reason or node.error_class or node.status)
            span.set_status(Status(StatusCode.ERROR, reason))
        span.end(end_time=(node.end_ts_ms or node.start_ts_ms) * 1_000_000)

    def _metrics(self, node: Node, operation: str) -> None:
        labels = _labels(node, operation)
        if node.tokens_in is not None:
            self._token_usage.record(node.tokens_in, {**labels, "gen_ai.token.type": "input"})
        if node.tokens_out is not None:
            self._token_usage.record(node.tokens_out, {**labels, "gen_ai.token.type": "output"})
        if node.status != "success":
            labels["error.type"] = _error_type(node)
        latency_ms = node.latency_ms or 0
        self._duration.record(latency_ms / 1000.0, labels)

    def flush(self) -> None:
        """Nothing to do: batching belongs to the caller's span processors and readers."""

    def close(self) -> None:
        """Refuse further :meth:`emit` calls (the providers stay open: they are the caller's)."""
        self._closed = True


def _names(node: Node) -> tuple[str, str]:
    if node.metadata.get(META_CONTEXT) is True:
        return _INVOKE_AGENT, f"{_INVOKE_AGENT} {node.name}".rstrip()
    operation = _OPERATIONS.get(node.kind, node.kind)
    target = (node.model or "") if node.kind in _MODEL_KINDS else node.name
    return operation, f"{operation} {target}".rstrip()


def _error_type(node: Node) -> str:
    if node.error_class:
        return node.error_class
    return "halt" if node.status == "halt" else "_OTHER"


def _labels(node: Node, operation: str) -> dict[str, str]:
    """What a span and the metrics both say of a node: the operation, model and provider."""
    labels = {"gen_ai.operation.name": operation}
    if node.model:
        labels["gen_ai.request.model"] = node.model
    provider = node.metadata.get(META_PROVIDER)
    if isinstance(provider, str):
        labels["gen_ai.provider.name"] = provider
    return labels


def _attributes(node: Node, chain_id: str, operation: str) -> dict[str, Any]:
    meta = node.metadata
    attributes: dict[str, Any] = {
        **_labels(node, operation),
        "ampmeter.node_id": node.node_id,
        "ampmeter.chain_id": chain_id,
        "ampmeter.kind": node.kind,
        "ampmeter.status": node.status,
        "ampmeter.cost_usd": float(node.cost_usd),  # span attributes take numbers
    }
    if node.tokens_in is not None:
        attributes["gen_ai.usage.input_tokens"] = node.tokens_in
    if node.tokens_out is not None:
        attributes["gen_ai.usage.output_tokens"] = node.tokens_out
    for key, name in (
        (META_CACHED_TOKENS, "gen_ai.usage.cache_read.input_tokens"),
        (META_CACHE_WRITE_TOKENS, "gen_ai.usage.cache_creation.input_tokens"),
        (META_REASONING_TOKENS, "gen_ai.usage.reasoning.output_tokens"),
    ):
        value = meta.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            attributes[name] = value
    if node.kind == "tool":
        attributes["gen_ai.tool.name"] = node.name
    if operation == _INVOKE_AGENT:
        attributes["gen_ai.agent.name"] = node.name
    if node.retries_used:
        attributes["ampmeter.retries"] = node.retries_used
    if node.status != "success":
        attributes["error.type"] = _error_type(node)
        if node.stop_reason:
            attributes["ampmeter.stop_reason"] = redact.scrub(node.stop_reason)
    return attributes
