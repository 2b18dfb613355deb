"""The core's contract: bad numbers, read-only limits, one error tree, the public surface, sink
failures kept away from calls, the executor's iteration count, and interrupts."""

from __future__ import annotations

import inspect
import math
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import pytest

import ampmeter
from ampmeter import (
    CONTINUE,
    ExecutionContext,
    ExecutionStats,
    Executor,
    Limit,
    LimitExceeded,
    ModelCallTrace,
)
from ampmeter._core.usage import Usage
from ampmeter.graph import ExecutionGraph
from ampmeter.keys import (
    KEY_COST,
    KEY_INPUT_TOKENS,
    KEY_INPUT_TOKENS_FOR,
    KEY_ITERATIONS,
    KEY_LLM_CALLS,
    KEY_STEPS,
)
from ampmeter.node import Node
from ampmeter.sinks.base import Sink

# -- bad numbers ------------------------------------------------------------------------------

HUGE = 10**400
BAD_AMOUNTS: list[tuple[object, type[Exception]]] = [
    (HUGE, ValueError),
    (math.nan, ValueError),
    (math.inf, ValueError),
    (-1.0, ValueError),
    (True, TypeError),
    ("1.0", TypeError),
]


@pytest.mark.parametrize(("value", "error"), BAD_AMOUNTS)
@pytest.mark.parametrize("argument", ["max_cost_usd", "timeout_s"])
def test_bad_ceilings_name_the_argument(argument: str, value: object, error: type) -> None:
    with pytest.raises(error, match=argument):
        ExecutionContext(**{argument: value})


@pytest.mark.parametrize(
    ("value", "error"),
    [(HUGE, ValueError), (-1, ValueError), (True, TypeError), (1.5, ValueError), ("3", TypeError)],
)
@pytest.mark.parametrize("argument", ["max_steps", "max_retries"])
def test_bad_count_ceilings_name_the_argument(argument: str, value: object, error: type) -> None:
    with pytest.raises(error, match=argument):
        ExecutionContext(**{argument: value})


@pytest.mark.parametrize(
    ("value", "error"),
    [(HUGE, ValueError), (math.nan, ValueError), (True, TypeError), ("9", TypeError)],
)
def test_bad_limit_values_are_refused(value: object, error: type) -> None:
    with pytest.raises(error, match="max_value"):
        Limit(KEY_COST, value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "error", "name"),
    [
        ({"tokens_in": 2**64}, ValueError, "tokens_in"),
        ({"tokens_in": 2**53 + 1}, ValueError, "tokens_in"),
        ({"tokens_out": -1}, ValueError, "tokens_out"),
        ({"tokens_in": True}, TypeError, "tokens_in"),
        ({"tokens_in": 1.0}, TypeError, "tokens_in"),
        ({"cost_usd": HUGE}, ValueError, "cost_usd"),
        ({"cost_usd": math.nan}, ValueError, "cost_usd"),
        ({"cost_usd": -0.5}, ValueError, "cost_usd"),
        ({"cost_usd": "0.1"}, TypeError, "cost_usd"),
        ({"tokens_in": 10, "cached_tokens": 2**60}, ValueError, "cached_tokens"),
    ],
)
def test_bad_usage_is_refused_and_nothing_changes(
    kwargs: dict[str, Any], error: type, name: str
) -> None:
    with ExecutionContext() as ctx:
        with ctx.llm_call("p", estimate_usd=0.0) as call:
            call.record(tokens_in=5, tokens_out=5, cost_usd=0.25)
            with pytest.raises(error, match=name):
                call.record(**kwargs)
        # The good record stands: the bad one changed nothing.
        assert ctx.stats.total_input_tokens() == 5
        assert ctx.stats.total_cost() == 0.25


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda s: s.incr_counter("k", HUGE), ValueError),
        (lambda s: s.incr_counter("k", 2**53 + 1), ValueError),
        (lambda s: s.set_counter("k", -(2**60)), ValueError),
        (lambda s: s.incr_gauge("g", HUGE), ValueError),
        (lambda s: s.set_gauge("g", math.inf), ValueError),
        (lambda s: s.incr_counter("k", True), TypeError),
        (lambda s: s.incr_gauge("g", "1"), TypeError),
    ],
)
def test_bad_stats_values_change_nothing(call: Any, error: type) -> None:
    stats = ExecutionStats()
    child = ExecutionStats(stats)
    with pytest.raises(error):
        call(child)
    assert stats.counters() == child.counters() == {}
    assert stats.gauges() == child.gauges() == {}


