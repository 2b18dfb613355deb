"""Reading JSONL logs by the contract's rules: the one reading of a valid line for every tool
(the rules are listed in ``docs/logs-and-analysis.md`` and on :func:`read_jsonl`).

Only a last line *without its newline* can be a write cut off by a crash, so only it is dropped
with a warning; a complete bad line is an error naming ``file:line`` (skipped and counted in
best-effort mode). No line longer than :func:`max_line_bytes` is ever held: a hostile log must
not exhaust memory, so such a line is read past in fixed-size pieces and refused by its size;
nor its stack, so a line nested deeper than :data:`~ampmeter.logs.events.MAX_DEPTH` is refused
by name. ``.gz`` files (or any gzip data) are decompressed on the fly.
"""

from __future__ import annotations

import gzip
import io
import os
import warnings
import zlib
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from ampmeter._scoped import Closeable
from ampmeter.errors import JsonlError, LogLineError
from ampmeter.logs.events import json_kind, nesting_problem, non_finite_field

__all__ = [
    "DEFAULT_MAX_LINE_BYTES",
    "MAX_LINE_ENV",
    "JsonlError",
    "JsonlReader",
    "LineCheck",
    "LogLineError",
    "LongLine",
    "ReadSummary",
    "SkippedLinesWarning",
    "TruncatedLineWarning",
    "file_lines",
    "max_line_bytes",
    "read_jsonl",
]

_GZIP_MAGIC: Final = b"\x1f\x8b"
DEFAULT_MAX_LINE_BYTES: Final = 64 * 1024 * 1024
MAX_LINE_ENV: Final = "AMPMETER_MAX_LINE_BYTES"
_SKIP_PIECE: Final = 1 << 16  # bytes read at a time while passing over a too-long line


def max_line_bytes() -> int:
    """The longest line a reader accepts: ``$AMPMETER_MAX_LINE_BYTES`` or 64 MiB.

    Raises ``ValueError`` when the variable is set to anything but a positive integer.
    """
    text = os.environ.get(MAX_LINE_ENV)
    if text is None or not text.strip():
        return DEFAULT_MAX_LINE_BYTES
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise ValueError(f"{MAX_LINE_ENV} must be a positive number of bytes, got {text!r}")
    return value


@dataclass(frozen=True, slots=True)
class LongLine:
    """Stands for a line longer than the limit (its bytes were read past, not kept)."""

    size: int
    limit: int

    def reason(self) -> str:
        """Why the line was refused, for a message that names the file and line."""
        return (
            f"line is {self.size:,} bytes, over the {self.limit:,}-byte maximum line size "
            f"(set {MAX_LINE_ENV} to read longer lines)"
        )


def file_lines(handle: io.BufferedIOBase | gzip.GzipFile, limit: int) -> Iterator[bytes | LongLine]:
    """The lines of a binary file (with their line break), a :class:`LongLine` for any line
    longer than ``limit`` bytes; memory stays within about ``limit`` bytes per line."""
    readline = handle.readline
    while True:
        line = readline(limit + 1)
        if not line:
            return
        if len(line) <= limit or (line.endswith(b"\n") and len(line) == limit + 1):
            yield line
            continue
        size = len(line)
        while not line.endswith(b"\n"):
            line = readline(_SKIP_PIECE)
            if not line:
                break
            size += len(line)
        yield LongLine(size - (1 if line.endswith(b"\n") else 0), limit)


_KEEP_SKIPPED: Final = 100  # line numbers of skipped lines kept in the summary


class TruncatedLineWarning(UserWarning):
    """The last line of a JSONL file was incomplete (a cut-off write) and was ignored."""


class SkippedLinesWarning(UserWarning):
    """Best-effort reading skipped bad lines of a file (how many, and the first of them)."""


LineCheck = Callable[[dict[str, Any]], "str | None"]
"""What a record must satisfy beyond being a JSON object: ``None``, or what is wrong with it
(naming the field)."""


@dataclass(slots=True)
class ReadSummary:
    """What a reader has seen so far: records yielded, blank and skipped lines."""

    path: str
    lines: int = 0
    records: int = 0
    blank: int = 0
    skipped: int = 0
    skipped_lines: list[int] = field(default_factory=list)  # the first 100 skipped line numbers
    truncated_last_line: bool = False


