"""ExecutionContext: one per agent (or sub-agent) run; it checks, records and contains its calls.

A context builds its admission (:mod:`ampmeter._core.steps`) once, when it is made, and
every call it makes (:class:`~ampmeter.call.Call`) passes that admission before it runs and settles
through it when it ends.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Final, Literal

from ampmeter._calls import CallMaker
from ampmeter._core.emit import Emitter
from ampmeter._core.exhaustion import ExhaustedHook
from ampmeter._core.frame import Frame
from ampmeter._core.outcome import TerminationReason
from ampmeter._core.pausing import raise_limit
from ampmeter._core.readonly import ReadOnly
from ampmeter._core.steps import Admission
from ampmeter._core.views import bound
from ampmeter._current import (
    CURRENT,
    OPEN,
    current_context,
    current_node_id,
    enclosing_context,
    open_contexts,
    restore,
)
from ampmeter._handing_off import HandingOff
from ampmeter._lineage import META_CONTEXTS, lineage
from ampmeter._scoped import Scoped
from ampmeter._settings import Settings
from ampmeter.budget import Budget
from ampmeter.call import Call
from ampmeter.graph import ExecutionGraph
from ampmeter.limits import ExceededLimit, Limit
from ampmeter.policies.configured import ConfiguredPolicies
from ampmeter.policies.registry import Policies
from ampmeter.pricing.source import TABLE, Pricing
from ampmeter.shared import remaining
from ampmeter.shared.handoff import Handoffs
from ampmeter.shared.ledger_step import LedgerStep
from ampmeter.sinks.base import Sink
from ampmeter.stats import ExecutionStats
from ampmeter.wrapping import Decision, WrapOptions

if TYPE_CHECKING:
    from ampmeter.ledgers.base import Ledger

__all__ = [
    "Call",
    "Decision",
    "ExecutionContext",
    "TerminationReason",
    "WrapOptions",
    "configured_policies",
    "current_context",
    "current_node_id",
    "open_contexts",
]

ADMISSION_TIMEOUT_S: Final = 30.0
"""How long a call that does not fit only because of calls in flight waits for them by default."""


class ExecutionContext(CallMaker, HandingOff, Scoped):
    """One agent run (or sub-agent): its limits, its live stats and its place in the graph.

    Keywords:

    * ``name``: the context's name, on its node and on every event it logs;
    * ``budget``: the context's limits as one :class:`~ampmeter.Budget`, or its short forms:
      ``limits`` (:class:`~ampmeter.Limit` objects on stats keys, fixed when the context is
      made: a sub-agent that needs others gets them from :meth:`spawn_child`),
      ``max_cost_usd``, ``max_steps``, ``max_llm_calls``, ``max_retries`` (shortcuts for
      limits on ``amp:cost``, ``amp:steps`` (successful calls), ``amp:llm_calls`` and
      ``amp:retries``), ``timeout_s`` (wall time; calls after it are refused), ``warn_at``,
      ``on_exhausted`` and ``pause_timeout_s`` (below);
    * ``policies``: the policy options as one :class:`~ampmeter.Policies`, or as keywords
      (``policy_options``: those below, and those of the policies in
      :mod:`ampmeter.policies.registry`);
    * ``chain_id``, ``metadata``: the graph's id and the context node's metadata;
    * ``sinks``: where every ended node goes (children add theirs to their parent's). A sink
      that fails never fails the call: its first error is kept in :attr:`sink_errors` (with one
      warning) and :meth:`close` raises it;
    * ``ledger``: a shared ledger (``SqliteLedger``, ``RedisLedger``) through which processes
      share the limits; ``on_ledger_error``: ``"halt"`` (default, fail closed) or ``"allow"``
      when the ledger cannot be reached;
    * ``max_nodes``: keep at most this many nodes in memory (0: all);
    * ``admission_timeout_s``: how long a call that fits what is spent, but not what calls in
      flight hold, waits for them (30 s; children inherit it) before
      :class:`~ampmeter.BudgetBusy`. A call that does not fit what is spent is refused at once;
    * ``on_unpriced``: a call to a model without a price, under a cost limit here or above, is
      ``"refuse"``-d (default), let through with a ``"warn"``-ing, or ``"allow"``-ed;
    * ``warn_at``: fractions of the shortcut limits at which a :class:`LimitEvent` is reported
      to ``on_limit_event`` (a callback; events are also in :meth:`snapshot`);
    * ``final_reserve_usd``: part of the cost limit only calls marked ``final`` may spend;
    * ``max_repeats``: the same request (or tool call with the same arguments) more than this
      many times is refused (a loop guard);
    * ``max_input_tokens_per_call``: a call estimated above this many input tokens is refused;
    * ``on_budget_pressure``, ``pressure_at``: once ``pressure_at`` (default 0.8) of a cost
      limit is spent, this hook may change an instrumented request (a cheaper model) or refuse
      it (return None);
    * ``estimate``: how a call's reservation is estimated: ``"learned"`` (default; the input
      corrected per model from finished calls) or ``"bound"`` (a ceiling no tokenizer can pass:
      the request's UTF-8 bytes plus framing, and ``max_tokens`` or the model's maximum output).
      Children and hand-offs inherit it;
    * ``on_expired_hold``: what a shared ledger does with the hold of a call whose process died
      (its lease ran out): ``"charge"`` it as unsettled spend (its request may have been
      billed) or ``"release"`` it. Unset, each ledger's own ``on_expired_hold=`` applies (it
      charges by default). Children and hand-offs inherit it. A context shows the charges of
      dead workers' holds under its ledger scope and its hand-offs (see :meth:`close`);
    * ``on_exhausted``: what a call that would break a hard limit does: ``"raise"`` (default:
      :class:`~ampmeter.LimitExceeded`) or ``"pause"``: it waits, holding no lock, for a raise
      made after it paused (:meth:`raise_limit`, ``ampmeter budget raise`` / ``resume``); a
      callable ``on_exhausted(ctx, exceeded) -> new_max | None`` is asked at once (None stops
      the call). ``pause_timeout_s`` (None: no end) or ``timeout_s`` ends a pause with
      ``LimitExceeded``. Each pause and resume is a limit event. Children inherit both;
    * ``disclose_budget``: tell instrumented LLM requests the budget left (:meth:`budget_note`)
      as a system message; the node keeps the line (``budget_note``). Children inherit it;
    * ``downgrade``: a ladder ``{fraction: {model: cheaper model}}`` (``"*"``: any model):
      past each fraction of the cost limit, instrumented requests for a named model are sent
      to the cheaper one and reserved at its price; the node keeps ``requested_model``. Give
      it or an ``on_budget_pressure`` hook, not both (a child's own replaces an inherited one);
    * ``pricing``: where prices come from, to estimate what a call reserves and to price a call
      recorded without a cost: the price table (``ampmeter.pricing.TABLE``, default; loaded on
      the first call that needs it), ``ampmeter.pricing.NO_PRICES`` (nothing is priced: such
      calls are ``unpriced``, never $0, and ``on_unpriced`` applies), or any object with the
      ``price`` and ``estimate`` functions of :mod:`ampmeter.pricing`. Children inherit it.

    Replays count once: a call or trace record with an ``idempotency_key`` already counted in
    this run, or (through ``ledger``) in its scope by any process, adds nothing and its node
    says ``duplicate_of``. Only keys the caller gives count once: a provider's response id
    is not one (:meth:`llm_call`, ``instrument(response_id_keys=...)``).
    """

    budget = ReadOnly[Budget]("Its own frozen :class:`~ampmeter.Budget` (those above bind it too).")
    node_id = ReadOnly[str]("Its own node: the graph's root, or a sub-agent's ``system`` node.")
    iteration = ReadOnly[int]("How many iterations have started (1-based), 0 before the first.")
    estimate = ReadOnly[str]("How a call's reservation is estimated: ``'learned'`` or ``'bound'``.")
    pricing = ReadOnly[Pricing]("Where its prices come from (``pricing=``, or its parent's).")
    admission_timeout_s = ReadOnly[float]("How long a call waits for calls in flight to make room.")
    sinks = ReadOnly[tuple[Sink, ...]]("Where its nodes go: its own sinks and its parents'.")
    closed = ReadOnly[bool]("Whether :meth:`close` ran.")

    def __init__(
        self,
        name: str = "agent_run",
        *,
        budget: Budget | None = None,
        policies: Policies | None = None,
        limits: Sequence[Limit] | None = None,
        max_cost_usd: float | Decimal | None = None,
        max_steps: int | None = None,
        max_llm_calls: int | None = None,
        max_retries: int | None = None,
        timeout_s: float | None = None,
        warn_at: Sequence[float] | None = None,
        on_exhausted: Literal["raise", "pause"] | ExhaustedHook | None = None,
        pause_timeout_s: float | None = None,
        chain_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        sinks: Iterable[Sink] = (),
        ledger: Ledger | None = None,
        on_ledger_error: Literal["halt", "allow"] = "halt",
        max_nodes: int = 0,
        admission_timeout_s: float | None = None,
        estimate: Literal["learned", "bound"] | None = None,
        on_expired_hold: Literal["charge", "release"] | None = None,
        disclose_budget: bool | None = None,
        pricing: Pricing | None = None,
        **policy_options: Any,
    ) -> None:
        given = {**locals(), **policy_options}  # every keyword above, by its name
        del given["self"], given["name"], given["policy_options"]
        # ``ampmeter run``'s context encloses the program's: its runs go inside it.
        self._setup(enclosing_context(), Settings.of(name, given))

    def _setup(self, parent: ExecutionContext | None, settings: Settings) -> None:
        if settings.pricing is not None:
            pricing = settings.pricing
        else:
            pricing = parent.pricing if parent is not None else TABLE
        budget = settings.budget
        load = getattr(pricing, "load", None)
        if budget.timeout_s is not None and load is not None:
            load()  # the price table's first load never counts against the timeout
        self._pricing = pricing
        name = settings.name
        self.name = name
        self.parent = parent
        limits = budget.all_limits
        self._lineage = lineage(parent._lineage if parent else None, name, limits)
        settings.metadata[META_CONTEXTS] = self._lineage  # a sub-agent's own event says it too
        self.ledger = settings.ledger
        self.data: Any = None
        if parent is None:
            self.graph = ExecutionGraph(settings.chain_id, max_nodes=settings.max_nodes)
            self.stats = ExecutionStats(graph=self.graph)
            self._node_id = self.graph.create_root(name, settings.metadata)
            sinks: tuple[Sink, ...] = settings.sinks
        else:
            self.graph = parent.graph
            self.stats = ExecutionStats(parent.stats)
            self._node_id = self.graph.begin_node(
                parent.current_parent_id(), "system", name, None, settings.metadata
            )
            self.graph.mark_running(self._node_id)
            inherited = parent.sinks
            sinks = inherited + tuple(s for s in settings.sinks if s not in inherited)
        self._estimate = settings.estimate or (parent.estimate if parent else "learned")
        kernel, level = bound(self.stats)
        assert level is not None
        self._kernel = kernel
        self._frame = Frame(
            name,
            self._node_id,
            parent._frame if parent is not None else None,
            level,
            limits,
            budget.timeout_s,
            settings.ledger,
            on_ledger_error=settings.on_ledger_error,
            handoff_from=settings.handoff_from,
            exhaustion=budget.exhaustion,
            disclose_budget=settings.disclose_budget,
            on_expired_hold=settings.on_expired_hold,
        )
        wait = settings.admission_timeout_s
        if wait is None:
            wait = parent.admission_timeout_s if parent is not None else ADMISSION_TIMEOUT_S
        self._admission_timeout_s: float = wait
        self._closed = False
        self._iteration = 0
        self._token: Any = None
        self._sinks = sinks
        self._emitter = Emitter(name, self.graph.chain_id, sinks)
        self._budget = budget
        self._policies = ConfiguredPolicies(
            self._frame,
            settings.policies.inherit(parent.policies if parent is not None else None),
            parent._policies if parent is not None else None,
            self.stats,
            pricing,
        )
        self._admission = Admission(
            frame=self._frame,
            kernel=kernel,
            emitter=self._emitter,
            wait_s=wait,
            ask_exhausted=self._ask_exhausted,
        )
        ledger_step = LedgerStep(self._admission) if self._admission.ledgered else None
        self._admission.install(self._policies.steps_for(self._admission), ledger_step)
        if not limits and settings.ledger is None:  # nothing reads its stats live
            kernel.fold(level)
        self._handoffs = Handoffs(self._frame, kernel, self._emitter)
        OPEN.add(self)

    # -- identity -----------------------------------------------------------------------------

    @property
    def limits(self) -> tuple[Limit, ...]:
        """This context's own limits (read-only: they are fixed when the context is made)."""
        return self._frame.limits

    @limits.setter
    def limits(self, value: object) -> None:
        raise AttributeError(
            "ExecutionContext.limits is read-only: limits are fixed when the context is made; "
            "use spawn_child(limits=...) for a part of the run that needs other limits"
        )

    @property
    def policies(self) -> Policies:
        """The :class:`~ampmeter.Policies` in force here (frozen): this context's own options,
        with the inherited ones of the contexts above where not set here."""
        return self._policies.values

    @property
    def chain_id(self) -> str:
        """The id of the chain (graph) this context belongs to."""
        return self.graph.chain_id

    @property
    def on_expired_hold(self) -> str | None:
        """What a shared ledger does with the hold of a call of this context whose lease ran
        out (``"charge"`` or ``"release"``): the rule set here, on a context above or by the
        hand-off this context came from; None when none was set (each ledger's own applies)."""
        return self._frame.on_expired_hold

    @property
    def sink_errors(self) -> tuple[Exception, ...]:
        """The first error of each sink that failed on this context's nodes (the calls
        themselves went on); ``snapshot()["sink_failures"]`` counts every failure."""
        return tuple(self._emitter.errors)

    @property
    def termination_reason(self) -> TerminationReason | None:
        """Why this context ended (or is ending): None while it runs unstopped."""
        return self._frame.termination_reason

    @termination_reason.setter
    def termination_reason(self, value: TerminationReason | None) -> None:
        self._frame.termination_reason = value

    @property
    def exceeded_limit(self) -> ExceededLimit | None:
        """The limit that stopped this context, if one did."""
        return self._frame.exceeded_limit

    @exceeded_limit.setter
    def exceeded_limit(self, value: ExceededLimit | None) -> None:
        self._frame.exceeded_limit = value

    @property
    def wrap_up(self) -> bool:
        """True once a soft limit of this context or an enclosing one was exceeded: the agent
        should finish with what it has (hard limits still hold)."""
        return any(step.wraps_up() for step in self._policies.steps)

    # -- children -----------------------------------------------------------------------------

    def spawn_child(self, name: str, **keywords: Any) -> ExecutionContext:
        """A context for a sub-agent: a ``system`` node here, stats that roll up into ours.
        ``keywords`` are those of :class:`ExecutionContext`; the child inherits what it does not
        set of the inherited policy options, ``on_ledger_error`` and the like."""
        self._check_open()
        keywords.setdefault("on_ledger_error", self._frame.on_ledger_error)
        child = ExecutionContext.__new__(ExecutionContext)
        child._setup(self, Settings.of(name, keywords))
        return child

    # -- exhaustion ---------------------------------------------------------------------------

    def raise_limit(self, key: str, new_max_value: float) -> None:
        """Set this context's hard limit on ``key`` to ``new_max_value`` (from any thread): calls
        paused on it (``on_exhausted="pause"``) go on, and later calls are checked against it.
        ``KeyError`` when this context has no hard limit on ``key``."""
        raise_limit(self._frame, key, new_max_value, self._kernel)

    def _ask_exhausted(self, owner: Frame, exceeded: ExceededLimit) -> object:
        """Ask this context's ``on_exhausted`` callback about a limit of ``owner`` (this
        context's frame or one above): the callback is given the context that owns it."""
        context = self
        while context._frame is not owner and context.parent is not None:
            context = context.parent
        hook = self._frame.exhaustion.hook
        return None if hook is None else hook(context, exceeded)

    @property
    def disclose_budget(self) -> bool:
        """Whether instrumented LLM requests are told the budget (:meth:`budget_note`) as a
        system message (``disclose_budget=True`` here or on a context above)."""
        return self._frame.disclose_budget

    def remaining(self) -> dict[str, Any]:
        """What is left of each hard limit on an exact key, here and above (the shared ledgers'
        ceilings included), less what is spent and what calls in flight hold: the tightest per
        key. Money keys in Decimal dollars."""
        return {key: rest for key, (rest, _) in remaining.left(self._frame, self._kernel).items()}

    def budget_note(self) -> str:
        """One short line an agent can read, such as ``Budget left: $0.42 of $1.00, 7 of 20
        steps`` (the tightest limits, as :meth:`remaining` finds them)."""
        return remaining.note(remaining.left(self._frame, self._kernel))

    # -- cancel, close ------------------------------------------------------------------------

    def cancel(self) -> None:
        """Stop this context: further calls in it (and in its children) are halted."""
        self._frame.cancel()
        if self.termination_reason is None:
            self.termination_reason = TerminationReason.CONTEXT_CANCELED

    @property
    def canceled(self) -> bool:
        """True once this context or an enclosing one was canceled."""
        return self._frame.any_canceled()

    def close(self, exc: BaseException | None = None) -> None:
        """End the context (idempotent): its node ends and its sinks are flushed.

        First the spend of its hand-offs is read from the ledger, and the holds of dead workers
        charged as unsettled (under its hand-offs, or at its own ledger scope) are recorded as
        nodes of their own (see :mod:`ampmeter.shared.unsettled`); :meth:`snapshot` does the
        same while the context runs.

        Raises the first error a sink reported (here or while flushing) unless the context is
        closing because of ``exc``.
        """
        if self._closed:
            return
        self._closed = True
        OPEN.discard(self)
        self._kernel.sweep()  # calls their owners dropped are charged and logged first
        self._handoffs.settle()
        outcome = self._frame.closing(exc)
        node = self._kernel.node(self._node_id)
        if self._kernel.end(node, outcome):
            self._emitter.emit(node)
        self._kernel.retire(self._frame.level)  # its totals stay counted above it
        self._emitter.flush()
        if self._emitter.errors and exc is None:
            raise self._emitter.errors[0]

    def _enter(self) -> None:
        self._token = CURRENT.set((self, self._node_id))

    def _leave(self, exc: BaseException | None) -> None:
        token, self._token = self._token, None
        restore(token, self.parent)
        self.close(exc)

    def snapshot(self) -> dict[str, Any]:
        """Graph snapshot plus this context's counters, gauges, reservations and termination.

        The spend of this context's hand-offs is read from the ledger first, so a child that
        still runs (also after this context closed) shows what it has spent so far."""
        self._handoffs.refresh()
        return {
            "name": self.name,
            "chain_id": self.chain_id,
            "node_id": self._node_id,
            "iteration": self._iteration,
            **self._frame.describe(),
            "counters": self.stats.counters(),
            "gauges": _json_numbers(self.stats.gauges()),
            "reserved": _json_numbers(self.stats.reserved()),
            "sink_errors": [f"{type(e).__name__}: {e}" for e in self._emitter.errors],
            "sink_failures": sum(self._emitter.failures.values()),
            "limit_events": [
                *self._policies.log.dicts(),
                *self._frame.pause_events,
            ],
            "graph": self.graph.snapshot(),
        }

    def __repr__(self) -> str:
        return f"ExecutionContext(name={self.name!r}, chain_id={self.chain_id!r})"

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"context {self.name!r} is closed")


def _json_numbers(values: dict[str, Any]) -> dict[str, Any]:
    """Values for a JSON snapshot: Decimal money as numbers, as the logs write it."""
    return {k: float(v) if isinstance(v, Decimal) else v for k, v in values.items()}


def configured_policies(ctx: ExecutionContext) -> ConfiguredPolicies:
    """The policy steps of ``ctx``'s chain and their wiring (for the integrations; not user
    API)."""
    return ctx._policies
