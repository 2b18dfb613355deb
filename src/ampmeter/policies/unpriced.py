"""Unpriced models: under a cost limit (of the context or one above it) an LLM call to a model
the pricing cannot price is refused before it is sent (``on_unpriced="refuse"``, the default)
or let through with a warning and an ``unpriced`` event (``"warn"``); ``"allow"`` puts no step
in the admission. An unpriced call is never counted as free: its node says ``unpriced``.

A call whose node says it is not metered (:data:`META_UNMETERED`: a batch's creation, billed
when the batch runs) is unpriced too, and refused with that reason; under a token limit as well,
since its tokens are counted nowhere either (an unpriced model's tokens are: a token limit alone
lets it through)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from ampmeter.keys import KEY_COST, KEY_INPUT_TOKENS, KEY_OUTPUT_TOKENS, KEY_UNPRICED_LLM_CALLS
from ampmeter.limits import ExceededLimit, Limit
from ampmeter.policies.options import LimitEvent, Option, Policy
from ampmeter.policies.step import PolicyStep
from ampmeter.pricing.source import TABLE

if TYPE_CHECKING:
    from ampmeter._core.frame import Frame
    from ampmeter._core.steps import Admission, Ticket
    from ampmeter.policies.configured import ConfiguredPolicies
    from ampmeter.policies.events import EventLog

__all__ = ["META_UNMETERED", "POLICY", "Unpriced"]

_LIMIT = Limit(KEY_UNPRICED_LLM_CALLS, 0)

META_UNMETERED = "unmetered"
"""Node metadata: why the call's cost is not metered (what it is, e.g. a batch)."""


class Unpriced(PolicyStep):
    """The unpriced-model rule of one context's calls (see the module docstring)."""

    __slots__ = ("log", "owner", "refuses", "token_owner")
    priced_calls = False  # a priced call is none of its business: its plan leaves this out
    kinds = frozenset({"llm"})  # the plan of any other kind does not ask it

    def __init__(
        self,
        admission: Admission,
        owners: tuple[Frame | None, Frame | None],
        refuses: bool,
        log: EventLog,
    ) -> None:
        super().__init__(admission)
        # The nearest context with a cost limit, and the nearest with a token limit.
        self.owner, self.token_owner = owners
        self.refuses = refuses
        self.log = log  # the context's own events

    def admit(self, ticket: Ticket, thread: int | None) -> None:
        """Refuse (or report) a call whose model has no price (only their plans ask this)."""
        unmetered = META_UNMETERED in ticket.kernel_node.metadata
        owner = self.owner
        if owner is None and unmetered:
            owner = self.token_owner
        if owner is None:  # an unpriced model's tokens are counted: a token limit sees them
            return
        note = self._reason(ticket, owner)
        if self.refuses:
            stop = ExceededLimit(_LIMIT, KEY_UNPRICED_LLM_CALLS, 1, note)
            raise self.refuse(ticket, owner, stop)
        warnings.warn(f"ampmeter: {note}", RuntimeWarning, stacklevel=4)
        node_id, name = ticket.kernel_node.node_id, self.admission.frame.name
        event = LimitEvent("unpriced", _LIMIT, KEY_UNPRICED_LLM_CALLS, 1.0, 1.0, node_id, name)
        self.log.report(event)

    def _reason(self, ticket: Ticket, by: Frame) -> str:
        """Why ``ticket``'s call is unpriced (``by``: the context whose limit refuses it), and
        what to do about it."""
        owner = by.name
        unmetered = ticket.kernel_node.metadata.get(META_UNMETERED)
        if unmetered is not None:
            limit = "a cost" if by is self.owner else "a token"
            return (
                f"{ticket.name!r} sends {unmetered}, which ampmeter does not meter, and "
                f"context {owner!r} has {limit} limit; set on_unpriced='warn' or 'allow' to "
                "send it with its cost and tokens counted nowhere"
            )
        model = ticket.model
        pricing = self.admission.frame.policies.pricing
        if pricing is TABLE:
            fix = (
                f"price it with ampmeter.set_price({model!r}, input_per_mtok=..., "
                f"output_per_mtok=...) (patterns like 'ft:gpt-4o-mini*' work), "
            )
        else:  # set_price changes the table, which this context's pricing does not read
            fix = f"price it in the context's pricing ({pricing!r}), "
        return (
            f"model {model!r} has no price and context {owner!r} has a cost limit; "
            f"{fix}give the call an estimate_usd, or set on_unpriced='warn' or 'allow'"
        )


def _watches(key: str) -> Callable[[Limit], bool]:
    def watches(limit: Limit) -> bool:
        return limit.matches(key) or (limit.key.startswith(key) and not limit.soft)

    return watches


_WATCHES_COST: Final = _watches(KEY_COST)
_WATCHES_TOKENS: Final = (_watches(KEY_INPUT_TOKENS), _watches(KEY_OUTPUT_TOKENS))


def _make(admission: Admission, configured: ConfiguredPolicies) -> Unpriced | None:
    mode = configured.values.on_unpriced or "refuse"
    if mode == "allow":
        return None
    ancestry = admission.frame.ancestry
    cost = next((f for f in ancestry if any(map(_WATCHES_COST, f.limits))), None)
    tokens = next(
        (f for f in ancestry if any(w(limit) for limit in f.limits for w in _WATCHES_TOKENS)),
        None,
    )
    if cost is None and tokens is None:
        return None
    return Unpriced(admission, (cost, tokens), mode == "refuse", configured.log)


def _mode(mode: object) -> object:
    if mode not in ("refuse", "warn", "allow"):
        raise ValueError(f"on_unpriced must be 'refuse', 'warn' or 'allow', got {mode!r}")
    return mode


POLICY = Policy("unpriced", (Option("on_unpriced", _mode, inherited=True),), _make)
"""``on_unpriced``, inherited."""
