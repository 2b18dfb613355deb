"""Policy options and what policies report: the keywords of a context, limit events, final
calls, and the loop guard's identity of a request."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any, Final, Literal

from ampmeter import _validate
from ampmeter.keys import (
    KEY_BUDGET_PRESSURE,
    KEY_COST,
    KEY_INPUT_TOKENS_PER_CALL,
    KEY_REPEATS_FOR,
)
from ampmeter.limits import ExceededLimit, Limit, LimitType, warn_fractions

__all__ = [
    "KEY_BUDGET_PRESSURE",
    "KEY_INPUT_TOKENS_PER_CALL",
    "KEY_REPEATS_FOR",
    "META_LIMIT_EVENTS",
    "LimitEvent",
    "OnUnpriced",
    "PolicyOptions",
    "PressureHook",
    "final_call",
    "fingerprint",
    "in_final_call",
    "is_cost_ceiling",
    "request_fingerprint",
    "shared_refusal",
]

SHARED_READ_S: Final = 0.5
"""How long a shared ledger's totals, once read, stand for the budget pressure and
``wrap_up`` (a settlement always reads them afresh)."""

META_LIMIT_EVENTS: Final = "limit_events"
"""Node metadata: the :class:`LimitEvent` dicts the node's settlement produced."""

OnUnpriced = Literal["refuse", "warn", "allow"]
# The first argument is the ExecutionContext the call runs in (policies never import contexts).
PressureHook = Callable[[Any, dict[str, Any]], "dict[str, Any] | None"]

# -- final calls ----------------------------------------------------------------------------------

_FINAL: contextvars.ContextVar[bool] = contextvars.ContextVar("ampmeter_final_call", default=False)


@contextlib.contextmanager
def final_call() -> Iterator[None]:
    """Mark the SDK calls made inside this block as the final answer: they may spend the
    context's ``final_reserve_usd``."""
    token = _FINAL.set(True)
    try:
        yield
    finally:
        _FINAL.reset(token)


def in_final_call() -> bool:
    """Whether the code runs inside :func:`final_call`."""
    return _FINAL.get()


