"""What is left of a context's budget: every hard limit of the context and of those above it,
in this process and in the shared ledgers, less what is spent and what calls in flight hold.

The tightest limit on each key wins, so an agent told :func:`note` sees the budget that will
actually stop it.
"""

from __future__ import annotations

from decimal import Decimal
from typing import TYPE_CHECKING, Any

from ampmeter import keys, money
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
    for each in frame.chain:
        limits = _ceilings(each.limits)
        if not limits:
            continue
        held = kernel.reserved(each.level)
        for limit in limits:
            used = _value(kernel, each, limit.key) + held.get(limit.key, 0)
            _keep(found, limit.key, limit.max_value - used, limit.max_value)
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
        parts.append(f"{money.format_usd(_usd(cost[0]))} of {money.format_usd(_usd(cost[1]))}")
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
    ceilings: dict[str, Any] = {lim.key: lim.max_value for lim in limits}
    for key, kept in view.ceilings.items():
        if key not in ceilings or float(kept) < float(ceilings[key]):
            ceilings[key] = kept
    for key, ceiling in ceilings.items():
        used = float(view.spent.get(key, 0)) + float(view.reserved.get(key, 0))
        _keep(found, key, float(ceiling) - used, float(ceiling))


def _keep(found: Left, key: str, rest: Any, ceiling: Any) -> None:
    rest = max(rest, 0)
    if keys.is_money(key):
        rest, ceiling = _usd(rest), _usd(ceiling)
    else:  # counts: limits keep them as floats
        rest, ceiling = _whole(rest), _whole(ceiling)
    current = found.get(key)
    if current is None or rest < current[0]:
        found[key] = (rest, ceiling)


def _usd(value: Any) -> Decimal:
    """Dollars as Decimal, to the nano-dollar (kernel floats carry binary residue)."""
    return Decimal(str(value)).quantize(Decimal("1e-9")).normalize()


def _whole(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _count(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
