"""A context's limits as one frozen value: :class:`Budget`."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal

from ampmeter import _validate
from ampmeter._core.exhaustion import ExhaustedHook, Exhaustion
from ampmeter.keys import KEY_COST, KEY_LLM_CALLS, KEY_RETRIES, KEY_STEPS
from ampmeter.limits import Limit, context_limits, warn_fractions

__all__ = ["Budget"]

_SHORTCUTS = (
    (KEY_COST, "max_cost_usd"),
    (KEY_STEPS, "max_steps"),
    (KEY_LLM_CALLS, "max_llm_calls"),
    (KEY_RETRIES, "max_retries"),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Budget:
    """What one context may spend, as a frozen value: ``Budget(max_cost_usd=1.0, timeout_s=60)``
    is what ``ExecutionContext(max_cost_usd=1.0, timeout_s=60)`` builds, and ``budget=`` takes.
    The fields are the context's keywords of the same names (``max_cost_usd`` in exact Decimal
    dollars), each checked once, here, by an error that names it. The limits of every enclosing
    context bind a child as well as its own."""

    limits: tuple[Limit, ...] = ()
    max_cost_usd: Decimal | None = None
    max_steps: int | None = None
    max_llm_calls: int | None = None
    max_retries: int | None = None
    timeout_s: float | None = None
    warn_at: tuple[float, ...] = ()
    on_exhausted: str | ExhaustedHook | None = None
    pause_timeout_s: float | None = None
    all_limits: tuple[Limit, ...] = field(init=False, repr=False, compare=False)
    """:attr:`limits` and the shortcuts' limits (with ``warn_at``), as the context checks them."""
    exhaustion: Exhaustion | None = field(init=False, repr=False, compare=False)
    """The checked ``on_exhausted`` and ``pause_timeout_s`` (None: as the enclosing context)."""

    def __post_init__(self) -> None:
        fix = object.__setattr__  # a frozen value sets its checked fields once, here
        fix(self, "limits", context_limits(self.limits, None, None, None))
        shortcuts = []
        for key, name in _SHORTCUTS:
            value = getattr(self, name)
            if value is not None:
                fix(self, name, _validate.limit_max(key, value, name))
                shortcuts.append((key, getattr(self, name)))
        fix(self, "timeout_s", _validate.optional_amount(self.timeout_s, "timeout_s"))
        warn_at = () if self.warn_at is None else warn_fractions(self.warn_at, "warn_at")
        fix(self, "warn_at", warn_at)
        exhaustion = Exhaustion.checked(self.on_exhausted, self.pause_timeout_s)
        if exhaustion is not None:
            fix(self, "pause_timeout_s", exhaustion.timeout_s)
        fix(self, "exhaustion", exhaustion)
        made = (Limit(key, value, warn_at=self.warn_at) for key, value in shortcuts)
        fix(self, "all_limits", (*self.limits, *made))
