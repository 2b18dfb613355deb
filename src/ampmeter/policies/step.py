"""What every policy step shares beyond the admission's three verbs: the terms it adds
to a shared ledger's reservation, the events it reports once a call's usage is added, and the
relief it gives an instrumented request under budget pressure."""

from __future__ import annotations

from decimal import Decimal
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from ampmeter._core.outcome import Outcome, TerminationReason
from ampmeter._core.steps import Admission, Step, Ticket
from ampmeter.keys import KEY_COST
from ampmeter.policies.options import META_LIMIT_EVENTS, is_cost_ceiling
from ampmeter.policies.shared_totals import shared_totals

if TYPE_CHECKING:
    from ampmeter._core.frame import Frame
    from ampmeter._core.usage import Usage
    from ampmeter.errors import LimitExceeded
    from ampmeter.limits import ExceededLimit, Limit
    from ampmeter.policies.marks import CallMarks

__all__ = ["Observer", "PolicyStep", "Relief", "SharedTerms", "Totals"]


class Totals(Protocol):
    """A context's stats as policies read them (:class:`~ampmeter.ExecutionStats` is one)."""

    def get_counter(self, key: str) -> int:
        """A counter's value (0 when never written)."""

    def get_gauge(self, key: str) -> Decimal:
        """A gauge's value (money in dollars)."""


class SharedTerms:
    """What one context's shared ledger checks a call against, beyond its plain ceilings
    (policies change them in place):

    * ``ceilings`` and their ``owners`` (the limit each ceiling stands for);
    * ``extra``: keys to hold beyond the ceilings', with their amount (None: the call's own
      estimate for the key);
    * ``windows``: the windowed limits the ledger checks over its sliding window.
    """

    __slots__ = ("ceilings", "extra", "owners", "windows")

    def __init__(self, ceilings: dict[str, Any], owners: dict[str, Limit]) -> None:
        self.ceilings = ceilings
        self.owners = owners
        self.extra: dict[str, float | None] = {}
        self.windows: tuple[Limit, ...] = ()

    def cap(self, key: str, top: Any, limit: Limit) -> None:
        """Check ``key`` against ``top`` (for ``limit``) from now on."""
        self.ceilings = {**self.ceilings, key: top}
        self.owners = {**self.owners, key: limit}


class PolicyStep(Step):
    """A policy in a context's admission. ``priced_calls`` (a :class:`Step`'s): whether it
    acts on, and needs the marks of, a priced call; ``fingerprints``: whether it needs each
    call's loop-guard identity."""

    __slots__ = ("admission",)
    fingerprints: ClassVar[bool] = False

    def __init__(self, admission: Admission) -> None:
        self.admission = admission

    def refuse(self, ticket: Ticket, owner: Frame, stop: ExceededLimit) -> LimitExceeded:
        """Halt ``ticket`` for ``stop`` (a limit of ``owner``); the error to raise."""
        return self.admission.refuse(ticket, (owner, stop, TerminationReason.LIMIT_EXCEEDED))

    def shared_terms(self, owner: Frame, marks: CallMarks | None, terms: SharedTerms) -> None:
        """Add this policy's terms for ``owner``'s shared ledger (through a shared ledger a
        policy counts what every process sharing the scope did)."""

    def wraps_up(self) -> bool:
        """Whether this policy asks the agent to finish (``ctx.wrap_up``)."""
        return False


class Observer(PolicyStep):
    """A policy that looks at what each call used once it is added (windows, warnings, soft
    limits, the input cap); its events go on the call's node."""

    __slots__ = ()

    def observe(self, usage: Usage, node_id: str) -> list[dict[str, Any]]:
        """Look at ``usage`` (added at ``node_id``); the events reported, as dicts."""
        raise NotImplementedError

    def settle(self, ticket: Ticket, usage: Usage, outcome: Outcome) -> Outcome:
        events = self.observe(usage, ticket.kernel_node.node_id)
        if events:
            self.admission.kernel.append_metadata(ticket.kernel_node, META_LIMIT_EVENTS, events)
        return outcome


class Relief(PolicyStep):
    """A policy that may change an instrumented request before it is measured and reserved, or
    refuse it, by the largest share of a cost ceiling spent here or above (its ``ceilings``,
    each with its context's frame). Through a shared ledger the spend is what all its processes
    spent. A refusal stops the call when it is admitted."""

    __slots__ = ("ceilings",)

    def __init__(self, admission: Admission) -> None:
        super().__init__(admission)
        self.ceilings = tuple(
            (frame, limit.max_value)
            for frame in admission.frame.ancestry
            for limit in frame.limits
            if is_cost_ceiling(limit) and limit.max_value > 0
        )

    def admit(self, ticket: Ticket, thread: int | None) -> None:
        marks = ticket.marks
        if marks is not None and marks.refusal is not None:
            raise self.refuse(ticket, self.admission.frame, marks.refusal)

    def spent(self) -> float:
        """The largest share of a cost ceiling here or above that is spent: through a shared
        ledger, of every process's spend (read at most every
        :data:`~ampmeter.policies.shared_totals.SHARED_READ_S`); else of this process's."""
        shares = []
        for frame, top in self.ceilings:
            spent: Decimal = frame.policies.stats.get_gauge(KEY_COST)
            totals = None if frame.ledger is None else shared_totals(frame.ledger).read()
            if totals is not None:
                spent = max(spent, Decimal(totals.get(KEY_COST, 0)))
            shares.append(float(spent / top))
        return max(shares)

    def relieve(
        self, ctx: Any, request: dict[str, Any], notes: dict[str, Any]
    ) -> ExceededLimit | None:
        """Change ``request`` (an SDK call's keyword arguments; ``ctx`` is the context it runs
        in) in place, noting in ``notes`` (the node's metadata) what was done, or refuse it:
        the refusal is returned."""
        raise NotImplementedError
