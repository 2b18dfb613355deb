"""The policies configured for one context: what it declares for its own and its descendants'
steps, and the policy steps of its admission: one per registered policy in force, in the
order of :data:`~ampmeter.policies.registry.POLICIES`.

Besides the admission, this object is the wiring the integrations and the shared ledger step use:
a call's marks, a request's identity, the pressure hook, trace records and shared terms.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ampmeter.policies.events import EventLog
from ampmeter.policies.marks import CallMarks
from ampmeter.policies.options import (
    fingerprint,
    in_final_call,
    request_fingerprint,
)
from ampmeter.policies.registry import POLICIES, Policies
from ampmeter.policies.step import Observer, PolicyStep, Relief, SharedTerms, Totals

if TYPE_CHECKING:
    from ampmeter._core.frame import Frame
    from ampmeter._core.steps import Admission
    from ampmeter._core.usage import Usage
    from ampmeter.limits import ExceededLimit, Limit

__all__ = ["ConfiguredPolicies"]


class ConfiguredPolicies:
    """The policies of one context (see the module docstring). Wiring, not user API."""

    __slots__ = (
        "declared",
        "frame",
        "log",
        "marking",
        "observers",
        "parent",
        "pricing",
        "reliefs",
        "shapes_requests",
        "stats",
        "steps",
        "tracks_repeats",
        "values",
    )

    def __init__(
        self,
        frame: Frame,
        values: Policies,
        parent: ConfiguredPolicies | None,
        stats: Totals,
        pricing: object,
    ) -> None:
        self.frame = frame
        frame.policies = self  # how the policy steps of this context and below find it
        self.stats = stats  # the context's stats (thresholds and budget pressure read them)
        self.pricing = pricing  # the context's pricing (named in the unpriced rule's message)
        self.values = values  # in force here: the context's own and the inherited ones
        self.parent = parent
        self.log = EventLog(values.on_limit_event)
        self.declared: dict[str, Any] = {}
        for policy in POLICIES:
            state = None if policy.declare is None else policy.declare(self)
            if state is not None:
                self.declared[policy.name] = state
        self.steps: tuple[PolicyStep, ...] = ()
        self.observers: tuple[Observer, ...] = ()
        self.reliefs: tuple[Relief, ...] = ()
        self.marking = self.tracks_repeats = self.shapes_requests = False

    def declarations(self, policy: str) -> tuple[tuple[Frame, Any], ...]:
        """What ``policy`` declared here and in each context above, innermost first."""
        found = []
        configured: ConfiguredPolicies | None = self
        while configured is not None:
            if policy in configured.declared:
                found.append((configured.frame, configured.declared[policy]))
            configured = configured.parent
        return tuple(found)

    def steps_for(self, admission: Admission) -> tuple[PolicyStep, ...]:
        """The policy steps of ``admission`` (this context's), in admission order; none for a
        policy that is not in force."""
        steps = []
        for policy in POLICIES:
            step = policy.make(admission, self)
            if step is not None:
                steps.append(step)
        self.steps = tuple(steps)
        if not steps and not admission.frame.disclose_budget:
            return ()  # nothing to mark, shape or observe
        self.observers = tuple(step for step in self.steps if isinstance(step, Observer))
        self.reliefs = tuple(step for step in self.steps if isinstance(step, Relief))
        # A priced call needs no marks when only the unpriced rule is in force.
        self.marking = any(step.priced_calls for step in self.steps)
        self.tracks_repeats = any(step.fingerprints for step in self.steps)
        # Fixed once the admission is made: whether an instrumented request may be changed or
        # refused before it is sent (integrations.lifecycle.relieve_pressure).
        self.shapes_requests = bool(self.reliefs) or admission.frame.disclose_budget
        return self.steps

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
    ) -> CallMarks:
        """The marks of an LLM call (``priced``: by the table, a set price or the caller), asked
        for only when a policy needs them (a priced call's: :attr:`marking`; an unpriced one's:
        any step). ``final``
        None: as :func:`final_call` says here. An instrumented request is identified by what it
        sends (``request``), any other call by its ``prompt_text``; ``refused`` is a
        budget-pressure hook's refusal."""
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
