"""The shared ledger step: a call holds its reservation in the ledger of every context above it
that shares its limits with other processes, and commits what it used there when it ends.

A ledger that refuses only because of reservations in flight is asked again after a pause, up
to the context's ``admission_timeout_s``; one that refuses what is already spent stops the call
at once. A ledger that cannot be reached stops the call (fail closed) unless the context says
``on_ledger_error="allow"``.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ampmeter import redact
from ampmeter._core.idempotency import counted_before
from ampmeter._core.outcome import Outcome, TerminationReason
from ampmeter._core.pausing import PauseWait
from ampmeter._core.steps import Admission, Step, Steps, Stop, Ticket
from ampmeter._core.waiting import Pause, Wait, Work
from ampmeter.errors import BudgetBusy, BudgetUnavailable, LimitExceeded
from ampmeter.keys import KEY_RETRIES, KEY_UNPRICED_LLM_CALLS
from ampmeter.limits import ExceededLimit, Limit, LimitType
from ampmeter.policies.options import KEY_REPEATS_FOR, shared_refusal

if TYPE_CHECKING:
    from ampmeter._core.frame import Frame
    from ampmeter._core.usage import Usage
    from ampmeter.ledgers.base import Ledger, Refusal

__all__ = ["LedgerStep"]


@dataclass(frozen=True, slots=True)
class LedgerRequest:
    """What one call asks of one context's shared ledger, kept while it waits for room."""

    frame: Frame
    ledger: Ledger
    amounts: dict[str, Any]
    # scope -> its ceilings and the limit each comes from, the ledger's own scope first
    scopes: dict[str, tuple[dict[str, Any], dict[str, Limit]]]
    windows: tuple[Limit, ...] = ()  # the windowed limits the ledger checks at its own scope

    def stop(self, refusal: Refusal) -> tuple[str, ExceededLimit]:
        """The scope and the exceeded limit a ledger's refusal names (with the note of the
        policy behind it: a window, the loop guard)."""
        value = refusal.value  # Decimal dollars for money keys, as limits hold them
        if refusal.window_s is not None:
            for limit in self.windows:
                if limit.key == refusal.key and limit.window_s == refusal.window_s:
                    note = f"limit exceeded in {limit.window_s:g}s"
                    return self.ledger.scope, ExceededLimit(limit, limit.key, value, note)
        found = self.scopes.get(refusal.scope or "")
        owner = None if found is None else found[1].get(refusal.key or "")
        if owner is not None and owner.max_value == refusal.ceiling:
            stop = ExceededLimit(owner, refusal.key or "", value)
            return refusal.scope or "", shared_refusal(stop)
        if refusal.scope is not None and refusal.key is not None:
            # A ceiling only the ledger keeps (an operator's ``budget raise`` on a scope whose
            # context has no limit of its own there, or a tighter one kept there): the refusal
            # itself names it.
            kept = Limit(refusal.key, max(refusal.ceiling, 0))  # below 0 refuses as 0 does
            return refusal.scope, shared_refusal(ExceededLimit(kept, refusal.key, value))
        # A refusal without a ceiling (a settled id): the first ceiling stands for it.
        first = next(((s, f) for s, f in self.scopes.items() if f[0]), None)
        if first is None:  # only windows were asked for
            limit = self.windows[0]
            return self.ledger.scope, ExceededLimit(limit, limit.key, value)
        scope, (ceilings, owners) = first
        key = next(iter(ceilings))
        return scope, ExceededLimit(owners[key], key, value)


