"""The checked settings of one context: its :class:`~ampmeter.Budget`, its
:class:`~ampmeter.Policies` and its own keywords, validated once, before anything is made (an
error names the keyword to fix)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from ampmeter import _validate
from ampmeter.budget import Budget
from ampmeter.node import META_CONTEXT
from ampmeter.policies.registry import POLICIES, Policies
from ampmeter.pricing import source
from ampmeter.pricing.plan import ESTIMATE_MODES

if TYPE_CHECKING:
    from ampmeter.ledgers.base import Ledger
    from ampmeter.pricing.source import Pricing
    from ampmeter.propagation import Handoff
    from ampmeter.sinks.base import Sink

__all__ = ["Settings"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """A context's checked keywords. ``None`` means "as the enclosing context" for
    ``admission_timeout_s``, ``estimate``, ``on_expired_hold``, ``disclose_budget`` and
    ``pricing``."""

    name: str
    budget: Budget
    policies: Policies
    chain_id: str | None = None
    metadata: Any = None
    sinks: tuple[Sink, ...] = ()
    ledger: Ledger | None = None
    on_ledger_error: str = "halt"
    max_nodes: int = 0
    admission_timeout_s: float | None = None
    estimate: str | None = None
    on_expired_hold: _validate.ExpiredHold | None = None
    disclose_budget: bool | None = None
    pricing: Pricing | None = None
    handoff_from: Handoff | None = None

    def __post_init__(self) -> None:
        fix = object.__setattr__  # a frozen value sets its checked fields once, here
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name must be a non-empty str, got {self.name!r}")
        for policy in POLICIES:
            if policy.check is not None:
                policy.check(self.policies, self.budget.all_limits)
        if self.on_ledger_error not in ("halt", "allow"):
            raise ValueError(
                f"on_ledger_error must be 'halt' or 'allow', got {self.on_ledger_error!r}"
            )
        if self.estimate is not None and self.estimate not in ESTIMATE_MODES:
            raise ValueError(f"estimate must be 'learned' or 'bound', got {self.estimate!r}")
        if self.disclose_budget is not None and not isinstance(self.disclose_budget, bool):
            raise TypeError(f"disclose_budget must be True or False, got {self.disclose_budget!r}")
        meta = _validate.metadata(self.metadata)
        meta[META_CONTEXT] = True
        fix(self, "metadata", meta)
        if self.ledger is not None:
            from ampmeter.ledgers.base import Ledger

            if not isinstance(self.ledger, Ledger):
                raise TypeError(f"ledger must be a Ledger, got {type(self.ledger).__name__}")
        fix(self, "sinks", tuple(self.sinks))
        for sink in self.sinks:
            if not callable(getattr(sink, "emit", None)):
                raise TypeError(f"sinks must be Sink objects, got {type(sink).__name__}")
        fix(self, "max_nodes", _validate.count(self.max_nodes, "max_nodes (0 = unbounded)"))
        wait = _validate.optional_amount(self.admission_timeout_s, "admission_timeout_s")
        fix(self, "admission_timeout_s", wait)
        fix(self, "on_expired_hold", _validate.expired_hold(self.on_expired_hold))
        fix(self, "pricing", source.checked(self.pricing))

    @classmethod
    def of(
        cls, name: str, keywords: Mapping[str, Any], handoff_from: Handoff | None = None
    ) -> Settings:
        """Settings from a context's keywords: ``budget`` or its short forms, ``policies`` or
        the policy options, and the context's own."""
        short: dict[str, Any] = {}
        own: dict[str, Any] = {}
        options: dict[str, Any] = {}
        for key, value in keywords.items():
            (short if key in _BUDGET else own if key in _OWN else options)[key] = value
        return cls(
            name=name,
            budget=_value("budget", options.pop("budget", None), Budget, short),
            policies=_value("policies", options.pop("policies", None), Policies, options),
            handoff_from=handoff_from,
            **own,
        )


_BUDGET = frozenset(f.name for f in fields(Budget) if f.init)
_OWN = frozenset(f.name for f in fields(Settings)) - {"name", "budget", "policies", "handoff_from"}


def _value(name: str, value: Any, kind: type[Any], short: dict[str, Any]) -> Any:
    """``value``, or the ``kind`` its ``short`` keywords make (None: not given); not both."""
    if value is None:
        return kind(**short)
    given = [key for key, item in short.items() if item is not None]
    if not isinstance(value, kind):
        raise TypeError(f"{name} must be a {kind.__name__}, got {type(value).__name__}")
    if given:
        raise TypeError(f"give {name}= or {', '.join(given)}=, not both")
    return value
