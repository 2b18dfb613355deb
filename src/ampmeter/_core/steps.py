"""The admission: every containment concern is a step a call passes before it runs.

A step has three verbs: ``admit(ticket, thread)`` (holds what the step needs, or raises the
refusal; a step that must wait returns a generator of its waits, see
:mod:`ampmeter._core.waiting`, and one that never waits returns None),
``settle(ticket, usage, outcome)`` (the call ended: replace holds by what it used; returns the
outcome, with anything the step adds to the node) and ``release(ticket)`` (give holds back
without usage). A context builds its :class:`Admission` once, when it is made: it holds the
core's own steps (the deadline when a context above has a timeout, the local limits; a canceled
context is refused before any step) and the context hands it the rest
(:meth:`Admission.install`): one step per policy in force (:mod:`ampmeter.policies`) and the
shared ledger's when a context above has one. Each call follows the :class:`KindPlan` of its kind
and model, compiled on the first such call.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

from ampmeter import redact
from ampmeter._core.check import Guard, Hit
from ampmeter._core.frame import Stop
from ampmeter._core.idempotency import counted_once, usage_after
from ampmeter._core.outcome import Outcome, TerminationReason
from ampmeter._core.pausing import PauseWait
from ampmeter._core.ticket import ADMITTED, DONE, NEW, Ticket
from ampmeter._core.usage import Shape, Usage
from ampmeter._core.waiting import Pause, Steps, Wait
from ampmeter.errors import BudgetBusy, ExecutionCanceled, LimitExceeded
from ampmeter.keys import KEY_ELAPSED_S, KEY_ITERATIONS
from ampmeter.limits import ExceededLimit, Limit, exceeded

if TYPE_CHECKING:
    from ampmeter._core.cells import Cell, Level
    from ampmeter._core.emit import Emitter
    from ampmeter._core.frame import Frame
    from ampmeter._core.kernel import Kernel

__all__ = [
    "ADMITTED",
    "DONE",
    "NEW",
    "Admission",
    "HoldPlan",
    "KindPlan",
    "Step",
    "Steps",
    "Stop",
    "Ticket",
    "timed_out",
]

PLANS_MAX: Final = 4_096


class Step:
    """One containment concern (see the module docstring). The base admits and holds nothing.
    ``kinds``: the kinds of call its admission can act on (None: every kind); ``priced_calls``:
    whether it acts on calls whose model has a price (False: only on unpriced ones). The plan
    of a call it never acts on does not ask it."""

    __slots__ = ()

    kinds: frozenset[str] | None = None
    priced_calls: bool = True

    def admit(self, ticket: Ticket, thread: int | None) -> Steps | None:
        """Hold what this step needs for ``ticket``, or raise its refusal; a step that must
        wait returns its waits (a generator), else None."""
        return None

    def settle(self, ticket: Ticket, usage: Usage, outcome: Outcome) -> Outcome:
        """The call ended with ``usage``: settle this step's holds."""
        return outcome

    def release(self, ticket: Ticket) -> None:
        """Give this step's holds back without usage."""


