"""TokenTracker v0 JSONL sink: one line per finished node, appended to a file.

A node becomes a line one way: :func:`node_to_event` builds the event dict and ``orjson``
encodes it (:func:`encode_event`). The flush modes differ only in when that line is written,
and so in what a crash can take:

=========  ===============================================  ==========  ====================
mode       when the line is written                         SIGKILL     power loss / OS crash
=========  ===============================================  ==========  ====================
``line``   by :meth:`JsonlSink.emit`, one ``write`` per     nothing     what the OS had not
(default)  event, before it returns                         emitted     yet put on the disk
``batch``  by a writer thread, per 1024 events or after     up to the   the same, plus that
           0.25 s idle (the caller only appends to a        buffer and  buffer
           buffer; a slow disk blocks callers)              queue
``fsync``  as ``line``, then ``fsync`` before emit returns  nothing     nothing the disk
                                                                        acknowledged
=========  ===============================================  ==========  ====================

``line`` is the default: once ``emit`` returned the event is the kernel's, which a killed
process cannot lose, for about the cost of one ``write`` system call per event. A file whose
last line was cut by a crash is repaired before the first append (:func:`set_aside_cut_tail`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import queue
import stat
import threading
import warnings
import weakref
from typing import BinaryIO, Final

import orjson

from ampmeter.errors import SinkClosedError, SinkWriteError
from ampmeter.logs.lines import COMPONENTS, EVENT_TYPES, encode_event, iso_utc, node_to_event
from ampmeter.node import Node
from ampmeter.sinks.base import Sink

__all__ = [
    "COMPONENTS",
    "CUT_SUFFIX",
    "EVENT_TYPES",
    "FLUSH_MODES",
    "CutTailWarning",
    "JsonlSink",
    "SinkClosedError",
    "SinkWriteError",
    "encode_event",
    "iso_utc",
    "node_to_event",
    "set_aside_cut_tail",
]

FLUSH_MODES: Final = ("line", "batch", "fsync")

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
    other process is writing ``path`` at this moment (a crashed writer is not). Appending
    therefore never glues an event onto a cut line, and strict reading of the log still works.
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


_BATCH: Final = 1024  # events per hand-off to the writer thread
_IDLE_FLUSH_S: Final = 0.25  # a partial batch reaches the file at most this long after emit


_Batch = list[tuple[Node, str]]  # (node, chain id) pairs


class _Writer:
    """State shared by a sink, its writer thread and its exit finalizer (never the sink)."""

    def __init__(self, path: str, fd: int, mode: str, run_id: str | None, component: str):
        self.path = path
        self.fd = fd
        self.mode = mode
        self.run_id = run_id
        self.component = component
        self.lock = threading.Lock()
        self.buf: _Batch = []
        self.queue: queue.Queue[_Batch | threading.Event | None] = queue.Queue(maxsize=64)
        try:
            self.offset = os.lseek(fd, 0, os.SEEK_END)  # where a failed write is cut back to
        except OSError:  # a pipe or a terminal: nothing to cut
            self.offset = 0
        self.written = 0
        self.lost = 0
        self.error: BaseException | None = None
        self.closed = False
        self.thread: threading.Thread | None = None

    # -- encoding and writing (writer thread in batch mode, caller's thread otherwise) --------

    def take(self) -> _Batch:
        """Swap the buffer for an empty one and return it (the caller holds the lock)."""
        batch, self.buf = self.buf, []
        return batch

    def write(self, items: _Batch) -> None:
        """Write ``items`` or count them as lost; the first failure is kept for the callers."""
        count = len(items)
        if self.error is not None:
            self.lost += count
            return
        run_id, component = self.run_id, self.component
        lines = (
            encode_event(node_to_event(node, run_id or chain, component)) for node, chain in items
        )
        try:
            self._put(b"".join(lines))  # encoded here: an event that cannot be is a failure too
        except Exception as exc:  # a failed write must reach the caller, never kill the thread
            self.error = exc
            self.lost += count
            with contextlib.suppress(OSError):  # leave only whole lines for the next reader
                os.ftruncate(self.fd, self.offset)
            return
        self.written += count

    def _put(self, data: bytes) -> None:
        """Append ``data`` whole (``write`` may take it in parts), then fsync if asked."""
        view = memoryview(data)
        while view:
            done = os.write(self.fd, view)
            if done == 0:
                raise OSError(errno.EIO, "write returned 0 bytes")
            view = view[done:]
        if self.mode == "fsync":
            os.fsync(self.fd)
        self.offset += len(data)

    def failure(self) -> SinkWriteError:
        exc = self.error
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        code = exc.errno if isinstance(exc, OSError) and exc.errno else errno.EIO
        return SinkWriteError(
            code,
            f"JsonlSink could not write {self.path!r}: {reason}; {self.lost} event(s) were not "
            f"written ({self.written} were). The sink accepts no more events.",
        )

    # -- writer thread --------------------------------------------------------------------

    def run(self) -> None:
        get = self.queue.get
        while True:
            try:
                item = get(timeout=_IDLE_FLUSH_S)
            except queue.Empty:
                # Never wait for the lock here: an emitter may hold it while blocked on a full
                # queue, and only this thread can empty the queue.
                if self.lock.acquire(blocking=False):
                    try:
                        items = self.take()
                    finally:
                        self.lock.release()
                    if items:
                        self.write(items)
                continue
            if item is None:
                return
            if isinstance(item, threading.Event):
                item.set()
            else:
                self.write(item)

    def hand_over(self, last: threading.Event | None) -> None:
        """Queue the partial batch, then ``last`` (an event to set, or None: stop)."""
        with self.lock:
            items = self.take()
            if items:
                self.queue.put(items)
            self.queue.put(last)

    def drain(self) -> None:
        """Hand the partial batch to the writer thread and wait until everything is written."""
        thread = self.thread
        if thread is None or not thread.is_alive():
            return
        done = threading.Event()
        self.hand_over(done)
        while not done.wait(1.0):
            if not thread.is_alive():  # pragma: no cover - the thread catches everything
                break

    def shutdown(self) -> None:
        """Write everything, stop the writer thread and close the file (idempotent)."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
        thread = self.thread
        if thread is not None and thread.is_alive():
            self.hand_over(None)
            thread.join()
        try:
            os.close(self.fd)
        except OSError as exc:
            if self.error is None:
                self.error = exc


