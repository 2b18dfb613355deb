"""The one list of policies, in admission order, and :class:`Policies`, the frozen value of a
context's policy options. A new policy is a module that declares its
:class:`~ampmeter.policies.options.Policy` and one line here (or ``POLICIES.append(...)``)."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from types import MappingProxyType
from typing import Any, NoReturn

from ampmeter.policies import (
    downgrade,
    events,
    final_reserve,
    input_cap,
    loop_guard,
    pressure,
    thresholds,
    unpriced,
    windows,
)
from ampmeter.policies.options import Option, Policy

__all__ = ["POLICIES", "Policies"]

POLICIES: list[Policy] = [
    events.POLICY,  # on_limit_event: where the others' events go (no step)
    pressure.POLICY,  # a budget-pressure hook (on_budget_pressure, pressure_at)
    downgrade.POLICY,  # or a downgrade ladder
    input_cap.POLICY,  # max_input_tokens_per_call
    unpriced.POLICY,  # on_unpriced, under a cost limit
    loop_guard.POLICY,  # max_repeats
    final_reserve.POLICY,  # final_reserve_usd
    windows.POLICY,  # Limit(..., window_s=...)
    thresholds.POLICY,  # Limit(..., warn_at=..., soft=True), warn_at
]
"""Every policy, in admission order: a context's chain holds each one's step where in force."""


_INDEX: list[Any] = [0, {}]  # how many policies the index has, and their options by keyword


def _options() -> dict[str, Option]:
    """Every registered option by keyword (made again when :data:`POLICIES` grew); a keyword
    two policies declare is refused."""
    if _INDEX[0] != len(POLICIES):
        index: dict[str, Option] = {}
        for option in (option for policy in POLICIES for option in policy.options):
            if index.setdefault(option.name, option) is not option:
                raise ValueError(f"two registered policies take the keyword {option.name!r}")
        _INDEX[:] = len(POLICIES), index
    options: dict[str, Option] = _INDEX[1]
    return options


class Policies:
    """A context's policy options, as a frozen value: ``Policies(max_repeats=3)`` is what
    ``ExecutionContext(max_repeats=3)`` builds, and ``policies=`` takes. The keywords are those
    the registered policies declare, each checked once, here; one not set reads None. A child
    inherits all but ``max_repeats`` and ``final_reserve_usd`` where it does not set them."""

    __slots__ = ("_values",)
    _values: Mapping[str, Any]

    def __init__(self, **options: Any) -> None:
        values: dict[str, Any] = {}
        if options:
            known = _options()
            for name, value in options.items():
                option = known.get(name)
                if option is None:
                    raise TypeError(
                        f"unknown keyword {name!r}: not a context keyword nor a policy option "
                        f"({', '.join(sorted(known))})"
                    )
                if value is not None:
                    values[name] = option.check(value)
            for policy in POLICIES:
                if policy.translate is not None:
                    policy.translate(values)
        object.__setattr__(self, "_values", MappingProxyType(values))

    def __getattr__(self, name: str) -> Any:
        if name not in _options():
            raise AttributeError(f"Policies has no option {name!r}")
        return self._values.get(name)

    def __setattr__(self, name: str, value: object = None) -> NoReturn:
        raise AttributeError("Policies is frozen: make a new one (Policies(...)) instead")

    __delattr__ = __setattr__

    def __reduce__(self) -> tuple[Any, ...]:
        # copy and pickle make the value again from its options (its slot is read-only)
        return (partial(Policies, **self._values), ())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Policies) and dict(self._values) == dict(other._values)

    def __hash__(self) -> int:
        return hash(tuple(sorted(self._values.items())))  # keywords are distinct: never values

    def __repr__(self) -> str:
        return f"Policies({', '.join(f'{k}={v!r}' for k, v in self._values.items())})"

    def inherit(self, parent: Policies | None) -> Policies:
        """These options, with the parent's inherited ones where not set here."""
        if parent is None or not parent._values:
            return self
        known = _options()
        merged = {k: v for k, v in parent._values.items() if known[k].inherited}
        merged.update(self._values)
        value = Policies.__new__(Policies)
        object.__setattr__(value, "_values", MappingProxyType(merged))
        return value
