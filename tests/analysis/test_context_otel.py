"""OtelSink fed by a real ExecutionContext: sub-agents, LLM and tool calls, halted calls."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from ampmeter.context import ExecutionContext
from ampmeter.errors import BudgetUnavailable, LimitExceeded
from ampmeter.graph import ExecutionGraph
from ampmeter.keys import KEY_COST
from ampmeter.ledgers import RedisLedger
from ampmeter.sinks.otel import OtelSink, span_id_for, trace_id_for
from support.redis_server import free_port


class Otel:
    """A tracer provider with a batching processor into memory, and an in-memory metric reader."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(BatchSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def sink(self) -> OtelSink:
        return OtelSink(tracer_provider=self.tracer_provider, meter_provider=self.meter_provider)

    def spans(self) -> dict[str, ReadableSpan]:
        assert self.tracer_provider.force_flush()
        spans = self.exporter.get_finished_spans()
        by_node = {str((s.attributes or {})["ampmeter.node_id"]): s for s in spans}
        assert len(by_node) == len(spans)  # one span per node, none twice
        return by_node

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
def otel() -> Iterator[Otel]:
    made = Otel()
    yield made
    made.tracer_provider.shutdown()
    made.meter_provider.shutdown()


def _assert_mirrors_graph(graph: ExecutionGraph, spans: dict[str, ReadableSpan]) -> None:
    """Every node has exactly one span, in one trace, under its parent node's span."""
    nodes = graph.nodes()
    assert set(spans) == {n.node_id for n in nodes}
    assert {s.context.trace_id for s in spans.values()} == {trace_id_for(graph.chain_id)}
    for node in nodes:
        span = spans[node.node_id]
        assert span.context.span_id == span_id_for(graph.chain_id, node.node_id)
        assert node.end_ts_ms is not None
        assert span.start_time == node.start_ts_ms * 1_000_000
        assert span.end_time == node.end_ts_ms * 1_000_000
        if node.parent_id is None:
            assert span.parent is None
        else:
            assert span.parent is not None
            assert span.parent.span_id == spans[node.parent_id].context.span_id


def test_an_agent_run_exports_spans_that_mirror_its_graph(otel: Otel) -> None:
    with ExecutionContext("planner", max_cost_usd=10.0, sinks=[otel.sink()]) as ctx:
        with ctx.llm_call("plan", model="gpt-4o-mini", estimate_usd=0.01) as plan:
            plan.record(1200, 300, cost_usd=0.0125, cached_tokens=1000, reasoning_tokens=120)
        with ctx.spawn_child("researcher", max_cost_usd=0.5) as child:
            with child.tool_call("web_search") as search:
                pass
            with pytest.raises(TimeoutError), child.tool_call("fetch_page") as fetch:
                raise TimeoutError("page timed out")
            with child.llm_call("read", model="claude-sonnet-4", estimate_usd=0.1) as read:
                read.record(400, 50, cost_usd=0.25)
            with (
                pytest.raises(LimitExceeded) as caught,
                child.llm_call("read_more", model="claude-sonnet-4", estimate_usd=0.5),
            ):
                pytest.fail("the child's cost limit must stop this call")
        with ctx.llm_call("answer", model="gpt-4o-mini", estimate_usd=0.01) as answer:
            answer.record(200, 80, cost_usd=0.002)
    halted_id = caught.value.node_id
    assert halted_id is not None
    spans = otel.spans()
    _assert_mirrors_graph(ctx.graph, spans)

    root, sub = spans[ctx.node_id], spans[child.node_id]
    assert root.name == "invoke_agent planner"
    assert sub.name == "invoke_agent researcher"
    for agent, name in ((root, "planner"), (sub, "researcher")):
        assert agent.attributes is not None
        assert agent.attributes["gen_ai.operation.name"] == "invoke_agent"
        assert agent.attributes["gen_ai.agent.name"] == name
    assert sub.parent is not None and sub.parent.span_id == root.context.span_id
    assert spans[plan.node_id].name == "chat gpt-4o-mini"
    assert spans[read.node_id].name == "chat claude-sonnet-4"
    assert spans[search.node_id].name == "execute_tool web_search"
    for call in (search, fetch, read):
        parent = spans[call.node_id].parent
        assert parent is not None and parent.span_id == sub.context.span_id

    plan_attrs = dict(spans[plan.node_id].attributes or {})
    assert plan_attrs["gen_ai.usage.input_tokens"] == 1200
    assert plan_attrs["gen_ai.usage.output_tokens"] == 300
    assert plan_attrs["gen_ai.usage.cache_read.input_tokens"] == 1000
    assert plan_attrs["gen_ai.usage.reasoning.output_tokens"] == 120
    assert plan_attrs["ampmeter.cost_usd"] == 0.0125
    assert dict(spans[search.node_id].attributes or {})["gen_ai.tool.name"] == "web_search"

    halted = spans[halted_id]
    halted_node = ctx.graph.node(halted_id)
    assert halted_node.status == "halt"
    assert halted_node.stop_reason is not None and KEY_COST in halted_node.stop_reason
    assert halted.name == "chat claude-sonnet-4"
    assert halted.status.status_code is StatusCode.ERROR
    assert halted.status.description == halted_node.stop_reason
    assert halted.attributes is not None
    assert halted.attributes["ampmeter.stop_reason"] == halted_node.stop_reason
    assert halted.attributes["error.type"] == "halt"
    # the sub-agent whose limit fired ends halted too; the run above it succeeds
    assert sub.status.status_code is StatusCode.ERROR
    assert sub.status.description == ctx.graph.node(child.node_id).stop_reason
    assert spans[fetch.node_id].status.status_code is StatusCode.ERROR
    assert dict(spans[fetch.node_id].attributes or {})["error.type"] == "TimeoutError"
    for ok in (root, spans[plan.node_id], spans[read.node_id], spans[answer.node_id]):
        assert ok.status.status_code is StatusCode.UNSET


