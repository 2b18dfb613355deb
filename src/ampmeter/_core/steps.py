"""The admission chain: every containment concern is a step a call passes before it runs.

A step has three verbs: ``admit(flight, thread)`` (holds what the step needs, or raises the
refusal; a step that must wait returns a generator of its waits, see
:mod:`ampmeter._core.waiting`, and one that never waits returns None),
``settle(flight, usage, outcome)`` (the call ended: replace holds by what it used; returns the
outcome, with anything the step adds to the node) and ``release(flight)`` (give holds back
without usage). A context builds its :class:`Chain` once, when it is made, from the steps its
configuration needs: cancellation always, the deadline when a context above has a timeout, one
step per policy in force (:mod:`ampmeter.policies`), the local limits, and the shared ledger
when a context above has one.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final

from ampmeter._core.check import Guard, Hit
from ampmeter._core.exhaustion import PauseWait
from ampmeter._core.idempotency import counted_once, usage_after
from ampmeter._core.outcome import Outcome, TerminationReason
from ampmeter._core.usage import Shape, Usage
from ampmeter._core.waiting import Pause, Wait, Work
from ampmeter.errors import BudgetBusy, ExecutionCanceled, LimitExceeded
from ampmeter.keys import KEY_ELAPSED_S
from ampmeter.limits import ExceededLimit, Limit, exceeded
from ampmeter.pricing.source import in_nano

if TYPE_CHECKING:
    from ampmeter._core.cells import Cell
    from ampmeter._core.emit import Emitter
    from ampmeter._core.frame import Frame
    from ampmeter._core.kernel import Kernel, Level
    from ampmeter.ledgers.base import Ledger, Reservation
    from ampmeter.node import Node
    from ampmeter.policies.configured import ConfiguredPolicies
    from ampmeter.policies.marks import CallMarks
    from ampmeter.pricing.request_size import RequestSize
    from ampmeter.pricing.source import NanoPricing, Pricing

__all__ = ["ADMITTED", "DONE", "NEW", "Chain", "Flight", "Step", "Stop", "timed_out"]

NEW, ADMITTED, DONE = 0, 1, 2
_CACHE_MAX: Final = 4_096  # per context: reservation shapes with a resolved hold plan

Stop = tuple["Frame", "ExceededLimit", TerminationReason]
"""A refusal: the context whose limit fired, the limit, and the reason it stops."""
HoldPlan = tuple[tuple[tuple["Level", tuple[str, ...]], ...], tuple[tuple[str, int], ...]]
Steps = Generator["Pause | Work", Any, None]


class Flight:
    """One call's state in the chain: its node, reservation, holds and progress. The
    :class:`~ampmeter.Call` a user sees owns it; it is the kernel's
    :class:`~ampmeter._core.cells.Ticket` for the call, referred to weakly, so a call dropped
    without settling (an interrupt) is found and ended."""

    __slots__ = (
        "__weakref__",
        "amounts",
        "feed",
        "holds",
        "idempotency_key",
        "kind",
        "ledger_holds",
        "marks",
        "model",
        "name",
        "node",
        "phase",
        "prompt_size",
        "provider",
        "recorded",
        "reservation",
        "rows",
        "thread",
    )

    node: Node
    # Filled in by the kernel when it admits the call (see Ticket).
    amounts: Mapping[str, Any]
    holds: tuple[tuple[Level, tuple[str, ...]], ...]
    thread: int

    def __init__(
        self,
        kind: str,
        name: str,
        model: str | None,
        provider: str | None,
        reservation: Usage,
        prompt_size: RequestSize | None,
        marks: CallMarks | None,
        idempotency_key: str | None,
    ) -> None:
        self.kind = kind
        self.name = name
        self.model = model
        self.provider = provider
        self.reservation = reservation
        self.prompt_size = prompt_size
        self.marks = marks
        self.recorded = False
        self.phase = NEW
        self.rows: tuple[Guard, ...] | None = None  # the ceilings a policy chose, if any
        self.ledger_holds: tuple[tuple[Ledger, Reservation], ...] = ()
        self.idempotency_key = idempotency_key  # counted once per key in the run (replays)
        self.feed: Iterator[tuple[Cell, int]] | None = None  # the kernel's settlement progress


class Step:
    """One containment concern (see the module docstring). The base admits and holds nothing."""

    __slots__ = ()

    def admit(self, flight: Flight, thread: int | None) -> Steps | None:
        """Hold what this step needs for ``flight``, or raise its refusal; a step that must
        wait returns its waits (a generator), else None."""
        return None

    def settle(self, flight: Flight, usage: Usage, outcome: Outcome) -> Outcome:
        """The call ended with ``usage``: settle this step's holds."""
        return outcome

    def release(self, flight: Flight) -> None:
        """Give this step's holds back without usage."""


