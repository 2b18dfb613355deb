"""The local journal of settlements (commits, releases) a ledger backend could not take.

One file per settlement in a directory, written to a temporary name, synced and renamed into
place, so a reader never sees half an entry and processes sharing the directory need no lock.
Replaying applies each entry and deletes its file; entries are idempotent by reservation id, so
two processes replaying the same file, or a settlement that did reach the backend before it
was journaled, count once.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, NamedTuple

import orjson

from ampmeter.ledgers._amounts import to_units

__all__ = ["Journal", "Settlement", "default_journal_dir"]

_log = logging.getLogger("ampmeter.ledgers")
_SUFFIX = ".settlement.json"
# Entries say their unit; an entry without one was written when amounts were float dollars.
_UNIT = "nano"


class Settlement(NamedTuple):
    """A commit (``actual`` added at ``scopes``, in stored units: nano-dollars for money keys)
    or a release of one reservation id; a commit may carry its idempotency key."""

    op: Literal["commit", "release"]
    reservation_id: str
    scopes: tuple[str, ...]
    actual: dict[str, int]
    idempotency_key: str | None = None


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
    """Settlements kept on disk in ``directory`` until :meth:`replay` applies them."""

    __slots__ = ("_appended", "_lock", "directory", "pending")

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self._lock = threading.Lock()
        self._appended = 0
        # True while entries may wait: entries left by an earlier process count too
        self.pending = self.directory.is_dir() and any(self._entries())

    def append(self, settlement: Settlement) -> Path:
        """Write ``settlement``, synced to disk if it is a commit; return its file.

        A release is not synced: losing one to a power cut costs a hold until its lease ends,
        not spend, and a dead backend can make every reserve journal one.
        """
        entry = orjson.dumps(
            {
                "op": settlement.op,
                "id": settlement.reservation_id,
                "scopes": list(settlement.scopes),
                "actual": settlement.actual,
                "unit": _UNIT,
                "idempotency_key": settlement.idempotency_key,
            }
        )
        digest = hashlib.sha256(settlement.reservation_id.encode()).hexdigest()[:32]
        path = self.directory / f"{settlement.op}-{digest}{_SUFFIX}"
        durable = settlement.op == "commit"
        self.directory.mkdir(parents=True, exist_ok=True)
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

    def replay(self, apply: Callable[[Settlement], object]) -> int:
        """Apply every entry (oldest first) and delete it; return how many were applied.

        Stops at the first entry ``apply`` raises for (the backend is down), keeping it and
        the rest. An entry that cannot be read is renamed ``*.corrupt`` and logged.
        """
        with self._lock:
            appended_before = self._appended
        applied = 0
        if self.directory.is_dir():
            paths = sorted(self._entries(), key=_mtime)
            for path in paths:
                settlement = _read(path)
                if settlement is None:
                    continue
                apply(settlement)
                with contextlib.suppress(FileNotFoundError):  # another process replayed it
                    path.unlink()
                applied += 1
        with self._lock:
            if self._appended == appended_before:
                self.pending = False
        return applied

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


def _read(path: Path) -> Settlement | None:
    try:
        raw = orjson.loads(path.read_bytes())
        op = raw["op"]
        if op not in ("commit", "release"):
            raise ValueError(f"unknown op {op!r}")
        actual = _actual(raw["actual"], raw.get("unit"))
        key = raw.get("idempotency_key")
        scopes = tuple(str(s) for s in raw["scopes"])
        return Settlement(op, str(raw["id"]), scopes, actual, None if key is None else str(key))
    except FileNotFoundError:
        return None  # replayed meanwhile by another process
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        with contextlib.suppress(OSError):
            path.rename(path.with_name(path.name + ".corrupt"))
        _log.error("ledger journal entry %s cannot be read, set aside: %s", path, error)
        return None


def _actual(raw: Any, unit: object) -> dict[str, int]:
    """An entry's amounts in stored units; an entry of the float era (no unit) held dollars,
    read as written, and counts as floats."""
    if not isinstance(raw, dict):
        raise TypeError("'actual' is not an object")
    if unit == _UNIT:
        found = {str(key): value for key, value in raw.items()}
        for key, value in found.items():
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"'actual'[{key!r}] is not a whole number of units")
        return found
    if unit is not None:
        raise ValueError(f"unknown unit {unit!r}")
    return {str(key): to_units(str(key), value, f"actual[{key!r}]") for key, value in raw.items()}


def _sync_directory(directory: Path) -> None:
    """Make the rename durable (POSIX; elsewhere the rename is all there is)."""
    if os.name != "posix":
        return
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
