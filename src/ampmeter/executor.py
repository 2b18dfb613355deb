"""The executor loop: iterations counted, limits checked after each one and before the next."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from ampmeter.context import ExecutionContext, TerminationReason
from ampmeter.errors import ExecutionCanceled, HookAbort, LimitExceeded
from ampmeter.keys import KEY_ELAPSED_S
from ampmeter.limits import ExceededLimit, Limit, default_limits
from ampmeter.sinks.base import Sink

__all__ = ["CONTINUE", "AgentLoop", "ExecutionResult", "Executor"]


class _Continue:
    __slots__ = ()

    def __repr__(self) -> str:
        return "CONTINUE"


CONTINUE: Final = _Continue()
"""Returned by ``loop.next(ctx)`` to ask for another iteration."""


class AgentLoop(Protocol):
    """An agent's loop: ``next(ctx)`` does one iteration and returns a result or ``CONTINUE``."""

    def next(self, ctx: ExecutionContext) -> Any: ...


@dataclass(slots=True)
class ExecutionResult:
    """How an executor run ended: its result (None unless it succeeded) and why it stopped."""

    result: Any
    context: ExecutionContext
    exceeded_limit: ExceededLimit | None
    termination_reason: TerminationReason
    error: BaseException | None = None


class Executor:
    """Runs an agent loop in a fresh context until it returns a result or a limit stops it.

    Limits are checked when an iteration completes (after ``next`` returns ``CONTINUE``) and
    before the next one starts, so ``ctx.iteration`` counts iterations that ran and a stop names
    the limit actually exceeded; with an iteration limit of N exactly N iterations run.

    ``limits`` defaults to :func:`~ampmeter.default_limits` (100 iterations, 3 consecutive
    parse errors of each kind); other keywords go to :class:`~ampmeter.ExecutionContext`.
    """

    def __init__(
        self,
        loop: AgentLoop | Callable[[ExecutionContext], Any],
        limits: Sequence[Limit] | None = None,
        *,
        name: str = "agent_run",
        sinks: Iterable[Sink] = (),
        **context_options: Any,
    ) -> None:
        step = getattr(loop, "next", None)
        if callable(step):
            self._next: Callable[[ExecutionContext], Any] = step
        elif callable(loop):
            self._next = loop
        else:
            raise TypeError("loop must have a next(ctx) method or be callable")
        self.loop = loop
        self.limits = list(default_limits() if limits is None else limits)
        self.name = name
        self.sinks = tuple(sinks)
        self.context_options = context_options

    def execute(self, data: Any = None) -> ExecutionResult:
        """Run the loop with ``data`` (available as ``ctx.data``) and report how it ended."""
        ctx = ExecutionContext(
            self.name, limits=self.limits, sinks=self.sinks, **self.context_options
        )
        ctx.data = data
        result: Any = None
        error: BaseException | None = None
        with ctx:
            try:
                while True:
                    ctx.start_iteration()
                    outcome = self._next(ctx)
                    if outcome is not CONTINUE:
                        result = outcome
                        break
                    ctx.end_iteration()  # the iteration completed: check before the next
            except LimitExceeded as exc:
                if exc.exceeded is not None and ctx.exceeded_limit is None:
                    ctx.exceeded_limit = exc.exceeded
                timed_out = exc.exceeded is not None and exc.exceeded.key == KEY_ELAPSED_S
                ctx.termination_reason = (
                    TerminationReason.TIMEOUT if timed_out else TerminationReason.LIMIT_EXCEEDED
                )
                error = exc
            except ExecutionCanceled as exc:
                ctx.termination_reason = TerminationReason.CONTEXT_CANCELED
                error = exc
            except HookAbort as exc:
                ctx.termination_reason = TerminationReason.HOOK_ABORT
                error = exc
            except Exception as exc:
                ctx.termination_reason = TerminationReason.ERROR
                error = exc
                ctx.close(exc)
        reason = ctx.termination_reason or TerminationReason.SUCCESS
        return ExecutionResult(result, ctx, ctx.exceeded_limit, reason, error)