class Chain:
    """The steps of one context's calls, built once when the context is made."""

    __slots__ = (
        "admitters",
        "emitter",
        "frame",
        "guards",
        "index",
        "kernel",
        "ledgered",
        "level",
        "policies",
        "pricing",
        "rows",
        "settlers",
        "steps",
        "wait_s",
    )

    def __init__(
        self,
        frame: Frame,
        kernel: Kernel,
        emitter: Emitter,
        policies: ConfiguredPolicies,
        wait_s: float,
        pricing: Pricing,
    ) -> None:
        self.frame = frame
        self.kernel = kernel
        self.emitter = emitter
        self.level = frame.level
        self.guards = tuple(f for f in frame.chain if f.can_stop())
        # The ceilings of every guard: each context's own guard, which a raised limit updates.
        self.rows = tuple(f.guard for f in self.guards)
        self.policies = policies
        self.pricing: NanoPricing = in_nano(pricing)  # what calls are estimated and priced with
        self.wait_s = wait_s
        self.ledgered = tuple(f for f in self.guards if f.ledger is not None)
        steps: list[Step] = [Cancel(self)]
        timed = tuple(f for f in self.guards if f.deadline is not None)
        if timed:
            steps.append(Deadline(self, timed))
        steps.extend(policies.steps_for(self))
        steps.append(LocalLimits(self, run=not self.ledgered))
        if self.ledgered:
            from ampmeter.shared.ledger_step import LedgerStep

            steps.append(LedgerStep(self))
        self.steps: tuple[Step, ...] = tuple(steps)
        # Admission asks only the steps that admit anything; settlement only those that settle
        # anything, last step first.
        self.admitters = tuple(s for s in steps if type(s).admit is not Step.admit)
        self.settlers = tuple(s for s in reversed(steps) if type(s).settle is not Step.settle)

    # -- admission ------------------------------------------------------------------------------

    def admission(self, flight: Flight, thread: int | None) -> Steps:
        """Pass ``flight`` through every step (``thread``: the waiting thread, None in a task).
        A refusal or an interrupt gives back what earlier steps held, and halts the node."""
        if flight.phase != NEW:
            raise RuntimeError(f"call {flight.node.node_id} was already started")
        flight.phase = DONE  # refused: the node is halted and nothing is held
        try:
            for step in self.admitters:
                waits = step.admit(flight, thread)
                if waits is not None:
                    yield from waits
        except BaseException as error:
            reason = (
                "interrupted"
                if not isinstance(error, Exception)
                else f"admission failed: {_error_text(error)}"
            )
            self.abandon(flight, reason)
            raise
        if self.ledgered:
            self.kernel.run(flight.node)
        flight.phase = ADMITTED

    def abandon(self, flight: Flight, reason: str) -> None:
        """Give back every hold of ``flight`` (an admission that did not finish) and end its
        node as ``halt`` with ``reason`` (unless a step ended it already)."""
        for step in reversed(self.steps):
            step.release(flight)
        if self.kernel.abort(flight.node, Outcome("halt", stop_reason=reason)):
            self.emitter.emit(flight.node)

    def halt(self, flight: Flight, reason: str) -> None:
        """End a call that did not run as ``halt`` with ``reason``."""
        self.abandon(flight, reason)

    def refuse(self, flight: Flight, stop: Stop, message: str | None = None) -> LimitExceeded:
        """Record ``stop`` and halt the call; the error to raise."""
        owner, limit, reason = stop
        self.frame.stop(owner, limit, reason)
        self.halt(flight, message or str(limit))
        return LimitExceeded(
            f"{flight.kind} call {flight.name!r} stopped before it ran: {message or limit}",
            limit,
            flight.node.node_id,
        )

    def owner(self, found: tuple[int, Hit]) -> Stop:
        """The stop a kernel hit (guard index, hit) stands for."""
        index, hit = found
        return self.guards[index], exceeded(hit), TerminationReason.LIMIT_EXCEEDED

    def deadline_passed(self) -> Stop | None:
        """The first context above whose wall time (``timeout_s``) is over, as a stop."""
        timed = tuple(f for f in self.guards if f.deadline is not None)
        return timed_out(timed) if timed else None

    def exceeded_now(self) -> Stop | None:
        """The first limit above this context exceeded now (a deadline first), as a stop."""
        found = self.deadline_passed()
        rows = self.rows
        if found is None and rows:
            hit = self.kernel.check(rows, None)
            if hit is not None:
                found = self.owner(hit)
        return found

    # -- settlement -----------------------------------------------------------------------------

    def settle(self, flight: Flight, usage: Usage, outcome: Outcome) -> None:
        """End an admitted call: every step settles, last step first, then sinks see the node."""
        node = flight.node
        if node.status == "created" and not self.kernel.is_held(node):
            # Never admitted (refused, or never started): nothing was used.
            if outcome.status == "success":
                outcome = Outcome("halt", stop_reason="never started")
            self.kernel.end(node, outcome)
            self.emitter.emit(node)
            return
        keyed = flight.idempotency_key is not None
        if keyed:
            usage, outcome = counted_once(self.frame, flight, usage, outcome)
        ledgered = keyed and bool(self.ledgered)
        for step in self.settlers:
            outcome = step.settle(flight, usage, outcome)
            if ledgered:  # a shared ledger may have counted it before this run
                usage = usage_after(usage, outcome)
        if self.emitter.sinks:
            self.emitter.emit(node)


