"""``async with ctx.llm_call(...)``: entering and leaving a call from a coroutine.

Without a shared ledger this is the synchronous path. With one, the ledger's reserve and commit
(a Redis round trip) run on a worker thread, so the event loop goes on serving other tasks
meanwhile. A task cancelled while its reserve runs waits for it to end and gives back what it
got, so no hold is left behind. This module stays plain Python (it is not compiled with the
context): it holds the coroutines, the compiled :class:`~ampmeter.context.Call` the steps.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ampmeter.context import Call


async def aenter(call: Call) -> Call:
    """``Call.__aenter__``."""
    if not call._enter_async_local():
        return call
    try:
        await _off_loop(call._enter_async_shared)
    except asyncio.CancelledError as cancel:
        call._enter_async_cancelled(cancel)
        raise
    return call._enter_async_done()


async def aexit(
    call: Call,
    exc_type: type[BaseException] | None,
    exc: BaseException | None,
    tb: TracebackType | None,
) -> None:
    """``Call.__aexit__``."""
    if call._exit_async_local(exc_type, exc, tb):
        await _off_loop(functools.partial(call.context._settle, call, exc))


async def _off_loop(work: Callable[[], None]) -> None:
    """Run blocking ledger work on a worker thread; a cancelled caller still waits for it."""
    future = asyncio.ensure_future(asyncio.to_thread(work))
    try:
        await asyncio.shield(future)
    except asyncio.CancelledError:
        await asyncio.wait([future])
        raise
