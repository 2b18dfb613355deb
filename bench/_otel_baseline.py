"""A reusable OpenTelemetry SDK baseline for the benchmarks: one span, six attributes.

The span goes through a real ``TracerProvider`` and ``BatchSpanProcessor`` (so the caller pays
what an instrumented application pays: span creation, attribute validation, the hand-off to the
batch queue) and is exported off-thread to an exporter that only counts spans, so no I/O is
measured. Benchmarks import :class:`OtelSpanBaseline` and time :meth:`OtelSpanBaseline.span`
next to their own code, in the same process and the same run.

    with OtelSpanBaseline() as otel:
        per_span_us = otel.median_us(batches=100, batch_size=1_000)
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from ampmeter._scoped import Scoped

__all__ = ["NAME", "CountingExporter", "OtelSpanBaseline", "spans"]

NAME = "OTel SDK span (6 attrs, BatchSpanProcessor)"


class CountingExporter(SpanExporter):
    """An exporter that drops spans after counting them (no I/O, no memory growth)."""

    def __init__(self) -> None:
        self.exported = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Count the batch and report success."""
        self.exported += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        """Nothing to release."""


class OtelSpanBaseline(Scoped):
    """A tracer wired like a production service: TracerProvider + BatchSpanProcessor.

    :meth:`span` is the unit of work: start a span with three attributes (kind, name, model),
    add three more when the call ends (tokens in, tokens out, cost), end it. The queue is big
    enough for ``batch_size`` spans and :meth:`median_us` flushes between batches (untimed), so
    no span is dropped and the measured cost is never flattered by a full queue.
    """

    def __init__(self, max_queue_size: int = 8_192) -> None:
        self.exporter = CountingExporter()
        self.provider = TracerProvider()
        self.processor = BatchSpanProcessor(
            self.exporter, max_queue_size=max_queue_size, max_export_batch_size=512
        )
        self.provider.add_span_processor(self.processor)
        self.tracer = self.provider.get_tracer("ampmeter.bench")
        self.max_queue_size = max_queue_size

    def span(self) -> None:
        """One span with six attributes, started and ended on the caller's thread."""
        span = self.tracer.start_span(
            "step", attributes={"amp.kind": "llm", "amp.name": "step", "gen_ai.model": "gpt"}
        )
        span.set_attribute("gen_ai.usage.input_tokens", 1200)
        span.set_attribute("gen_ai.usage.output_tokens", 350)
        span.set_attribute("amp.cost_usd", 0.00125)
        span.end()

    def batch_us(self, batch_size: int) -> float:
        """Mean µs per span over one batch of ``batch_size`` spans, flushed afterwards."""
        if batch_size > self.max_queue_size:
            raise ValueError(f"batch_size {batch_size} exceeds the queue ({self.max_queue_size})")
        span = self.span
        start = time.perf_counter_ns()
        for _ in range(batch_size):
            span()
        elapsed = time.perf_counter_ns() - start
        self.processor.force_flush()
        return elapsed / batch_size / 1_000

    def median_us(self, batches: int, batch_size: int = 1_000) -> float:
        """Median over ``batches`` of the mean µs per span in a batch."""
        return statistics.median(self.batch_us(batch_size) for _ in range(batches))

    def shutdown(self) -> None:
        """Flush and stop the batch processor's worker thread."""
        self.provider.shutdown()

    def _leave(self, exc: BaseException | None) -> None:
        self.shutdown()


def spans(count: int) -> None:
    """One warm-up span, then ``count`` spans, exported and shut down (a round counted by
    ``_instructions.per_round``)."""
    with OtelSpanBaseline() as otel:
        otel.span()
        for _ in range(count):
            otel.span()
        otel.processor.force_flush()
