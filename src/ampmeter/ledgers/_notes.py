"""The notes a ledger keeps per scope beside its amounts: an operator's pause of the scope, the
mark of an operator's last raise of each ceiling, the calls paused at a cap (see
:class:`~ampmeter.ledgers.PausedCall`) and claims (what happens once per scope).

A backend keeps notes as text by name; this module names and reads them, so every backend
agrees."""

from __future__ import annotations

import time
from collections.abc import Mapping

import orjson

from ampmeter.keys import is_money
from ampmeter.ledgers._amounts import check_key, to_amount, to_units
from ampmeter.ledgers._rules import PausedCall

__all__ = [
    "PAUSE",
    "claim_name",
    "paused_call",
    "paused_calls",
    "paused_name",
    "paused_text",
    "raised_name",
]

PAUSE = "pause"
"""The note of a scope an operator paused (its text: when); a reserve on the path refuses."""
_RAISED = "raised:"
_PAUSED = "paused:"
_CLAIM = "claim:"


def claim_name(name: str) -> str:
    """The note whose first writer claims ``name``."""
    return _CLAIM + name


def raised_name(key: str) -> str:
    """The note that marks the last operator's raise of ``key``."""
    return _RAISED + check_key(key, "key")


def paused_name(call_id: str) -> str:
    """The note of the paused call ``call_id``."""
    return _PAUSED + call_id


def paused_call(
    call_id: str, key: str, cap: object, context: str, since: float, lasts_s: float
) -> PausedCall:
    """The checked :class:`PausedCall` a context notes (see ``Ledger.note_paused``)."""
    field = check_key(key, "key")
    amount = to_amount(field, to_units(field, cap, "cap", ceiling=True))
    until = time.time() + lasts_s
    return PausedCall(check_key(call_id, "call id"), field, amount, context, since, until)


def paused_text(call: PausedCall) -> str:
    """The note's text for ``call`` (money as a decimal string, read back exactly)."""
    body = {
        "key": call.key,
        "cap": str(call.cap) if is_money(call.key) else call.cap,
        "context": call.context,
        "since": call.since,
        "until": call.until,
    }
    return orjson.dumps(body).decode()


def paused_calls(
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
    """A paused call's note as :func:`paused_text` wrote it, or None if it is not one."""
    try:
        body = orjson.loads(text)
        key, context = check_key(body["key"], "key"), str(body["context"])
        cap = to_amount(key, to_units(key, body["cap"], "cap", ceiling=True))
        return PausedCall(call_id, key, cap, context, float(body["since"]), float(body["until"]))
    except (KeyError, TypeError, ValueError, orjson.JSONDecodeError):
        return None
