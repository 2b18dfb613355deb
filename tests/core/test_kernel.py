"""The accounting kernel through its own methods: nodes, usage, admission, settlement.

Money amounts are kept out of the checks on purpose (their representation is the money
module's business); token and call counts show the paths.
"""

from __future__ import annotations

from decimal import Decimal

import pytest

from ampmeter import Limit
from ampmeter._core.cells import Cell, Level
from ampmeter._core.check import Guard, compile_limits
from ampmeter._core.kernel import Kernel
from ampmeter._core.outcome import Outcome
from ampmeter._core.ticket import Ticket
from ampmeter._core.usage import SPENT_AT, Spent, Usage
from ampmeter.keys import KEY_INPUT_TOKENS, KEY_LLM_CALLS, KEY_STEPS
from ampmeter.node import Node


class LevelPlan:
    """Stands for a context's plan: a reservation's input tokens are held at ``hold_at``, and
    a call's usage adds at ``level`` and every level above it."""

    def __init__(self, level: Level, hold_at: Level) -> None:
        self.level, self.hold_at = level, hold_at
        self.hold = None

    def hold_plan(self) -> tuple[object, ...]:
        self.hold_at.note(KEY_INPUT_TOKENS)
        return ((self.hold_at, (KEY_INPUT_TOKENS,)),), ((KEY_INPUT_TOKENS, 0),)

    def settlement(
        self, ticket: Ticket, spent: Spent
    ) -> tuple[tuple[tuple[Cell, int], ...], tuple[Guard, ...]]:
        entries = Usage.of_call("llm", "", "", spent).shape().entries
        return self.level.cells(tuple((k, SPENT_AT[f], g) for k, f, g in entries)), ()


def ticket_at(level: Level, tokens_in: int = 0, hold_at: Level | None = None) -> Ticket:
    """A call in flight at ``level`` reserving ``tokens_in`` input tokens (held at ``hold_at``):
    the kernel's ticket, which it keeps a weak reference to."""
    ticket = Ticket()
    ticket.plan = LevelPlan(level, hold_at or level)
    ticket._reserved = (tokens_in, 0, 0, 1)  # (what its maker sets)
    return ticket


def counters(level: Level) -> dict[str, int]:
    return {key: cell.value for key, cell in level.counters.items()}


def make() -> tuple[Kernel, Level, Level, str]:
    kernel = Kernel("k")
    root = kernel.create_root("root", {})
    parent = Level(None)
    child = Level(parent)
    return kernel, parent, child, root.node_id


def test_a_node_runs_and_ends_once_and_the_aggregates_count_it() -> None:
    kernel, _, _, root = make()
    node = kernel.begin(root, "llm", "ask", "m", {})
    assert node.status == "created" and node.depth == 1
    kernel.run(node)
    assert kernel.aggregates()["in_flight"] == 1
    assert kernel.end(node, Outcome("success", 0, 12, 3))
    assert not kernel.end(node, Outcome("fail"))  # a second end changes nothing
    aggregates = kernel.aggregates()
    assert aggregates["total_tokens_in"] == 12 and aggregates["total_tokens_out"] == 3
    assert aggregates["total_llm_calls"] == 1 and aggregates["in_flight"] == 0
    assert kernel.node(node.node_id).status == "success"


def test_a_begun_node_has_every_field_as_its_keywords_would_set_it() -> None:
    kernel, _, _, root = make()
    meta = {"a": 1}
    node = kernel.begin(root, "llm", "ask", "m", meta)
    expected = Node(
        node.node_id, root, "llm", "ask", node.start_ts_ms, model="m", metadata=meta, depth=1
    )
    assert node == expected and node.metadata is meta


def test_an_ending_sets_each_node_field_of_its_name_and_merges_its_metadata() -> None:
    kernel, _, _, root = make()
    node = kernel.begin(root, "llm", "ask", "m", {"a": 1})
    ending = Outcome("fail", 7, 5, 3, "Timeout", "deadline", {"b": 2})
    assert kernel.end(node, ending)
    ended = kernel.node(node.node_id)
    assert [getattr(ended, name) for name in Outcome._fields[:-1]] == list(ending[:-1])
    assert ended.metadata == {"a": 1, "b": 2} and ended.end_ts_ms is not None
    aggregates = kernel.aggregates()
    assert (aggregates["total_cost_usd"], aggregates["total_tokens_in"]) == (Decimal("7E-9"), 5)


def test_a_second_root_and_an_unknown_parent_are_refused() -> None:
    kernel, _, _, _ = make()
    with pytest.raises(RuntimeError, match="exactly one root"):
        kernel.create_root("again", {})
    with pytest.raises(KeyError, match="n999999"):
        kernel.begin("n999999", "llm", "ask", None, {})


