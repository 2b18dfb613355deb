"""A call interrupted while in flight is charged at its reservation, as unsettled spend; so is a
call whose owner dropped it in flight.

Once a call is admitted its request may be on the wire, and a provider bills a request whose
answer nobody waits for. So an interrupt that reaches an admitted call before it recorded any
usage (Ctrl-C, the SIGTERM of ``ampmeter run --timeout``, ``SystemExit`` from another thread)
does not make it free: it ends ``fail`` (its error class the interrupt's), charged the cost it
reserved, with ``cost_status`` ``"unsettled"``, like the hold of a worker that died mid-call
(:mod:`ampmeter.shared.unsettled`): the bill is unknown, the reservation is its ceiling. No
tokens are recorded (the provider never reported any). A call interrupted *before* it was
admitted was never sent: it still ends ``halt``, free. An LLM call of a model with no known
price reserved no cost, so there is no amount to charge: it still ends ``fail``, counted as a
sent call, ``cost_status`` ``"unpriced"`` (never a free stop). A call with neither a cost nor a
model (a bare ``llm_call`` or ``tool_call``) has nothing to say it was sent: it ends ``halt``.

A call started by hand (``call.start()``) whose owner lost it without ``finish()`` (an
exception path of the caller's, a generator closed early, a task canceled in between) is ended
the same way, with the error class ``CallDropped``, when the kernel's sweep finds it
(:func:`settle_dropped`): until then its hold keeps counting. Whatever it recorded was dropped
with it; its reservation is what is charged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from ampmeter import money
from ampmeter._core.outcome import Ending, Outcome
from ampmeter._core.ticket import stand_in
from ampmeter._core.usage import Spent
from ampmeter.keys import KEY_UNSETTLED_COST
from ampmeter.node import META_COST_STATUS

if TYPE_CHECKING:
    from ampmeter._core.ticket import Held, Ticket
    from ampmeter.node import Node

__all__ = [
    "COST_STATUS_UNSETTLED",
    "DROPPED",
    "charged_in_flight",
    "is_interrupted_in_flight",
    "settle_dropped",
]

COST_STATUS_UNSETTLED: Final = "unsettled"
"""The ``cost_status`` of a call charged at its reservation because its bill is unknown."""

DROPPED: Final = "CallDropped"
"""The error class of a call charged because its owner dropped it in flight."""

_DROPPED_UNSENT: Final = Outcome(
    "halt", error_class=DROPPED, stop_reason="dropped by its owner before it ended"
)


def is_interrupted_in_flight(ticket: Ticket, exc: BaseException) -> bool:
    """Whether ``exc`` is an interrupt (a ``BaseException`` that is not an ``Exception``)
    ending ``ticket`` after it was admitted and before it recorded usage, with a reserved cost
    to charge or a model whose call was sent unpriced."""
    return (
        not isinstance(exc, Exception)
        and ticket.kernel_node.status == "running"
        and not ticket.recorded
        and _maybe_sent(ticket)
    )


def _maybe_sent(ticket: Ticket) -> bool:
    """Whether an admitted ``ticket`` may have been sent: it reserved a cost, or is an LLM call
    of a model."""
    return ticket.reserved[2] > 0 or (ticket.kind == "llm" and bool(ticket.model))


def charged_in_flight(
    ticket: Ticket, exc: BaseException, read: dict[str, Any] | None
) -> tuple[Spent, Ending]:
    """What a call ``exc`` interrupted in flight spent, and how it ended: its reserved cost
    (none: an LLM call counted sent and unpriced), with what an integration ``read`` from the
    response in its metadata."""
    name = type(exc).__name__
    return _charged(ticket, name, f"interrupted ({name}) after it was sent", read)


def _charged(
    ticket: Ticket, error: str, cause: str, read: dict[str, Any] | None
) -> tuple[Spent, Ending]:
    _, _, cost, _ = ticket.reserved
    unpriced = int(not cost and ticket.kind == "llm")
    charged = f"charged at its reservation ({money.format_usd(money.from_nano(cost))})"
    reason = f"{cause}: " + (f"{charged} as unsettled spend" if cost else "its price is unknown")
    meta = {**(read or {}), META_COST_STATUS: COST_STATUS_UNSETTLED if cost else "unpriced"}
    spent: Spent = (0, 0, 0, 0, 0, 0, cost, 1, 0, 0, unpriced)  # (no tokens: none were reported)
    return spent, ("fail", cost, None, None, error, reason, meta)


def settle_dropped(node: Node, held: Held) -> None:
    """Settle the call of ``node`` that its owner dropped while the kernel held it (``held``):
    through its context's admission, as its owner would have on an interrupt in flight (the
    shared ledgers committed, the node ended, sinks see it), charged its reservation as
    unsettled spend; one that cannot have been sent (see the module) halts, free."""
    ticket = stand_in(node, held)
    admission = ticket.plan.admission
    if node.status == "running" and _maybe_sent(ticket):
        spent, ending = _charged(ticket, DROPPED, "dropped by its owner after it was sent", None)
    else:
        spent, ending = (0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0), _DROPPED_UNSENT
    admission.settle(ticket, spent, ending)
    # (After it: a settlement an interrupt cut short is run again by the next sweep.)
    if spent[6]:  # (its cost)
        admission.kernel.add(admission.level, KEY_UNSETTLED_COST, spent[6], True)
