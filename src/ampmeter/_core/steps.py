"""The admission: every containment concern is a step a call passes before it runs.

A step has three verbs: ``admit(ticket, thread)`` (holds what the step needs, or raises the
refusal; a step that must wait returns a generator of its waits, see
:mod:`ampmeter._core.waiting`, and one that never waits returns None),
``settle(ticket, usage, outcome)`` (the call ended: replace holds by what it used; returns the
outcome, with anything the step adds to the node) and ``release(ticket)`` (give holds back
without usage). A context builds its :class:`Admission` once, when it is made, and hands it
its steps (:meth:`Admission.install`): one per policy in force (:mod:`ampmeter.policies`) and
the shared ledger's when a context above has one. A canceled context admits nothing; then come
the deadline's step (when a context above has a timeout) and the policies'; then the admission
holds the call's reservation against the limits of its context and those above, in the kernel
in one step (waiting for room when calls in flight hold it); the shared ledger's step is last.
Each call follows the :class:`KindPlan` of its kind and model, compiled on the first such call:
a call that no policy acts on goes from the admission straight to the kernel.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final

from ampmeter import redact
from ampmeter._core.check import Guard, Hit, Refused
from ampmeter._core.frame import Stop
from ampmeter._core.idempotency import META_DUPLICATE_OF, counted_once
from ampmeter._core.outcome import Ending, Outcome, TerminationReason
from ampmeter._core.pausing import PauseWait
from ampmeter._core.ticket import ADMITTED, DONE, NEW, Reserved, Ticket, reservation_keys
from ampmeter._core.usage import SPENT_AT, Spent, Usage
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
        "ledger_step",
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
        hold in the kernel, the shared ledger's (needed when a context above has a ledger)
        after it."""
        steps: list[Step] = [Deadline(self, self.timed)] if self.timed else []
        steps.extend(policy_steps)
        # Admission asks only the steps before the hold that admit anything; settlement only
        # the policies that settle anything, last step first, after the kernel.
        self.admitters = tuple(s for s in steps if type(s).admit is not Step.admit)
        self.settlers = tuple(s for s in reversed(steps) if type(s).settle is not Step.settle)
        self.ledger_step = ledger_step
        self.steps: tuple[Step, ...] = (*steps, ledger_step) if ledger_step else tuple(steps)
        self.plans: dict[tuple[str, str | None, str, bool], KindPlan] = {}

    def plan(self, kind: str, model: str | None, tool: str, priced: bool) -> KindPlan:
        """Compile the plan of calls of ``kind`` and ``model`` (a tool call's: of ``tool``)
        here, ``priced`` or not (asked on each call: prices change), on its first call: the next
        find it in :attr:`plans`, which keeps the first :data:`PLANS_MAX` of them."""
        found = KindPlan(self, kind, priced, reservation_keys(kind, model, tool))
        if len(self.plans) < PLANS_MAX:
            self.plans[kind, model, tool, priced] = found
            # Cleared when a context at or above this one is folded into its parent (the
            # levels a usage adds to change then: see ampmeter._core.cells).
            self.level.caches.append(found.settles)
        return found

    # -- admission ------------------------------------------------------------------------------

    def admit(self, ticket: Ticket, thread: int | None, reserved: Reserved) -> Steps | None:
        """Pass ``ticket`` through the steps of its plan, hold its reservation (``reserved``, as
        the call gives it) in the kernel, then in the shared ledger (``thread``: the waiting
        thread, None in a task). None once
        it is admitted; when something must wait (a step, room held by calls in flight, the
        shared ledger), the waits with the rest of the admission after them
        (:mod:`ampmeter._core.waiting` drives them). A canceled context (or one above it)
        admits nothing. A refusal or an interrupt gives back what was held, and halts the
        node."""
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
                    return self._admitting(ticket, thread, waits, rest, held=False)
            rows = self.rows if ticket.rows is None else ticket.rows
            found = self.kernel.admit(ticket, reserved, rows, self.ledger_step is None)
            if found is not None:
                waits = self._room(ticket, thread, rows, found)
                return self._admitting(ticket, thread, waits, (), held=True)
            if self.ledger_step is not None:
                return self._admitting(ticket, thread, None, (), held=True)
        except BaseException as error:
            self._failed(ticket, error)
            raise
        ticket.phase = ADMITTED
        return None

    def _admitting(
        self,
        ticket: Ticket,
        thread: int | None,
        waits: Steps | None,
        rest: tuple[Step, ...],
        *,
        held: bool,
    ) -> Steps:
        """The admission from where something waits on: ``waits``, the steps after it
        (``rest``), the hold in the kernel unless it was ``held`` there already, the shared
        ledger's step."""
        try:
            if waits is not None:
                yield from waits
            for step in rest:
                more = step.admit(ticket, thread)
                if more is not None:
                    yield from more
            if not held:
                rows = self.rows if ticket.rows is None else ticket.rows
                found = self.kernel.admit(ticket, ticket.reserved, rows, self.ledger_step is None)
                if found is not None:
                    yield from self._room(ticket, thread, rows, found)
            if self.ledger_step is not None:
                more = self.ledger_step.admit(ticket, thread)
                if more is not None:
                    yield from more
                self.kernel.run_held(ticket)  # running once the ledger holds it too
        except BaseException as error:
            self._failed(ticket, error)
            raise
        ticket.phase = ADMITTED

    def _room(
        self, ticket: Ticket, thread: int | None, rows: tuple[Guard, ...], found: Refused | None
    ) -> Steps:
        """Hold a call that did not fit (``found``) in the kernel: pause at a spent limit when
        the context says so, wait for calls in flight that hold the rest, or raise the stop."""
        kernel = self.kernel
        wait: Wait | None = None
        paused = PauseWait(self.frame, kernel, ticket.kernel_node)
        try:
            while found is not None:
                if kernel.sweep():  # calls their owners dropped held some of it: charged now
                    found = kernel.admit(ticket, ticket.reserved, rows, self.ledger_step is None)
                    continue
                index, hit, busy = found
                if not busy:
                    stop = self.owner((index, hit))
                    if not self.frame.exhaustion.pauses:
                        raise self.refuse(ticket, stop)
                    yield from paused.turn(thread, self, ticket, stop)
                    # A raised ceiling is read from the guards (without a policy's own rows).
                    rows = self.rows
                else:
                    wait = wait or Wait(self.wait_s)
                    pause = wait.next_pause()
                    if pause is None or not kernel.holders(ticket.kernel_node, thread)[1]:
                        # Out of time, or only calls this one cannot outwait hold the rest.
                        raise self.busy(ticket, index, hit)
                    yield Pause(pause, kernel if thread is not None else None)
                found = kernel.admit(ticket, ticket.reserved, rows, self.ledger_step is None)
        except BaseException:
            paused.abandon()
            raise
        yield from paused.resumed()

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

    def busy(self, ticket: Ticket, index: int, hit: Hit) -> BudgetBusy:
        """Stop a call that waited in vain for calls in flight to settle."""
        limit = exceeded(hit)
        reason = f"waited {self.wait_s:g}s for calls in flight to settle: {limit}"
        self.abandon(ticket, reason)
        return BudgetBusy(
            f"{ticket.kind} call {ticket.name!r} stopped before it ran: what is spent leaves "
            f"room, but calls in flight held the rest ({reason}); raise admission_timeout_s to "
            "wait longer",
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

    def settle(self, ticket: Ticket, spent: Spent, ending: Ending) -> None:
        """End an admitted call that ``spent`` this, as ``ending`` says: the shared ledger's step
        settles, then the kernel (a limit the usage broke stops the contexts up to its owner),
        then the policies' steps, last first (these and a replay read it as a Usage); then
        sinks see the node."""
        node = ticket.kernel_node
        kernel = self.kernel
        if node.status == "created" and not kernel.is_held(node):
            # Never admitted (refused, or never started): nothing was used.
            kernel.end(node, _NEVER_STARTED if ending[0] == "success" else Outcome(*ending))
            self.emitter.emit(node)
            return
        key = ticket.idempotency_key
        usage = outcome = None
        if key is not None or self.ledger_step is not None or self.settlers:
            usage, outcome = spent_usage(ticket, spent), Outcome(*ending)
            if key is not None:
                usage, outcome = counted_once(self.frame.seen, key, node.node_id, usage, outcome)
            if self.ledger_step is not None:
                outcome = self.ledger_step.settle(ticket, usage, outcome)
            if key is not None and META_DUPLICATE_OF in (outcome.metadata or ()):
                spent = NOTHING_SPENT  # counted before this call: adds nothing
                usage = spent_usage(ticket, spent)
            ending = outcome
        found = kernel.settle(ticket, spent, ending)
        if found is not None:
            guard, hit = found
            owner = self.guards[self.rows.index(guard)]
            self.frame.stop(owner, exceeded(hit), TerminationReason.LIMIT_EXCEEDED)
        if usage is not None and outcome is not None:
            for step in self.settlers:
                outcome = step.settle(ticket, usage, outcome)
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


HoldPlan = tuple[tuple[tuple["Level", tuple[str, ...]], ...], tuple[tuple[str, int], ...]]
"""Where a plan's reservations are held: (each guard level with the keys held there, each key
held anywhere with its place in the reservation's counts, see
:data:`~ampmeter._core.ticket.Reserved`)."""

Settlement = tuple[tuple[tuple["Cell", int], ...], tuple[Guard, ...]]
"""What a call's usage adds to when it settles: (each (cell, place in its Spent) pair, at its
context and every context above; the guards whose ceilings watch one of its keys)."""

NOTHING_SPENT: Final = (0,) * 11
"""The :data:`~ampmeter._core.usage.Spent` of a replay: it adds nothing."""
_NEVER_STARTED: Final = Outcome("halt", stop_reason="never started")


def spent_usage(ticket: Ticket, spent: Spent) -> Usage:
    """What ``ticket``'s call, having spent ``spent``, adds to the stats, as a :class:`Usage`."""
    kind = ticket.kind
    return Usage.of_call(kind, ticket.model or "", ticket.name if kind == "tool" else "", spent)


class KindPlan:
    """What every call of one kind and model (or tool) in one context needs, compiled on the
    first such call (:meth:`Admission.plan`) instead of worked out per call: the admission steps
    that can act on it (a step that never acts on its kind, or only on unpriced calls when it
    is priced, is not asked), where its reservations are held (:attr:`hold`: each guard with
    the keys its limits watch, whatever the amounts), and per pattern of zero amounts what a
    call settles (:attr:`settles`: the cells it adds to, here and above, and the only guards
    its settlement can push over a ceiling, those watching one of its keys). Each is compiled
    on its first use, under the kernel's lock (:meth:`hold_plan`, :meth:`settlement`)."""

    __slots__ = ("admission", "admitters", "hold", "reserves", "settles")

    def __init__(
        self, admission: Admission, kind: str, priced: bool, reserves: tuple[tuple[str, int], ...]
    ) -> None:
        self.admission = admission
        self.admitters: tuple[Step, ...] = tuple(
            step
            for step in admission.admitters
            if (step.kinds is None or kind in step.kinds) and (step.priced_calls or not priced)
        )
        self.reserves = reserves  # every key its reservations may hold, with its amount's place
        self.hold: HoldPlan | None = None  # where they are held (compiled on first use)
        self.settles: dict[tuple[object, ...], Settlement] = {}

    def hold_plan(self) -> HoldPlan:
        """Where this plan's reservations are held, each key made known at its level (so
        prefix limits see it from the start)."""
        holds = []
        watched: dict[str, int] = {}
        for frame in self.admission.guards:
            keys = tuple(k for k, _ in self.reserves if any(m.matches(k) for m in frame.limits))
            if keys:
                holds.append((frame.level, keys))
                watched.update((k, place) for k, place in self.reserves if k in keys)
                for key in keys:
                    frame.level.note(key)
        self.hold = plan = (tuple(holds), tuple(watched.items()))
        return plan

    def settlement(self, ticket: Ticket, spent: Spent) -> Settlement:
        """What ``ticket``'s call settles, having spent ``spent`` (see the class docstring). Only
        a key the usage adds to can newly pass a ceiling when its call settles: a guard
        watching none of them is not checked then (a limit another way passed, a key the caller
        set, is found before the next call)."""
        t_in, t_out, cached, _, reasoning, _, cost, calls, steps, retries, unpriced = spent
        pattern = (
            not t_in,
            not t_out,
            not cached,
            not reasoning,
            not cost,
            calls,
            steps,
            retries,
            unpriced,
        )
        found = self.settles.get(pattern)
        if found is not None:
            return found
        shape = spent_usage(ticket, spent).shape()
        keys = shape.keys
        entries = tuple((key, SPENT_AT[field], gauge) for key, field, gauge in shape.entries)
        found = (
            self.admission.level.cells(entries),
            tuple(
                guard
                for guard in self.admission.rows
                if any(row[3].matches(key) for row in guard.rows for key in keys)
            ),
        )
        if shape.interned and len(self.settles) < PLANS_MAX:
            self.settles[pattern] = found
        return found
