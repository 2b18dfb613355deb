"""What policies declare and report: their options, limit events, final calls, and the loop
guard's identity of a request."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any, Final

from ampmeter.keys import KEY_COST, KEY_REPEATS_FOR
from ampmeter.limits import ExceededLimit, Limit, LimitType

if TYPE_CHECKING:
    from ampmeter._core.steps import Admission
    from ampmeter.policies.configured import ConfiguredPolicies
    from ampmeter.policies.registry import Policies
    from ampmeter.policies.step import PolicyStep

__all__ = [
    "KEY_REPEATS_FOR",
    "META_LIMIT_EVENTS",
    "LimitEvent",
    "Option",
    "Policy",
    "callable_option",
    "final_call",
    "fingerprint",
    "in_final_call",
    "is_cost_ceiling",
    "request_fingerprint",
    "shared_refusal",
]

META_LIMIT_EVENTS: Final = "limit_events"
"""Node metadata: the :class:`LimitEvent` dicts the node's settlement produced."""

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
        data = {item.name: getattr(self, item.name) for item in fields(self)}
        return data | {"limit": self.limit.describe(), "value": float(self.value)}


# -- declarations ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Option:
    """One keyword a policy declares: ``check`` turns a user's value (never None) into the
    policy's, with an error that names the keyword; ``inherited`` options apply to children
    that do not set them."""

    name: str
    check: Callable[[Any], Any]
    inherited: bool = False


@dataclass(frozen=True, slots=True)
class Policy:
    """A policy as :mod:`~ampmeter.policies.registry` lists it: its keywords; ``make``, its step
    in a context's chain (None: not in force); ``declare``, what a context keeps for its and its
    descendants' steps (counts, windows, watches); ``translate``, a rewrite of the checked
    keywords; ``check``, of them against the context's own limits, before anything is made."""

    name: str
    options: tuple[Option, ...]
    make: Callable[[Admission, ConfiguredPolicies], PolicyStep | None]
    declare: Callable[[ConfiguredPolicies], Any] | None = None
    translate: Callable[[dict[str, Any]], None] | None = None
    check: Callable[[Policies, tuple[Limit, ...]], None] | None = None


def callable_option(name: str, *, inherited: bool = True) -> Option:
    """An option whose value is a callback."""

    def check(hook: object) -> object:
        if not callable(hook):
            raise TypeError(f"{name} must be callable, got {type(hook).__name__}")
        return hook

    return Option(name, check, inherited)


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
