"""The local journal of settlements (commits, releases) a ledger backend could not take.

One file per settlement, written to a temporary name, synced and renamed into place, so a reader
never sees half an entry and processes sharing the directory need no lock. Entries are
idempotent by reservation id, so two processes replaying one file, or a settlement that reached
the backend before it was journaled, count once. Replaying adds spend, so each entry is checked
first (:mod:`ampmeter.ledgers._journal_entry`); one that fails is never applied: it is renamed
``*.corrupt`` (kept for a person to look at) and logged with the reason. On POSIX the directory
is private to its user (mode 0700), and an entry another user owns is refused the same way.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from ampmeter.errors import BudgetUnavailable
from ampmeter.ledgers._journal_entry import BadEntry, Settlement, read_entry, sealed_entry

__all__ = ["Journal", "Settlement", "default_journal_dir"]

_log = logging.getLogger("ampmeter.ledgers")
_R = TypeVar("_R")

# Pauses between the tries of a commit or release before it goes to the journal.
SETTLE_RETRY_PAUSES_S = (0.05, 0.2)
_SUFFIX = ".settlement.json"
_ASIDE = ".corrupt"  # what an entry that must not be replayed is renamed to end with


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
        }
        entry = sealed_entry(fields, self._key)
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
            return read_entry(data, self._tree, self._key)
        except BadEntry as bad:
            _set_aside(path, str(bad))
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
