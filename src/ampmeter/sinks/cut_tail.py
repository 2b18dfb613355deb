"""A log's cut last line, set aside before anything is appended to it.

Opening a file whose last line was cut by a crash (it does not end with a line break) first
sets that tail aside: a tail that is a whole JSON object only lacked its line break and gets
one; anything else is moved, byte for byte, to ``<path>.cut`` (appended, one tail per line) and
the log is truncated after its last whole line. Appending therefore never glues an event onto a
cut line, and strict reading of the log still works.
"""

from __future__ import annotations

import fcntl
import os
import stat
import warnings
from typing import BinaryIO, Final

import orjson

__all__ = ["CUT_SUFFIX", "CutTailWarning", "set_aside_cut_tail"]

CUT_SUFFIX: Final = ".cut"  # where a crash's cut last line is moved when the log is reopened

_CHUNK: Final = 1 << 16  # bytes read at a time while looking for a cut tail
_PARSE_TAIL_MAX: Final = 1 << 20  # a longer cut tail is moved aside without trying to parse it


class CutTailWarning(UserWarning):
    """A log opened for appending ended with a cut line, which was set aside."""


def set_aside_cut_tail(path: str) -> int:
    """Make ``path`` end with a whole line before anything is appended; return the bytes moved.

    A tail without a line break that is a whole JSON object gets its line break; any other tail
    (a line cut by a crash) is appended to ``path + CUT_SUFFIX`` and cut off ``path``, with a
    :class:`CutTailWarning`. A missing, empty or non-regular file is left alone. Assumes no
    other process is writing ``path`` at this moment (a crashed writer is not).
    """
    try:
        f = open(path, "r+b")  # noqa: SIM115 - closed below on every path
    except (FileNotFoundError, PermissionError):  # nothing to repair, or no way to read it
        return 0
    with f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return 0
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)  # one repair at a time (sinks opened together)
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return 0
        tail_start = _after_last_line_break(f, size)
        if size - tail_start <= _PARSE_TAIL_MAX:
            f.seek(tail_start)
            try:
                whole = type(orjson.loads(f.read(size - tail_start))) is dict
            except orjson.JSONDecodeError:
                whole = False
            if whole:  # a complete event that only lacks its line break
                with open(path, "ab") as append:
                    append.write(b"\n")
                return 0
        if os.fstat(f.fileno()).st_size != size:
            return 0  # the file grows: a live writer is finishing that line, not a crash
        aside = path + CUT_SUFFIX
        with open(aside, "ab") as out:
            f.seek(tail_start)
            left = size - tail_start
            while left > 0 and (piece := f.read(min(_CHUNK, left))):
                out.write(piece)
                left -= len(piece)
            out.write(b"\n")
            out.flush()
            os.fsync(out.fileno())  # the tail is safe elsewhere before it leaves the log
        if os.fstat(f.fileno()).st_size != size:
            return 0  # it grew meanwhile (the copy aside is then only a spare)
        f.truncate(tail_start)
    moved = size - tail_start
    warnings.warn(
        f"{path}: its last line was cut ({moved} bytes without a line break, as a crash leaves "
        f"it); moved it to {aside} so that new events start on a line of their own",
        CutTailWarning,
        stacklevel=3,
    )
    return moved


def _after_last_line_break(f: BinaryIO, size: int) -> int:
    """The offset just after the last ``\\n`` of the open file ``f`` (0 if it has none)."""
    end = size
    while end > 0:
        begin = max(0, end - _CHUNK)
        f.seek(begin)
        found = f.read(end - begin).rfind(b"\n")
        if found >= 0:
            return begin + found + 1
        end = begin
    return 0
