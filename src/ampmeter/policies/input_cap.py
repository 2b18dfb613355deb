"""The per-call input cap (``max_input_tokens_per_call``): an LLM call whose input estimate is
above it is refused before it is sent; one whose actual input went above it although its
estimate did not is reported (an ``input_over_limit`` event)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ampmeter._validate import count
from ampmeter.keys import KEY_INPUT_TOKENS_PER_CALL
from ampmeter.limits import ExceededLimit, Limit
from ampmeter.policies.options import LimitEvent, Option, Policy
from ampmeter.policies.step import Observer

if TYPE_CHECKING:
    from ampmeter._core.steps import Admission, Ticket
    from ampmeter._core.usage import Usage
    from ampmeter.policies.configured import ConfiguredPolicies
    from ampmeter.policies.events import EventLog

__all__ = ["POLICY", "InputCap"]


class InputCap(Observer):
    """The input cap of one context's LLM calls (see the module docstring)."""

    __slots__ = ("cap", "limit", "log")
    kinds = frozenset({"llm"})  # the plan of any other kind does not ask it

    def __init__(self, admission: Admission, cap: int, log: EventLog) -> None:
        super().__init__(admission)
        self.cap = cap
        self.limit = Limit(KEY_INPUT_TOKENS_PER_CALL, cap)
        self.log = log  # the context's own events

    def admit(self, ticket: Ticket, thread: int | None) -> None:
        marks = ticket.marks
        if marks is not None and marks.input_tokens > self.cap:
            note = "input too large for one call (max_input_tokens_per_call)"
            over = ExceededLimit(self.limit, KEY_INPUT_TOKENS_PER_CALL, marks.input_tokens, note)
            raise self.refuse(ticket, self.admission.frame, over)

    def observe(self, usage: Usage, node_id: str) -> list[dict[str, Any]]:
        cap = self.cap
        if usage.kind != "llm" or usage.tokens_in <= cap:
            return []
        event = LimitEvent(
            "input_over_limit",
            self.limit,
            KEY_INPUT_TOKENS_PER_CALL,
            float(usage.tokens_in),
            usage.tokens_in / max(cap, 1),
            node_id,
            self.admission.frame.name,
        )
        self.log.report(event)
        return [event.to_dict()]


def _make(admission: Admission, configured: ConfiguredPolicies) -> InputCap | None:
    cap = configured.values.max_input_tokens_per_call
    return None if cap is None else InputCap(admission, cap, configured.log)


_OPTION = Option("max_input_tokens_per_call", lambda n: count(n, "max_input_tokens_per_call"), True)
POLICY = Policy("input_cap", (_OPTION,), _make)
"""``max_input_tokens_per_call``, inherited."""
