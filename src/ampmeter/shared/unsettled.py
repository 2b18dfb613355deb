"""Unsettled spend: the holds of dead workers that a shared ledger charged (their requests may
have been billed), recorded by a surviving context as failed nodes of its own, so every total
and log carries them (``docs/shared-budgets.md``). Each hold is recorded once across every
process: the first reader claims it in the ledger; a hold this process still renews is its own
call's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final

from ampmeter import money
from ampmeter._core.interrupted import COST_STATUS_UNSETTLED
from ampmeter._core.outcome import Outcome
from ampmeter.keys import (
    KEY_COST,
    KEY_COST_FOR,
    KEY_INPUT_TOKENS_FOR,
    KEY_LLM_CALLS,
    KEY_TOOL_CALLS,
    KEY_UNPRICED_LLM_CALLS,
    KEY_UNSETTLED_COST,
)
from ampmeter.node import META_COST_STATUS

if TYPE_CHECKING:
    from ampmeter._core.emit import Emitter
    from ampmeter._core.kernel import Kernel, Level
    from ampmeter.ledgers.base import Ledger, UnsettledHold

__all__ = ["COST_STATUS_UNSETTLED", "UNSETTLED_NAME", "record_unsettled"]

UNSETTLED_NAME: Final = "unsettled hold"
"""The name of such a node."""


def record_unsettled(
    holds: Iterable[UnsettledHold],
    ledger: Ledger,
    kernel: Kernel,
    level: Level,
    emitter: Emitter,
    parent_id: str,
    recorded: dict[str, Mapping[str, Any]],
) -> None:
    """Record, under ``parent_id``, each of ``holds`` that this reader is the first to claim
    in ``ledger``, and note it in ``recorded`` (id -> the hold's amounts) as soon as it is."""
    for hold in holds:
        if hold.id in recorded or not ledger.claim_unsettled(hold):
            continue
        recorded[hold.id] = hold.amounts
        _record(hold, kernel, level, emitter, parent_id)


def _record(
    hold: UnsettledHold, kernel: Kernel, level: Level, emitter: Emitter, parent_id: str
) -> None:
    amounts = hold.amounts  # the ledger leaves out the keys held at 0 (exact limits' others)
    cost = money.to_nano(amounts.get(KEY_COST, 0), KEY_COST)
    models = {
        key[len(prefix) :]: None
        for key in amounts
        for prefix in (KEY_COST_FOR, KEY_INPUT_TOKENS_FOR)
        if key.startswith(prefix)
    }
    model = next(iter(models)) if len(models) == 1 else None
    tool = any(key.startswith(KEY_TOOL_CALLS) for key in amounts)
    kind = "tool" if tool else "llm"
    # An LLM call that reserved no cost, its price unknown: sent, so never a free $0.
    unpriced = not cost and bool(amounts.get(KEY_UNPRICED_LLM_CALLS))
    meta = {
        META_COST_STATUS: "unpriced" if unpriced else COST_STATUS_UNSETTLED,
        "reservation_id": hold.id,
        "ledger_scope": hold.scopes[0],
    }
    node = kernel.begin(parent_id, kind, UNSETTLED_NAME, model, meta)
    kernel.add(level, KEY_TOOL_CALLS if tool else KEY_LLM_CALLS, 1, False)
    if unpriced:
        kernel.add(level, KEY_UNPRICED_LLM_CALLS, 1, False)
    if cost:
        kernel.add(level, KEY_COST, cost, True)
        kernel.add(level, KEY_UNSETTLED_COST, cost, True)
        if model is not None:
            kernel.add(level, KEY_COST_FOR + model, cost, True)
    reason = (
        "its worker ended without settling, and its price is unknown (its hold ran out)"
        if unpriced
        else "its worker ended without settling: the hold was charged as unsettled spend "
        f"({money.format_usd(money.from_nano(cost))}) when its lease ran out"
    )
    if kernel.end(node, Outcome("fail", cost, error_class="UnsettledHold", stop_reason=reason)):
        emitter.emit(node)