class LedgerStep(Step):
    """Holds a call's reservation in every shared ledger above it (see the module docstring)."""

    __slots__ = ("admission",)

    def __init__(self, admission: Admission) -> None:
        self.admission = admission

    def admit(self, ticket: Ticket, thread: int | None) -> Steps:
        for frame in self.admission.ledgered:
            yield from self.admit_at(frame, ticket, thread, self.request(frame, ticket))

    def admit_at(
        self, frame: Frame, ticket: Ticket, thread: int | None, request: LedgerRequest
    ) -> Steps:
        """Hold ``ticket`` in ``frame``'s ledger: wait for calls in flight, or pause (when the
        context says so) until a raise or an operator's resume."""
        wait: Wait | None = None
        admission = self.admission
        paused = PauseWait(admission.frame, admission.kernel, ticket.kernel_node)
        try:
            while True:
                refusal = yield Work(functools.partial(self.try_once, ticket, request))
                if refusal is None:
                    break
                if refusal.busy and not refusal.paused:
                    wait = wait or Wait(self.admission.wait_s)
                    yield Pause(self.pause(ticket, request, refusal, wait, thread))
                    continue
                # Spent, or paused by an operator, and this context pauses rather than stops.
                stop: Stop = (frame, request.stop(refusal)[1], TerminationReason.LIMIT_EXCEEDED)
                yield from paused.turn(thread, self.admission, ticket, stop)
                request = self.request(frame, ticket)  # a raise changes the ceilings
        except BaseException:
            paused.abandon()
            raise
        yield from paused.resumed()

    def request(self, frame: Frame, ticket: Ticket) -> LedgerRequest:
        """What the call reserves in ``frame``'s shared ledger, and against which ceilings."""
        ledger = frame.ledger
        assert ledger is not None
        usage = ticket.reservation  # (made when read: once here)
        reservation = usage.amounts()
        # The keys the call may add to when it ends: its reservation's, and its model's or its
        # tool's cached and reasoning keys.
        possible = usage._replace(cached_tokens=1, reasoning_tokens=1, tokens_in=1, tokens_out=1)
        candidates = tuple(dict.fromkeys(key for key, _, _ in possible.entries()))
        ceilings, owners = shared_ceilings(frame.limits, candidates)
        # The policies' terms: the reserve, the loop guard, windows, watched keys.
        ceilings, owners, extra, windows = self.admission.frame.policies.shared_terms(
            frame, ticket.marks, ceilings, owners
        )
        # A context made from a hand-off also holds at the scopes of the contexts above it,
        # and records every key a call adds (retries too), so the parent can read the child's
        # whole spend. So does a context with no ceiling there: its spend is the scope's, and
        # the hold of a call whose process dies mid-call is charged from its lease (else a
        # killed worker of a run without limits would leave its billed call nowhere). So does
        # an LLM call that reserves no cost (its price unknown): its hold is then that call's
        # model and one unpriced call, not nothing, should it run out unsettled.
        link = frame.handoff_from
        scopes = {ledger.scope: (ceilings, owners)}
        if link is not None:
            for scope, limits in link.ancestors:
                scopes[scope] = shared_ceilings(limits, candidates)
        keys = dict.fromkeys(k for c, _ in scopes.values() for k in c)
        keys.update(dict.fromkeys(extra))
        unpriced = ticket.kind == "llm" and not usage.cost_nano and bool(usage.model)
        if link is not None or not keys or unpriced:
            keys.update(dict.fromkeys(candidates))
            keys[KEY_RETRIES] = None
            if ticket.kind == "llm":
                keys[KEY_UNPRICED_LLM_CALLS] = None  # unpriced is not zero, also for the parent
        # A policy's fixed amount, else (no term, or None) the call's own estimate.
        amounts = {k: reservation.get(k, 0) if extra.get(k) is None else extra[k] for k in keys}
        if unpriced:
            amounts[KEY_UNPRICED_LLM_CALLS] = 1
        return LedgerRequest(frame, ledger, amounts, scopes, windows)

    def try_once(self, ticket: Ticket, request: LedgerRequest) -> Refusal | None:
        """Ask the ledger once: None when the call holds there now (or may go on without it),
        the refusal when only reservations in flight are in the way; a refusal by what is
        spent raises :class:`~ampmeter.LimitExceeded` at once."""
        from ampmeter.ledgers.base import Refusal

        admission, frame, ledger = self.admission, request.frame, request.ledger
        own, *above = request.scopes.items()
        try:
            held = ledger.try_reserve(
                request.amounts,
                own[1][0],
                ancestors={scope: found[0] for scope, found in above},
                windows=[(lim.key, lim.window_s or 0.0, lim.max_value) for lim in request.windows],
                # the rule of the context that makes the call, else the ledger's own
                on_expired_hold=admission.frame.on_expired_hold,
            )
        except BudgetUnavailable as error:
            if frame.on_ledger_error == "allow":
                admission.kernel.update(
                    ticket.kernel_node.node_id,
                    {"budget_enforced": False, "ledger_error": redact.error_text(error)},
                )
                return None
            reason = f"budget ledger unavailable (fail closed): {error}"
            raise _stopped(admission, ticket, BudgetUnavailable, "stopped", reason) from error
        except BaseException as error:
            admission.abandon(ticket, f"ledger error: {redact.error_text(error)}")
            raise
        if isinstance(held, Refusal):
            if admission.frame.exhaustion.pauses and (held.paused or not held.busy):
                return held  # the call pauses (admit)
            if held.paused:  # an operator's pause (ampmeter budget pause) fails closed
                reason = f"shared budget {held.scope!r} is paused (ampmeter budget resume)"
                raise _stopped(admission, ticket, LimitExceeded, "stopped before it ran", reason)
            if held.busy:
                return held
            scope, stop = request.stop(held)
            why: Stop = (frame, stop, TerminationReason.LIMIT_EXCEEDED)
            raise admission.refuse(ticket, why, f"shared budget {scope!r}: {stop}")
        ticket.ledger_holds = (*ticket.ledger_holds, (ledger, held))
        return None

    def pause(
        self,
        ticket: Ticket,
        request: LedgerRequest,
        refusal: Refusal,
        wait: Wait,
        thread: int | None,
    ) -> float:
        """How long to pause before asking the ledger again, or :class:`~ampmeter.BudgetBusy`
        when the wait is over: out of time, or only holds this call would wait for in vain
        (its enclosing calls' and, on a thread, that thread's own) stand in the way. Calls
        of this process their owners dropped are charged first: nobody would end their holds."""
        if self.admission.kernel.sweep():
            return 0.0  # (ask again at once)
        pause = wait.next_pause()
        others = refusal.reserved - self.own_holds(ticket, refusal, thread)
        if pause is None or others <= 0:
            scope, stop = request.stop(refusal)
            waited = f"waited {wait.waited():.3g}s of admission_timeout_s={wait.limit_s:g}"
            reason = f"calls in flight held the rest of shared budget {scope!r} ({waited}): {stop}"
            self.admission.abandon(ticket, reason)
            raise BudgetBusy(
                f"{ticket.kind} call {ticket.name!r} stopped before it ran: what is spent leaves "
                f"room, but {reason}; raise admission_timeout_s to wait longer",
                stop,
                ticket.kernel_node.node_id,
            )
        return pause

    def own_holds(self, ticket: Ticket, refusal: Refusal, thread: int | None) -> Any:
        """What this process's calls that ``ticket`` cannot outwait hold at the refusing
        ceiling: the calls it runs inside and, on a thread, every call of that thread."""
        stuck, _ = self.admission.kernel.holders(ticket.kernel_node, thread)
        total: Any = 0
        for other in stuck:
            if not isinstance(other, Ticket) or other is ticket:
                continue
            for _, held in other.ledger_holds:
                if refusal.scope in held.scopes:
                    total += held.amounts.get(refusal.key or "", 0)
        return total

    def settle(self, ticket: Ticket, usage: Usage, outcome: Outcome) -> Outcome:
        """Commit the call's usage to the ledgers that hold it; a failure is noted on the node
        (the call is counted here all the same)."""
        if not ticket.ledger_holds:
            return outcome
        actual_amounts: dict[str, Any] = usage.amounts()
        if ticket.kernel_node.retries_used:  # counted on the node as they happen, shared at the end
            actual_amounts[KEY_RETRIES] = ticket.kernel_node.retries_used
        failure = None
        for ledger, held in ticket.ledger_holds:
            actual = {key: actual_amounts.get(key, 0) for key in held.amounts}
            for key in actual:
                if key.startswith(KEY_REPEATS_FOR):  # a repeat counts as held, whatever the end
                    actual[key] = held.amounts[key]
            try:
                committed = ledger.commit(held, actual, idempotency_key=ticket.idempotency_key)
            except Exception as error:
                failure = redact.error_text(error)
                continue
            key = ticket.idempotency_key
            if committed.duplicate and key is not None:  # counted before this run (a re-run)
                scope = held.scopes[0] if held.scopes else ledger.scope
                seen = self.admission.frame.seen
                outcome = counted_before(seen, key, outcome, scope, committed)
        if failure is None:
            return outcome
        meta = {**(outcome.metadata or {}), "ledger_error": failure}
        return outcome._replace(metadata=meta)

    def release(self, ticket: Ticket) -> None:
        for ledger, held in ticket.ledger_holds:
            # If the release fails the lease returns the hold; the stop is what matters.
            with contextlib.suppress(Exception):
                ledger.release(held)
        ticket.ledger_holds = ()