class Admission:
    """The steps of one context's calls, built once when the context is made."""

    __slots__ = (
        "admitters",
        "ask_exhausted",
        "emitter",
        "frame",
        "guards",
        "kernel",
        "ledgered",
        "level",
        "plans",
        "rows",
        "settlers",
        "steps",
        "timed",
        "wait_s",
    )

    def __init__(
        self,
        *,
        frame: Frame,
        kernel: Kernel,
        emitter: Emitter,
        wait_s: float,
        ask_exhausted: Callable[[Frame, ExceededLimit], object],
    ) -> None:
        self.frame = frame
        self.kernel = kernel
        self.emitter = emitter
        self.level = frame.level
        self.guards = tuple(f for f in frame.ancestry if f.can_stop())
        # The ceilings of every guard: each context's own guard, which a raised limit updates.
        self.rows = tuple(f.guard for f in self.guards)
        self.wait_s = wait_s
        # An on_exhausted callback, asked about the frame whose limit a paused call met.
        self.ask_exhausted = ask_exhausted
        self.ledgered = tuple(f for f in self.guards if f.ledger is not None)
        self.timed = tuple(f for f in self.guards if f.deadline is not None)  # with a timeout_s
        self.install((), None)

    def install(self, policy_steps: Sequence[Step], ledger_step: Step | None) -> None:
        """Put the steps the context hands over in their places: the policies' before the
        local limits, the shared ledger's (needed when a context above has a ledger) last."""
        steps: list[Step] = [Deadline(self, self.timed)] if self.timed else []
        steps.extend(policy_steps)
        steps.append(LocalLimits(self, run=ledger_step is None))
        if ledger_step is not None:
            steps.append(ledger_step)
        self.steps: tuple[Step, ...] = tuple(steps)
        # Admission asks only the steps that admit anything; settlement only those that settle
        # anything, last step first.
        self.admitters = tuple(s for s in steps if type(s).admit is not Step.admit)
        self.settlers = tuple(s for s in reversed(steps) if type(s).settle is not Step.settle)
        self.plans: dict[tuple[str, str | None, bool], KindPlan] = {}

    def plan(self, kind: str, model: str | None, priced: bool) -> KindPlan:
        """Compile the plan of calls of ``kind`` and ``model`` here, ``priced`` or not (asked on
        each call: prices change), on its first call: the next find it in :attr:`plans`, which
        keeps the first :data:`PLANS_MAX` of them."""
        found = KindPlan(self, kind, priced)
        if len(self.plans) < PLANS_MAX:
            self.plans[kind, model, priced] = found
        return found

    # -- admission ------------------------------------------------------------------------------

    def admit(self, ticket: Ticket, thread: int | None) -> Steps | None:
        """Pass ``ticket`` through every step of its plan (``thread``: the waiting thread, None
        in a task). None once it is admitted; the waits of a step that must wait, with the rest
        of the admission after them, when one must (:mod:`ampmeter._core.waiting` drives them).
        A canceled context (or one above it) admits nothing. A refusal or an interrupt gives
        back what earlier steps held, and halts the node."""
        if ticket.phase != NEW:
            raise RuntimeError(f"call {ticket.kernel_node.node_id} was already started")
        ticket.phase = DONE  # refused: the node is halted and nothing is held
        try:
            frame = self.frame
            if frame.root.canceled_in_tree and frame.any_canceled():
                self.abandon(ticket, "context canceled")
                raise ExecutionCanceled(
                    f"context {frame.name!r} was canceled", ticket.kernel_node.node_id
                )
            admitters = ticket.plan.admitters
            for step in admitters:
                waits = step.admit(ticket, thread)
                if waits is not None:
                    rest = admitters[admitters.index(step) + 1 :]
                    return self._waiting(ticket, thread, waits, rest)
        except BaseException as error:
            self._failed(ticket, error)
            raise
        self._admitted(ticket)
        return None

    def _waiting(
        self, ticket: Ticket, thread: int | None, waits: Steps, rest: tuple[Step, ...]
    ) -> Steps:
        """The admission from a step that waits on: its waits, then the steps after it."""
        try:
            yield from waits
            for step in rest:
                more = step.admit(ticket, thread)
                if more is not None:
                    yield from more
        except BaseException as error:
            self._failed(ticket, error)
            raise
        self._admitted(ticket)

    def _admitted(self, ticket: Ticket) -> None:
        """A call every step let through: admitted, its node running (with a shared ledger,
        only once the ledger's step has held it too)."""
        if self.ledgered:
            self.kernel.run(ticket.kernel_node)
        ticket.phase = ADMITTED

    def _failed(self, ticket: Ticket, error: BaseException) -> None:
        """Halt a call whose admission raised ``error``, giving back what it held."""
        reason = (
            "interrupted"
            if not isinstance(error, Exception)
            else f"admission failed: {redact.error_text(error)}"
        )
        self.abandon(ticket, reason)

    def abandon(self, ticket: Ticket, reason: str) -> None:
        """Give back every hold of ``ticket`` (an admission that did not finish) and end its
        node as ``halt`` with ``reason`` (unless a step ended it already)."""
        for step in reversed(self.steps):
            step.release(ticket)
        if self.kernel.abort(ticket.kernel_node, Outcome("halt", stop_reason=reason)):
            self.emitter.emit(ticket.kernel_node)

    def refuse(self, ticket: Ticket, stop: Stop, message: str | None = None) -> LimitExceeded:
        """Record ``stop`` and halt the call; the error to raise."""
        owner, limit, reason = stop
        self.frame.stop(owner, limit, reason)
        self.abandon(ticket, message or str(limit))
        return LimitExceeded(
            f"{ticket.kind} call {ticket.name!r} stopped before it ran: {message or limit}",
            limit,
            ticket.kernel_node.node_id,
        )

    def owner(self, found: tuple[int, Hit]) -> Stop:
        """The stop a kernel hit (guard index, hit) stands for."""
        index, hit = found
        return self.guards[index], exceeded(hit), TerminationReason.LIMIT_EXCEEDED

    def deadline_passed(self) -> Stop | None:
        """The first context above whose wall time (``timeout_s``) is over, as a stop."""
        return timed_out(self.timed) if self.timed else None

    def exceeded_now(self) -> Stop | None:
        """The first limit above this context exceeded now (a deadline first), as a stop."""
        found = self.deadline_passed()
        rows = self.rows
        if found is None and rows:
            hit = self.kernel.check(rows, None)
            if hit is not None:
                found = self.owner(hit)
        return found

    def iteration_refused(self) -> Stop | None:
        """The stop of this context's own iteration limit were one more iteration to start."""
        frame = self.frame
        own = tuple(row for row in frame.guard.rows if not row[0] and row[1] == KEY_ITERATIONS)
        found = self.kernel.check((Guard(frame.level, own),), {KEY_ITERATIONS: 1}) if own else None
        return (
            None if found is None else (frame, exceeded(found[1]), TerminationReason.LIMIT_EXCEEDED)
        )

    # -- settlement -----------------------------------------------------------------------------

    def settle(self, ticket: Ticket, usage: Usage, outcome: Outcome) -> None:
        """End an admitted call: every step settles, last step first, then sinks see the node."""
        node = ticket.kernel_node
        if node.status == "created" and not self.kernel.is_held(node):
            # Never admitted (refused, or never started): nothing was used.
            if outcome.status == "success":
                outcome = Outcome("halt", stop_reason="never started")
            self.kernel.end(node, outcome)
            self.emitter.emit(node)
            return
        key = ticket.idempotency_key
        keyed = key is not None
        if key is not None:
            usage, outcome = counted_once(
                self.frame.seen, key, ticket.kernel_node.node_id, usage, outcome
            )
        ledgered = keyed and bool(self.ledgered)
        for step in self.settlers:
            outcome = step.settle(ticket, usage, outcome)
            if ledgered:  # a shared ledger may have counted it before this run
                usage = usage_after(usage, outcome)
        if self.emitter.sinks:
            self.emitter.emit(node)


