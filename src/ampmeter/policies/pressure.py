"""Budget pressure: once ``pressure_at`` (default 0.8) of a cost ceiling here or above is
spent, the ``on_budget_pressure`` hook sees each instrumented request before it is measured and
reserved; it may change it (a cheaper model) or refuse it (None), and the refusal stops the
call when it is admitted. Through a shared ledger the spend is what all its processes spent."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from ampmeter.keys import KEY_BUDGET_PRESSURE
from ampmeter.limits import ExceededLimit, Limit, warn_fractions
from ampmeter.policies.options import Option, Policy, callable_option
from ampmeter.policies.step import Relief

if TYPE_CHECKING:
    from ampmeter._core.steps import Admission
    from ampmeter.policies.configured import ConfiguredPolicies

__all__ = ["POLICY", "PRESSURE_AT", "Pressure"]

PRESSURE_AT: Final = 0.8
"""The share of a cost ceiling at which the hook starts to see requests, unless told."""


class Pressure(Relief):
    """The budget-pressure hook of one context's calls (see the module docstring)."""

    __slots__ = ("at", "hook")

    def __init__(self, admission: Admission, configured: ConfiguredPolicies) -> None:
        super().__init__(admission)
        self.hook = configured.values.on_budget_pressure
        at = configured.values.pressure_at
        self.at = PRESSURE_AT if at is None else at

    def relieve(
        self, ctx: Any, request: dict[str, Any], notes: dict[str, Any]
    ) -> ExceededLimit | None:
        """Pass ``request`` to the hook once ``at`` of a cost ceiling is spent: its answer
        replaces the request in place, or (None) refuses it."""
        spent = self.spent()
        if spent < self.at:
            return None
        changed = self.hook(ctx, dict(request))
        if changed is None:
            name = getattr(self.hook, "__qualname__", type(self.hook).__name__)
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


def _make(admission: Admission, configured: ConfiguredPolicies) -> Pressure | None:
    if configured.values.on_budget_pressure is None:
        return None
    step = Pressure(admission, configured)
    return step if step.ceilings else None


POLICY = Policy(
    "pressure",
    (
        callable_option("on_budget_pressure"),
        Option("pressure_at", lambda at: warn_fractions((at,), "pressure_at")[0], inherited=True),
    ),
    _make,
)
"""``on_budget_pressure`` and ``pressure_at``, inherited."""