class JsonlReader(Closeable, Iterator[dict[str, Any]]):
    """Iterator over the JSON objects of a JSONL source; see :func:`read_jsonl`.

    ``summary`` (and ``skipped``) fill in as the iterator advances; they are final once it is
    exhausted; ``line`` is the line number of the record last returned. Use it as a context
    manager (or call :meth:`close`) to close the file early.
    """

    def __init__(
        self,
        lines: Iterable[bytes | str | LongLine],
        name: str,
        best_effort: bool,
        handles: tuple[io.IOBase, ...] = (),
        check: LineCheck | None = None,
        on_skip: Callable[[int, str], object] | None = None,
    ) -> None:
        self.summary = ReadSummary(name)
        self.line = 0
        self._best_effort = best_effort
        self._handles = handles
        self._check = check
        self._on_skip = on_skip
        self._it = self._records(iter(lines))

    @property
    def skipped(self) -> int:
        """Lines skipped as invalid so far (only ever non-zero with ``best_effort=True``)."""
        return self.summary.skipped

    def __iter__(self) -> JsonlReader:
        return self

    def __next__(self) -> dict[str, Any]:
        return next(self._it)

    def close(self) -> None:
        """Stop reading and close the file."""
        self._it.close()
        for handle in self._handles:  # also when iteration never started
            handle.close()

    def _lines(self, lines: Iterator[bytes | str | LongLine]) -> Iterator[tuple[int, bytes | str]]:
        """Numbered non-blank lines; a damaged compressed tail ends the stream with a warning."""
        summary = self.summary
        number = 0
        try:
            for raw in lines:
                number += 1
                if isinstance(raw, LongLine):
                    self._bad(number, raw.reason())
                elif raw.strip():
                    yield number, raw
                else:
                    summary.blank += 1
        except EOFError:
            warnings.warn(
                f"{summary.path}: compressed data ends early (a cut-off write); "
                f"reading stopped after line {number}",
                TruncatedLineWarning,
                stacklevel=4,
            )
        except (gzip.BadGzipFile, zlib.error) as exc:
            raise JsonlError(summary.path, number + 1, f"unreadable gzip data ({exc})") from None
        except UnicodeDecodeError as exc:  # text sources
            raise JsonlError(summary.path, number + 1, f"undecodable text ({exc})") from None
        finally:
            summary.lines = number

    def _records(
        self, lines: Iterator[bytes | str | LongLine]
    ) -> Generator[dict[str, Any], None, None]:
        try:
            yield from self._parse(lines)
        finally:  # exhausted, closed or collected: the file is no longer needed
            for handle in self._handles:
                handle.close()

    def _parse(self, lines: Iterator[bytes | str | LongLine]) -> Iterator[dict[str, Any]]:
        summary = self.summary
        loads = orjson.loads
        check = self._check
        numbered = self._lines(lines)
        pending = next(numbered, None)
        # One line of look-ahead: only the last line can be a cut-off write.
        while pending is not None:
            number, raw = pending
            pending = next(numbered, None)
            try:
                obj = loads(raw)
            except orjson.JSONDecodeError as exc:
                if pending is None and raw[-1:] not in (b"\n", "\n"):
                    summary.truncated_last_line = True
                    warnings.warn(
                        f"{summary.path}:{number}: ignoring an incomplete last line "
                        f"(a cut-off write): {_short(exc)}",
                        TruncatedLineWarning,
                        stacklevel=3,
                    )
                    return
                reason = nesting_problem(raw) or non_finite_field(raw)
                self._bad(number, reason or f"invalid JSON ({_short(exc)})")
                continue
            if type(obj) is not dict:
                self._bad(number, f"expected a JSON object, got {json_kind(obj)}")
                continue
            if check is not None:
                problem = check(obj)
                if problem is not None:
                    self._bad(number, problem)
                    continue
            summary.records += 1
            self.line = number
            yield obj
        if summary.skipped and self._on_skip is None:
            first = summary.skipped_lines[0]
            warnings.warn(
                f"{summary.path}: skipped {summary.skipped:,} bad line(s), the first at line "
                f"{first}",
                SkippedLinesWarning,
                stacklevel=3,
            )

    def _bad(self, number: int, reason: str) -> None:
        summary = self.summary
        if not self._best_effort:
            raise JsonlError(summary.path, number, reason)
        summary.skipped += 1
        if len(summary.skipped_lines) < _KEEP_SKIPPED:
            summary.skipped_lines.append(number)
        if self._on_skip is not None:
            self._on_skip(number, reason)


def _short(exc: Exception) -> str:
    text = str(exc)
    return text if len(text) <= 120 else text[:117] + "..."


def read_jsonl(
    path: str | os.PathLike[str],
    *,
    best_effort: bool = False,
    check: LineCheck | None = None,
    on_skip: Callable[[int, str], object] | None = None,
) -> JsonlReader:
    """Iterate the JSON objects of a JSONL (or gzip-compressed JSONL) file, one line at a time.

    Memory does not grow with the file, nor past :func:`max_line_bytes` per line. Raises
    :class:`JsonlError` (a ``ValueError``) naming ``file:line`` and the field for a line that
    is not a JSON object, holds a non-finite number, fails ``check`` or is too long, unless
    ``best_effort`` is true (then the line is skipped, counted in ``summary``, passed to
    ``on_skip(line, reason)`` when given, and else told in one :class:`SkippedLinesWarning`).
    An incomplete last line (no newline) is dropped with a :class:`TruncatedLineWarning`. The
    file is opened here, so a missing file raises ``FileNotFoundError`` at once.
    """
    name = os.fspath(path)
    limit = max_line_bytes()
    raw = open(name, "rb")  # noqa: SIM115 - owned by the returned reader
    try:
        compressed = name.endswith(".gz") or raw.peek(2)[:2] == _GZIP_MAGIC
    except OSError:
        raw.close()
        raise
    if not compressed:
        return JsonlReader(file_lines(raw, limit), name, best_effort, (raw,), check, on_skip)
    unzipped = gzip.GzipFile(fileobj=raw, mode="rb")
    lines = file_lines(unzipped, limit)
    return JsonlReader(lines, name, best_effort, (unzipped, raw), check, on_skip)


def iter_lines(
    lines: Iterable[bytes | str],
    *,
    name: str = "<lines>",
    best_effort: bool = False,
    check: LineCheck | None = None,
    on_skip: Callable[[int, str], object] | None = None,
) -> JsonlReader:
    """Apply the same rules to lines already in memory (``name`` is used in messages). Lines
    keep their newline, as in a file: only a last line without one can be a cut-off write."""
    return JsonlReader(lines, name, best_effort, (), check, on_skip)