class Cancel(Step):
    """A canceled context (or one above it) runs no more calls."""

    __slots__ = ("chain",)

    def __init__(self, chain: Chain) -> None:
        self.chain = chain

    def admit(self, flight: Flight, thread: int | None) -> None:
        frame = self.chain.frame
        if frame.any_canceled():
            self.chain.halt(flight, "context canceled")
            raise ExecutionCanceled(f"context {frame.name!r} was canceled", flight.node.node_id)


class Deadline(Step):
    """A context above with a timeout stops calls once its wall time is over."""

    __slots__ = ("chain", "timed")

    def __init__(self, chain: Chain, timed: tuple[Frame, ...]) -> None:
        self.chain = chain
        self.timed = timed

    def admit(self, flight: Flight, thread: int | None) -> None:
        found = timed_out(self.timed)
        if found is not None:
            raise self.chain.refuse(flight, found)


def timed_out(timed: tuple[Frame, ...]) -> Stop | None:
    """The first of ``timed`` whose wall time is over, as a stop."""
    now = time.monotonic()
    for frame in timed:
        if frame.deadline is not None and now > frame.deadline:
            limit = Limit(KEY_ELAPSED_S, frame.timeout_s or 0.0)
            elapsed = ExceededLimit(limit, KEY_ELAPSED_S, now - frame.started_at)
            return frame, elapsed, TerminationReason.TIMEOUT
    return None