def test_bad_graph_values_name_the_argument() -> None:
    graph = ExecutionGraph()
    root = graph.create_root("r")
    node = graph.begin_node(root, "llm", "c")
    with pytest.raises(ValueError, match="cost_usd"):
        graph.mark_success(node, HUGE)
    with pytest.raises(ValueError, match="tokens_in"):
        graph.mark_success(node, 0.1, 2**64)
    assert graph.node(node).status == "created"
    assert graph.aggregates()["total_cost_usd"] == 0.0


# -- limits are read-only ----------------------------------------------------------------------


def test_limits_cannot_be_replaced_after_construction() -> None:
    ctx = ExecutionContext(max_steps=1)
    with pytest.raises(AttributeError, match="read-only"):
        ctx.limits = [Limit(KEY_LLM_CALLS, 100)]  # type: ignore[misc]
    with ctx.llm_call("a", estimate_usd=0.0) as call:
        call.record(tokens_in=1, tokens_out=1, cost_usd=0.0)
    with pytest.raises(LimitExceeded), ctx.llm_call("b", estimate_usd=0.0):
        pytest.fail("a second call ran past max_steps=1")
    assert ctx.limits == (Limit(KEY_STEPS, 1),)


# -- the executor counts iterations that ran ---------------------------------------------------


def test_executor_stops_when_an_iteration_completes_and_names_the_real_limit() -> None:
    ran = []

    def loop(ctx: ExecutionContext) -> Any:
        ran.append(ctx.iteration)
        ctx.trace(ModelCallTrace(model="m", input_tokens=400))
        return CONTINUE

    limits = [Limit(KEY_ITERATIONS, 3), Limit(KEY_INPUT_TOKENS, 1000)]
    result = Executor(loop, limits).execute()
    assert ran == [1, 2, 3]
    assert result.context.iteration == 3
    assert result.exceeded_limit is not None
    assert result.exceeded_limit.key == KEY_INPUT_TOKENS
    assert result.exceeded_limit.value == 1200


def test_executor_with_only_an_iteration_limit_runs_exactly_n() -> None:
    ran = []
    result = Executor(lambda ctx: ran.append(1) or CONTINUE, [Limit(KEY_ITERATIONS, 4)]).execute()
    assert len(ran) == 4 and result.context.iteration == 4
    assert result.exceeded_limit is not None and result.exceeded_limit.key == KEY_ITERATIONS


# -- one error tree, one surface ---------------------------------------------------------------


def test_every_public_exception_is_an_ampmeter_error() -> None:
    errors = [
        value
        for name in ampmeter.__all__
        if isinstance(value := getattr(ampmeter, name), type) and issubclass(value, Exception)
    ]
    assert len(errors) >= 10
    for error in errors:
        assert issubclass(error, ampmeter.AmpmeterError), error
    assert issubclass(ampmeter.SinkWriteError, OSError)
    assert issubclass(ampmeter.JsonlError, ValueError)
    assert issubclass(ampmeter.BudgetBusy, LimitExceeded)
    from ampmeter.ledgers import LedgerUnavailable

    assert LedgerUnavailable is ampmeter.BudgetUnavailable  # one outage, one class


PUBLIC_API = {
    "AgentLoop",
    "AmpmeterError",
    "AnalysisError",
    "Budget",
    "BudgetBusy",
    "BudgetUnavailable",
    "CONTINUE",
    "Call",
    "Decision",
    "EventSchemaError",
    "ExceededLimit",
    "ExecutionCanceled",
    "ExecutionContext",
    "ExecutionGraph",
    "ExecutionResult",
    "ExecutionStats",
    "Executor",
    "HandoffError",
    "HookAbort",
    "InMemoryLedger",
    "JsonlError",
    "JsonlSink",
    "LLMCallMetrics",
    "Ledger",
    "Limit",
    "LimitEvent",
    "LimitExceeded",
    "LimitType",
    "LogLineError",
    "MemorySink",
    "ModelCallTrace",
    "Node",
    "ParseErrorTrace",
    "Policies",
    "PriceResult",
    "Sink",
    "SinkClosedError",
    "SinkWriteError",
    "SqliteLedger",
    "StreamAbandoned",
    "StreamCumulativeMetrics",
    "StreamMetricsLogger",
    "StreamOutlivedContext",
    "TaskResult",
    "TerminationReason",
    "ToolCallTrace",
    "WebhookSink",
    "WrapOptions",
    "check_limits",
    "clear_prices",
    "current_context",
    "current_node_id",
    "default_limits",
    "estimate",
    "event_errors",
    "final_call",
    "find_limit_exceeded",
    "instrument",
    "instrument_anthropic",
    "instrument_openai",
    "price",
    "read_jsonl",
    "remove_price",
    "set_default_context",
    "set_price",
    "set_tool_price",
    "uninstrument",
    "validate_event",
}


