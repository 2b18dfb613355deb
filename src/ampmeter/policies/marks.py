"""What the policies need to know about one call, noted when the call is made."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ampmeter.limits import ExceededLimit

__all__ = ["CallMarks"]


class CallMarks:
    """One call's facts for the policy steps: its model and whether it is priced, its input
    estimate, whether it is the final answer, its loop-guard identity, and a budget-pressure
    hook's refusal."""

    __slots__ = ("final", "fingerprint", "input_tokens", "model", "priced", "refusal")

    def __init__(
        self,
        model: str | None,
        priced: bool,
        input_tokens: int,
        final: bool,
        fingerprint: str | None,
        refusal: ExceededLimit | None = None,
    ) -> None:
        self.model = model
        self.priced = priced
        self.input_tokens = input_tokens
        self.final = final
        self.fingerprint = fingerprint
        self.refusal = refusal
