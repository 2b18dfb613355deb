"""The policies configured for one context: what it declares (its own event list, loop-guard
counts, windows and watched limits) and the policy steps its admission holds.

A context makes its :class:`Policies` once, when it is made, and its admission asks for the steps
(:meth:`Policies.steps_for`): one step per policy in force for its calls, its own or inherited,
and none for a policy not configured. The steps, in admission order:

1. :class:`~ampmeter.policies.pressure.Pressure` (a budget-pressure hook's refusal),
2. :class:`~ampmeter.policies.input_cap.InputCap` (``max_input_tokens_per_call``),
3. :class:`~ampmeter.policies.unpriced.Unpriced` (``on_unpriced``, under a cost limit),
4. :class:`~ampmeter.policies.loop_guard.LoopGuard` (``max_repeats``),
5. :class:`~ampmeter.policies.final_reserve.FinalReserve` (``final_reserve_usd``),
6. :class:`~ampmeter.policies.windows.Windows` (``Limit(..., window_s=...)``),
7. :class:`~ampmeter.policies.thresholds.Thresholds` (``warn_at`` and ``soft=True``).

Besides the admission, this object is the wiring the integrations and the shared ledger step use:
a call's marks, a request's identity, the pressure hook, trace records and shared terms.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ampmeter.keys import KEY_COST
from ampmeter.policies.events import EventLog
from ampmeter.policies.final_reserve import FinalReserve
from ampmeter.policies.input_cap import InputCap
from ampmeter.policies.loop_guard import LoopGuard, Repeats
from ampmeter.policies.marks import CallMarks
from ampmeter.policies.options import (
    PolicyOptions,
    fingerprint,
    in_final_call,
    is_cost_ceiling,
    request_fingerprint,
)
from ampmeter.policies.pressure import Pressure
from ampmeter.policies.step import Observer, PolicyStep, SharedTerms, Totals
from ampmeter.policies.thresholds import Thresholds, Watch
from ampmeter.policies.unpriced import Unpriced
from ampmeter.policies.windows import Window, Windows

if TYPE_CHECKING:
    from ampmeter._core.frame import Frame
    from ampmeter._core.steps import Admission
    from ampmeter._core.usage import Usage
    from ampmeter.limits import ExceededLimit, Limit

__all__ = ["Policies"]


def _watches_cost(limit: Limit) -> bool:
    return limit.matches(KEY_COST) or (limit.key.startswith(KEY_COST) and not limit.soft)


class Policies:
    """The policies of one context (see the module docstring). Wiring, not user API."""

    __slots__ = (
        "frame",
        "log",
        "marking",
        "observers",
        "options",
        "pressure",
        "pricing",
        "repeats",
        "shapes_requests",
        "stats",
        "steps",
        "thresholds",
        "tracks_repeats",
        "unpriced",
        "watch",
        "windows",
    )

    def __init__(
        self, frame: Frame, options: PolicyOptions, stats: Totals, pricing: object
    ) -> None:
        self.frame = frame
        frame.policies = self  # how the policy steps of this context and below find it
        self.options = options
        self.stats = stats  # the context's stats (thresholds and budget pressure read them)
        self.pricing = pricing  # the context's pricing (named in the unpriced rule's message)
        self.log = EventLog(options.on_limit_event)
        most = options.max_repeats
        self.repeats = None if most is None else Repeats(frame, most)
        self.windows = tuple(Window(lim) for lim in frame.limits if lim.window_s is not None)
        watched = tuple(lim for lim in frame.limits if lim.warn_at or lim.soft)
        self.watch = Watch(frame, watched, self.log) if watched else None
        self.steps: tuple[PolicyStep, ...] = ()
        self.observers: tuple[Observer, ...] = ()
        self.pressure: Pressure | None = None
        self.unpriced: Unpriced | None = None
        self.thresholds: Thresholds | None = None
        self.marking = False
        self.tracks_repeats = False
        self.shapes_requests = False

    def steps_for(self, admission: Admission) -> tuple[PolicyStep, ...]:
        """The policy steps of ``admission`` (this context's), in admission order; none for a
        policy that is not configured."""
        frames = admission.frame.ancestry
        declared: tuple[Policies, ...] = tuple(frame.policies for frame in frames)
        options = self.options
        ceilings = tuple(
            (frame, limit.max_value)
            for frame in frames
            for limit in frame.limits
            if is_cost_ceiling(limit) and limit.max_value > 0
        )
        if options.on_budget_pressure is not None and ceilings:
            self.pressure = Pressure(
                admission, options.on_budget_pressure, options.pressure_at, ceilings
            )
        cap = options.max_input_tokens_per_call
        input_cap = None if cap is None else InputCap(admission, cap, self.log)
        owner = next((f for f in frames if any(map(_watches_cost, f.limits))), None)
        mode = options.on_unpriced or "refuse"
        if mode != "allow" and owner is not None:
            self.unpriced = Unpriced(admission, owner, mode == "refuse", self.log)
        counters = tuple(p.repeats for p in declared if p.repeats is not None)
        self.tracks_repeats = bool(counters)
        reserve = any(f.policies.options.final_reserve_usd is not None for f in admission.guards)
        windows = any(p.windows for p in declared)
        watches = tuple(p.watch for p in declared if p.watch is not None)
        if watches:
            self.thresholds = Thresholds(admission, watches)
        steps = (
            self.pressure,
            input_cap,
            self.unpriced,
            LoopGuard(admission, counters) if counters else None,
            FinalReserve(admission) if reserve else None,
            Windows(admission) if windows else None,
            self.thresholds,
        )
        self.steps = tuple(step for step in steps if step is not None)
        self.observers = tuple(step for step in self.steps if isinstance(step, Observer))
        # Only the unpriced rule in force: a priced call needs no marks.
        self.marking = any(step is not self.unpriced for step in self.steps)
        # Fixed once the admission is made: whether an instrumented request may be changed or
        # refused before it is sent (integrations.lifecycle.relieve_pressure).
        self.shapes_requests = self.pressure is not None or admission.frame.disclose_budget
        return self.steps

    @property
    def wrap_up(self) -> bool:
        """Whether a soft limit of this context or an enclosing one was exceeded."""
        thresholds = self.thresholds
        return thresholds is not None and any(w.wrap_up() for w in thresholds.watches)

    def events(self) -> list[dict[str, Any]]:
        """This context's own limit events, as dicts."""
        return self.log.dicts()

    # -- making a call --------------------------------------------------------------------------

    def llm_marks(
        self,
        model: str | None,
        priced: bool,
        input_tokens: int,
        final: bool | None,
        prompt_text: str | None = None,
        request: Mapping[str, Any] | None = None,
        refused: ExceededLimit | None = None,
    ) -> CallMarks | None:
        """The marks of an LLM call (``priced``: by the table, a set price or the caller);
        None when no policy needs them. ``final`` None: as :func:`final_call` says here. An
        instrumented request is identified by what it sends (``request``), any other call by
        its ``prompt_text``; ``refused`` is a budget-pressure hook's refusal."""
        if not self.marking and (priced or self.unpriced is None):
            return None
        key = None
        if self.tracks_repeats:
            if request is not None:
                key = request_fingerprint(request)
            elif prompt_text is not None:
                key = fingerprint("llm", model, prompt_text)
        if final is None:
            final = in_final_call()
        return CallMarks(model, priced, input_tokens, final, key, refused)

    def tool_marks(self, name: str, arguments: object) -> CallMarks | None:
        """The marks of a tool call (a loop-guard identity when ``arguments`` are given)."""
        if not self.marking:
            return None
        key = None
        if arguments is not None and self.tracks_repeats:
            key = fingerprint("tool", name, arguments)
        return CallMarks(None, True, 0, False, key)

    # -- trace records and shared ledgers -----------------------------------------------------

    def traced(self, usage: Usage) -> list[dict[str, Any]]:
        """After a trace record's ``usage`` was added: the events a call's settlement would
        report (the context puts them on its own node)."""
        node_id = self.frame.node_id
        return [e for step in reversed(self.observers) for e in step.observe(usage, node_id)]

    def shared_terms(
        self,
        owner: Frame,
        marks: CallMarks | None,
        ceilings: dict[str, Any],
        owners: dict[str, Limit],
    ) -> tuple[dict[str, Any], dict[str, Limit], dict[str, Any], tuple[Limit, ...]]:
        """What ``owner``'s shared ledger checks a call against beyond its plain ceilings
        (each policy step's :meth:`~ampmeter.policies.step.PolicyStep.shared_terms`): the
        ceilings, the limits they stand for, keys to hold beyond them (None: the call's own
        estimate), and the windowed limits the ledger checks."""
        terms = SharedTerms(ceilings, owners)
        for step in self.steps:
            step.shared_terms(owner, marks, terms)
        return terms.ceilings, terms.owners, terms.extra, terms.windows
