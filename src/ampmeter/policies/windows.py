"""Windowed limits (``Limit(key, max, window_s=60)``): only what settled in the last
``window_s`` seconds counts. Locally a window is checked as a ceiling on the running total,
raised by what has left the window, in the same kernel step as every other ceiling (so with
the holds of calls in flight); through a shared ledger the ledger checks its own window."""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from ampmeter._core.check import Guard
from ampmeter.limits import DerivedCeiling, Limit, LimitType
from ampmeter.policies.options import Policy
from ampmeter.policies.step import Observer

if TYPE_CHECKING:
    from ampmeter._core.check import LimitRow
    from ampmeter._core.frame import Frame
    from ampmeter._core.steps import Admission, Ticket
    from ampmeter._core.usage import Usage
    from ampmeter.policies.configured import ConfiguredPolicies
    from ampmeter.policies.marks import CallMarks
    from ampmeter.policies.step import SharedTerms

__all__ = ["POLICY", "Window", "Windows"]


class Window:
    """What settled in the last ``window_s`` seconds for a windowed limit's key."""

    __slots__ = ("expired", "limit", "lock", "recent")

    def __init__(self, limit: Limit) -> None:
        self.limit = limit
        self.lock = threading.Lock()
        # (monotonic time, amount as the kernel counts it: money in nano-dollars)
        self.recent: deque[tuple[float, Any]] = deque()
        self.expired: Any = 0  # settled amounts that have left the window

    def add(self, amount: Any) -> None:
        with self.lock:
            self.recent.append((time.monotonic(), amount))

    def row(self) -> LimitRow:
        """The window as a ceiling on the running total, raised by the settled amount older
        than the window (it only grows)."""
        limit = self.limit
        assert limit.window_s is not None
        start = time.monotonic() - limit.window_s
        with self.lock:
            recent = self.recent
            while recent and recent[0][0] <= start:
                self.expired += recent.popleft()[1]
            gone = self.expired
        ceiling = DerivedCeiling(limit, gone, f"limit exceeded in {limit.window_s:g}s")
        return (False, limit.key, limit.internal_max + gone, ceiling)


class Windows(Observer):
    """The windowed limits of one context and those above it (see the module docstring)."""

    __slots__ = ("by_frame", "slots", "windows")

    def __init__(self, admission: Admission, by_frame: dict[Frame, tuple[Window, ...]]) -> None:
        super().__init__(admission)
        self.by_frame = by_frame  # the windows of each context here and above that has any
        # (guard index, that guard's windows), and every window here and above
        self.slots = tuple(
            (index, by_frame[frame])
            for index, frame in enumerate(admission.guards)
            if frame in by_frame
        )
        self.windows = tuple(w for windows in by_frame.values() for w in windows)

    def admit(self, ticket: Ticket, thread: int | None) -> None:
        if ticket.marks is None:  # embedding requests and steps: the plain ceilings
            return
        rows = list(ticket.rows if ticket.rows is not None else self.admission.rows)
        for index, windows in self.slots:
            guard = rows[index]
            rows[index] = Guard(guard.level, (*guard.rows, *(window.row() for window in windows)))
        ticket.rows = tuple(rows)

    def observe(self, usage: Usage, node_id: str) -> list[dict[str, Any]]:
        entries = usage.entries()
        for window in self.windows:
            for key, field, _ in entries:
                if key == window.limit.key and usage[field]:
                    window.add(usage[field])
        return []

    def shared_terms(self, owner: Frame, marks: CallMarks | None, terms: SharedTerms) -> None:
        limits = tuple(window.limit for window in self.by_frame.get(owner, ()))
        if limits:
            terms.windows = limits
            terms.extra.update((lim.key, None) for lim in limits if lim.type is LimitType.EXACT)


def _declare(configured: ConfiguredPolicies) -> tuple[Window, ...] | None:
    limits = configured.frame.limits
    return tuple(Window(lim) for lim in limits if lim.window_s is not None) or None


def _make(admission: Admission, configured: ConfiguredPolicies) -> Windows | None:
    by_frame = dict(configured.declarations("windows"))
    return Windows(admission, by_frame) if by_frame else None


POLICY = Policy("windows", (), _make, _declare)
"""Windowed limits (``Limit(..., window_s=...)``): no keyword of its own."""