class Deadline(Step):
    """A context above with a timeout stops calls once its wall time is over."""

    __slots__ = ("admission", "timed")

    def __init__(self, admission: Admission, timed: tuple[Frame, ...]) -> None:
        self.admission = admission
        self.timed = timed

    def admit(self, ticket: Ticket, thread: int | None) -> None:
        found = timed_out(self.timed)
        if found is not None:
            raise self.admission.refuse(ticket, found)


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

    __slots__ = ("admission", "run")

    def __init__(self, admission: Admission, run: bool) -> None:
        self.admission = admission
        self.run = run  # mark the node running here (no ledger step follows)

    def admit(self, ticket: Ticket, thread: int | None) -> Steps | None:
        admission = self.admission
        rows = ticket.rows if ticket.rows is not None else admission.rows
        if rows:
            reservation = ticket.reservation
            shape = reservation.shape()
            holds, keys, fields = ticket.plan.holds.get(shape) or ticket.plan.hold_plan(shape)
            pending = dict(zip(keys, map(reservation.__getitem__, fields), strict=True))
        else:
            holds, pending = (), {}
        found = admission.kernel.admit(ticket, pending, holds, rows, self.run)
        if found is None:
            return None
        return self.waiting(ticket, thread, rows, holds, pending, found)

    def waiting(
        self,
        ticket: Ticket,
        thread: int | None,
        rows: tuple[Guard, ...],
        holds: Any,
        pending: dict[str, Any],
        found: tuple[int, Hit, bool] | None,
    ) -> Steps:
        """Admit a call that did not fit (``found``): pause at a spent limit when the context
        says so, wait for calls in flight that hold the rest, or raise the stop."""
        admission = self.admission
        kernel = admission.kernel
        wait: Wait | None = None
        paused: PauseWait | None = None
        try:
            while found is not None:
                index, hit, busy = found
                if not busy:
                    stop = admission.owner((index, hit))
                    if not admission.frame.exhaustion.pauses:
                        raise admission.refuse(ticket, stop)
                    if paused is None:
                        paused = PauseWait(
                            admission.frame, stop[0], stop[1], kernel, ticket.kernel_node
                        )
                        raised = yield from paused.begin(admission, ticket, stop)
                    else:
                        raised = False
                    if not raised:
                        yield from paused.look(thread, admission, ticket, stop)
                    # A raised ceiling is read from the guards (without a policy's own rows).
                    rows = admission.rows
                else:
                    wait = wait or Wait(admission.wait_s)
                    pause = wait.next_pause()
                    if pause is None or not kernel.holders(ticket.kernel_node, thread)[1]:
                        # Out of time, or only calls this one cannot outwait hold the rest.
                        raise self.busy(ticket, index, hit)
                    yield Pause(pause, kernel if thread is not None else None)
                found = kernel.admit(ticket, pending, holds, rows, self.run)
        except BaseException:
            if paused is not None:
                paused.abandon()
            raise
        if paused is not None:
            yield from paused.resumed()

    def busy(self, ticket: Ticket, index: int, hit: Hit) -> BudgetBusy:
        """Stop a call that waited in vain for calls in flight to settle."""
        admission = self.admission
        limit = exceeded(hit)
        reason = f"waited {admission.wait_s:g}s for calls in flight to settle: {limit}"
        admission.abandon(ticket, reason)
        return BudgetBusy(
            f"{ticket.kind} call {ticket.name!r} stopped before it ran: what is spent leaves "
            f"room, but calls in flight held the rest ({reason}); raise admission_timeout_s to "
            "wait longer",
            limit,
            ticket.kernel_node.node_id,
        )

    def settle(self, ticket: Ticket, usage: Usage, outcome: Outcome) -> Outcome:
        admission = self.admission
        found = admission.kernel.settle(ticket, usage, outcome, admission.rows)
        if found is not None:
            owner, limit, reason = admission.owner(found)
            admission.frame.stop(owner, limit, reason)
        return outcome