class JsonlSink(Sink):
    """Writes every finished non-root node as one TokenTracker v0 line, appending to ``path``.

    ``run_id`` is written as each event's ``run_id`` (default: the chain id of the node);
    ``component`` is the default TokenTracker component. The file is opened (created if needed)
    at construction; :meth:`close`, leaving a ``with`` block, or interpreter exit writes what is
    buffered. ``flush`` is ``"line"`` (default), ``"batch"`` or ``"fsync"``: see the module
    docstring for what each can lose on SIGKILL and on power loss. A file whose last line was
    cut by a crash has that tail set aside first (:func:`set_aside_cut_tail`).

    Failures: a failed write is kept, counted and raised as :class:`SinkWriteError` (an
    ``OSError``; the sink's only write error) from :meth:`emit` (``line``/``fsync``: this
    event's write failed; every mode: an earlier write failed), :meth:`flush` and :meth:`close`,
    saying how many events were lost. The file keeps only whole lines. Nothing else from the
    writer thread ever reaches the caller.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        flush: str = "line",
        run_id: str | None = None,
        component: str = "pipeline",
    ) -> None:
        if flush not in FLUSH_MODES:
            raise ValueError(f"flush must be one of {FLUSH_MODES}, got {flush!r}")
        if run_id is not None and (not isinstance(run_id, str) or not run_id):
            raise ValueError(f"run_id must be a non-empty str or None, got {run_id!r}")
        if component not in COMPONENTS:
            raise ValueError(
                f"component must be one of {sorted(COMPONENTS)} (TokenTracker v0), "
                f"got {component!r}"
            )
        self.path = os.fspath(path)
        self.flush_mode = flush
        set_aside_cut_tail(self.path)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        w = self._w = _Writer(self.path, fd, flush, run_id, component)
        if flush == "batch":
            w.thread = threading.Thread(
                target=w.run, name=f"ampmeter-jsonl:{os.path.basename(self.path)}", daemon=True
            )
            w.thread.start()
        self._finalizer = weakref.finalize(self, w.shutdown)

    @property
    def run_id(self) -> str | None:
        """The run id written on every event, or None to use each node's chain id."""
        return self._w.run_id

    @property
    def events_written(self) -> int:
        """Events that reached the file so far."""
        return self._w.written

    @property
    def events_lost(self) -> int:
        """Events that could not be written because of a write error."""
        return self._w.lost

    def emit(self, node: Node, chain_id: str) -> None:
        """Write (``line``/``fsync``) or queue (``batch``) the event for ``node``.

        The root (a node without parent) is skipped. ``node`` must be finished and must not
        change afterwards: in ``batch`` mode it is read later, on the writer thread.

        Raises:
            SinkWriteError: this event could not be written, or the sink failed earlier (the
                event is counted in :attr:`events_lost`).
            SinkClosedError: the sink is closed.
            ValueError: ``node`` is not finished or of an unknown kind.
        """
        if node.parent_id is None:
            return
        if node.end_ts_ms is None or node.kind not in EVENT_TYPES:
            raise ValueError(
                f"JsonlSink takes finished nodes of a known kind; node {node.node_id!r} has "
                f"status {node.status!r} and kind {node.kind!r}"
            )
        w = self._w
        with w.lock:
            if w.closed:
                raise SinkClosedError(f"JsonlSink for {self.path!r} is closed")
            if w.error is not None:
                w.lost += 1
                raise w.failure()
            if w.thread is None:
                w.write([(node, chain_id)])
                if w.error is not None:
                    raise w.failure()
                return
            w.buf.append((node, chain_id))
            if len(w.buf) >= _BATCH:
                w.queue.put(w.take())  # blocks while the writer is behind: back-pressure

    def flush(self) -> None:
        """Wait until every event emitted so far is in the file; raise if writing failed."""
        w = self._w
        w.drain()
        if w.error is not None:
            raise w.failure()

    def close(self) -> None:
        """Write everything, close the file; raise :class:`SinkWriteError` if lines were lost.

        Closing twice is harmless; the error is raised by the first close only.
        """
        w = self._w
        if w.closed:
            return
        self._finalizer()
        if w.error is not None:
            raise w.failure()
