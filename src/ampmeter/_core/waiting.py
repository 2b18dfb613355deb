"""How admission waits: one bounded wait, and the two ways to run an admission (a thread
blocks; a task awaits).

An admission is a generator: it yields :class:`Pause` (wait a while, then try again) or
:class:`Work` (blocking work such as a ledger round trip, whose result is sent back in). The
thread driver sleeps and runs the work itself; the task driver awaits ``asyncio.sleep`` and runs
the work on a worker thread, so the event loop goes on meanwhile.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable, Generator, Iterator
from typing import TYPE_CHECKING, Any, Final, TypeVar

if TYPE_CHECKING:
    from ampmeter._core.kernel import Kernel

__all__ = ["Pause", "Steps", "Wait", "Work", "off_loop", "run_async", "run_sync"]

_T = TypeVar("_T")

# Pauses of a call waiting for room: the first, doubled up to the longest (jittered).
_FIRST_PAUSE_S: Final = 0.005
_LONGEST_PAUSE_S: Final = 0.1


class Wait:
    """A bounded wait with growing, jittered pauses (so waiters do not ask all at once)."""

    __slots__ = ("_pause", "deadline", "limit_s", "started")

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self.started = time.monotonic()
        self.deadline = self.started + limit_s
        self._pause = _FIRST_PAUSE_S

    def next_pause(self) -> float | None:
        """Seconds to pause before the next try, or None when the time is up."""
        left = self.deadline - time.monotonic()
        if left <= 0.0:
            return None
        pause = self._pause * random.uniform(0.5, 1.0)  # jitter, not a secret
        self._pause = min(self._pause * 2.0, _LONGEST_PAUSE_S)
        return min(pause, left)

    def waited(self) -> float:
        """Seconds since the wait began."""
        return time.monotonic() - self.started


class Pause:
    """Wait ``seconds`` before trying again; a thread waiting on ``kernel`` wakes early when a
    call in flight gives its hold back."""

    __slots__ = ("kernel", "seconds")

    def __init__(self, seconds: float, kernel: Kernel | None = None) -> None:
        self.seconds = seconds
        self.kernel = kernel


class Work:
    """Blocking work (a ledger round trip) whose result the admission needs."""

    __slots__ = ("run",)

    def __init__(self, run: Callable[[], Any]) -> None:
        self.run = run


Steps = Generator["Pause | Work", Any, None]
"""An admission's waits, as a step or a whole admission yields them."""


def run_sync(admission: Steps) -> None:
    """Run an admission on this thread: sleep through pauses, run work here."""
    item = next(admission, None)  # its first request (None: it is done)
    while item is not None:
        with _giving_back(admission):
            sent = _answer(item)
        item = _advance(admission, sent)


async def run_async(admission: Steps) -> None:
    """Run an admission in a task: await pauses, run work on a worker thread."""
    item = next(admission, None)  # its first request (None: it is done)
    while item is not None:
        with _giving_back(admission):
            sent = await _answer_async(item)
        item = _advance(admission, sent)


def _answer(item: Pause | Work) -> Any:
    """Do what the admission asks on this thread: the work's result, or None after the pause
    (until a settlement in the kernel, or plain sleep)."""
    if isinstance(item, Work):
        return item.run()
    if item.kernel is not None:
        item.kernel.wait_for_settlement(item.seconds)
    else:
        time.sleep(item.seconds)
    return None


async def _answer_async(item: Pause | Work) -> Any:
    """Do what the admission asks in a task: the work's result (run on a worker thread), or
    None after the pause."""
    import asyncio

    if isinstance(item, Work):
        return await off_loop(item.run)
    await asyncio.sleep(item.seconds)
    return None


def _advance(admission: Steps, sent: Any) -> Pause | Work | None:
    """Answer the admission's last request with ``sent``: its next request (None: it is done)."""
    try:
        return admission.send(sent)
    except StopIteration:
        return None


@contextlib.contextmanager
def _giving_back(admission: Steps) -> Iterator[None]:
    """An interrupt while waiting (a signal, a cancelled task) goes into the admission, which
    gives back what it holds, and on to the caller."""
    try:
        yield
    except BaseException as error:
        admission.throw(error)
        raise


async def off_loop(work: Callable[[], _T]) -> _T:
    """Run blocking work on a worker thread; a cancelled caller still waits for it."""
    import asyncio

    future = asyncio.ensure_future(asyncio.to_thread(work))
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        await asyncio.wait([future])
        raise
