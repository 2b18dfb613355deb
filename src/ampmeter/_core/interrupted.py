"""A call interrupted while in flight is charged at its reservation, as unsettled spend.

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
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from ampmeter import money
from ampmeter._core.outcome import Ending
from ampmeter._core.usage import Spent
from ampmeter.node import META_COST_STATUS

if TYPE_CHECKING:
    from ampmeter._core.ticket import Ticket

__all__ = ["COST_STATUS_UNSETTLED", "charged_in_flight", "is_interrupted_in_flight"]

COST_STATUS_UNSETTLED: Final = "unsettled"
"""The ``cost_status`` of a call charged at its reservation because its bill is unknown."""


def is_interrupted_in_flight(ticket: Ticket, exc: BaseException) -> bool:
    """Whether ``exc`` is an interrupt (a ``BaseException`` that is not an ``Exception``)
    ending ``ticket`` after it was admitted and before it recorded usage, with a reserved cost
    to charge or a model whose call was sent unpriced."""
    return (
        not isinstance(exc, Exception)
        and ticket.kernel_node.status == "running"
        and not ticket.recorded
        and (ticket.reserved[2] > 0 or (ticket.kind == "llm" and bool(ticket.model)))
    )


def charged_in_flight(
    ticket: Ticket, exc: BaseException, read: dict[str, Any] | None
) -> tuple[Spent, Ending]:
    """What a call ``exc`` interrupted in flight spent, and how it ended: its reserved cost
    (none: an LLM call counted sent and unpriced), with what an integration ``read`` from the
    response in its metadata."""
    _, _, cost, _ = ticket.reserved
    unpriced = int(not cost and ticket.kind == "llm")
    charged = f"charged at its reservation ({money.format_usd(money.from_nano(cost))})"
    reason = f"interrupted ({type(exc).__name__}) after it was sent: " + (
        f"{charged} as unsettled spend" if cost else "its price is unknown"
    )
    meta = {**(read or {}), META_COST_STATUS: COST_STATUS_UNSETTLED if cost else "unpriced"}
    spent: Spent = (0, 0, 0, 0, 0, 0, cost, 1, 0, 0, unpriced)  # (no tokens: none were reported)
    return spent, ("fail", cost, None, None, type(exc).__name__, reason, meta)