HoldPlan = tuple[tuple[tuple["Level", tuple[str, ...]], ...], tuple[str, ...], tuple[int, ...]]
"""Where a reservation is held: (each guard level with the keys held there, every key held
anywhere, each key's Usage field)."""


class KindPlan:
    """What every call of one kind and model in one context needs, compiled on the first such
    call (:meth:`Admission.plan`) instead of worked out per call: the admission steps that can
    act on it (a step that never acts on its kind, or only on unpriced calls when it is priced,
    is not asked), and per shape of usage (:class:`~ampmeter._core.usage.Shape`, the one shape
    cache) where a reservation of that shape is held (:attr:`holds`: each guard with the keys
    its limits watch) and the cells a usage of that shape adds to when the call settles
    (:attr:`adds`: its context and every context above it). A shape's entry is compiled on
    its first use (:meth:`hold_plan`, :meth:`cells`)."""

    __slots__ = ("adds", "admission", "admitters", "holds")

    def __init__(self, admission: Admission, kind: str, priced: bool) -> None:
        self.admission = admission
        self.admitters: tuple[Step, ...] = tuple(
            step
            for step in admission.admitters
            if (step.kinds is None or kind in step.kinds) and (step.priced_calls or not priced)
        )
        self.holds: dict[Shape, HoldPlan] = {}
        self.adds: dict[Shape, tuple[tuple[Cell, int], ...]] = {}

    def hold_plan(self, shape: Shape) -> HoldPlan:
        """Where a reservation of ``shape`` is held (compiled now; kept for an interned
        shape)."""
        holds = []
        watched: dict[str, int] = {}
        for frame in self.admission.guards:
            keys = tuple(k for k in shape.keys if any(lim.matches(k) for lim in frame.limits))
            if keys:
                holds.append((frame.level, keys))
                watched.update((k, f) for k, f, _ in shape.entries if k in keys)
        plan = (tuple(holds), tuple(watched), tuple(watched.values()))
        self.admission.kernel.note(plan[0])
        if shape.interned:
            self.holds[shape] = plan
        return plan

    def cells(self, shape: Shape) -> tuple[tuple[Cell, int], ...]:
        """The (cell, Usage field) pairs a usage of ``shape`` adds to when the call settles
        (compiled now, under the kernel's lock; kept for an interned shape)."""
        found = self.admission.level.cells(shape.entries)
        if shape.interned:
            self.adds[shape] = found
        return found
