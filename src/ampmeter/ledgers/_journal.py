"""The local journal of settlements (commits, releases) a ledger backend could not take.

One file per settlement, written to a temporary name, synced and renamed into place, so a reader
never sees half an entry and processes sharing the directory need no lock. Entries are
idempotent by reservation id, so two processes replaying one file, or a settlement that reached
the backend before it was journaled, count once.

Replaying adds spend, by whichever process opens the ledger next, so an entry is trusted no
further than it can be checked; one that fails is never applied: it is renamed ``*.corrupt``
(kept for a person to look at) and logged with the reason. An entry must be

* sealed: a SHA-256 checksum of its contents, or, when the ledger has a ``handoff_key``, an
  HMAC-SHA256 under that key, which nobody without the key can forge. A ledger with a key
  replays only entries sealed with it; one without a key only checksummed ones. Each leaves
  the other kind in place for a ledger of that kind (set aside, they would be lost). The
  ``AMPMETER_HANDOFF_KEY`` environment variable is not used here: ``ampmeter run`` makes a fresh
  one per run, so entries a run left would never be replayed by the next;
* well formed: a known operation, a usable reservation id, amounts that are whole, non-negative
  numbers of units within what a backend counts;
* in the ledger's own tree (the journal directory belongs to one tree), each scope enclosing
  the first, as a reservation's scopes do;
* its user's: on POSIX the directory is private to its user (mode 0700).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, NamedTuple, TypeVar

import orjson

from ampmeter.errors import BudgetUnavailable
from ampmeter.ledgers._amounts import (
    MAX_UNITS,
    check_key,
    check_reservation_id,
    check_scope,
    root_of,
    scope_path,
)

__all__ = ["BadEntry", "Journal", "Settlement", "default_journal_dir"]

_log = logging.getLogger("ampmeter.ledgers")
_R = TypeVar("_R")

# Pauses between the tries of a commit or release before it goes to the journal.
SETTLE_RETRY_PAUSES_S = (0.05, 0.2)
_SUFFIX = ".settlement.json"
_ASIDE = ".corrupt"  # what an entry that must not be replayed is renamed to end with


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


class _OtherSeal(Exception):
    """An entry sealed as another kind of ledger of the tree seals (signed with a key this
    one has none of, or checksummed while this one has a key): that ledger checks and replays
    it, so it is left in place, not set aside (it would be lost)."""


def _read_entry(data: bytes, tree: str, key: bytes | None) -> Settlement:
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
    if (key is not None) != seal.startswith(_MAC):
        raise _OtherSeal
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


def default_journal_dir(backend: str, where: str, scope: str) -> Path:
    """The journal of a backend's scope tree, one subdirectory per backend, location and root.

    Under ``$AMPMETER_JOURNAL_DIR`` if set, else ``$XDG_CACHE_HOME/ampmeter/journal``
    (``~/.cache`` by default), else the system temporary directory when there is no home.
    """
    root = scope.partition("/")[0]
    digest = hashlib.sha256(f"{backend}\0{where}\0{root}".encode()).hexdigest()[:24]
    base = os.environ.get("AMPMETER_JOURNAL_DIR")
    if not base:
        cache = os.environ.get("XDG_CACHE_HOME") or ""
        if not cache:
            home = os.path.expanduser("~")
            cache = os.path.join(home, ".cache") if home != "~" else tempfile.gettempdir()
        base = os.path.join(cache, "ampmeter", "journal")
    return Path(base) / f"{backend}-{digest}"


class Journal:
    """Settlements kept on disk in ``directory`` until :meth:`replay` applies them.

    ``tree`` is the root scope of the ledger the journal belongs to: an entry for a scope
    outside it is refused. ``key`` (the ledger's ``handoff_key``) signs entries and is needed
    to replay them; without one, entries carry a checksum.
    """

    __slots__ = ("_appended", "_key", "_lock", "_tree", "directory", "pending")

    def __init__(self, directory: str | os.PathLike[str], *, tree: str, key: bytes | None) -> None:
        self.directory = Path(directory)
        self._tree = tree
        self._key = key
        self._lock = threading.Lock()
        self._appended = 0
        # True while entries may wait: entries left by an earlier process count too
        self.pending = self.directory.is_dir() and any(self._entries())

    def append(self, settlement: Settlement) -> Path:
        """Write ``settlement``, synced to disk if it is a commit; return its file.

        A release is not synced: losing one to a power cut costs a hold until its lease ends,
        not spend, and a dead backend can make every reserve journal one.
        """
        fields = {
            "op": settlement.op,
            "id": settlement.reservation_id,
            "scopes": list(settlement.scopes),
            "actual": settlement.actual,
            "idempotency_key": settlement.idempotency_key,
            "unit": _UNIT,
        }
        entry = orjson.dumps({"entry": fields, "seal": _seal(fields, self._key)})
        digest = hashlib.sha256(settlement.reservation_id.encode()).hexdigest()[:32]
        path = self.directory / f"{settlement.op}-{digest}{_SUFFIX}"
        durable = settlement.op == "commit"
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(dir=self.directory, prefix=".", suffix=".tmp")
        try:
            with os.fdopen(descriptor, "wb") as file:
                file.write(entry)
                if durable:
                    file.flush()
                    os.fsync(file.fileno())
            os.replace(temporary, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
        if durable:
            _sync_directory(self.directory)
        with self._lock:
            self._appended += 1
            self.pending = True
        return path

    def settle(
        self,
        settlement: Settlement,
        apply: Callable[[Settlement], _R],
        kept: Callable[[], object],
    ) -> _R:
        """``apply(settlement)`` after replaying what waits, with a few quick retries while the
        backend is unavailable; then keep it here, call ``kept`` and raise
        :class:`~ampmeter.errors.BudgetUnavailable` saying where it is (or that it is lost, when
        it cannot be written either)."""
        try:
            if self.pending:
                self.replay(apply)  # fails fast while the backend is down
            for pause in SETTLE_RETRY_PAUSES_S:
                try:
                    return apply(settlement)
                except BudgetUnavailable:
                    time.sleep(pause)
            return apply(settlement)  # the last try
        except BudgetUnavailable as error:
            what = f"the {settlement.op} of reservation {settlement.reservation_id!r}"
            try:
                path = self.append(settlement)
            except OSError as failed:
                raise BudgetUnavailable(
                    f"{error}; {what} could not be journaled in {self.directory} either "
                    f"({failed}): it is lost"
                ) from error
            kept()
            raise BudgetUnavailable(
                f"{error}; {what} is kept in {path} and applied when the ledger is back"
            ) from error

    def replay(self, apply: Callable[[Settlement], object]) -> None:
        """Apply every entry (oldest first) and delete it.

        Stops at the first entry ``apply`` raises for (the backend is down), keeping it and
        the rest. An entry that fails a check (see the module) is renamed ``*.corrupt``,
        logged, and not applied.
        """
        with self._lock:
            appended_before = self._appended
        if self.directory.is_dir():
            paths = sorted(self._entries(), key=_mtime)
            for path in paths:
                settlement = self._read(path)
                if settlement is None:
                    continue
                apply(settlement)
                with contextlib.suppress(FileNotFoundError):  # another process replayed it
                    path.unlink()
        with self._lock:
            if self._appended == appended_before:
                self.pending = False

    def _read(self, path: Path) -> Settlement | None:
        """The checked settlement in ``path``; None when it is gone (another process replayed
        it) or was refused and set aside."""
        try:
            with open(path, "rb") as file:
                owner = os.fstat(file.fileno()).st_uid
                data = file.read()
        except FileNotFoundError:
            return None
        except OSError as error:
            _set_aside(path, f"it cannot be read: {error}")
            return None
        try:
            if hasattr(os, "getuid") and owner != os.getuid():
                raise BadEntry(f"it belongs to another user (uid {owner})")
            return _read_entry(data, self._tree, self._key)
        except BadEntry as bad:
            _set_aside(path, str(bad))
            return None
        except _OtherSeal:
            return None

    def _entries(self) -> list[Path]:
        try:
            return [
                self.directory / name
                for name in os.listdir(self.directory)
                if name.endswith(_SUFFIX)
            ]
        except FileNotFoundError:
            return []


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return 0.0


def _set_aside(path: Path, reason: str) -> None:
    """Rename an entry that must not be replayed out of the journal, keeping it, and say so."""
    aside = path.with_name(path.name + _ASIDE)
    try:
        path.rename(aside)
    except FileNotFoundError:
        return  # another process set it aside first
    except OSError as error:
        _log.error(
            "ledger journal entry %s was not applied (%s) and could not be set aside: %s",
            path,
            reason,
            error,
        )
        return
    _log.error(
        "ledger journal entry %s was not applied and is set aside as %s: %s",
        path,
        aside.name,
        reason,
    )


def _sync_directory(directory: Path) -> None:
    """Make the rename durable (POSIX; elsewhere the rename is all there is)."""
    if os.name != "posix":
        return
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
