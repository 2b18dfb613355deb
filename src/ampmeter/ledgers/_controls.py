"""The operator's handles of a ledger: ceilings kept in it, raises, pauses, paused calls.

What an operator (``ampmeter budget``) or a paused context reads and writes beside the amounts,
built on the backend's ceilings and notes (see :mod:`ampmeter.ledgers._notes`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping

from ampmeter.ledgers import _notes
from ampmeter.ledgers._amounts import (
    Amount,
    AmountIn,
    check_amounts,
    check_key,
    raised_ceiling,
    to_amount,
)
from ampmeter.ledgers._rules import PausedCall
from ampmeter.ledgers.backend import Backend

__all__ = ["Controls"]


class Controls(Backend):
    """The ceilings kept in the ledger and the operator's handles (see :class:`Ledger`)."""

    def ceilings(self, scope: str | None = None) -> dict[str, Amount]:
        """The ceilings the ledger keeps for ``scope`` (default: this ledger's) itself."""
        name = self._readable(scope)
        return {
            key: to_amount(key, value)
            for key, value in self._backend_read("ceilings", name).items()
        }

    def set_ceilings(self, scope: str, ceilings: Mapping[str, AmountIn]) -> dict[str, Amount]:
        """Keep ``ceilings`` (``{key: max}``) for ``scope`` and below; they only ever tighten (a
        child handed them cannot raise them; an operator uses :meth:`set_ceiling`). Returns
        every ceiling now kept there."""
        name = self._readable(scope)
        wanted = check_amounts(ceilings, "ceilings", ceiling=True)
        kept = self._backend_set_ceilings(name, wanted, True)
        return {key: to_amount(key, value) for key, value in kept.items()}

    def set_ceiling(self, scope: str, key: str, value: AmountIn) -> None:
        """Set the ceiling ``key`` of ``scope`` to ``value`` (checked as every limit's maximum
        is), higher or lower: the operator's raise (``ampmeter budget raise``). A call waiting
        for room, or paused at its cap there, sees it at its next try."""
        name = self._readable(scope)
        field = check_key(key, "key")
        self._backend_set_ceilings(name, {field: raised_ceiling(field, value)}, False)
        # Then a fresh mark (after the ceiling: whoever sees the mark sees the ceiling).
        self._backend_set_note(name, _notes.raised_name(field), uuid.uuid4().hex)

    def raise_mark(self, key: str, scope: str | None = None) -> str | None:
        """A mark each :meth:`set_ceiling` of ``key`` at ``scope`` moves (None before the first):
        a paused call takes a kept ceiling only once it moved (never one an earlier run left)."""
        return self._backend_notes(self._readable(scope)).get(_notes.raised_name(key))

    def note_paused(
        self,
        call_id: str,
        key: str,
        cap: AmountIn,
        context: str,
        since: float,
        lasts_s: float,
        scope: str | None = None,
    ) -> PausedCall:
        """Note ``context``'s call ``call_id``, paused since ``since`` at ``cap`` on ``key``, at
        ``scope``, for ``lasts_s`` (then the note lapses)."""
        name = self._readable(scope)
        call = _notes.paused_call(call_id, key, cap, context, since, lasts_s)
        for lapsed in _notes.paused_calls(self._backend_notes(name), time.time(), lapsed=True):
            self._backend_set_note(name, _notes.paused_name(lapsed), None)
        self._backend_set_note(name, _notes.paused_name(call.id), _notes.paused_text(call))
        return call

    def forget_paused(self, call_id: str, scope: str | None = None) -> None:
        """Drop the note of a paused call (:meth:`note_paused`): it went on or stopped."""
        self._backend_set_note(self._readable(scope), _notes.paused_name(call_id), None)

    def paused_calls(self, scope: str | None = None) -> tuple[PausedCall, ...]:
        """The calls paused at a cap on ``scope`` (default: this ledger's) now."""
        found = _notes.paused_calls(self._backend_notes(self._readable(scope)), time.time())
        return tuple(found.values())

    def exists(self, scope: str | None = None) -> bool:
        """Whether the ledger keeps anything for ``scope`` (default: this ledger's) or below it."""
        return self._backend_known(self._readable(scope))

    def pause(self, scope: str | None = None) -> None:
        """Pause ``scope`` (default: this ledger's): from its next reserve on, no process admits
        anything there or below it (a :class:`Refusal` with ``paused``) until :meth:`resume`."""
        self._backend_set_note(self._readable(scope), _notes.PAUSE, repr(time.time()))

    def resume(self, scope: str | None = None) -> None:
        """Lift a :meth:`pause` of ``scope`` (default: this ledger's); a pause of an enclosing
        scope still applies."""
        self._backend_set_note(self._readable(scope), _notes.PAUSE, None)
