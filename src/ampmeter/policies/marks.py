"""What the policies need to know about one call, noted when the call is made."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ampmeter.limits import ExceededLimit

__all__ = ["CallMarks"]


# Not frozen: a frozen init costs about four times as much, once per call; nothing writes to it.
@dataclass(slots=True, eq=False)
class CallMarks:
    """One call's facts for the policy steps: its model and whether it is priced, its input
    estimate, whether it is the final answer, its loop-guard identity, and a budget-pressure
    hook's refusal."""

    model: str | None
    priced: bool
    input_tokens: int
    final: bool
    fingerprint: str | None
    refusal: ExceededLimit | None = None