def test_the_public_api_is_pinned() -> None:
    assert set(ampmeter.__all__) == PUBLIC_API  # wiring (keys, pricing, Usage, ...) stays out
    for name in ampmeter.__all__:
        value = getattr(ampmeter, name)
        if callable(value) and not isinstance(value, type(ampmeter)):
            assert inspect.getdoc(value), f"{name} has no docstring"


def test_help_of_execution_context_documents_every_keyword() -> None:
    doc = inspect.getdoc(ExecutionContext) or ""
    for name in inspect.signature(ExecutionContext.__init__).parameters:
        if name != "self":
            assert f"``{name}``" in doc, f"help(ExecutionContext) does not explain {name}"


def test_signatures_and_docstrings_read_like_the_source() -> None:
    signature = inspect.signature(ExecutionContext.__init__)
    assert "max_cost_usd" in signature.parameters and "args" not in signature.parameters
    for method in (
        ExecutionContext.llm_call,
        ampmeter.Call.record,
        ExecutionStats.incr_counter,
        ExecutionGraph.mark_success,
    ):
        assert inspect.getdoc(method)
    hints = inspect.get_annotations(ampmeter.Call.record, eval_str=True)
    assert hints["tokens_in"] == (int | None)
    # Parts billed at their own rates (1-hour cache writes, audio, web searches) are a keyword.
    assert inspect.signature(ampmeter.Call.record).parameters["parts"].kind.name == "KEYWORD_ONLY"
    assert "``parts``" in (inspect.getdoc(ampmeter.Call.record) or "")


# -- Usage is the one translation to keys ------------------------------------------------------


def test_usage_names_its_keys_once() -> None:
    usage = Usage("llm", "gpt-4o", "", 10, 4, 2, 1, 500_000_000, 1, 1)  # $0.50 in nano-dollars
    amounts = usage.amounts()
    assert amounts[KEY_INPUT_TOKENS] == amounts[KEY_INPUT_TOKENS_FOR + "gpt-4o"] == 10
    assert amounts["amp:cached_input_tokens:gpt-4o"] == 2
    assert amounts["amp:reasoning_tokens"] == 1
    assert amounts[KEY_COST] == 0.5 and amounts[KEY_LLM_CALLS] == 1 and amounts[KEY_STEPS] == 1
    tool = Usage("tool", tool="search", calls=1).amounts()
    assert tool == {"amp:tool_calls": 1.0, "amp:tool_calls:search": 1.0}
    with pytest.raises(ValueError, match="cached_tokens"):
        Usage.checked(tokens_in=1, cached_tokens=2)


# -- a failing sink never fails a call ----------------------------------------------------------


class _FullDisk(Sink):
    def __init__(self) -> None:
        self.seen: list[Node] = []

    def emit(self, node: Node, chain_id: str) -> None:
        self.seen.append(node)
        raise OSError(28, "No space left on device")


def test_a_failing_sink_is_reported_at_close_not_to_the_call() -> None:
    sink = _FullDisk()
    ctx = ExecutionContext(sinks=[sink])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            with ctx.llm_call("p", estimate_usd=0.0) as call:  # no OSError here
                call.record(tokens_in=3, tokens_out=1, cost_usd=0.01)
    assert ctx.stats.get_counter(KEY_LLM_CALLS) == 3  # accounting kept
    assert len(ctx.sink_errors) == 1  # the sink's first error; the others are counted
    assert ctx.snapshot()["sink_failures"] == 3
    assert len([w for w in caught if "sink" in str(w.message)]) == 1  # one warning
    assert ctx.snapshot()["sink_errors"][0].startswith("OSError")
    with pytest.raises(OSError, match="No space"):
        ctx.close()


# -- interrupts --------------------------------------------------------------------------------