class LocalLimits(Step):
    """The limits of this context and those above it, checked and held in the kernel in one
    step. A call that does not fit only because of other calls' holds waits for them."""

    __slots__ = ("chain", "plans", "run")

    def __init__(self, chain: Chain, run: bool) -> None:
        self.chain = chain
        self.run = run  # mark the node running here (no ledger step follows)
        self.plans: dict[Shape, HoldPlan] = {}

    def plan(self, shape: Shape) -> HoldPlan:
        """Where a reservation of this shape is held (each guard, with the keys its limits
        watch), and which of its keys any guard watches, each with its Usage field (made now;
        kept in :attr:`plans`)."""
        holds = []
        watched: dict[str, int] = {}
        for frame in self.chain.guards:
            keys = tuple(k for k in shape.keys if any(lim.matches(k) for lim in frame.limits))
            if keys:
                holds.append((frame.level, keys))
                watched.update((k, f) for k, f, _ in shape.entries if k in keys)
        plan = (tuple(holds), tuple(watched.items()))
        self.chain.kernel.note(plan[0])
        if len(self.plans) < _CACHE_MAX:
            self.plans[shape] = plan
        return plan

    def admit(self, flight: Flight, thread: int | None) -> Steps | None:
        chain = self.chain
        rows = flight.rows if flight.rows is not None else chain.rows
        if rows:
            reservation = flight.reservation
            shape = reservation.shape()
            holds, watched = self.plans.get(shape) or self.plan(shape)
            pending: dict[str, Any] = {key: reservation[field] for key, field in watched}
        else:
            holds, pending = (), {}
        found = chain.kernel.admit(flight, pending, holds, rows, self.run)
        if found is None:
            return None
        return self.waiting(flight, thread, rows, holds, pending, found)

    def waiting(
        self,
        flight: Flight,
        thread: int | None,
        rows: tuple[Guard, ...],
        holds: Any,
        pending: dict[str, Any],
        found: tuple[int, Hit, bool] | None,
    ) -> Steps:
        """Admit a call that did not fit (``found``): pause at a spent limit when the context
        says so, wait for calls in flight that hold the rest, or raise the stop."""
        chain = self.chain
        kernel = chain.kernel
        wait: Wait | None = None
        paused: PauseWait | None = None
        try:
            while found is not None:
                index, hit, busy = found
                if not busy:
                    stop = chain.owner((index, hit))
                    if not chain.frame.exhaustion.pauses:
                        raise chain.refuse(flight, stop)
                    if paused is None:
                        paused = PauseWait(chain.frame, stop[0], stop[1], kernel, flight.node)
                        raised = yield from paused.begin(chain, flight, stop)
                    else:
                        raised = False
                    if not raised:
                        yield from paused.look(thread, chain, flight, stop)
                    # A raised ceiling is read from the guards (without a policy's own rows).
                    rows = chain.rows
                else:
                    wait = wait or Wait(chain.wait_s)
                    pause = wait.next_pause()
                    if pause is None or not kernel.holders(flight.node, thread)[1]:
                        # Out of time, or only calls this one cannot outwait hold the rest.
                        raise self.busy(flight, index, hit)
                    yield Pause(pause, kernel if thread is not None else None)
                found = kernel.admit(flight, pending, holds, rows, self.run)
        except BaseException:
            if paused is not None:
                paused.abandon()
            raise
        if paused is not None:
            yield from paused.resumed()

    def busy(self, flight: Flight, index: int, hit: Hit) -> BudgetBusy:
        """Stop a call that waited in vain for calls in flight to settle."""
        chain = self.chain
        limit = exceeded(hit)
        reason = f"waited {chain.wait_s:g}s for calls in flight to settle: {limit}"
        chain.halt(flight, reason)
        return BudgetBusy(
            f"{flight.kind} call {flight.name!r} stopped before it ran: what is spent leaves "
            f"room, but calls in flight held the rest ({reason}); raise admission_timeout_s to "
            "wait longer",
            limit,
            flight.node.node_id,
        )

    def settle(self, flight: Flight, usage: Usage, outcome: Outcome) -> Outcome:
        chain = self.chain
        found = chain.kernel.settle(flight, chain.level, usage, outcome, chain.rows)
        if found is not None:
            owner, limit, reason = chain.owner(found)
            chain.frame.stop(owner, limit, reason)
        return outcome


def _error_text(error: BaseException) -> str:
    from ampmeter import redact

    return redact.error_text(error)
