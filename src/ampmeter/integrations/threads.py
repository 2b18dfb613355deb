"""Threads carry the context that started them.

A ``contextvars`` context does not follow work into another thread, so a call submitted to a
``ThreadPoolExecutor`` (LiteLLM's ``batch_completion``, a user's ``executor.submit``) or run by
a ``threading.Thread`` would go out unmetered. Once instrumented, work submitted or started
while an ampmeter context is current runs in a copy of the submitter's contextvars context;
work submitted outside a context runs exactly as without ampmeter.
"""

from __future__ import annotations

import contextvars
import functools
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

from ampmeter.context import current_context
from ampmeter.integrations.patching import Patch, undo_all

__all__ = ["instrument_thread_pools", "instrument_threads", "uninstrument_threads"]

_patches: list[Patch] = []


def _wrap_submit(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def submit(executor: Any, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        if current_context() is None:
            return original(executor, fn, *args, **kwargs)
        # One copy per task: a context cannot be entered by two threads at once.
        return original(executor, contextvars.copy_context().run, fn, *args, **kwargs)

    return submit


def _wrap_start(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def start(thread: threading.Thread) -> None:
        if current_context() is not None:
            # The thread runs its run() (a subclass's own too) in a copy of this context.
            context, run = contextvars.copy_context(), thread.run

            def run_in_context() -> None:
                try:
                    context.run(run)
                finally:
                    del thread.__dict__["run"]  # the thread's own run() again, and no cycle left

            thread.run = run_in_context  # type: ignore[method-assign]
        original(thread)

    return start


def instrument_threads(_module: ModuleType | None = None) -> None:
    """Carry the context into ``threading.Thread`` objects started in it (idempotent)."""
    if any(patch.owner is threading.Thread for patch in _patches):
        return
    _patches.append(Patch.apply(threading.Thread, "start", _wrap_start(threading.Thread.start)))


def instrument_thread_pools(module: ModuleType) -> None:
    """Carry the context into work submitted to ``module.ThreadPoolExecutor`` (the
    ``concurrent.futures.thread`` module; idempotent)."""
    executor = module.ThreadPoolExecutor
    if any(patch.owner is executor for patch in _patches):
        return
    _patches.append(Patch.apply(executor, "submit", _wrap_submit(executor.submit)))


def uninstrument_threads() -> None:
    """Restore ``Thread.start`` and ``ThreadPoolExecutor.submit`` (idempotent)."""
    undo_all(_patches)