def shared_ceilings(
    limits: Iterable[Limit], candidates: Sequence[str]
) -> tuple[dict[str, Any], dict[str, Limit]]:
    """The ledger ceilings of ``limits`` for a call that may add to ``candidates``, and the
    limit each comes from.

    Every exact limit takes part, also keys the call reserves nothing for (no estimate): the
    hold is then 0, but the commit still adds what the call actually used. A prefix limit takes
    part through the keys of its family this call may add to (its model's or its tool's), each
    shared on its own, as the local check counts them.
    """
    ceilings: dict[str, Any] = {}
    owners: dict[str, Limit] = {}
    for limit in limits:
        if not limit.is_ceiling:
            continue  # soft and windowed limits: the policies' shared terms
        if limit.type is LimitType.EXACT:
            keys: Iterable[str] = (limit.key,)
        else:
            keys = [key for key in candidates if key.startswith(limit.key)]
        for key in keys:
            if key not in ceilings or limit.max_value < ceilings[key]:
                ceilings[key] = limit.max_value  # the tightest; the first of equals
                owners[key] = limit
    return ceilings, owners


def _stopped(
    admission: Admission,
    ticket: Ticket,
    error: type[LimitExceeded],
    how: str,
    reason: str,
) -> LimitExceeded:
    """Abandon ``ticket`` for ``reason``; the ``error`` saying the call ``how`` to raise."""
    admission.abandon(ticket, reason)
    return error(
        f"{ticket.kind} call {ticket.name!r} {how}: {reason}", None, ticket.kernel_node.node_id
    )
