"""OtelSink: GenAI spans and metrics from real graph nodes, in memory and over OTLP/HTTP."""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from ampmeter.graph import ExecutionGraph
from ampmeter.node import (
    META_CACHED_TOKENS,
    META_CONTEXT,
    META_PROVIDER,
    META_REASONING_TOKENS,
)
from ampmeter.sinks.otel import (
    DURATION_BUCKETS_S,
    TOKEN_BUCKETS,
    OtelSink,
    span_id_for,
    trace_id_for,
)


class Setup:
    """A sink wired to an in-memory span exporter and metric reader."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.sink = OtelSink(self.tracer_provider, self.meter_provider)

    def spans(self) -> dict[str, ReadableSpan]:
        return {
            str(s.attributes["ampmeter.node_id"]): s for s in self.exporter.get_finished_spans()
        }

    def histogram(self, name: str) -> list[HistogramDataPoint]:
        data = self.reader.get_metrics_data()
        assert data is not None
        points: list[HistogramDataPoint] = []
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == name:
                        points += [p for p in metric.data.data_points]  # type: ignore[misc]
        return points


@pytest.fixture
def setup() -> Iterator[Setup]:
    made = Setup()
    yield made
    made.tracer_provider.shutdown()
    made.meter_provider.shutdown()


def build_run() -> tuple[ExecutionGraph, list[str]]:
    """A small agent run; returns the graph and node ids in the order they ended."""
    graph = ExecutionGraph()
    root = graph.create_root("planner", metadata={META_CONTEXT: True})
    chat = graph.begin_node(
        root, "llm", "chat", model="gpt-4o-mini", metadata={META_PROVIDER: "openai"}
    )
    graph.mark_running(chat)
    graph.mark_success(
        chat, 0.0125, 1200, 300, metadata={META_CACHED_TOKENS: 1000, META_REASONING_TOKENS: 120}
    )
    sub = graph.begin_node(root, "system", "researcher", metadata={META_CONTEXT: True})
    graph.mark_running(sub)
    tool = graph.begin_node(sub, "tool", "web_search")
    graph.mark_running(tool)
    graph.mark_failure(tool, "TimeoutError", "search timed out")
    halted = graph.begin_node(sub, "llm", "chat", model="claude-sonnet-4")
    graph.mark_halt(halted, "limit amp:cost exceeded: 1.2 > 1.0")
    graph.mark_halt(sub, "limit amp:cost exceeded: 1.2 > 1.0")
    graph.mark_success(root, 0.0)
    return graph, [chat, tool, halted, sub, root]


def emit_all(sink: OtelSink, graph: ExecutionGraph, order: list[str]) -> None:
    for node_id in order:
        sink.emit(graph.node(node_id), graph.chain_id)


def test_span_names_and_kinds_follow_the_genai_conventions(setup: Setup) -> None:
    graph, order = build_run()
    emit_all(setup.sink, graph, order)
    spans = setup.spans()
    chat, tool, halted, sub, root = order
    assert spans[chat].name == "chat gpt-4o-mini"
    assert spans[tool].name == "execute_tool web_search"
    assert spans[halted].name == "chat claude-sonnet-4"
    assert spans[sub].name == "invoke_agent researcher"
    assert spans[root].name == "invoke_agent planner"
    assert spans[chat].kind is SpanKind.CLIENT
    assert spans[tool].kind is SpanKind.INTERNAL
    assert spans[root].attributes is not None
    assert spans[root].attributes["gen_ai.agent.name"] == "planner"
    assert spans[sub].attributes is not None
    assert spans[sub].attributes["gen_ai.operation.name"] == "invoke_agent"


def test_llm_span_carries_usage_cost_and_ids(setup: Setup) -> None:
    graph, order = build_run()
    emit_all(setup.sink, graph, order)
    chat = order[0]
    attributes = dict(setup.spans()[chat].attributes or {})
    assert attributes == {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "gpt-4o-mini",
        "gen_ai.provider.name": "openai",
        "gen_ai.usage.input_tokens": 1200,
        "gen_ai.usage.output_tokens": 300,
        "gen_ai.usage.cache_read.input_tokens": 1000,
        "gen_ai.usage.reasoning.output_tokens": 120,
        "ampmeter.cost_usd": 0.0125,
        "ampmeter.node_id": chat,
        "ampmeter.chain_id": graph.chain_id,
        "ampmeter.kind": "llm",
        "ampmeter.status": "success",
    }
    assert setup.spans()[chat].status.status_code is StatusCode.UNSET


def test_fail_and_halt_set_error_status_with_the_stop_reason(setup: Setup) -> None:
    graph, order = build_run()
    emit_all(setup.sink, graph, order)
    spans = setup.spans()
    tool, halted = spans[order[1]], spans[order[2]]
    assert tool.status.status_code is StatusCode.ERROR
    assert tool.status.description == "search timed out"
    assert tool.attributes is not None and tool.attributes["error.type"] == "TimeoutError"
    assert tool.attributes["gen_ai.tool.name"] == "web_search"
    assert halted.status.status_code is StatusCode.ERROR
    assert halted.status.description == "limit amp:cost exceeded: 1.2 > 1.0"
    assert halted.attributes is not None and halted.attributes["error.type"] == "halt"
    assert "gen_ai.usage.input_tokens" not in halted.attributes


def test_parent_links_and_trace_id_mirror_the_graph(setup: Setup) -> None:
    graph, order = build_run()
    emit_all(setup.sink, graph, order)
    spans = setup.spans()
    trace_id = uuid.UUID(graph.chain_id).int
    assert {s.context.trace_id for s in spans.values()} == {trace_id}
    for node in graph.nodes():
        span = spans[node.node_id]
        assert span.context.span_id == span_id_for(graph.chain_id, node.node_id)
        if node.parent_id is None:
            assert span.parent is None
        else:
            assert span.parent is not None
            assert span.parent.span_id == spans[node.parent_id].context.span_id
    assert len({s.context.span_id for s in spans.values()}) == len(spans)


def test_times_are_the_nodes_times(setup: Setup) -> None:
    graph, order = build_run()
    emit_all(setup.sink, graph, order)
    spans = setup.spans()
    for node in graph.nodes():
        assert node.end_ts_ms is not None
        assert spans[node.node_id].start_time == node.start_ts_ms * 1_000_000
        assert spans[node.node_id].end_time == node.end_ts_ms * 1_000_000


def test_user_spans_keep_random_ids(setup: Setup) -> None:
    graph, order = build_run()
    emit_all(setup.sink, graph, order)
    tracer = setup.tracer_provider.get_tracer("ampmeter")  # the very tracer the sink uses
    with tracer.start_as_current_span("user work") as user:
        pass
    node_span_ids = {span_id_for(graph.chain_id, n) for n in order}
    assert user.get_span_context().span_id not in node_span_ids
    assert user.get_span_context().trace_id != trace_id_for(graph.chain_id)


def test_non_uuid_chain_ids_hash_to_one_trace(setup: Setup) -> None:
    graph = ExecutionGraph(chain_id="run-42")
    root = graph.create_root("agent")
    step = graph.begin_node(root, "retrieval", "vector_store")
    graph.mark_success(step, 0.0)
    graph.mark_success(root, 0.0)
    emit_all(setup.sink, graph, [step, root])
    spans = setup.spans()
    assert spans[step].name == "retrieval vector_store"
    assert spans[root].name == "system agent"  # a root without context metadata
    assert spans[step].context.trace_id == spans[root].context.trace_id == trace_id_for("run-42")
    assert spans[step].parent is not None
    assert spans[step].parent.span_id == spans[root].context.span_id


def test_token_usage_histogram_by_token_type(setup: Setup) -> None:
    graph, order = build_run()
    emit_all(setup.sink, graph, order)
    points = setup.histogram("gen_ai.client.token.usage")
    by_type = {p.attributes["gen_ai.token.type"]: p for p in points if p.attributes}
    assert set(by_type) == {"input", "output"}  # the halted call has no tokens
    assert by_type["input"].sum == 1200 and by_type["input"].count == 1
    assert by_type["output"].sum == 300
    assert by_type["input"].attributes is not None
    assert by_type["input"].attributes["gen_ai.request.model"] == "gpt-4o-mini"
    assert tuple(by_type["input"].explicit_bounds) == tuple(float(b) for b in TOKEN_BUCKETS)


def test_operation_duration_histogram_in_seconds(setup: Setup) -> None:
    graph, order = build_run()
    emit_all(setup.sink, graph, order)
    points = setup.histogram("gen_ai.client.operation.duration")
    by_model = {p.attributes["gen_ai.request.model"]: p for p in points if p.attributes}
    assert set(by_model) == {"gpt-4o-mini", "claude-sonnet-4"}  # model calls only
    chat = graph.node(order[0])
    assert chat.latency_ms is not None
    assert by_model["gpt-4o-mini"].sum == pytest.approx(chat.latency_ms / 1000)
    assert tuple(by_model["gpt-4o-mini"].explicit_bounds) == DURATION_BUCKETS_S
    halted_attrs = by_model["claude-sonnet-4"].attributes
    assert halted_attrs is not None and halted_attrs["error.type"] == "halt"


def test_bad_input_is_refused(setup: Setup) -> None:
    graph = ExecutionGraph()
    root = graph.create_root("agent")
    open_node = graph.begin_node(root, "llm", "chat", model="m")
    with pytest.raises(ValueError, match="only ended nodes"):
        setup.sink.emit(graph.node(open_node), graph.chain_id)
    with pytest.raises(TypeError, match="Node"):
        setup.sink.emit({"node_id": "n1"}, graph.chain_id)  # type: ignore[arg-type]
    graph.mark_success(open_node, 0.0)
    with pytest.raises(TypeError, match="chain_id"):
        setup.sink.emit(graph.node(open_node), None)  # type: ignore[arg-type]
    assert setup.exporter.get_finished_spans() == ()
    with setup.sink as sink:
        sink.emit(graph.node(open_node), graph.chain_id)
    with pytest.raises(RuntimeError, match="closed"):
        setup.sink.emit(graph.node(open_node), graph.chain_id)
    assert len(setup.exporter.get_finished_spans()) == 1


@settings(max_examples=30, deadline=None)
@given(parents=st.lists(st.integers(min_value=0), min_size=1, max_size=15), data=st.data())
def test_any_tree_in_any_emit_order_keeps_its_links(parents: list[int], data: Any) -> None:
    made = Setup()
    graph = ExecutionGraph()
    ids = [graph.create_root("agent", metadata={META_CONTEXT: True})]
    for pick in parents:
        ids.append(graph.begin_node(ids[pick % len(ids)], "tool", f"t{len(ids)}"))
    for node_id in ids[1:]:
        graph.mark_success(node_id, 0.0)
    graph.mark_success(ids[0], 0.0)
    emit_all(made.sink, graph, data.draw(st.permutations(ids)))
    spans = made.spans()
    for node in graph.nodes():
        parent = spans[node.node_id].parent
        if node.parent_id is None:
            assert parent is None
        else:
            assert parent is not None and parent.span_id == spans[node.parent_id].context.span_id
    made.tracer_provider.shutdown()
    made.meter_provider.shutdown()


class _Receiver(http.server.BaseHTTPRequestHandler):
    """Decodes OTLP/HTTP protobuf trace exports into the server's ``requests`` list."""

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        self.server.requests.append((self.path, request))  # type: ignore[attr-defined]
        payload = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_end_to_end_over_otlp_http() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    server.requests = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
        graph, order = build_run()
        with OtelSink(provider, MeterProvider()) as sink:
            emit_all(sink, graph, order)
        assert provider.force_flush(30_000)
        provider.shutdown()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
    requests = server.requests  # type: ignore[attr-defined]
    assert requests and {path for path, _ in requests} == {"/v1/traces"}
    received = {}
    for _, request in requests:
        for resource_spans in request.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                assert scope_spans.scope.name == "ampmeter"
                for span in scope_spans.spans:
                    attributes = {kv.key: kv.value for kv in span.attributes}
                    received[attributes["ampmeter.node_id"].string_value] = (span, attributes)
    assert set(received) == set(order)
    chat_span, chat_attrs = received[order[0]]
    assert chat_span.name == "chat gpt-4o-mini"
    assert chat_attrs["gen_ai.usage.input_tokens"].int_value == 1200
    assert chat_attrs["ampmeter.cost_usd"].double_value == 0.0125
    trace_id = uuid.UUID(graph.chain_id).bytes
    for node in graph.nodes():
        span, _ = received[node.node_id]
        assert span.trace_id == trace_id
        assert span.span_id == span_id_for(graph.chain_id, node.node_id).to_bytes(8, "big")
        if node.parent_id is None:
            assert span.parent_span_id == b""
        else:
            assert span.parent_span_id == received[node.parent_id][0].span_id
    assert received[order[1]][0].status.message == "search timed out"


_GLOBAL_SCRIPT = """
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from ampmeter.graph import ExecutionGraph
from ampmeter.sinks.otel import OtelSink, span_id_for

sink = OtelSink()  # created before the global provider exists
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
graph = ExecutionGraph()
root = graph.create_root("agent")
step = graph.begin_node(root, "llm", "chat", model="m")
graph.mark_success(step, 0.5, 1, 2)
graph.mark_success(root, 0.0)
sink.emit(graph.node(step), graph.chain_id)
sink.emit(graph.node(root), graph.chain_id)
spans = {s.name: s for s in exporter.get_finished_spans()}
assert spans["chat m"].parent.span_id == span_id_for(graph.chain_id, root), spans
print("ok", len(spans))
"""


def test_uses_the_global_provider_when_none_is_given() -> None:
    # a fresh interpreter: the global provider can be set only once per process
    result = subprocess.run(
        [sys.executable, "-c", _GLOBAL_SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["ok", "2"]
