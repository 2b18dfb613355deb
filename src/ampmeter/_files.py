"""The files analysis reads and writes: an input must be a file; an output is written whole or
not at all. Errors are ``OSError``s whose ``filename`` is the path the user gave."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator

__all__ = ["replaced_when_complete", "require_file"]


@contextlib.contextmanager
def replaced_when_complete(path: str | os.PathLike[str]) -> Iterator[str]:
    """Yield a temporary path beside ``path``; when the block ends without error it replaces
    ``path``, otherwise it is removed and ``path`` is left as it was.

    The temporary file is created before the block runs, so an output that cannot be written
    (a directory, a read-only place, ``/proc``) fails at once with an ``OSError`` whose
    ``filename`` is ``path``.
    """
    target = os.fspath(path)
    tmp = f"{target}.tmp-{os.getpid()}"
    if os.path.isdir(target):
        raise IsADirectoryError(errno.EISDIR, "is a directory, not a file", target)
    try:
        with open(tmp, "wb"):
            pass
    except OSError as exc:
        reason = (exc.strerror or str(exc)).lower()
        raise type(exc)(exc.errno, f"cannot write to it ({reason})", target) from None
    try:
        yield tmp
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def require_file(path: str | os.PathLike[str]) -> None:
    """Raise ``FileNotFoundError`` for a missing ``path``, ``IsADirectoryError`` for a directory
    (anything else, a pipe or ``/dev/stdin`` too, is left to ``open``)."""
    if os.path.isdir(path):
        raise IsADirectoryError(errno.EISDIR, "is a directory, not a file", os.fspath(path))
    if not os.path.exists(path):
        raise FileNotFoundError(errno.ENOENT, "no such file", os.fspath(path))
