"""The loop guard (``max_repeats``): the same request, or a tool call with the same arguments,
more than N times in a context (or below it) is refused. Through a shared ledger the count is
that of every process sharing the scope: the request's repeat key is held in the ledger."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from ampmeter._validate import count
from ampmeter.limits import ExceededLimit, Limit
from ampmeter.policies.options import KEY_REPEATS_FOR, Option, Policy
from ampmeter.policies.step import PolicyStep

if TYPE_CHECKING:
    from ampmeter._core.frame import Frame
    from ampmeter._core.steps import Admission, Ticket
    from ampmeter.policies.configured import ConfiguredPolicies
    from ampmeter.policies.marks import CallMarks
    from ampmeter.policies.step import SharedTerms

__all__ = ["POLICY", "LoopGuard", "Repeats"]


class Repeats:
    """How often each request was seen in the context that declares ``max_repeats``."""

    __slots__ = ("frame", "lock", "most", "seen")

    def __init__(self, frame: Frame, most: int) -> None:
        self.frame = frame
        self.most = most
        self.lock = threading.Lock()
        self.seen: dict[str, int] = {}

    def count(self, key: str) -> ExceededLimit | None:
        """Count one more request ``key``; the stop when that is one too many."""
        with self.lock:
            seen = self.seen.get(key, 0) + 1
            self.seen[key] = seen
        most = self.most
        if seen <= most:
            return None
        full = KEY_REPEATS_FOR + key
        note = f"loop detected (the same request {seen} times, max_repeats={most})"
        return ExceededLimit(Limit(full, most), full, seen, note)


class LoopGuard(PolicyStep):
    """The loop guards of one context and those above it (see the module docstring)."""

    __slots__ = ("counters",)
    fingerprints = True

    def __init__(self, admission: Admission, counters: tuple[Repeats, ...]) -> None:
        super().__init__(admission)
        self.counters = counters  # innermost first

    def admit(self, ticket: Ticket, thread: int | None) -> None:
        marks = ticket.marks
        if marks is not None and marks.fingerprint is not None:
            for counter in self.counters:
                stop = counter.count(marks.fingerprint)
                if stop is not None:
                    raise self.refuse(ticket, counter.frame, stop)

    def shared_terms(self, owner: Frame, marks: CallMarks | None, terms: SharedTerms) -> None:
        if marks is None or marks.fingerprint is None:
            return
        for counter in self.counters:
            if counter.frame is owner:
                key = KEY_REPEATS_FOR + marks.fingerprint
                terms.cap(key, float(counter.most), Limit(key, counter.most))
                terms.extra[key] = 1.0  # each request holds one repeat


def _declare(configured: ConfiguredPolicies) -> Repeats | None:
    most = configured.values.max_repeats
    return None if most is None else Repeats(configured.frame, most)


def _make(admission: Admission, configured: ConfiguredPolicies) -> LoopGuard | None:
    counters = tuple(repeats for _, repeats in configured.declarations("loop_guard"))
    return LoopGuard(admission, counters) if counters else None


_OPTION = Option("max_repeats", lambda most: count(most, "max_repeats"))
POLICY = Policy("loop_guard", (_OPTION,), _make, _declare)
"""``max_repeats``, of the context that sets it (and binding its descendants)."""
