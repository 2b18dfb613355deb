"""The final-answer reserve (``final_reserve_usd``): part of a context's cost ceiling that only
calls marked final (:func:`~ampmeter.policies.final_call`, ``llm_call(final=True)``) may spend.
Other calls are checked against the ceiling less the reserve, locally and in a shared ledger."""

from __future__ import annotations

from decimal import Decimal
from operator import attrgetter
from typing import TYPE_CHECKING

from ampmeter import _validate, money
from ampmeter._core.check import Guard
from ampmeter.keys import KEY_COST
from ampmeter.limits import DerivedCeiling, Limit
from ampmeter.policies.options import Option, Policy, is_cost_ceiling
from ampmeter.policies.step import PolicyStep

if TYPE_CHECKING:
    from ampmeter._core.check import LimitRow
    from ampmeter._core.frame import Frame
    from ampmeter._core.steps import Admission, Ticket
    from ampmeter.policies.configured import ConfiguredPolicies
    from ampmeter.policies.marks import CallMarks
    from ampmeter.policies.registry import Policies
    from ampmeter.policies.step import SharedTerms

__all__ = ["POLICY", "FinalReserve"]


class FinalReserve(PolicyStep):
    """The final-answer reserves of one context and those above it (see the module docstring)."""

    __slots__ = ("lowered", "reserves", "revision")

    def __init__(self, admission: Admission, reserves: dict[Frame, Decimal]) -> None:
        super().__init__(admission)
        self.reserves = reserves  # of this context and those above it that keep one
        self.revision = -1  # the count of raised limits the rows were made at
        self.lowered: tuple[Guard, ...] = ()

    def admit(self, ticket: Ticket, thread: int | None) -> None:
        # LLM and tool calls carry marks; embedding requests and steps (none) are checked
        # against the plain ceilings.
        marks = ticket.marks
        if marks is not None and not marks.final:
            ticket.rows = self.rows()

    def rows(self) -> tuple[Guard, ...]:
        """The guards' ceilings with each reserve taken off its context's cost ceilings (made
        again when a limit was raised)."""
        admission = self.admission
        revision = admission.frame.root.revision
        if revision != self.revision:
            self.lowered = tuple(
                Guard(guard.level, (*guard.rows, *_lowered(frame, self.reserves.get(frame))))
                for frame, guard in zip(admission.guards, admission.rows, strict=True)
            )
            self.revision = revision
        return self.lowered

    def shared_terms(self, owner: Frame, marks: CallMarks | None, terms: SharedTerms) -> None:
        reserve = self.reserves.get(owner)
        final = marks is not None and marks.final
        if reserve is not None and KEY_COST in terms.ceilings and not final:
            top = terms.ceilings[KEY_COST] - reserve
            # A ceiling lowered below the reserve leaves nothing (named as $0; the cap is exact).
            terms.cap(KEY_COST, top, Limit(KEY_COST, max(top, 0)))


def _lowered(frame: Frame, reserve: Decimal | None) -> tuple[LimitRow, ...]:
    """Rows for ``frame``'s cost ceilings less its ``reserve`` (none without a reserve)."""
    if reserve is None:
        return ()
    kept = money.format_usd(reserve)
    rows: list[LimitRow] = []
    for limit in frame.limits:
        if is_cost_ceiling(limit):
            top = limit.max_value - reserve
            note = f"final-answer reserve ({kept} kept for a call marked final)"
            ceiling = DerivedCeiling(Limit(KEY_COST, max(top, 0)), 0, note)
            rows.append((False, KEY_COST, money.to_nano(top, allow_negative=True), ceiling))
    return tuple(rows)


def _make(admission: Admission, configured: ConfiguredPolicies) -> FinalReserve | None:
    reserves = dict(configured.declarations("final_reserve"))
    return (
        FinalReserve(admission, reserves) if any(f in reserves for f in admission.guards) else None
    )


def _check(policies: Policies, limits: tuple[Limit, ...]) -> None:
    """A reserve needs a cost ceiling of the same context larger than it."""
    reserve = policies.final_reserve_usd
    if reserve is None:
        return
    ceilings = [lim.max_value for lim in limits if is_cost_ceiling(lim)]
    if not ceilings:
        raise ValueError(
            "final_reserve_usd needs a cost limit on the same context (max_cost_usd=...)"
        )
    if reserve >= min(ceilings):
        raise ValueError(
            f"final_reserve_usd ({reserve}) must be less than the cost limit ({min(ceilings)})"
        )


POLICY = Policy(
    "final_reserve",
    (Option("final_reserve_usd", lambda usd: _validate.dollars(usd, "final_reserve_usd")),),
    _make,
    attrgetter("values.final_reserve_usd"),  # what a context declares: its reserve
    check=_check,
)
"""``final_reserve_usd``, of the context that sets it (its own cost ceilings)."""
