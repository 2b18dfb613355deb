"""The operator's handles of a ledger (ceilings kept in it, raises, pauses, paused calls) and the
notes they keep per scope beside its amounts: an operator's pause of the scope, the mark of an
operator's last raise of each ceiling, the calls paused at a cap (see
:class:`~ampmeter.ledgers.PausedCall`) and claims (what happens once per scope).

A backend keeps notes as text by name; this module names and reads them, so every backend
agrees. :class:`Controls` is what an operator (``ampmeter budget``) or a paused context reads and
writes, built on the backend's ceilings and notes."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping

import orjson

from ampmeter.keys import is_money
from ampmeter.ledgers._amounts import (
    Amount,
    AmountIn,
    check_amounts,
    check_key,
    raised_ceiling,
    to_amount,
    to_units,
)
from ampmeter.ledgers._rules import PausedCall
from ampmeter.ledgers.backend import Backend

__all__ = ["CLAIM", "PAUSE", "Controls"]

PAUSE = "pause"
"""The note of a scope an operator paused (its text: when); a reserve on the path refuses."""
CLAIM = "claim:"
"""The start of the notes whose first writer claims the rest of the name."""
_RAISED = "raised:"  # + a key: the mark of the last operator's raise of that ceiling
_PAUSED = "paused:"  # + a call id: a call paused at a cap, as JSON


def _cap(key: str, cap: object) -> Amount:
    """A paused call's cap on ``key``, checked as a ceiling is."""
    return to_amount(key, to_units(key, cap, "cap", ceiling=True))


def _paused_calls(
    notes: Mapping[str, str], now: float, *, lapsed: bool = False
) -> dict[str, PausedCall]:
    """The paused calls among ``notes`` (by id) that are live at ``now``, or those that lapsed
    (``lapsed``); a note that does not read as one counts as lapsed."""
    found: dict[str, PausedCall] = {}
    for name, text in notes.items():
        if not name.startswith(_PAUSED):
            continue
        call_id = name[len(_PAUSED) :]
        call = _read(call_id, text)
        if (call is None or call.until < now) == lapsed:
            found[call_id] = call or PausedCall(call_id, "", 0, "", 0.0, 0.0)
    return found


def _read(call_id: str, text: str) -> PausedCall | None:
    """A paused call's note as :meth:`Controls.note_paused` wrote it, or None if it is not one."""
    try:
        body = orjson.loads(text)
        key, context = check_key(body["key"], "key"), str(body["context"])
        cap = _cap(key, body["cap"])
        return PausedCall(call_id, key, cap, context, float(body["since"]), float(body["until"]))
    except (KeyError, TypeError, ValueError, orjson.JSONDecodeError):
        return None


class Controls(Backend):
    """The ceilings kept in the ledger and the operator's handles (see :class:`Ledger`)."""

    def ceilings(self, scope: str | None = None) -> dict[str, Amount]:
        """The ceilings the ledger keeps for ``scope`` (default: this ledger's) itself."""
        kept = self._backend_read("ceilings", self._readable(scope))
        return {key: to_amount(key, value) for key, value in kept.items()}

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
        self._backend_set_note(name, _RAISED + field, uuid.uuid4().hex)

    def raise_mark(self, key: str, scope: str | None = None) -> str | None:
        """A mark each :meth:`set_ceiling` of ``key`` at ``scope`` moves (None before the first):
        a paused call takes a kept ceiling only once it moved (never one an earlier run left)."""
        field = check_key(key, "key")
        return self._backend_notes(self._readable(scope)).get(_RAISED + field)

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
        field = check_key(key, "key")
        amount, until = _cap(field, cap), time.time() + lasts_s
        call = PausedCall(check_key(call_id, "call id"), field, amount, context, since, until)
        for lapsed in _paused_calls(self._backend_notes(name), time.time(), lapsed=True):
            self._backend_set_note(name, _PAUSED + lapsed, None)
        # Money as a decimal string, so that it is read back exactly.
        cap_text = str(amount) if is_money(field) else amount
        body = {"key": field, "cap": cap_text, "context": context, "since": since, "until": until}
        self._backend_set_note(name, _PAUSED + call.id, orjson.dumps(body).decode())
        return call

    def forget_paused(self, call_id: str, scope: str | None = None) -> None:
        """Drop the note of a paused call (:meth:`note_paused`): it went on or stopped."""
        self._backend_set_note(self._readable(scope), _PAUSED + call_id, None)

    def paused_calls(self, scope: str | None = None) -> tuple[PausedCall, ...]:
        """The calls paused at a cap on ``scope`` (default: this ledger's) now."""
        found = _paused_calls(self._backend_notes(self._readable(scope)), time.time())
        return tuple(found.values())

    def exists(self, scope: str | None = None) -> bool:
        """Whether the ledger keeps anything for ``scope`` (default: this ledger's) or below it."""
        return self._backend_known(self._readable(scope))

    def pause(self, scope: str | None = None) -> None:
        """Pause ``scope`` (default: this ledger's): from its next reserve on, no process admits
        anything there or below it (a :class:`Refusal` with ``paused``) until :meth:`resume`."""
        self._backend_set_note(self._readable(scope), PAUSE, repr(time.time()))

    def resume(self, scope: str | None = None) -> None:
        """Lift a :meth:`pause` of ``scope`` (default: this ledger's); a pause of an enclosing
        scope still applies."""
        self._backend_set_note(self._readable(scope), PAUSE, None)