def test_token_metrics_add_up_to_the_context_usage(otel: Otel) -> None:
    with ExecutionContext("planner", sinks=[otel.sink()]) as ctx:
        for tokens_in, tokens_out in ((120, 30), (300, 45), (7, 2)):
            with ctx.llm_call("step", model="gpt-4o-mini") as call:
                call.record(tokens_in, tokens_out, cost_usd=0.001)
        with ctx.spawn_child("helper") as child, child.llm_call("aside", model="m") as aside:
            aside.record(50, 5, cost_usd=0.0)
    points = otel.histogram("gen_ai.client.token.usage")
    by_type: dict[str, float] = {}
    for point in points:
        token_type = str(dict(point.attributes or {})["gen_ai.token.type"])
        by_type[token_type] = by_type.get(token_type, 0) + point.sum
    assert by_type == {
        "input": ctx.stats.total_input_tokens(),
        "output": ctx.stats.total_output_tokens(),
    }
    assert sum(p.count for p in otel.histogram("gen_ai.client.operation.duration")) == 4


def test_a_call_stopped_by_an_unreachable_ledger_exports_an_error_span(otel: Otel) -> None:
    ledger = RedisLedger(f"redis://127.0.0.1:{free_port()}/0", "otel", timeout_s=0.2)
    ctx = ExecutionContext("worker", max_cost_usd=1.0, ledger=ledger, sinks=[otel.sink()])
    with (
        pytest.raises(BudgetUnavailable) as caught,
        ctx.llm_call("plan", model="gpt-4o-mini", estimate_usd=0.1),
    ):
        pytest.fail("an unreachable ledger must stop the call")
    ctx.close()
    ledger.close()
    node_id = caught.value.node_id
    assert node_id is not None
    spans = otel.spans()
    _assert_mirrors_graph(ctx.graph, spans)
    span = spans[node_id]
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description is not None and "unavailable" in span.status.description
    assert span.status.description == ctx.graph.node(node_id).stop_reason


def test_calls_from_threads_and_tasks_attach_to_their_agent_spans(otel: Otel) -> None:
    with ExecutionContext("fanout", sinks=[otel.sink()]) as ctx:
        children = [ctx.spawn_child(f"worker-{i}") for i in range(4)]

        def run(child: ExecutionContext) -> None:
            with child:
                for _ in range(5):
                    with child.tool_call("lookup"):
                        pass

        threads = [threading.Thread(target=run, args=(c,)) for c in children]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)

        async def ask(child: ExecutionContext) -> None:
            async with child, child.llm_call("think", model="m") as call:
                await asyncio.sleep(0)
                call.record(10, 1, cost_usd=0.0)

        asyncio.run(_gather(ask, [ctx.spawn_child(f"task-{i}") for i in range(3)]))
    spans = otel.spans()
    _assert_mirrors_graph(ctx.graph, spans)
    agents = [n for n in ctx.graph.nodes() if n.parent_id == ctx.node_id]
    assert sorted(spans[a.node_id].name for a in agents) == sorted(
        [f"invoke_agent worker-{i}" for i in range(4)]
        + [f"invoke_agent task-{i}" for i in range(3)]
    )
    for agent in agents:
        below = [n for n in ctx.graph.nodes() if n.parent_id == agent.node_id]
        assert len(below) == (5 if agent.name.startswith("worker") else 1)


async def _gather(
    ask: Callable[[ExecutionContext], Awaitable[None]], children: list[ExecutionContext]
) -> None:
    await asyncio.gather(*(ask(child) for child in children))
