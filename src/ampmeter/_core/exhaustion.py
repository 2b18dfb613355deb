"""What a call does at a hard limit: stop (``on_exhausted="raise"``, the default), pause until
a person raises the ceiling (``"pause"``), or ask a callback (a new ceiling, or None to stop).

A paused call (:mod:`.pausing`) tries again when a ceiling is raised for it after it paused:
``raise_limit`` from any thread, or ``ampmeter budget raise`` on its ledger scope from any
process (a raise is known by the ledger's raise mark moving on, so a ceiling an earlier run
left there is never taken), or when an operator's pause of the scope is lifted (``ampmeter
budget resume``). The pause ends as a stop when ``pause_timeout_s`` or a context's
``timeout_s`` runs out. While it waits, the call is noted in its ledger (``ampmeter budget
show`` lists it with its cap). Every pause and resume is a limit event, on the call's node
(``limit_events``) and in the context's snapshot.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Final, Protocol

from ampmeter import _validate

if TYPE_CHECKING:
    from ampmeter.limits import ExceededLimit

__all__ = ["ON_EXHAUSTED_MODES", "ExhaustedHook", "Exhaustion", "PauseLedger"]

ON_EXHAUSTED_MODES: Final = ("raise", "pause")

ExhaustedHook = Callable[[Any, "ExceededLimit"], "float | Decimal | int | None"]
"""``on_exhausted(ctx, exceeded) -> new_max | None`` (``ctx``: the context whose limit was met):
a new ceiling for the exceeded limit's key resumes the call at once; None declines, and the call
stops with :class:`~ampmeter.LimitExceeded`."""


class PauseLedger(Protocol):
    """What a paused call asks of its context's shared ledger (:class:`ampmeter.Ledger` is
    one): where ceilings were raised, and a note of the pause for ``ampmeter budget show``."""

    def raise_mark(self, key: str) -> str | None:
        """The mark of the last raise of ``key``'s ceiling (None: never raised)."""

    def ceilings(self) -> Mapping[str, Any]:
        """The ceilings the ledger keeps for its scope."""

    def note_paused(
        self, call_id: str, key: str, cap: Any, context: str, since: float, lasts_s: float
    ) -> object:
        """Note a paused call (renewed while it waits)."""

    def forget_paused(self, call_id: str) -> None:
        """Drop a paused call's note."""


@dataclass(frozen=True, slots=True)
class Exhaustion:
    """A context's checked ``on_exhausted`` and ``pause_timeout_s`` (None: no end to a pause)."""

    mode: str = "raise"
    timeout_s: float | None = None
    hook: ExhaustedHook | None = None

    @classmethod
    def checked(cls, on_exhausted: object, pause_timeout_s: object) -> Exhaustion | None:
        """The settings from a user's keywords (None when neither is given: inherit)."""
        if on_exhausted is None and pause_timeout_s is None:
            return None
        timeout = _validate.optional_amount(pause_timeout_s, "pause_timeout_s")
        if on_exhausted is None:
            return cls("pause", timeout)
        if callable(on_exhausted):
            return cls("pause", timeout, on_exhausted)
        if on_exhausted not in ON_EXHAUSTED_MODES:
            raise ValueError(
                f"on_exhausted must be 'raise', 'pause' or a callable, got {on_exhausted!r}"
            )
        return cls(str(on_exhausted), timeout)

    @property
    def pauses(self) -> bool:
        """Whether a call at a hard limit pauses rather than stops."""
        return self.mode == "pause"
