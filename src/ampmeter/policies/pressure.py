"""Budget pressure: once ``pressure_at`` (default 0.8) of a cost ceiling here or above is
spent, the ``on_budget_pressure`` hook sees each instrumented request before it is measured and
reserved; it may change it (a cheaper model) or refuse it (None), and the refusal stops the
call when it is admitted. Through a shared ledger the spend is what all its processes spent."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Final

from ampmeter.keys import KEY_COST
from ampmeter.limits import ExceededLimit, Limit, warn_fractions
from ampmeter.policies.downgrade import DowngradeLadder
from ampmeter.policies.options import (
    KEY_BUDGET_PRESSURE,
    Option,
    Policy,
    PressureHook,
    callable_option,
    is_cost_ceiling,
)
from ampmeter.policies.shared_totals import shared_totals
from ampmeter.policies.step import PolicyStep

if TYPE_CHECKING:
    from ampmeter._core.frame import Frame
    from ampmeter._core.steps import Admission, Ticket
    from ampmeter.policies.configured import ConfiguredPolicies

__all__ = ["POLICY", "PRESSURE_AT", "Pressure"]

PRESSURE_AT: Final = 0.8
"""The share of a cost ceiling at which the hook starts to see requests, unless told."""


class Pressure(PolicyStep):
    """The budget-pressure hook of one context's calls (see the module docstring)."""

    __slots__ = ("at", "ceilings", "hook")

    def __init__(
        self,
        admission: Admission,
        hook: PressureHook,
        at: float | None,
        ceilings: tuple[tuple[Frame, Decimal], ...],
    ) -> None:
        super().__init__(admission)
        self.hook = hook
        self.at = PRESSURE_AT if at is None else at
        self.ceilings = ceilings  # every cost ceiling here and above, with its context

    def admit(self, ticket: Ticket, thread: int | None) -> None:
        marks = ticket.marks
        if marks is not None and marks.refusal is not None:
            raise self.refuse(ticket, self.admission.frame, marks.refusal)

    def relieve(self, ctx: Any, request: dict[str, Any]) -> ExceededLimit | None:
        """Pass ``request`` (an SDK call's keyword arguments) to the hook once ``at`` of a cost
        ceiling is spent: its answer replaces the request in place, or (None) refuses it; the
        refusal is returned."""
        # the largest share of a cost ceiling here or above that is spent
        spent = max(float(_spent_cost(frame) / top) for frame, top in self.ceilings)
        if spent < self.at:
            return None
        hook = self.hook
        if isinstance(hook, DowngradeLadder):  # the ladder reads the share spent, not the context
            changed: object = hook.swapped(dict(request), spent)
        else:
            changed = hook(ctx, dict(request))
        if changed is None:
            name = getattr(hook, "__qualname__", type(hook).__name__)
            note = f"refused by on_budget_pressure hook {name}"
            limit = Limit(KEY_BUDGET_PRESSURE, self.at)
            return ExceededLimit(limit, KEY_BUDGET_PRESSURE, spent, note)
        if not isinstance(changed, Mapping):
            raise TypeError(
                f"on_budget_pressure must return the request (a dict) or None, "
                f"got {type(changed).__name__}"
            )
        request.clear()
        request.update(changed)
        return None


def _spent_cost(frame: Frame) -> Decimal:
    """What the cost budget of ``frame``'s context has spent, in dollars: through a shared
    ledger, every process's spend (read at most every :data:`SHARED_READ_S`); else this
    process's."""
    local: Decimal = frame.policies.stats.get_gauge(KEY_COST)
    if frame.ledger is None:
        return local
    totals = shared_totals(frame.ledger).read()
    return local if totals is None else max(local, Decimal(totals.get(KEY_COST, 0)))


def _make(admission: Admission, configured: ConfiguredPolicies) -> Pressure | None:
    hook = configured.values.on_budget_pressure
    if hook is None:
        return None
    ceilings = tuple(
        (frame, limit.max_value)
        for frame in admission.frame.ancestry
        for limit in frame.limits
        if is_cost_ceiling(limit) and limit.max_value > 0
    )
    return Pressure(admission, hook, configured.values.pressure_at, ceilings) if ceilings else None


def _ladder(values: dict[str, Any]) -> None:
    """``downgrade`` as the pressure hook, with ``pressure_at`` its lowest rung (one hook per
    context: a ladder and an ``on_budget_pressure`` of one's own do not mix)."""
    ladder = values.pop("downgrade", None)
    if ladder is None:
        return
    if "on_budget_pressure" in values:
        raise ValueError(
            "give downgrade= or on_budget_pressure=, not both (the ladder is a pressure hook)"
        )
    values.update(on_budget_pressure=ladder, pressure_at=ladder.lowest)


POLICY = Policy(
    "pressure",
    (
        callable_option("on_budget_pressure"),
        Option("pressure_at", lambda at: warn_fractions((at,), "pressure_at")[0], inherited=True),
        Option("downgrade", DowngradeLadder, inherited=True),
    ),
    _make,
    translate=_ladder,
)
"""``on_budget_pressure`` and ``pressure_at`` (or a ``downgrade`` ladder), inherited."""
