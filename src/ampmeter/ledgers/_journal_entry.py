"""One journal entry on disk: written sealed, and checked in full before it may be replayed.

A journal entry adds spend to a budget when it is replayed, by whichever process opens the
ledger next, so a file in the journal directory is trusted no further than it can be checked:

* it is sealed: a SHA-256 checksum of its contents, or, when the ledger has a ``handoff_key``,
  an HMAC-SHA256 under that key, which nobody without the key can forge. A ledger with a key
  replays only entries sealed with it; one without a key only checksummed ones;
* it is well formed: a known operation, a usable reservation id, amounts that are whole,
  non-negative numbers of units within what a backend counts;
* its scopes are in the ledger's own tree (the journal directory belongs to one tree) and
  each encloses the first, as a reservation's scopes do.

The ``AMPMETER_HANDOFF_KEY`` environment variable is not used here: ``ampmeter run`` makes a
fresh one per run, so entries a run left would never be replayed by the next.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any, Literal, NamedTuple

import orjson

from ampmeter.ledgers._amounts import (
    MAX_UNITS,
    check_key,
    check_reservation_id,
    check_scope,
    root_of,
    scope_path,
)

__all__ = ["BadEntry", "Settlement", "read_entry", "sealed_entry"]

# Entries say their unit: amounts are whole nano-dollars for money keys, counts otherwise.
_UNIT = "nano"
_CHECKSUM = "sha256:"
_MAC = "hmac-sha256:"


class Settlement(NamedTuple):
    """A commit (``actual`` added at ``scopes``, in stored units: nano-dollars for money keys)
    or a release of one reservation id; a commit may carry its idempotency key."""

    op: Literal["commit", "release"]
    reservation_id: str
    scopes: tuple[str, ...]
    actual: dict[str, int]
    idempotency_key: str | None = None


class BadEntry(ValueError):
    """A journal entry that must not be replayed; the message says why."""


def sealed_entry(fields: dict[str, Any], key: bytes | None) -> bytes:
    """The file contents of an entry holding ``fields``, sealed (see the module)."""
    entry = {**fields, "unit": _UNIT}
    return orjson.dumps({"entry": entry, "seal": _seal(entry, key)})


def read_entry(data: bytes, tree: str, key: bytes | None) -> Settlement:
    """The settlement in an entry file, checked, or :class:`BadEntry` saying what is wrong."""
    try:
        document = orjson.loads(data)
    except orjson.JSONDecodeError as error:
        raise BadEntry(f"it cannot be read: {error}") from None
    if isinstance(document, dict) and "seal" not in document:
        raise BadEntry("it has no seal (it was written by an older ampmeter, or not by ampmeter)")
    if not isinstance(document, dict) or not isinstance(document.get("entry"), dict):
        raise BadEntry("it cannot be read: it is not a journal entry")
    entry = document["entry"]
    _check_seal(entry, document["seal"], key)
    try:
        return _checked_fields(entry, tree)
    except (TypeError, ValueError) as error:
        raise BadEntry(str(error)) from None


def _seal(entry: dict[str, Any], key: bytes | None) -> str:
    canonical = orjson.dumps(entry, option=orjson.OPT_SORT_KEYS)
    if key is None:
        return _CHECKSUM + hashlib.sha256(canonical).hexdigest()
    return _MAC + hmac.new(key, canonical, hashlib.sha256).hexdigest()


def _check_seal(entry: dict[str, Any], seal: object, key: bytes | None) -> None:
    if not isinstance(seal, str):
        raise BadEntry("it cannot be read: its seal is not a string")
    if key is not None and not seal.startswith(_MAC):
        raise BadEntry("it is not signed with this ledger's handoff_key")
    if key is None and seal.startswith(_MAC):
        raise BadEntry("it is signed with a handoff_key: open the ledger with that key")
    if not hmac.compare_digest(seal.encode(), _seal(entry, key).encode()):
        what = "signature" if key is not None else "checksum"
        raise BadEntry(
            f"its {what} does not match its contents (it was changed after it was written"
            + (", or signed with another handoff_key)" if key is not None else ")")
        )


def _checked_fields(entry: dict[str, Any], tree: str) -> Settlement:
    op = entry.get("op")
    if op not in ("commit", "release"):
        raise ValueError(f"unknown operation {op!r}")
    if entry.get("unit") != _UNIT:
        raise ValueError(f"unknown unit {entry.get('unit')!r}")
    reservation_id = check_reservation_id(entry.get("id"))
    scopes, actual = entry.get("scopes"), entry.get("actual")
    if not isinstance(scopes, list) or not isinstance(actual, dict):
        raise TypeError("'scopes' must be a list and 'actual' an object")
    if op == "release" and (scopes or actual):
        raise ValueError("a release carries no scopes and no amounts")
    if op == "commit":
        if not scopes:
            raise ValueError("a commit names at least one scope")
        _check_scopes([check_scope(scope) for scope in scopes], tree)
    for name, value in actual.items():
        check_key(name, "an amount's key")
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"amount {name!r} is not a whole number of units: {value!r}")
        if value < 0:
            raise ValueError(f"amount {name!r} is negative ({value}): spend is never taken back")
        if value > MAX_UNITS:
            raise ValueError(f"amount {name!r} is more than a ledger can count ({value})")
    key = entry.get("idempotency_key")
    if key is not None:
        check_key(key, "idempotency_key")
    return Settlement(op, reservation_id, tuple(scopes), dict(actual), key)


def _check_scopes(scopes: list[str], tree: str) -> None:
    """Every scope in ``tree``, and each one the first or a scope enclosing it."""
    for scope in scopes:
        if root_of(scope) != tree:
            raise ValueError(f"scope {scope!r} is outside this ledger's tree {tree!r}")
    path = scope_path(scopes[0])
    for scope in scopes[1:]:
        if scope not in path:
            raise ValueError(f"scope {scope!r} does not enclose the entry's scope {scopes[0]!r}")
