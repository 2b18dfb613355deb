"""Configuration as values (issue 38, point 4): a context's limits are a frozen Budget and its
policy options a frozen Policies value, both built from the short keywords too; policies are
registered in one list, so a policy of one's own is one module and one line."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest

from ampmeter import Budget, ExecutionContext, Limit, LimitExceeded, Policies
from ampmeter.limits import ExceededLimit
from ampmeter.policies import registry
from ampmeter.policies.options import Option, Policy
from ampmeter.policies.step import PolicyStep

# -- a third-party policy: one module's worth, and one line to register it ---------------------


class BannedTools(PolicyStep):
    """Refuses tool calls to the tools a context bans (``banned_tools=``), before they run."""

    __slots__ = ("banned",)

    def __init__(self, admission: Any, banned: frozenset[str]) -> None:
        super().__init__(admission)
        self.banned = banned

    def admit(self, flight: Any, thread: int | None) -> None:
        if flight.kind == "tool" and flight.name in self.banned:
            stop = ExceededLimit(Limit("myapp:banned", 0), "myapp:banned", 1, "banned tool")
            raise self.refuse(flight, self.admission.frame, stop)


def _tools(value: object) -> frozenset[str]:
    if isinstance(value, str) or not all(isinstance(v, str) for v in value):  # type: ignore[attr-defined]
        raise TypeError(f"banned_tools must be a list of tool names, got {value!r}")
    return frozenset(value)  # type: ignore[arg-type]


def _make(admission: Any, configured: Any) -> BannedTools | None:
    banned = configured.values.banned_tools
    return None if banned is None else BannedTools(admission, banned)


BANNED = Policy("banned_tools", (Option("banned_tools", _tools, inherited=True),), _make)


@pytest.fixture
def registered() -> Iterator[None]:
    before = list(registry.POLICIES)
    registry.POLICIES.append(BANNED)  # the one line
    try:
        yield
    finally:
        registry.POLICIES[:] = before


@pytest.mark.usefixtures("registered")
def test_a_policy_registered_by_one_line_is_applied_and_inherited() -> None:
    with ExecutionContext("run", banned_tools=["rm"]) as ctx:
        with ctx.tool_call("ls") as call:
            call.record()
        with pytest.raises(LimitExceeded, match="banned tool"), ctx.tool_call("rm"):
            pass
        child = ctx.spawn_child("child")  # an inherited option binds the child too
        assert child.policies.banned_tools == frozenset({"rm"})
        with pytest.raises(LimitExceeded, match="banned tool"), child.tool_call("rm"):
            pass
        child.close()
    assert ExecutionContext(policies=Policies(banned_tools=("x",))).policies == Policies(
        banned_tools=["x"]
    )
    with pytest.raises(TypeError, match="banned_tools must be a list"):
        ExecutionContext(banned_tools="rm")
    registry.POLICIES.append(Policy("again", (Option("banned_tools", _tools),), _make))
    try:
        with pytest.raises(ValueError, match="two registered policies take the keyword"):
            ExecutionContext(banned_tools=["x"])
    finally:
        registry.POLICIES.pop()


def test_an_unregistered_keyword_is_refused_by_name() -> None:
    with pytest.raises(TypeError, match="unknown keyword 'banned_tools'"):
        ExecutionContext(banned_tools=["rm"])
    with pytest.raises(TypeError, match="unknown keyword 'handoff_from'"):
        ExecutionContext(handoff_from=None)  # made by from_handoff only
    with pytest.raises(TypeError, match="unknown keyword 'max_repeat'"):
        Policies(max_repeat=3)


# -- frozen values, inherited -----------------------------------------------------------------


def test_values_are_frozen_and_children_inherit_the_policies() -> None:
    budget = Budget(max_cost_usd=1, warn_at=[0.8, 0.5])
    assert budget.max_cost_usd == Decimal("1") and budget.warn_at == (0.5, 0.8)
    with pytest.raises(dataclasses.FrozenInstanceError):
        budget.max_cost_usd = Decimal(2)  # type: ignore[misc]
    policies = Policies(on_unpriced="warn", max_repeats=2, pressure_at=0.5)
    with pytest.raises(AttributeError, match="frozen"):
        policies.max_repeats = 3
    with pytest.raises(AttributeError, match="frozen"):
        del policies._values
    assert hash(policies) == hash(Policies(pressure_at=0.5, max_repeats=2, on_unpriced="warn"))
    with ExecutionContext("run", budget=budget, policies=policies) as ctx:
        assert ctx.budget is budget and ctx.policies is policies
        with pytest.raises(AttributeError):
            ctx.policies = Policies()  # type: ignore[misc]
        child = ctx.spawn_child("child", max_input_tokens_per_call=100)
        # inherited options come from above; max_repeats is the parent's own (it still binds
        # the child through the parent's loop guard)
        assert child.policies == Policies(
            on_unpriced="warn", pressure_at=0.5, max_input_tokens_per_call=100
        )
        assert child.budget == Budget() and child.limits == ()
        grandchild = child.spawn_child("grandchild", on_unpriced="allow")
        assert grandchild.policies.on_unpriced == "allow"
        assert grandchild.policies.max_input_tokens_per_call == 100
        for sub in (grandchild, child):
            sub.close()
    assert copy.deepcopy(policies) == pickle.loads(pickle.dumps(policies)) == policies
    assert copy.deepcopy(budget) == budget
    # wiring is not on the context
    assert not hasattr(ctx, "policy_options") and not hasattr(ctx, "on_ledger_error")
    assert not hasattr(ctx, "configured_policies")


# -- short keywords and values build the same context -------------------------------------------


def _run(ctx: ExecutionContext) -> list[str]:
    """Three identical tool calls and a costly one; what happened to each."""
    seen = []
    with ctx:
        for _ in range(3):
            try:
                with ctx.tool_call("search", arguments={"q": "x"}) as call:
                    call.record()
                seen.append("ran")
            except LimitExceeded as stop:
                seen.append(f"stopped: {stop.exceeded.note if stop.exceeded else stop}")
        try:
            with ctx.llm_call("think", estimate_usd=0.9) as call:
                call.record(cost_usd=0.9)
            seen.append("ran")
        except LimitExceeded:
            seen.append("reserve kept")
    seen.extend(e["kind"] for e in ctx.snapshot()["limit_events"])
    return seen


def test_short_keywords_and_values_give_equal_contexts() -> None:
    short = ExecutionContext(
        "run",
        max_cost_usd=1.0,
        warn_at=(0.5,),
        timeout_s=60,
        max_repeats=2,
        final_reserve_usd=0.2,
        on_unpriced="warn",
    )
    valued = ExecutionContext(
        "run",
        budget=Budget(max_cost_usd=1.0, warn_at=(0.5,), timeout_s=60),
        policies=Policies(max_repeats=2, final_reserve_usd=0.2, on_unpriced="warn"),
    )
    assert short.budget == valued.budget and short.policies == valued.policies
    assert short.limits == valued.limits == (Limit("amp:cost", Decimal("1"), warn_at=(0.5,)),)
    expected = ["ran", "ran", "stopped: loop detected", "reserve kept"]
    for ctx in (short, valued):
        got = _run(ctx)
        assert got[:2] == expected[:2] and got[2].startswith(expected[2]), got
        assert got[3] == "reserve kept"


@pytest.mark.parametrize(
    ("keywords", "error", "match"),
    [
        ({"budget": Budget(max_steps=3), "max_cost_usd": 1}, TypeError, "budget= or max_cost_usd="),
        ({"policies": Policies(), "max_repeats": 2}, TypeError, "policies= or max_repeats="),
        ({"budget": {"max_steps": 3}}, TypeError, "budget must be a Budget"),
        ({"policies": {"max_repeats": 3}}, TypeError, "policies must be a Policies"),
        ({"limits": 0}, TypeError, "limits must be a list of Limit"),
        ({"max_cost_usd": -1}, ValueError, "max_cost_usd"),
        ({"warn_at": (1.5,)}, ValueError, "warn_at"),
        ({"pause_timeout_s": -1}, ValueError, "pause_timeout_s"),
        ({"on_exhausted": "wait"}, ValueError, "on_exhausted"),
        ({"max_repeats": -1}, ValueError, "max_repeats"),
        ({"pressure_at": 0}, ValueError, "pressure_at"),
        ({"downgrade": {0.5: {"a": "b"}}, "on_budget_pressure": print}, ValueError, "downgrade="),
        ({"final_reserve_usd": 0.5}, ValueError, "needs a cost limit"),
    ],
)
def test_values_and_keywords_refuse_the_same_way(
    keywords: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        ExecutionContext(**keywords)
    with ExecutionContext("parent") as parent, pytest.raises(error, match=match):
        parent.spawn_child("child", **keywords)


def test_max_llm_calls_is_a_short_keyword_like_max_steps() -> None:
    with ExecutionContext("run", max_llm_calls=2) as ctx:
        assert ctx.limits == (Limit("amp:llm_calls", 2),) and ctx.budget.max_llm_calls == 2
        for _ in range(2):
            with ctx.llm_call("think", estimate_usd=0.0) as call:
                call.record(cost_usd=0.0)
        with pytest.raises(LimitExceeded, match="amp:llm_calls"), ctx.llm_call("think"):
            pass
    with pytest.raises(ValueError, match="max_llm_calls must be a whole number"):
        Budget(max_llm_calls=1.5)  # type: ignore[arg-type]
