"""Warnings and soft limits: a limit with ``warn_at`` fractions reports a ``warning`` event the
first time each is reached; a soft limit (``soft=True``) reports a ``soft_limit`` event and sets
``ctx.wrap_up`` instead of refusing. Through a shared ledger both read the shared total after
each settlement, and a warning fires once per scope across processes
(:meth:`~ampmeter.ledgers.Ledger.claim`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ampmeter.limits import LimitType
from ampmeter.policies.options import LimitEvent, Policy
from ampmeter.policies.shared_totals import SharedTotals, shared_totals
from ampmeter.policies.step import Observer

if TYPE_CHECKING:
    from ampmeter._core.frame import Frame
    from ampmeter._core.steps import Admission
    from ampmeter._core.usage import Shape, Usage
    from ampmeter.limits import Limit
    from ampmeter.policies.configured import ConfiguredPolicies
    from ampmeter.policies.events import EventLog
    from ampmeter.policies.marks import CallMarks
    from ampmeter.policies.step import SharedTerms

__all__ = ["POLICY", "Thresholds", "Watch"]

Found = list[tuple["EventLog", LimitEvent]]


class Watch:
    """The warned and soft limits one context declares, with what they reported so far."""

    __slots__ = ("done", "fired", "frame", "limits", "log", "matched", "shared", "wrapped")

    def __init__(self, frame: Frame, limits: tuple[Limit, ...], log: EventLog) -> None:
        self.frame = frame
        self.limits = limits
        self.log = log  # the declaring context's events
        self.fired: set[tuple[int, str, float | None]] = set()
        self.done: set[tuple[int, str]] = set()  # (limit, key) pairs with nothing left to fire
        self.matched: dict[Shape, tuple[Any, ...]] = {}
        self.wrapped = False
        ledger = frame.ledger
        self.shared: SharedTotals | None = None if ledger is None else shared_totals(ledger)

    def wrap_up(self) -> bool:
        """Whether a soft limit here is exceeded (through a shared ledger: by the total of
        every process, read at most every :data:`SHARED_READ_S`)."""
        if self.wrapped:
            return True
        if self.shared is not None:
            totals = self.shared.read()
            if totals is not None and any(
                limit.soft and totals.get(limit.key, 0.0) > limit.max_value for limit in self.limits
            ):
                self.wrapped = True
        return self.wrapped

    def pairs(self, shape: Shape) -> tuple[Any, ...]:
        """Which (limit, key) pairs a usage of ``shape`` reaches (found once per shape)."""
        watched = self.matched.get(shape)
        if watched is None:
            watched = tuple(
                (index, limit, key, gauge)
                for index, limit in enumerate(self.limits)
                for key, _, gauge in shape.entries
                if limit.matches(key)
            )
            if shape.interned:
                self.matched[shape] = watched
        return watched

    def look(self, shape: Shape, node_id: str, found: Found) -> None:
        """Add to ``found`` the events a usage of ``shape``, added at ``node_id``, fires."""
        watched = self.pairs(shape)
        stats = self.frame.policies.stats
        shared = self.shared
        totals = None
        if shared is not None and any((i, k) not in self.done for i, _, k, _ in watched):
            totals = shared.read(fresh=True)  # the shared total, this call's commit included
        for index, limit, key, gauge in watched:
            if (index, key) in self.done:
                continue
            top = limit.max_value
            value: Any  # Decimal dollars for money keys
            if totals is not None and key in totals:
                value = totals[key]
            else:
                value = stats.get_gauge(key) if gauge else float(stats.get_counter(key))
            fraction = float(value / top) if top > 0 else (1.0 if value > top else 0.0)
            # (kind, threshold) of each event due: a soft limit's has no threshold
            due = [("warning", at) for at in limit.warn_at if fraction >= at]
            if limit.soft and value > top:
                due.append(("soft_limit", None))
            with self.log.lock:
                for kind, threshold in due:
                    if (index, key, threshold) in self.fired:
                        continue
                    self.fired.add((index, key, threshold))
                    self.wrapped = self.wrapped or threshold is None
                    # through a shared ledger, the first process to claim the event reports it
                    if shared is None or shared.claim(
                        f"{kind} {limit.describe()} {key} {threshold}"
                    ):
                        event = LimitEvent(
                            kind,
                            limit,
                            key,
                            value,
                            fraction,
                            node_id,
                            self.frame.name,
                            threshold=threshold,
                        )
                        found.append((self.log, event))
                if all((index, key, t) in self.fired for t in limit.warn_at) and (
                    not limit.soft or (index, key, None) in self.fired
                ):
                    self.done.add((index, key))  # nothing left to report for this key


class Thresholds(Observer):
    """The warnings and soft limits of one context and those above it (see the module
    docstring)."""

    __slots__ = ("watches",)

    def __init__(self, admission: Admission, watches: tuple[Watch, ...]) -> None:
        super().__init__(admission)
        self.watches = watches  # innermost first

    def observe(self, usage: Usage, node_id: str) -> list[dict[str, Any]]:
        shape = usage.shape()
        found: Found = []
        for watch in self.watches:
            watch.look(shape, node_id, found)
        for log, event in found:
            log.report(event)
        return [event.to_dict() for _, event in found]

    def wraps_up(self) -> bool:
        return any(watch.wrap_up() for watch in self.watches)

    def shared_terms(self, owner: Frame, marks: CallMarks | None, terms: SharedTerms) -> None:
        for watch in self.watches:
            if watch.frame is owner:  # held so that the ledger keeps their shared total
                terms.extra.update(
                    (lim.key, None) for lim in watch.limits if lim.type is LimitType.EXACT
                )


def _declare(configured: ConfiguredPolicies) -> Watch | None:
    frame = configured.frame
    watched = tuple(lim for lim in frame.limits if lim.warn_at or lim.soft)
    return Watch(frame, watched, configured.log) if watched else None


def _make(admission: Admission, configured: ConfiguredPolicies) -> Thresholds | None:
    watches = tuple(watch for _, watch in configured.declarations("thresholds"))
    return Thresholds(admission, watches) if watches else None


POLICY = Policy("thresholds", (), _make, _declare)
"""Warnings (``warn_at``) and soft limits (``soft=True``) of the limits: no keyword of their own."""
