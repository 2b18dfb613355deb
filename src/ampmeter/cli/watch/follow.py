"""Follow JSONL logs as they grow: new complete lines of every file matching the patterns.

A line is read only once its newline is written; the bytes after the last newline (a write
in progress, or cut by a crash) are kept and completed by the next read. Complete lines go
through the reading every tool shares (:func:`ampmeter.logs.iter_lines` with
:func:`ampmeter.logs.event_problem`, best effort), so a bad line is counted, not fatal. A file
that shrinks or is replaced is read again from the start. A directory stands for the
``*.jsonl`` files in it, now and later.
"""

from __future__ import annotations

import glob
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from ampmeter.analysis.validate import file_kind
from ampmeter.logs import event_problem, iter_lines

__all__ = ["FileBatch", "LogFollower"]

_READ_CHUNK: Final = 1 << 20


@dataclass(slots=True)
class FileBatch:
    """What one poll read from one file: its new records, and whether it started over."""

    path: str
    records: list[dict[str, Any]] = field(default_factory=list)
    restarted: bool = False
    bad_lines: int = 0


@dataclass(slots=True)
class _Tail:
    path: str
    inode: int
    offset: int = 0
    partial: bytes = b""
    lines: int = 0


class LogFollower:
    """Reads what was appended to the files named by ``patterns`` (paths or globs)."""

    def __init__(self, patterns: Sequence[str | os.PathLike[str]]) -> None:
        self.patterns = [os.fspath(p) for p in patterns]
        self._tails: dict[str, _Tail] = {}
        self.bad_lines = 0

    @property
    def paths(self) -> list[str]:
        """The files followed so far, in the order they were found."""
        return list(self._tails)

    @property
    def pending_bytes(self) -> int:
        """Bytes read after the last newline of every file, waiting for the rest of their line."""
        return sum(len(tail.partial) for tail in self._tails.values())

    def lines_read(self, path: str) -> int:
        """Complete lines read from ``path`` so far (since it last started over)."""
        return self._tails[path].lines

    def _matches(self) -> list[str]:
        found: list[str] = []
        for pattern in self.patterns:
            if glob.has_magic(pattern):
                names = sorted(glob.glob(pattern))
            elif os.path.isdir(pattern):  # its event logs, not the stream logger's other files
                names = [
                    name
                    for name in sorted(glob.glob(os.path.join(glob.escape(pattern), "*.jsonl")))
                    if file_kind(name) == "events"
                ]
            else:
                names = [pattern]
            # A compressed file cannot be followed as it grows: only plain JSONL is.
            plain = [n for n in names if not n.endswith(".gz") and os.path.isfile(n)]
            found += [n for n in plain if n not in found]
        return found

    def poll(self) -> list[FileBatch]:
        """Read every file's new complete lines; new files matching a glob join in."""
        batches = []
        for path in self._matches():
            batch = self._read(path)
            if batch is not None:
                batches.append(batch)
        return batches

    def _read(self, path: str) -> FileBatch | None:
        try:
            handle = open(path, "rb")  # noqa: SIM115 - closed below, also on error
        except FileNotFoundError:  # removed between the glob and the open
            return None
        with handle:
            stat = os.fstat(handle.fileno())
            tail = self._tails.get(path)
            restarted = False
            if tail is None or tail.inode != stat.st_ino or stat.st_size < tail.offset:
                restarted = tail is not None
                tail = self._tails[path] = _Tail(path, stat.st_ino)
            if stat.st_size == tail.offset and not restarted:
                return None
            handle.seek(tail.offset)
            data = handle.read(max(stat.st_size - tail.offset, _READ_CHUNK))
        tail.offset += len(data)
        text = tail.partial + data
        end = text.rfind(b"\n") + 1
        complete = [line + b"\n" for line in text[: end - 1].split(b"\n")] if end else []
        tail.partial = text[end:]
        tail.lines += len(complete)
        batch = FileBatch(path, restarted=restarted)
        reader = iter_lines(complete, name=path, best_effort=True, check=event_problem)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # bad lines are counted on the frame instead
            batch.records = list(reader)
        batch.bad_lines = reader.summary.skipped
        self.bad_lines += batch.bad_lines
        return batch