STORM = textwrap.dedent(
    """
    import os, signal, subprocess, sys, threading, time
    from ampmeter import ExecutionContext, Limit
    from ampmeter.keys import KEY_INPUT_TOKENS_FOR, KEY_LLM_CALLS
    from ampmeter.limits import LimitType

    root = ExecutionContext("storm", max_cost_usd=1e9, max_steps=10**9)
    ctx = root.spawn_child("worker", limits=[Limit(KEY_INPUT_TOKENS_FOR, 1e15, LimitType.PREFIX)])

    def calls():
        with ctx.llm_call("c", model="m", estimate_usd=0.001, max_tokens=5) as call:
            call.record(tokens_in=3, tokens_out=2, cost_usd=0.001)

    # Another process sends SIGINT every ~0.15 ms for the given seconds, then exits. The handler
    # raises only while a call is under way, so the interrupts land in ampmeter's code and the
    # call's block, never in this loop's own bookkeeping. One call is made first, before the
    # storm: the first call imports what calls use (pricing), and CPython's import machinery is
    # not safe against interrupts (one landing just after it takes its global import lock leaves
    # that lock held), so a storm there would hang the next import in any other thread, whatever
    # ampmeter does. A slow machine used to start the storm before that first call ended.
    calls()
    import _imp
    assert not _imp.lock_held()
    armed = False

    def on_sigint(signum, frame):
        if armed:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    # One call first: the price table's first load (an import) is not what this storms.
    calls()
    sender = subprocess.Popen([sys.executable, "-c", SENDER, str(os.getpid()), sys.argv[1]])
    interrupts = done = 0
    while sender.poll() is None:
        try:
            armed = True
            calls()
            armed = False
            done += 1
        except KeyboardInterrupt:
            armed = False
            interrupts += 1

    assert not _imp.lock_held(), "the storm landed in an import"
    # The lock is free: another thread makes a call at once (a daemon, so that a call that hangs
    # fails here, not at exit).
    worker = threading.Thread(target=calls, daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), "a call hangs after the storm"
    del calls
    # A call interrupted where none of its code runs is dropped, and charged when swept; its
    # ticket may live on in a reference cycle (the interrupt's traceback) until a collection,
    # holding its reservation until then. Collected now, every such call is swept at the close.
    import gc
    gc.collect()
    ctx.close()
    assert root.stats.reserved() == {} and ctx.stats.reserved() == {}, ctx.stats.reserved()
    assert root.graph.aggregates()["in_flight"] == 0, root.graph.aggregates()
    # Propagation is whole: the child and the root saw every settled call alike.
    assert root.stats.counters() == ctx.stats.counters(), (root.stats.counters(),
                                                           ctx.stats.counters())
    assert root.stats.get_counter(KEY_LLM_CALLS) >= done
    assert root.graph.aggregates()["max_depth"] <= 3, root.graph.aggregates()
    print(f"ok calls={done} interrupts={interrupts}")
    """
)
SENDER = (
    "import os, signal, sys, time\n"
    "pid, end = int(sys.argv[1]), time.monotonic() + float(sys.argv[2])\n"
    "while time.monotonic() < end:\n"
    "    os.kill(pid, signal.SIGINT)\n"
    "    time.sleep(0.00015)\n"
)


@pytest.mark.slow
def test_an_interrupt_storm_never_hangs_and_leaves_nothing_held(tmp_path: Path) -> None:
    script = tmp_path / "storm.py"
    script.write_text(f"SENDER = {SENDER!r}\n" + STORM)
    seconds = "8" if os.environ.get("CI") else "4"
    result = subprocess.run(
        [sys.executable, str(script), seconds], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    line = result.stdout.strip().splitlines()[-1]
    assert line.startswith("ok"), result.stdout
    interrupts = int(line.split("interrupts=")[1])
    assert interrupts > 100  # the storm really landed


# -- cold start ---------------------------------------------------------------------------------


def test_import_ampmeter_loads_only_the_accounting_core() -> None:
    """``import ampmeter`` leaves ledgers, pricing, sinks and SDKs for first use (a budget is
    checked before every call, so a process should not pay at import for what it never uses)."""
    code = textwrap.dedent(
        """
        import sys
        import ampmeter
        heavy = {
            "ampmeter.ledgers", "ampmeter.propagation", "ampmeter.pricing.table",
            "ampmeter.sinks.jsonl", "ampmeter.integrations", "genai_prices", "sqlite3", "logging",
            "tempfile", "pathlib", "secrets", "orjson", "openai", "anthropic", "httpx",
        }
        print(sorted(heavy & set(sys.modules)))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"
