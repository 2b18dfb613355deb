"""Test workers in processes: start them, gather one result from each, check they ended well."""

from __future__ import annotations

from collections.abc import Sequence
from multiprocessing.process import BaseProcess
from typing import Any


def gather(workers: Sequence[BaseProcess], out: Any, join_s: float = 30) -> list[Any]:
    """Start ``workers``, take one result per worker from the queue ``out``, then join each
    and assert it exited with 0. Results are read before joining: a process whose queued
    result is still unread does not end."""
    for process in workers:
        process.start()
    results = [out.get(timeout=120) for _ in workers]
    for process in workers:
        process.join(timeout=join_s)
        assert process.exitcode == 0, f"worker {process.name} ended with {process.exitcode}"
    return results
