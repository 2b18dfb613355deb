"""One object per call and a plan per (kind, model) (issue 38, points 2 and 3).

The :class:`~ampmeter.Call` a caller holds is the kernel's ticket itself (no second object
per call); every call of one kind and model in a context follows one compiled plan; a context
reads exactly what its descendants used, under threads too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from decimal import Decimal

import pytest

from ampmeter import ExecutionContext, Limit
from ampmeter._core.ticket import Ticket
from ampmeter._core.views import bound
from ampmeter.keys import KEY_COST, KEY_INPUT_TOKENS, KEY_LLM_CALLS
from support.entered import entered


def test_a_call_is_the_kernels_ticket_and_its_identity_is_read_only() -> None:
    ctx = ExecutionContext(max_cost_usd=1)
    with ctx.llm_call("plan", model="gpt-4o-mini", prompt_tokens=10, max_tokens=5) as call:
        assert isinstance(call, Ticket)
        assert call.reservation.tokens_in == 10  # what the kernel holds, read on the call
        for name in ("kind", "name", "model", "provider", "reservation", "idempotency_key"):
            with pytest.raises(AttributeError, match=rf"Call\.{name} is read-only"):
                setattr(call, name, None)
        call.record(tokens_in=10, tokens_out=5)
    assert (call.kind, call.model, call.name) == ("llm", "gpt-4o-mini", "plan")


def test_calls_of_one_kind_and_model_share_one_plan_and_skip_steps_that_never_act() -> None:
    with ExecutionContext(max_cost_usd=1, max_input_tokens_per_call=100) as ctx:
        calls = [ctx.llm_call("a", model="gpt-4o-mini", prompt_tokens=1) for _ in range(3)]
        assert calls[0].plan is calls[1].plan is calls[2].plan
        other = ctx.llm_call("b", model="gpt-4o", prompt_tokens=1)
        assert other.plan is not calls[0].plan
        tool = ctx.tool_call("search")
        unknown = ctx.llm_call("c", model="no-such-model", prompt_tokens=1)
        tool_steps = {type(s).__name__ for s in tool.plan.admitters}
        llm_only = {type(s).__name__ for s in calls[0].plan.admitters} - tool_steps
        assert llm_only == {"InputCap"}  # the unpriced rule is no priced call's business
        unpriced_only = {type(s).__name__ for s in unknown.plan.admitters} - tool_steps
        assert unpriced_only == {"Unpriced", "InputCap"}
        for call in (*calls, other, tool, unknown):
            call.finish()


def test_a_model_priced_later_follows_the_priced_plan_and_one_unpriced_again_is_refused() -> None:
    from ampmeter import LimitExceeded, clear_prices, set_price

    with ExecutionContext(max_cost_usd=1) as ctx:
        with pytest.raises(LimitExceeded, match="has no price"):
            ctx.llm_call("a", model="later-priced", prompt_tokens=10).start()
        set_price("later-priced", input_per_mtok=1, output_per_mtok=2)
        try:
            with ctx.llm_call("b", model="later-priced", prompt_tokens=10) as call:
                assert "Unpriced" not in {type(s).__name__ for s in call.plan.admitters}
                call.record(tokens_in=10, tokens_out=0)
        finally:
            clear_prices()
        with pytest.raises(LimitExceeded, match="has no price"):
            ctx.llm_call("c", model="later-priced", prompt_tokens=10).start()


def _cost(ctx: ExecutionContext) -> Decimal:
    return ctx.stats.total_cost()


def test_a_context_without_limits_reads_exactly_what_its_descendants_used_under_threads() -> None:
    root = ExecutionContext("root")
    planner = root.spawn_child("planner")
    workers = [planner.spawn_child(f"w{i}", max_cost_usd=100) for i in range(4)]
    kernel, planner_level = bound(planner.stats)
    assert planner_level is not None

    def work(ctx: ExecutionContext) -> None:
        for _ in range(200):
            with ctx.llm_call("step", model="gpt-4o-mini", estimate_usd=0.001) as call:
                call.record(tokens_in=3, tokens_out=1, cost_usd=0.000125)

    threads = [threading.Thread(target=work, args=(w,)) for w in workers]
    threads.append(threading.Thread(target=work, args=(planner,)))  # its own calls too
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # (the planner's level is folded: its calls are its own cell, its workers' are read)
    assert kernel.value(planner_level, KEY_LLM_CALLS, False) == 1_000
    assert planner.stats.get_counter(KEY_LLM_CALLS) == 1_000
    assert root.stats.get_counter(KEY_INPUT_TOKENS) == 3_000
    assert _cost(root) == _cost(planner) == Decimal("0.125")
    assert root.stats.counters() == planner.stats.counters()
    assert root.stats.gauges()[KEY_COST] == Decimal("0.125")


def test_setting_a_childs_key_leaves_what_its_parent_reads() -> None:
    root = ExecutionContext("root")
    child = root.spawn_child("child")
    child.stats.incr_counter("my:count", 5)
    child.stats.set_counter("my:count", 1)  # local: the parent keeps what was counted
    assert (child.stats.get_counter("my:count"), root.stats.get_counter("my:count")) == (1, 5)
    root.stats.set_counter("my:count", 2)
    child.stats.incr_counter("my:count", 1)
    assert (child.stats.get_counter("my:count"), root.stats.get_counter("my:count")) == (2, 3)


def test_an_admission_is_a_plain_call_unless_a_step_waits_then_it_hands_back_the_waits() -> None:
    from ampmeter import BudgetBusy
    from ampmeter._core.ticket import ADMITTED

    ctx = ExecutionContext(max_cost_usd=1, admission_timeout_s=0.05)
    first = ctx.llm_call("a", model="gpt-4o-mini", estimate_usd=0.6)
    assert first.plan.admission.admit(first, threading.get_ident(), first.reserved) is None
    assert first.phase == ADMITTED and first.node.status == "running"
    # What is spent leaves room, the first call's hold does not: the second waits for it.
    second = ctx.llm_call("b", model="gpt-4o-mini", estimate_usd=0.6)
    waits = second.plan.admission.admit(second, threading.get_ident(), second.reserved)
    assert waits is not None
    with pytest.raises(BudgetBusy):
        for _ in waits:
            pass
    assert second.node.status == "halt"
    first.finish()
    assert ctx.stats.reserved() == {}


def _ampmeter_calls(run: Callable[[], object]) -> list[str]:
    """The ampmeter functions ``run`` enters, in order."""
    return entered(run, lambda frame: "/ampmeter/" in frame.f_code.co_filename)


def test_a_call_no_policy_acts_on_goes_from_the_admission_straight_to_the_kernel() -> None:
    ctx = ExecutionContext(max_cost_usd=1)
    warm = ctx.llm_call("warm", model="gpt-4o-mini", prompt_tokens=10, max_tokens=5)
    warm.start().finish()  # compiles the plan, where its reservations are held
    call = ctx.llm_call("plan", model="gpt-4o-mini", prompt_tokens=10, max_tokens=5)
    assert call.plan.admitters == ()
    entered = _ampmeter_calls(call.start)
    # (No usage is made to be held: the plan knows the keys, the call its counts.)
    assert entered == ["Call.start", "Admission.admit", "Kernel.admit", "Kernel._check"]
    assert call.node.status == "running"
    ended = _ampmeter_calls(call.finish)
    settling = ended[ended.index("Admission.settle") :]
    assert settling[:3] == ["Admission.settle", "Kernel.settle", "KindPlan.settlement"]
    # What it spent is added from the tuple its end made: no Usage is made or shaped for it.
    assert not [name for name in ended if name.startswith("Usage.")]
    assert "Kernel._spent_past" in settling  # its usage reaches the cost ceiling: checked
    assert ctx.stats.reserved() == {}


def test_settling_checks_the_ceilings_its_usage_reaches_at_every_level_and_only_those() -> None:
    from ampmeter import Limit, LimitExceeded, LimitType, TerminationReason
    from ampmeter.keys import KEY_INPUT_TOKENS_FOR

    root = ExecutionContext("root", limits=[Limit("my:count", 1)])
    worker = root.spawn_child("worker", max_cost_usd=1)
    with worker.tool_call("search"):  # adds to no key a ceiling watches: not checked
        root.stats.incr_counter("my:count", 5)  # past its ceiling, by the caller, unchecked
    assert (root.termination_reason, worker.termination_reason) == (None, None)
    with pytest.raises(LimitExceeded, match="my:count"):  # found before the next call
        worker.tool_call("again").start()
    assert worker.termination_reason is TerminationReason.LIMIT_EXCEEDED

    root = ExecutionContext("root")
    per_model = Limit(KEY_INPUT_TOKENS_FOR, 100, LimitType.PREFIX)
    child = root.spawn_child("child", limits=[per_model])
    worker = child.spawn_child("worker", max_cost_usd=1)
    # A model first seen now: its per-model key, two levels up, is passed by what it used.
    with worker.llm_call("ask", model="gpt-4o-mini", prompt_tokens=10, max_tokens=5) as call:
        call.record(tokens_in=150, tokens_out=5)
    assert worker.termination_reason is TerminationReason.LIMIT_EXCEEDED
    assert child.termination_reason is TerminationReason.LIMIT_EXCEEDED
    assert child.exceeded_limit is not None
    assert child.exceeded_limit.key == KEY_INPUT_TOKENS_FOR + "gpt-4o-mini"
    assert root.termination_reason is None  # the owner was the child: the stop ends there


def test_a_settlement_stops_a_context_for_what_is_spent_not_for_what_others_hold() -> None:
    from ampmeter import TerminationReason

    ctx = ExecutionContext("run", max_cost_usd=1)
    first = ctx.llm_call("first", estimate_usd=0.8).start()  # holds 0.8 while in flight
    with ctx.llm_call("second", estimate_usd=0.1) as call:
        call.record(cost_usd=0.3)  # spent 0.3; with the hold 1.1, yet nothing is over
    assert (ctx.termination_reason, ctx.exceeded_limit) == (None, None)
    first.record(cost_usd=0.5)
    first.finish()
    assert ctx.stats.total_cost() == Decimal("0.8")
    ctx.close()
    assert ctx.termination_reason is TerminationReason.SUCCESS

    ctx = ExecutionContext("run", max_cost_usd=1)
    with ctx.llm_call("over", estimate_usd=0.1) as call:
        call.record(cost_usd=1.5)  # spent past the ceiling: the context stops, naming it
    assert ctx.termination_reason is TerminationReason.LIMIT_EXCEEDED
    assert ctx.exceeded_limit is not None and ctx.exceeded_limit.value == Decimal("1.5")


def test_a_plan_holds_every_key_its_calls_may_reserve_whatever_the_first_ones_amounts() -> None:
    from ampmeter import BudgetBusy

    limits = [Limit("amp:tool_calls", 3)]
    ctx = ExecutionContext(max_cost_usd=1, limits=limits, admission_timeout_s=0.05)
    free = ctx.tool_call("search").start()  # compiles the plan: no cost to hold
    priced = ctx.tool_call("search", estimate_usd=0.25).start()
    assert priced.plan is free.plan and priced.reserved == (0, 0, 250_000_000, 1)
    assert ctx.stats.reserved() == {KEY_COST: Decimal("0.25"), "amp:tool_calls": 2}
    assert priced.reservation.amounts()[KEY_COST] == Decimal("0.25")  # made when read
    with pytest.raises(BudgetBusy, match="amp:cost"):
        ctx.tool_call("search", estimate_usd=0.8).start()  # 0.25 held + 0.8 > $1
    free.finish()
    priced.finish()
    assert ctx.stats.reserved() == {}


def test_a_settlement_is_found_by_which_amounts_are_zero() -> None:
    from ampmeter.keys import KEY_CACHED_INPUT_TOKENS, KEY_STEPS, KEY_TOOL_CALLS_FOR

    ctx = ExecutionContext(max_cost_usd=1)
    for name in ("search", "fetch", "search"):  # a plan per tool
        with ctx.tool_call(name):
            pass
    stats = ctx.stats
    assert stats.get_counter(KEY_TOOL_CALLS_FOR + "search") == 2
    assert stats.get_counter(KEY_TOOL_CALLS_FOR + "fetch") == 1
    with ctx.llm_call("first", model="gpt-4o-mini") as call:
        call.record(100, 10)  # no cached tokens: no cached key yet
    assert KEY_CACHED_INPUT_TOKENS not in stats.counters()
    with ctx.llm_call("second", model="gpt-4o-mini") as call:
        call.record(100, 10, cached_tokens=40)
    with pytest.raises(RuntimeError), ctx.llm_call("third", model="gpt-4o-mini") as failed:
        failed.record(7, 1)
        raise RuntimeError("a retry: counted as one, not as a step")
    with ctx.embedding_call(model="text-embedding-3-small") as embedding:
        embedding.record(50)  # its tokens and cost, no LLM call and no step
    assert stats.get_counter(KEY_CACHED_INPUT_TOKENS) == 40
    assert stats.get_counter(KEY_INPUT_TOKENS) == 100 + 100 + 7 + 50
    assert stats.get_counter(KEY_LLM_CALLS) == 3 and stats.get_counter(KEY_STEPS) == 3 + 2
    assert stats.get_counter("amp:retries") == 1
    # Each pattern of zero amounts (and each tool) compiled once, then found.
    assert len(call.plan.settles) == 3 and len(failed.plan.settles) == 3
