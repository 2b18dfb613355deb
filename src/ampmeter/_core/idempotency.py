"""Exactly-once accounting across replays: a call with an ``idempotency_key`` counts once per
run (the root context keeps the keys it has seen) and once per shared ledger scope (the ledger
keeps them: ``commit(..., idempotency_key=)``).

A workflow engine that runs a step again after a crash (DBOS, Prefect), or replays recorded
results without sending them again (Temporal), records the same key twice; the second record
adds nothing, and its node says which node counted it (``duplicate_of``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from ampmeter import money

if TYPE_CHECKING:
    from ampmeter._core.frame import Frame
    from ampmeter._core.outcome import Outcome
    from ampmeter._core.steps import Flight
    from ampmeter._core.usage import Usage

__all__ = ["META_DUPLICATE_OF", "META_IDEMPOTENCY_KEY", "counted_once"]

META_IDEMPOTENCY_KEY: Final = "idempotency_key"
META_DUPLICATE_OF: Final = "duplicate_of"
_KEYS_KEPT: Final = 100_000  # per run; the oldest are forgotten first


def counted_once(
    frame: Frame, flight: Flight, usage: Usage, outcome: Outcome
) -> tuple[Usage, Outcome]:
    """The usage this call adds: its own the first time its key is seen in the run, else
    nothing (the node notes the first node and the cost it counted)."""
    key = flight.idempotency_key
    assert key is not None
    seen = frame.chain[-1].seen
    meta: dict[str, Any] = {**(outcome.metadata or {}), META_IDEMPOTENCY_KEY: key}
    first = seen.get(key)
    if first is None:
        if len(seen) >= _KEYS_KEPT:
            seen.pop(next(iter(seen)))
        seen[key] = (flight.node.node_id, outcome.cost_nano)
        return usage, outcome.with_usage(
            outcome.cost_nano, outcome.tokens_in, outcome.tokens_out, meta
        )
    node_id, cost_nano = first
    meta[META_DUPLICATE_OF] = node_id
    meta["first_cost_usd"] = float(money.from_nano(cost_nano))  # metadata is JSON for the log
    nothing = type(usage)(usage.kind, usage.model, usage.tool)
    return nothing, outcome.with_usage(0, 0, 0, meta)
