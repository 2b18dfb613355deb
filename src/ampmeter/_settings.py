"""The checked settings of one context: every keyword of :class:`~ampmeter.ExecutionContext`,
validated once, before anything is made (an error names the keyword to fix)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ampmeter import _validate
from ampmeter._core.exhaustion import Exhaustion
from ampmeter._reserve import ESTIMATE_MODES
from ampmeter.limits import Limit, context_limits
from ampmeter.node import META_CONTEXT
from ampmeter.policies.options import PolicyOptions
from ampmeter.pricing import source

if TYPE_CHECKING:
    from ampmeter.ledgers.base import Ledger
    from ampmeter.pricing.source import Pricing
    from ampmeter.propagation import Handoff
    from ampmeter.sinks.base import Sink

__all__ = ["Settings"]


@dataclass(frozen=True, slots=True)
class Settings:
    """A context's checked keywords. ``None`` means "as the enclosing context" for
    ``admission_timeout_s``, ``estimate``, ``on_expired_hold`` and ``pricing``."""

    name: str
    limits: tuple[Limit, ...]
    timeout_s: float | None
    admission_timeout_s: float | None
    chain_id: str | None
    metadata: dict[str, Any]
    sinks: tuple[Sink, ...]
    ledger: Ledger | None
    on_ledger_error: str
    max_nodes: int
    options: PolicyOptions
    estimate: str | None
    on_expired_hold: _validate.ExpiredHold | None
    handoff_from: Handoff | None = None
    exhaustion: Exhaustion | None = None
    disclose_budget: bool | None = None
    pricing: Pricing | None = None

    @classmethod
    def checked(
        cls,
        name: object,
        *,
        limits: Sequence[Limit] | None = None,
        max_cost_usd: object = None,
        max_steps: object = None,
        max_retries: object = None,
        timeout_s: object = None,
        chain_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        sinks: Iterable[Sink] = (),
        ledger: Ledger | None = None,
        on_ledger_error: object = "halt",
        max_nodes: int = 0,
        admission_timeout_s: object = None,
        estimate: object = None,
        on_expired_hold: object = None,
        handoff_from: Handoff | None = None,
        on_exhausted: object = None,
        pause_timeout_s: object = None,
        disclose_budget: object = None,
        downgrade: object = None,
        pricing: object = None,
        **policy_options: Any,
    ) -> Settings:
        """Settings from a user's keywords; each error names its keyword."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty str, got {name!r}")
        if downgrade is not None:
            policy_options = with_ladder(downgrade, policy_options)
        options = PolicyOptions.checked(**policy_options)
        own = context_limits(limits, max_cost_usd, max_steps, max_retries)
        shortcuts = sum(v is not None for v in (max_cost_usd, max_steps, max_retries))
        own = options.with_shortcut_warnings(own, shortcuts)
        options.check_reserve(own)
        if on_ledger_error not in ("halt", "allow"):
            raise ValueError(f"on_ledger_error must be 'halt' or 'allow', got {on_ledger_error!r}")
        if estimate is not None and estimate not in ESTIMATE_MODES:
            raise ValueError(f"estimate must be 'learned' or 'bound', got {estimate!r}")
        if disclose_budget is not None and not isinstance(disclose_budget, bool):
            raise TypeError(f"disclose_budget must be True or False, got {disclose_budget!r}")
        meta = _validate.metadata(metadata)
        meta[META_CONTEXT] = True
        if ledger is not None:
            from ampmeter.ledgers.base import Ledger

            if not isinstance(ledger, Ledger):
                raise TypeError(f"ledger must be a Ledger, got {type(ledger).__name__}")
        own_sinks = tuple(sinks)
        for sink in own_sinks:
            if not callable(getattr(sink, "emit", None)):
                raise TypeError(f"sinks must be Sink objects, got {type(sink).__name__}")
        return cls(
            name,
            own,
            _validate.optional_amount(timeout_s, "timeout_s"),
            _validate.optional_amount(admission_timeout_s, "admission_timeout_s"),
            chain_id,
            meta,
            own_sinks,
            ledger,
            str(on_ledger_error),
            _validate.count(max_nodes, "max_nodes (0 = unbounded)"),
            options,
            None if estimate is None else str(estimate),
            _validate.expired_hold(on_expired_hold),
            handoff_from,
            Exhaustion.checked(on_exhausted, pause_timeout_s),
            disclose_budget,
            source.checked(pricing),
        )


def with_ladder(downgrade: object, policy_options: dict[str, Any]) -> dict[str, Any]:
    """The policy keywords with ``downgrade`` as the budget-pressure hook (one hook per
    context: a ladder and an ``on_budget_pressure`` of one's own do not mix)."""
    from ampmeter.policies.downgrade import DowngradeLadder

    if policy_options.get("on_budget_pressure") is not None:
        raise ValueError(
            "give downgrade= or on_budget_pressure=, not both (the ladder is a pressure hook)"
        )
    ladder = DowngradeLadder(downgrade)
    return {**policy_options, "on_budget_pressure": ladder, "pressure_at": ladder.lowest}
