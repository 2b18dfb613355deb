"""What is left of a context's budget: every hard limit of the context and of those above it,
in this process and in the shared ledgers, less what is spent and what calls in flight hold.

The tightest limit on each key wins, so an agent told :func:`note` sees the budget that will
actually stop it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ampmeter import keys, money
from ampmeter._core.usage import internal_amount
from ampmeter.limits import LimitType

if TYPE_CHECKING:
    from ampmeter._core.frame import Frame
    from ampmeter._core.kernel import Kernel
    from ampmeter.ledgers.base import Ledger
    from ampmeter.limits import Limit

__all__ = ["Left", "left", "note"]

Left = dict[str, tuple[Any, Any]]
"""``{key: (left, ceiling)}``; money keys in Decimal dollars, others as counted."""

_NAMES = {keys.KEY_STEPS: "steps", keys.KEY_LLM_CALLS: "LLM calls", keys.KEY_RETRIES: "retries"}


def left(frame: Frame, kernel: Kernel) -> Left:
    """What is left of each exact hard limit on ``frame`` and the frames above it."""
    found: Left = {}
    for each in frame.ancestry:
        limits = _ceilings(each.limits)
        if not limits:
            continue
        held = kernel.reserved(each.level)
        for limit in limits:
            used = _value(kernel, each, limit.key) + held.get(limit.key, 0)
            _keep(found, limit.key, limit.internal_max - used, limit.internal_max)
        if each.ledger is not None:
            _shared(found, each.ledger, each.ledger.scope, limits)
            link = each.handoff_from
            for scope, above in link.ancestors if link is not None else ():
                _shared(found, each.ledger, scope, _ceilings(above))
    return found


def note(found: Left) -> str:
    """One short line an agent can read: ``Budget left: $0.42 of $1.00, 7 of 20 steps``."""
    parts = []
    cost = found.get(keys.KEY_COST)
    if cost is not None:
        parts.append(f"{money.format_usd(cost[0])} of {money.format_usd(cost[1])}")
    for key, (rest, ceiling) in found.items():
        if key == keys.KEY_COST:
            continue
        parts.append(f"{_count(rest)} of {_count(ceiling)} {_NAMES.get(key, key)}")
    return "Budget left: " + (", ".join(parts) if parts else "no limit")


def _ceilings(limits: tuple[Limit, ...]) -> tuple[Limit, ...]:
    return tuple(lim for lim in limits if lim.is_ceiling and lim.type is LimitType.EXACT)


def _value(kernel: Kernel, frame: Frame, key: str) -> Any:
    counted = kernel.value(frame.level, key, False)
    if counted is None:
        counted = kernel.value(frame.level, key, True)
    return counted or 0


def _shared(found: Left, ledger: Ledger, scope: str, limits: tuple[Limit, ...]) -> None:
    """Add what the ledger says is left at ``scope`` (its kept ceilings and ``limits``)."""
    view = ledger.show(scope)
    ceilings: dict[str, Any] = {lim.key: lim.internal_max for lim in limits}
    for key, kept in view.ceilings.items():
        kept_here = internal_amount(key, kept)
        if key not in ceilings or kept_here < ceilings[key]:
            ceilings[key] = kept_here
    for key, ceiling in ceilings.items():
        used = internal_amount(key, view.spent.get(key, 0)) + internal_amount(
            key, view.reserved.get(key, 0)
        )
        _keep(found, key, ceiling - used, ceiling)


def _keep(found: Left, key: str, rest: Any, ceiling: Any) -> None:
    """Keep the tighter of what is known for ``key``; money comes out as Decimal dollars."""
    rest = max(rest, 0)
    if keys.is_money(key):
        rest, ceiling = money.from_nano(rest), money.from_nano(ceiling)
    else:  # counts: limits may hold them as floats
        rest, ceiling = _whole(rest), _whole(ceiling)
    current = found.get(key)
    if current is None or rest < current[0]:
        found[key] = (rest, ceiling)


def _whole(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _count(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
