"""Where a context's limit events go: its own list (for :meth:`~ampmeter.ExecutionContext.snapshot`)
and its ``on_limit_event`` callback."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from typing import Any

from ampmeter.policies.options import LimitEvent, Policy, callable_option

__all__ = ["POLICY", "EventLog"]


class EventLog:
    """The limit events of one context (see the module docstring)."""

    __slots__ = ("events", "lock", "on_event")

    def __init__(self, on_event: Callable[[LimitEvent], None] | None) -> None:
        self.on_event = on_event
        self.lock = threading.Lock()
        self.events: list[LimitEvent] = []

    def report(self, event: LimitEvent) -> None:
        """Keep ``event`` and hand it to the callback (whose failure is only warned about)."""
        with self.lock:
            self.events.append(event)
        callback = self.on_event
        if callback is None:
            return
        try:
            callback(event)
        except Exception as error:
            # The call is settled and counted; a failing callback must not change that.
            warnings.warn(
                f"ampmeter: on_limit_event failed ({type(error).__name__}: {error}); the event "
                "is kept in the context's snapshot",
                RuntimeWarning,
                stacklevel=2,
            )

    def dicts(self) -> list[dict[str, Any]]:
        """The events so far, as dicts."""
        with self.lock:
            return [event.to_dict() for event in self.events]


POLICY = Policy("events", (callable_option("on_limit_event"),), lambda chain, configured: None)
"""``on_limit_event``: the callback every policy's events go to (no step of its own)."""