def test_copies_handed_out_do_not_change_the_kernel() -> None:
    kernel, _, _, root = make()
    node = kernel.begin(root, "tool", "search", None, {"a": 1})
    copy = kernel.copy(node.node_id, lambda n: n.to_dict())
    copy["status"] = "success"
    copy["metadata"]["a"] = 2
    _, everything = kernel.copy_all(lambda n: n.to_dict())
    everything[node.node_id]["metadata"]["b"] = 3
    assert kernel.node(node.node_id).status == "created"
    assert kernel.node(node.node_id).metadata == {"a": 1}
    aggregates = kernel.aggregates()
    aggregates["total_llm_calls"] = 99
    assert kernel.aggregates()["total_llm_calls"] == 0


def test_values_are_copies() -> None:
    kernel, parent, child, _ = make()
    kernel.add(child, KEY_INPUT_TOKENS, 5, False)
    seen = counters(child)
    seen[KEY_INPUT_TOKENS] = 1_000
    assert counters(child) == {KEY_INPUT_TOKENS: 5}
    assert counters(parent) == {KEY_INPUT_TOKENS: 5}  # added at every ancestor


def test_usage_is_added_at_the_level_and_every_ancestor() -> None:
    kernel, parent, child, _ = make()
    kernel.add_usage(child, Usage("llm", "", tokens_in=4, tokens_out=2, calls=1))
    for level in (child, parent):
        assert counters(level)[KEY_INPUT_TOKENS] == 4
        assert counters(level)[KEY_LLM_CALLS] == 1


NO_LIMIT = (Guard(Level(None), compile_limits([Limit(KEY_INPUT_TOKENS, 1e12)])),)


def test_admission_holds_and_settlement_replaces_the_hold_by_the_usage() -> None:
    kernel, parent, child, root = make()
    owner = ticket_at(child, tokens_in=100, hold_at=parent)
    node = owner.kernel_node = kernel.begin(root, "llm", "ask", None, {}, owner)
    assert kernel.admit(owner, owner.reserved, NO_LIMIT, True) is None
    assert node.status == "running" and kernel.is_held(node)
    assert kernel.reserved(parent) == {KEY_INPUT_TOKENS: 100}
    spent = (30, 5, 0, 0, 0, 0, 0, 1, 1, 0, 0)  # 30 tokens in, 5 out; one call, one step
    assert kernel.settle(owner, spent, Outcome("success", 0, 30, 5)) is None
    assert not kernel.is_held(node) and kernel.reserved(parent) == {}
    assert counters(parent)[KEY_INPUT_TOKENS] == 30 and counters(child)[KEY_STEPS] == 1
    assert kernel.node(node.node_id).status == "success"
    # settling again adds nothing
    kernel.settle(owner, spent, Outcome("success", 0, 30, 5))
    assert counters(parent)[KEY_INPUT_TOKENS] == 30


def test_a_guard_refuses_what_would_break_a_limit_and_holds_nothing() -> None:
    kernel, parent, child, root = make()
    guards = (Guard(parent, compile_limits([Limit(KEY_INPUT_TOKENS, 50)])),)
    kernel.add(child, KEY_INPUT_TOKENS, 40, False)
    owner = ticket_at(child, tokens_in=20, hold_at=parent)
    node = owner.kernel_node = kernel.begin(root, "llm", "ask", None, {}, owner)
    refused = kernel.admit(owner, owner.reserved, guards, True)
    assert refused is not None
    _, (limit, key, value), waiting_helps = refused
    assert (key, value, waiting_helps) == (KEY_INPUT_TOKENS, 60, False)
    assert limit.max_value == 50
    assert not kernel.is_held(node) and kernel.reserved(parent) == {}
    assert kernel.abort(node, Outcome("halt", stop_reason="limit"))
    assert kernel.node(node.node_id).status == "halt"
    smaller = ticket_at(child, tokens_in=10, hold_at=parent)
    smaller.kernel_node = kernel.begin(root, "llm", "ask", None, {}, smaller)
    assert kernel.admit(smaller, smaller.reserved, guards, True) is None


def test_release_drops_a_hold_without_adding_usage() -> None:
    kernel, parent, _, root = make()
    owner = ticket_at(parent, tokens_in=8)
    node = owner.kernel_node = kernel.begin(root, "llm", "ask", None, {}, owner)
    kernel.admit(owner, owner.reserved, NO_LIMIT, True)
    kernel.release(node)
    assert kernel.reserved(parent) == {} and counters(parent).get(KEY_INPUT_TOKENS, 0) == 0


def test_a_call_whose_owner_is_gone_holds_until_it_is_swept() -> None:
    """Its request may have been sent: what it holds counts until the sweep charges it
    (tests/context/test_dropped_calls.py), never stopping at once."""
    kernel, parent, _, root = make()
    owner = ticket_at(parent, tokens_in=8)
    node = owner.kernel_node = kernel.begin(root, "llm", "ask", None, {}, owner)
    kernel.admit(owner, owner.reserved, NO_LIMIT, True)
    del owner
    guards = (Guard(parent, compile_limits([Limit(KEY_INPUT_TOKENS, 10)])),)
    found = kernel.check(guards, {KEY_INPUT_TOKENS: 5})
    assert found is not None and found[1][1:] == (KEY_INPUT_TOKENS, 13)
    assert kernel.is_held(node) and kernel.node(node.node_id).status == "running"
