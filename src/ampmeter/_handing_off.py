"""The hand-off part of :class:`~ampmeter.ExecutionContext`: a child that runs in another
process (:meth:`~HandingOff.handoff`), its context there (:meth:`~HandingOff.from_handoff`,
:meth:`~HandingOff.resume`) and its spend read back here (:meth:`~HandingOff.refresh_handoffs`).
The ledger does the work (:mod:`ampmeter.shared.handoff`); this is what a context offers of it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any, TypeVar

from ampmeter import _validate
from ampmeter._settings import Settings
from ampmeter.limits import Limit, context_limits

if TYPE_CHECKING:
    from ampmeter._core.frame import Frame
    from ampmeter.ledgers.base import Ledger
    from ampmeter.pricing.source import Pricing
    from ampmeter.shared.handoff import Handoffs
    from ampmeter.sinks.base import Sink

__all__ = ["HandingOff"]

_Context = TypeVar("_Context", bound="HandingOff")


class HandingOff:
    """Hands part of a context's run to another process (see the module docstring)."""

    # What the context that mixes this in provides.
    _frame: Frame
    _handoffs: Handoffs
    _check_open: Callable[[], None]
    current_parent_id: Callable[[], str]
    _setup: Callable[[Any, Settings], None]

    def handoff(
        self,
        name: str,
        *,
        limits: Sequence[Limit] | None = None,
        max_cost_usd: float | Decimal | None = None,
        max_steps: int | None = None,
        max_retries: int | None = None,
        timeout_s: float | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> str:
        """Start a child that runs in another process; return its token (no secret in it).

        A ``system`` node is added here for the child. The other process calls
        :meth:`from_handoff` with the token: its calls then count at once toward its own limits
        (these arguments, as for :meth:`spawn_child`) and toward those of this context and of
        every context above it that shares a ledger, through the ledger's scope
        ``<scope>/<hand-off node>``. When this context closes, the child's spend is read from
        the ledger and added to these stats and the graph's aggregates (close it after the
        child is done). Needs a shared ledger (``SqliteLedger`` or ``RedisLedger``) on this
        context or one above it.
        """
        self._check_open()
        _validate.text(name, "name", empty=False)
        own = context_limits(limits, max_cost_usd, max_steps, max_retries)
        timeout = _validate.optional_amount(timeout_s, "timeout_s")
        meta = _validate.metadata(metadata)
        return self._handoffs.give(name, self.current_parent_id(), meta, own, timeout)

    @classmethod
    def from_handoff(
        cls: type[_Context],
        token: str,
        *,
        ledger: Ledger | None = None,
        sinks: Iterable[Sink] = (),
        pricing: Pricing | None = None,
    ) -> _Context:
        """The context of a child handed off with :meth:`handoff`, in this process.

        Its calls reserve in the hand-off's ledger scope and every scope above it, so they stop
        at the child's limits and at its parents' remaining budget. ``ledger`` (same backend,
        at or above the hand-off's scope) is needed when the backend wants credentials; else
        one is opened from the token. Nodes reach ``sinks`` with ids of their own under the
        hand-off node and the parent's chain id, so both logs read as one tree. ``pricing`` as
        for :class:`ExecutionContext` (a token carries no prices: the default is the table).
        """
        import secrets

        from ampmeter.propagation import decode, open_ledger  # ledgers load only when used
        from ampmeter.sinks.relabel import RelabeledSink

        found = decode(token, ledger=ledger)
        shared = open_ledger(found, ledger)
        prefix = f"{found.node_id}.{secrets.token_hex(3)}."
        wrapped = [
            RelabeledSink(
                sink, prefix=prefix, attach_to=found.node_id, depth_offset=found.depth + 1
            )
            for sink in sinks
        ]
        timeout = None if found.deadline is None else max(found.deadline - time.time(), 0.0)
        given = {
            "limits": found.limits,
            "timeout_s": timeout,
            "on_exhausted": found.on_exhausted,
            "pause_timeout_s": found.pause_timeout_s,
            "chain_id": found.chain_id,
            "metadata": {"handoff_from": found.node_id},
            "sinks": wrapped,
            "ledger": shared,
            "on_expired_hold": found.on_expired_hold,
            "pricing": pricing,
        }
        settings = Settings.of(found.name, given, handoff_from=found)
        ctx = cls.__new__(cls)
        ctx._setup(None, settings)
        ctx._frame.span_prefix = prefix
        return ctx

    @classmethod
    def resume(cls: type[_Context], token: str, **opening: Any) -> _Context:
        """Continue, in this process, a handed-off run whose process is gone (from its saved
        :meth:`handoff` token; the keywords, ``ledger``, ``sinks`` and ``pricing``, are those of
        :meth:`from_handoff`): the same ledger scope, with what the scope has spent already
        counted here from the start, so its limits hold across the restart. The holds the dead
        process left unsettled are not counted here: its parent records them (the ledger
        still counts them against every ceiling)."""
        ctx = cls.from_handoff(token, **opening)
        ctx._handoffs.count_spent_before()
        return ctx

    def refresh_handoffs(self) -> dict[str, Any]:
        """Read the spend of this context's hand-offs from the ledger again; add what is new.

        A handed-off child may go on spending after this context closed (a background worker):
        its spend reaches these stats (and every context above) when this is called, and
        :meth:`snapshot` calls it. Returns what was added, per key. A ledger that cannot be read
        now adds nothing; the next call catches up.
        """
        return self._handoffs.refresh()