# -- events ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LimitEvent:
    """Something a limit or policy reports without refusing a call.

    ``kind`` is ``"warning"`` (a ``warn_at`` fraction reached; ``threshold`` says which),
    ``"soft_limit"`` (a soft limit exceeded: ``ctx.wrap_up`` is now True), ``"unpriced"`` (a call
    to an unpriced model let through by ``on_unpriced="warn"``) or ``"input_over_limit"`` (a call
    whose actual input exceeded ``max_input_tokens_per_call`` although its estimate did not).
    ``value`` is the key's value after the call at ``node_id`` settled, ``fraction`` that value
    over the limit; ``context`` names the context the limit belongs to.
    """

    kind: str
    limit: Limit
    key: str
    value: Any
    fraction: float
    node_id: str
    context: str
    threshold: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The event as JSON-ready data (for logs and snapshots)."""
        return {
            "kind": self.kind,
            "limit": self.limit.describe(),
            "key": self.key,
            "value": float(self.value),
            "fraction": self.fraction,
            "threshold": self.threshold,
            "node_id": self.node_id,
            "context": self.context,
        }


# -- options --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PolicyOptions:
    """A context's policy options (see :class:`~ampmeter.ExecutionContext`). ``None`` means
    "as the enclosing context" for the inherited ones: ``on_unpriced``, ``on_limit_event``,
    ``max_input_tokens_per_call``, ``on_budget_pressure`` and ``pressure_at``."""

    on_unpriced: OnUnpriced | None = None
    warn_at: tuple[float, ...] = ()
    on_limit_event: Callable[[LimitEvent], None] | None = None
    final_reserve_usd: Decimal | None = None
    max_repeats: int | None = None
    max_input_tokens_per_call: int | None = None
    on_budget_pressure: PressureHook | None = None
    pressure_at: float | None = None

    @classmethod
    def checked(
        cls,
        *,
        on_unpriced: object = None,
        warn_at: object = None,
        on_limit_event: object = None,
        final_reserve_usd: object = None,
        max_repeats: object = None,
        max_input_tokens_per_call: object = None,
        on_budget_pressure: object = None,
        pressure_at: object = None,
    ) -> PolicyOptions:
        """Options from untrusted values; each error names its argument."""
        if on_unpriced not in (None, "refuse", "warn", "allow"):
            raise ValueError(
                f"on_unpriced must be 'refuse', 'warn' or 'allow', got {on_unpriced!r}"
            )
        for name, hook in (
            ("on_limit_event", on_limit_event),
            ("on_budget_pressure", on_budget_pressure),
        ):
            if hook is not None and not callable(hook):
                raise TypeError(f"{name} must be callable, got {type(hook).__name__}")
        fraction = None
        if pressure_at is not None:
            fraction = warn_fractions((pressure_at,), "pressure_at")[0]
        return cls(
            on_unpriced,
            () if warn_at is None else warn_fractions(warn_at, "warn_at"),
            on_limit_event,  # type: ignore[arg-type]
            None
            if final_reserve_usd is None
            else _validate.dollars(final_reserve_usd, "final_reserve_usd"),
            None if max_repeats is None else _validate.count(max_repeats, "max_repeats"),
            None
            if max_input_tokens_per_call is None
            else _validate.count(max_input_tokens_per_call, "max_input_tokens_per_call"),
            on_budget_pressure,  # type: ignore[arg-type]
            fraction,
        )

    def with_shortcut_warnings(
        self, limits: tuple[Limit, ...], shortcuts: int
    ) -> tuple[Limit, ...]:
        """``limits`` with ``warn_at`` given to the last ``shortcuts`` (``max_cost_usd`` & co.)."""
        if not self.warn_at or not shortcuts:
            return limits
        first = len(limits) - shortcuts
        return (*limits[:first], *(replace(lim, warn_at=self.warn_at) for lim in limits[first:]))

    def check_reserve(self, limits: tuple[Limit, ...]) -> None:
        """A reserve needs a cost ceiling of the same context larger than it."""
        reserve = self.final_reserve_usd
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

    def inherit(self, parent: PolicyOptions | None) -> PolicyOptions:
        """These options with the inherited ones the parent's where not set here."""
        if parent is None:
            return self
        return replace(
            self,
            on_unpriced=self.on_unpriced or parent.on_unpriced,
            on_limit_event=self.on_limit_event or parent.on_limit_event,
            max_input_tokens_per_call=(
                self.max_input_tokens_per_call
                if self.max_input_tokens_per_call is not None
                else parent.max_input_tokens_per_call
            ),
            on_budget_pressure=self.on_budget_pressure or parent.on_budget_pressure,
            pressure_at=self.pressure_at if self.pressure_at is not None else parent.pressure_at,
        )


def is_cost_ceiling(limit: Limit) -> bool:
    """Whether ``limit`` is a plain hard ceiling on ``amp:cost``."""
    return limit.is_ceiling and limit.type is LimitType.EXACT and limit.key == KEY_COST


def shared_refusal(stop: ExceededLimit) -> ExceededLimit:
    """A shared ledger's refusal with the note of the policy behind it (the loop guard)."""
    if not stop.key.startswith(KEY_REPEATS_FOR) or stop.note:
        return stop
    seen, most = int(stop.value), int(stop.limit.max_value)
    note = f"loop detected (the same request {seen} times in the shared budget, "
    return replace(stop, note=f"{note}max_repeats={most})")


def fingerprint(*parts: object) -> str:
    """A short hash of ``parts`` (JSON with sorted keys; other objects by ``str``)."""
    import hashlib  # here: only contexts with a loop guard pay for these imports

    import orjson

    data = orjson.dumps(parts, option=orjson.OPT_SORT_KEYS, default=str)
    return hashlib.blake2b(data, digest_size=8).hexdigest()


# The request fields that make two SDK requests "the same" for the loop guard.
_REQUEST_FIELDS: Final = ("model", "messages", "input", "instructions", "system", "tools")


def request_fingerprint(request: Mapping[str, Any]) -> str:
    """The loop guard's identity of an SDK request: its model, messages (or input), system
    prompt and tools."""
    return fingerprint({k: request[k] for k in _REQUEST_FIELDS if k in request})
