"""A call is read-only from outside: ``record()`` is the only writer of its counts, and only
the call ends its node.

Counts assigned to a call would be settled unchecked (a negative input count gives a cap
back), and a node ended through the graph while its call is in flight would swallow the call's
own record and keep its hold for ever. Both are refused with an error that says what to do,
and nothing changes.
"""

from __future__ import annotations

import time

import pytest

from ampmeter import ExecutionContext, Limit, LimitExceeded
from ampmeter.keys import KEY_INPUT_TOKENS, KEY_LLM_CALLS

COUNTS = [
    "tokens_in",
    "tokens_out",
    "cached_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
    "tool_calls_made",
]


@pytest.mark.parametrize("name", COUNTS)
def test_a_calls_counts_cannot_be_assigned_and_the_cap_holds(name: str) -> None:
    with ExecutionContext(limits=[Limit(KEY_INPUT_TOKENS, 100)]) as ctx:
        with ctx.llm_call("plan", model="gpt-4o-mini", prompt_tokens=10, max_tokens=5) as call:
            with pytest.raises(AttributeError, match=rf"{name} is read-only.*call\.record"):
                setattr(call, name, -1000)
            with pytest.raises(AttributeError, match=rf"{name} is read-only"):
                delattr(call, name)
            assert getattr(call, name) == (None if name in ("tokens_in", "tokens_out") else 0)
            call.record(tokens_in=100, tokens_out=5)
            with pytest.raises(AttributeError, match=name):
                setattr(call, name, 0)
        assert (call.tokens_in, call.tokens_out) == (100, 5)  # still readable
        with (
            pytest.raises(LimitExceeded),
            ctx.llm_call("more", model="gpt-4o-mini", prompt_tokens=1, max_tokens=5),
        ):
            pass
        assert ctx.stats.get_counter(KEY_INPUT_TOKENS) == 100


def test_the_graph_refuses_to_end_the_node_of_a_call_in_flight() -> None:
    """The refusal changes nothing: the call records and ends as usual, its hold comes back
    at once, and the next call goes without waiting for it."""
    with ExecutionContext(max_cost_usd=0.001, admission_timeout_s=5.0) as ctx:
        made = ctx.llm_call("made", model="gpt-4o-mini", prompt_tokens=10, max_tokens=10)
        with pytest.raises(RuntimeError, match=r"call in flight.*call\.record"):
            ctx.graph.mark_halt(made.node_id, "not yours")  # made, not yet admitted
        with made as call:
            for mark in (
                lambda: ctx.graph.mark_success(call.node_id, 0),
                lambda: ctx.graph.mark_failure(call.node_id, "Boom", cost_usd=0),
                lambda: ctx.graph.mark_halt(call.node_id),
            ):
                with pytest.raises(RuntimeError, match=f"node {call.node_id} .*call in flight"):
                    mark()
            assert ctx.graph.node(call.node_id).status == "running"
            assert ctx.stats.reserved()  # its hold is still there
            call.record(tokens_in=10, tokens_out=10)
        node = ctx.graph.node(call.node_id)
        assert (node.status, node.tokens_in, node.tokens_out) == ("success", 10, 10)
        assert node.cost_usd > 0
        assert not ctx.stats.reserved()
        started = time.monotonic()
        with ctx.llm_call("next", model="gpt-4o-mini", prompt_tokens=10, max_tokens=10) as more:
            more.record(tokens_in=10, tokens_out=10)
        assert time.monotonic() - started < 1.0  # admitted at once: no hold left behind
        ctx.graph.mark_success(call.node_id, 1)  # an ended node: no change, as documented
    assert ctx.stats.get_counter(KEY_LLM_CALLS) == 2
    assert ctx.graph.aggregates()["total_cost_usd"] == ctx.stats.total_cost()


def test_nodes_begun_through_the_graph_are_still_marked_through_it() -> None:
    with ExecutionContext() as ctx:
        root = ctx.graph.root_id
        assert root is not None
        node = ctx.graph.begin_node(root, "tool", "search")
        ctx.graph.mark_success(node, 0.25, 3, 4)
    assert ctx.graph.node(node).status == "success"
    assert ctx.graph.aggregates()["total_tool_calls"] == 1
