"""``Ticket``: one call as the core sees it. :class:`~ampmeter.Call` is one (it subclasses it),
so the admission and the kernel write into the very object the caller holds: one object per
call, nothing else allocated for it. Its maker (the call's constructor) sets each field below
that the admission reads before writing it; the kernel writes the rest.

What the caller may read about the call is read-only (its kind, name and model, which its
node keeps, its provider, reservation, marks and idempotency key); the rest is the core's
bookkeeping, written by the admission (``phase``, ``rows``, ``ledger_holds``) and the kernel
(``feed``). The kernel refers to a ticket weakly, keeping beside the reference what the call
holds (:data:`Held`), so a call its owner dropped without ending it (an exception path,
a generator closed early, an interrupt) still holds its reservation until it is found by its
dead reference and charged as a call interrupted in flight is
(:func:`~ampmeter._core.interrupted.settle_dropped`).

A reservation is kept as its counts (:data:`Reserved`), which the kernel holds by the keys its
plan compiled once; the :class:`~ampmeter._core.usage.Usage` it stands for is made only when
something reads :attr:`Ticket.reservation` (a shared ledger, a reader).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ampmeter._core.idempotency import META_IDEMPOTENCY_KEY
from ampmeter._core.readonly import ReadOnly
from ampmeter._core.usage import Usage

if TYPE_CHECKING:
    from ampmeter._core.cells import Cell, Level
    from ampmeter._core.check import Guard
    from ampmeter.node import Node

__all__ = ["ADMITTED", "DONE", "NEW", "Held", "Reserved", "Ticket", "reservation_keys", "stand_in"]

NEW, ADMITTED, DONE = 0, 1, 2
"""A ticket's phases: made, admitted (holding its reservation), ended."""

Reserved = tuple[int, int, int, int]
"""A reservation's counts: input tokens, output tokens, cost in nano-dollars, and calls (1 for
an LLM or tool call, which also reserves one step; else 0)."""


def reservation_usage(kind: str, model: str | None, tool: str, reserved: Reserved) -> Usage:
    """The usage a call of ``kind`` (of ``model``, or ``tool``) reserving ``reserved`` stands
    for."""
    t_in, t_out, cost, calls = reserved
    return Usage(kind, model or "", tool, t_in, t_out, cost_nano=cost, calls=calls, steps=calls)


def reservation_keys(kind: str, model: str | None, tool: str) -> tuple[tuple[str, int], ...]:
    """Every key a reservation of a call of ``kind`` (of ``model``, or ``tool``) may hold,
    whatever its amounts (a model call's tokens, an LLM, embedding or tool call's cost, an LLM
    or tool call's one call and one step), each with the place of its amount in the
    reservation's counts: so where a plan's reservations are held is compiled once, not per
    pattern of zeros (a zero held adds nothing)."""
    tokens, cost = kind in ("llm", "embedding"), kind in ("llm", "embedding", "tool")
    calls = kind in ("llm", "tool")
    # Each amount such a call may reserve is its place + 1 here (0: it never reserves it).
    marked = reservation_usage(kind, model, tool, (tokens * 1, tokens * 2, cost * 3, calls * 4))
    return tuple((key, int(marked[field]) - 1) for key, field, _ in marked.shape().entries)


def _reservation(ticket: Ticket) -> Usage:
    node = ticket.kernel_node
    tool = node.name if node.kind == "tool" else ""
    return reservation_usage(node.kind, node.model, tool, ticket.reserved)


class Ticket:
    """One call's identity, reservation and progress through the admission (see the module
    docstring)."""

    __slots__ = (
        "__weakref__",
        "_idempotency_key",
        "_marks",
        "_provider",
        "_reserved",
        "feed",
        "kernel_node",
        "ledger_holds",
        "phase",
        "plan",
        "recorded",
        "rows",
    )

    # Kept once, on the call's node.
    kind: ReadOnly[str] = ReadOnly(
        "``llm``, ``tool``, ``embedding``, a step's.", of="kernel_node.kind"
    )
    name: ReadOnly[str] = ReadOnly("The call's name (its node's).", of="kernel_node.name")
    model: ReadOnly[str | None] = ReadOnly("The model called, if any.", of="kernel_node.model")
    node_id: ReadOnly[str] = ReadOnly("The id of the call's node.", of="kernel_node.node_id")
    provider: ReadOnly[str | None] = ReadOnly("The provider, when known.")
    reserved: ReadOnly[Reserved] = ReadOnly("What the call reserves before it runs, counted.")
    reservation: ReadOnly[Usage] = ReadOnly(
        "The same, as a usage (made when read).", of=_reservation
    )
    marks: ReadOnly[Any] = ReadOnly("What the context's policies noted (None: nothing).")
    idempotency_key: ReadOnly[str | None] = ReadOnly("Counted once per key in the run.")

    # What the read-only attributes above show, set by the call's maker.
    _reserved: Reserved
    _idempotency_key: str | None
    _provider: str | None
    _marks: Any
    kernel_node: Node  # the kernel's own node (users read ``call.node``, a copy)
    # Its context's steps.KindPlan (named loosely: the ticket imports nothing that imports it).
    plan: Any
    # Written by the admission: the phase (NEW, ADMITTED, DONE), the ceilings a policy chose
    # (None: the context's), each shared ledger with its reservation; by record(): whether the
    # usage was recorded.
    phase: int
    rows: tuple[Guard, ...] | None
    ledger_holds: tuple[tuple[Any, Any], ...]
    recorded: bool
    # Written by the kernel at settlement: the (cell, Usage field) pairs still to add, an
    # iterator an interrupted settlement resumes.
    feed: Iterator[tuple[Cell, int]]


Held = tuple[
    Callable[[], Any],  # (a weak reference)
    Mapping[str, Any],
    tuple[tuple["Level", tuple[str, ...]], ...],
    int,
    Any,
    Reserved,
    tuple[tuple[Any, Any], ...],
]
"""What the kernel keeps of a call it admitted and that has not ended, from its admission: a
weak reference to its ticket and, beside it, so that what it holds keeps counting when its
owner drops it and the sweep can charge it (:func:`stand_in`): each key's amount held, each
level whose limits watch the reservation with the keys held there, the admitting thread, the
call's plan and reservation, and (once a shared ledger holds it too) its ledger holds. One
tuple, made once per call. (Its idempotency key, if it was made with one, is on its node.)"""


def stand_in(node: Node, held: Held) -> Ticket:
    """A ticket that stands for the dropped call of ``node`` that the kernel ``held``, for its
    settlement."""
    ticket = Ticket()
    ticket.kernel_node = node
    _, _, _, _, ticket.plan, ticket._reserved, ticket.ledger_holds = held
    ticket._idempotency_key = node.metadata.get(META_IDEMPOTENCY_KEY)
    ticket._provider = ticket._marks = ticket.rows = None
    ticket.recorded = False  # (whatever it recorded was dropped with it)
    ticket.phase = DONE
    return ticket
