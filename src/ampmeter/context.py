"""ExecutionContext: one per agent (or sub-agent) run; it checks, records and contains its calls.

A context builds its admission chain (:mod:`ampmeter._core.steps`) once, when it is made, and
every call it makes (:class:`~ampmeter.call.Call`) passes that chain before it runs and settles
through it when it ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Literal

from ampmeter import _validate, redact
from ampmeter._core import priced
from ampmeter._core.current import (
    CURRENT,
    OPEN,
    any_open_context,
    current_context,
    current_node_id,
    open_contexts,
    restore,
)
from ampmeter._core.emit import Emitter
from ampmeter._core.frame import Frame
from ampmeter._core.kernel import bound
from ampmeter._core.outcome import Outcome, TerminationReason
from ampmeter._core.priced import use_pricing
from ampmeter._core.steps import Chain, timed_out
from ampmeter._core.usage import Usage
from ampmeter.call import Call, make_call
from ampmeter.errors import ExecutionCanceled, LimitExceeded
from ampmeter.graph import ExecutionGraph
from ampmeter.keys import (
    KEY_COST,
    KEY_ELAPSED_S,
    KEY_FORMAT_PARSE_ERROR_AT,
    KEY_FORMAT_PARSE_ERROR_CONSECUTIVE,
    KEY_FORMAT_PARSE_ERROR_TOTAL,
    KEY_ITERATIONS,
    KEY_RETRIES,
    KEY_STEPS,
    KEY_TOOLCHAIN_PARSE_ERROR_AT,
    KEY_TOOLCHAIN_PARSE_ERROR_CONSECUTIVE,
    KEY_TOOLCHAIN_PARSE_ERROR_TOTAL,
)
from ampmeter.limits import ExceededLimit, Limit, exceeded
from ampmeter.node import META_CONTEXT
from ampmeter.policies.compiled import Policies
from ampmeter.policies.options import LimitEvent, PolicyOptions, PressureHook
from ampmeter.shared.handoff import Handoffs
from ampmeter.stats import ExecutionStats
from ampmeter.trace import ModelCallTrace, ParseErrorTrace, ToolCallTrace, TraceRecord

if TYPE_CHECKING:
    from ampmeter.ledgers.base import Ledger
    from ampmeter.pricing.request_size import RequestSize
    from ampmeter.sinks.base import Sink

__all__ = [
    "Call",
    "Decision",
    "ExecutionContext",
    "TerminationReason",
    "WrapOptions",
    "any_open_context",
    "current_context",
    "current_node_id",
    "open_contexts",
    "use_pricing",
]

ADMISSION_TIMEOUT_S: Final = 30.0
"""How long a call that does not fit only because of calls in flight waits for them by default."""


class Decision(str, Enum):
    """What ``wrap_llm_call`` / ``wrap_tool_call`` tell the caller to do next."""

    ALLOW = "allow"
    RETRY = "retry"
    HALT = "halt"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class WrapOptions:
    """Options of ``wrap_llm_call`` / ``wrap_tool_call``.

    ``cost_estimate_hint`` is reserved before the call and, when it succeeds, recorded as its
    cost (the wrapped function returns nothing to price).
    """

    operation_name: str = ""
    cost_estimate_hint: float = 0.0
    model: str | None = None

    def __post_init__(self) -> None:
        _validate.text(self.operation_name, "operation_name")
        _validate.optional_text(self.model, "model")
        hint = _validate.amount(self.cost_estimate_hint, "cost_estimate_hint")
        object.__setattr__(self, "cost_estimate_hint", hint)


class ExecutionContext:
    """One agent run (or sub-agent): its limits, its live stats and its place in the graph.

    Keywords:

    * ``limits``: :class:`~ampmeter.Limit` objects on stats keys, fixed when the context is made
      (a sub-agent that needs others gets them from :meth:`spawn_child`);
    * ``max_cost_usd``, ``max_steps``, ``max_retries``: shortcuts for limits on ``amp:cost``,
      ``amp:steps`` (successful calls) and ``amp:retries``;
    * ``timeout_s``: wall time; calls after it are refused;
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
      it (return None).
    """

    def __init__(
        self,
        name: str = "agent_run",
        *,
        limits: Sequence[Limit] | None = None,
        max_cost_usd: float | None = None,
        max_steps: int | None = None,
        max_retries: int | None = None,
        timeout_s: float | None = None,
        chain_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        sinks: Iterable[Sink] = (),
        ledger: Ledger | None = None,
        on_ledger_error: Literal["halt", "allow"] = "halt",
        max_nodes: int = 0,
        admission_timeout_s: float | None = None,
        on_unpriced: Literal["refuse", "warn", "allow"] | None = None,
        warn_at: Sequence[float] | None = None,
        on_limit_event: Callable[[LimitEvent], None] | None = None,
        final_reserve_usd: float | None = None,
        max_repeats: int | None = None,
        max_input_tokens_per_call: int | None = None,
        on_budget_pressure: PressureHook | None = None,
        pressure_at: float | None = None,
    ) -> None:
        self._setup(
            None,
            name,
            limits,
            max_cost_usd,
            max_steps,
            max_retries,
            timeout_s,
            chain_id,
            metadata,
            sinks,
            ledger,
            on_ledger_error,
            max_nodes,
            admission_timeout_s,
            PolicyOptions.checked(
                on_unpriced=on_unpriced,
                warn_at=warn_at,
                on_limit_event=on_limit_event,
                final_reserve_usd=final_reserve_usd,
                max_repeats=max_repeats,
                max_input_tokens_per_call=max_input_tokens_per_call,
                on_budget_pressure=on_budget_pressure,
                pressure_at=pressure_at,
            ),
            None,
        )

    def _setup(
        self,
        parent: ExecutionContext | None,
        name: str,
        limits: Sequence[Limit] | None,
        max_cost_usd: object,
        max_steps: object,
        max_retries: object,
        timeout_s: object,
        chain_id: str | None,
        metadata: Mapping[str, Any] | None,
        sinks: Iterable[Sink],
        ledger: Ledger | None,
        on_ledger_error: str,
        max_nodes: int,
        admission_timeout_s: object,
        options: PolicyOptions,
        handoff_from: Any,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty str, got {name!r}")
        own_limits = build_limits(limits, max_cost_usd, max_steps, max_retries)
        shortcuts = sum(v is not None for v in (max_cost_usd, max_steps, max_retries))
        own_limits = options.with_shortcut_warnings(own_limits, shortcuts)
        options.check_reserve(own_limits)
        timeout = _validate.optional_amount(timeout_s, "timeout_s")
        wait = _validate.optional_amount(admission_timeout_s, "admission_timeout_s")
        if on_ledger_error not in ("halt", "allow"):
            raise ValueError(f"on_ledger_error must be 'halt' or 'allow', got {on_ledger_error!r}")
        meta = _validate.metadata(metadata)
        meta[META_CONTEXT] = True
        if ledger is not None:
            from ampmeter.ledgers.base import Ledger

            if not isinstance(ledger, Ledger):
                raise TypeError(f"ledger must be a Ledger, got {type(ledger).__name__}")
        own_sinks = tuple(sinks)
        for sink in own_sinks:
            if not callable(getattr(sink, "emit", None)):
                raise TypeError(f"sinks must be Sink objects, got {type(sink).__name__}")
        pricing = priced.layer()
        if timeout is not None and pricing is not None and hasattr(pricing, "load"):
            pricing.load()  # the price table's first load never counts against the timeout
        self.name = name
        self.parent = parent
        self.ledger = ledger
        self.on_ledger_error = on_ledger_error
        self.data: Any = None
        if parent is None:
            self.graph = ExecutionGraph(chain_id, max_nodes=max_nodes)
            self.stats = ExecutionStats(graph=self.graph)
            self._node_id = self.graph.create_root(name, meta)
            all_sinks: tuple[Sink, ...] = own_sinks
        else:
            self.graph = parent.graph
            self.stats = ExecutionStats(parent.stats)
            self._node_id = self.graph.begin_node(
                parent.current_parent_id(), "system", name, None, meta
            )
            self.graph.mark_running(self._node_id)
            inherited = parent.sinks
            all_sinks = inherited + tuple(s for s in own_sinks if s not in inherited)
        kernel, level = bound(self.stats)
        assert level is not None
        self._kernel = kernel
        parent_frame = parent.frame if parent is not None else None
        self._frame = Frame(
            self, parent_frame, level, own_limits, timeout, ledger, on_ledger_error, handoff_from
        )
        if wait is None:
            wait = parent.admission_timeout_s if parent is not None else ADMISSION_TIMEOUT_S
        self._admission_timeout_s: float = wait
        self._closed = False
        self._iteration = 0
        self._token: Any = None
        self._emitter = Emitter(name, self.graph.chain_id, all_sinks)
        self.policy_options: PolicyOptions = options.inherit(
            parent.policy_options if parent is not None else None
        )
        chain = self._frame.chain
        guards = tuple(f for f in chain if f.can_stop())
        self.policies: Policies | None = Policies.compile(
            self,
            tuple(f.context for f in chain),
            tuple(f.context for f in guards),
            tuple((f.level, f.rows) for f in guards),
        )
        self._chain = Chain(self._frame, kernel, self._emitter, self.policies, wait)
        self._handoffs = Handoffs(self._frame, kernel, self._emitter)
        OPEN.add(self)

    # -- identity -----------------------------------------------------------------------------

    @property
    def frame(self) -> Frame:
        """This context's part in admission (for its children; not user API)."""
        return self._frame

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
    def chain_id(self) -> str:
        """The id of the chain (graph) this context belongs to."""
        return self.graph.chain_id

    @property
    def node_id(self) -> str:
        """This context's own node: the graph's root, or the ``system`` node of a sub-agent."""
        return self._node_id

    @property
    def iteration(self) -> int:
        """How many iterations have started (1-based), 0 before the first."""
        return self._iteration

    @property
    def admission_timeout_s(self) -> float:
        """How long a call waits for calls in flight to make room."""
        return self._admission_timeout_s

    @property
    def sinks(self) -> tuple[Sink, ...]:
        """The sinks this context's nodes go to (its own and its parents')."""
        return self._emitter.sinks

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
    def closed(self) -> bool:
        """Whether :meth:`close` ran."""
        return self._closed

    @property
    def wrap_up(self) -> bool:
        """True once a soft limit of this context or an enclosing one was exceeded: the agent
        should finish with what it has (hard limits still hold)."""
        return self.policies is not None and self.policies.wrap_up

    def current_parent_id(self) -> str:
        """Where a node made now in this context goes: the innermost open call or step block
        of this context in this thread or task, else the context's own node."""
        current = CURRENT.get()
        if current is None or current[0] is not self or current[1] == self._node_id:
            return self._node_id
        found = self._kernel.open_ancestor(current[1], self._node_id)
        if found != current[1]:
            CURRENT.set((self, found))  # a block ended without restoring it: mend it here
        return found

    # -- children -----------------------------------------------------------------------------

    def spawn_child(
        self,
        name: str,
        *,
        limits: Sequence[Limit] | None = None,
        max_cost_usd: float | None = None,
        max_steps: int | None = None,
        max_retries: int | None = None,
        timeout_s: float | None = None,
        metadata: Mapping[str, Any] | None = None,
        sinks: Iterable[Sink] = (),
        ledger: Ledger | None = None,
        **policy_options: Any,
    ) -> ExecutionContext:
        """A context for a sub-agent: a ``system`` node here, stats that roll up into ours.

        ``policy_options`` are the policy keywords of :class:`ExecutionContext` (``warn_at``,
        ``max_repeats``, ...); the child inherits the others from this context."""
        self._check_open()
        child = ExecutionContext.__new__(ExecutionContext)
        child._setup(
            self,
            name,
            limits,
            max_cost_usd,
            max_steps,
            max_retries,
            timeout_s,
            None,
            metadata,
            sinks,
            ledger,
            self.on_ledger_error,
            0,
            None,
            PolicyOptions.checked(**policy_options),
            None,
        )
        return child

    # -- calls --------------------------------------------------------------------------------

    def llm_call(
        self,
        name: str | None = None,
        model: str | None = None,
        estimate_usd: float | None = None,
        max_tokens: int | None = None,
        *,
        prompt_tokens: int | None = None,
        prompt_text: str | None = None,
        provider: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        final: bool = False,
    ) -> Call:
        """An LLM call to run in a ``with`` block; entering it checks limits and reserves.

        The reservation is ``estimate_usd`` if given, else the price of the prompt (its token
        count, or the estimate of :mod:`ampmeter.pricing.request_size` from ``prompt_text``) and
        ``max_tokens`` output tokens (without ``max_tokens``, the pricing layer's default).
        A ``final`` call (the final answer) may spend the context's ``final_reserve_usd``.
        """
        self._check_open()
        _validate.optional_text(model, "model")
        _validate.optional_text(provider, "provider")
        label = _validate.text(name if name is not None else (model or "llm"), "name")
        out_est = 0 if max_tokens is None else _validate.count(max_tokens, "max_tokens")
        in_est, size = _prompt_estimate(prompt_tokens, prompt_text, model)
        priced_ok = True
        pricing = priced.layer()
        if estimate_usd is not None:
            cost_est = _validate.amount(estimate_usd, "estimate_usd")
        elif model and pricing is not None:
            # Without max_tokens the pricing layer assumes its default output length: a budget
            # must not treat a call of unknown length as free.
            estimated = pricing.estimate(
                model,
                provider,
                prompt_tokens=in_est,
                max_tokens=None if max_tokens is None else out_est,
            )
            priced_ok = estimated is not None
            cost_est = float(estimated or 0.0)
        else:
            cost_est = 0.0
        reservation = Usage("llm", model or "", "", in_est, out_est, 0, 0, cost_est, 1, 1)
        marks = None
        policies = self.policies
        if policies is not None:
            marks = policies.llm_marks(model, priced_ok, in_est, prompt_text, final)
        return self._call("llm", label, model, provider, reservation, metadata, size, marks)

    def embedding_call(
        self,
        name: str | None = None,
        model: str | None = None,
        *,
        prompt_text: str | None = None,
        prompt_tokens: int | None = None,
        estimate_usd: float | None = None,
        provider: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Call:
        """An embedding request: an ``embedding`` node whose input tokens and cost count toward
        ``amp:input_tokens[:<model>]`` and ``amp:cost[:<model>]`` (and their limits) like an LLM
        call's, without counting an LLM call or a step. Priced on exit unless recorded with a
        cost; the reservation is ``estimate_usd``, else the price of the input estimate."""
        self._check_open()
        _validate.optional_text(model, "model")
        _validate.optional_text(provider, "provider")
        label = _validate.text(name if name is not None else (model or "embedding"), "name")
        in_est, size = _prompt_estimate(prompt_tokens, prompt_text, model)
        pricing = priced.layer()
        if estimate_usd is not None:
            cost_est = _validate.amount(estimate_usd, "estimate_usd")
        elif model and pricing is not None:
            estimate = pricing.estimate(model, provider, prompt_tokens=in_est, max_tokens=0)
            cost_est = float(estimate or 0.0)
        else:
            cost_est = 0.0
        reservation = Usage("embedding", model or "", "", in_est, cost_usd=cost_est)
        return self._call("embedding", label, model, provider, reservation, metadata, size)

    def tool_call(
        self,
        name: str,
        *,
        estimate_usd: float | None = None,
        metadata: Mapping[str, Any] | None = None,
        arguments: object = None,
    ) -> Call:
        """A tool call to run in a ``with`` block (counts ``amp:tool_calls[:<name>]``).

        ``arguments`` (JSON-like) identify the call for the loop guard (``max_repeats``)."""
        self._check_open()
        if not isinstance(name, str) or not name:
            raise ValueError(f"tool name must be a non-empty str, got {name!r}")
        cost = _validate.optional_amount(estimate_usd, "estimate_usd") or 0.0
        reservation = Usage("tool", "", name, cost_usd=cost, calls=1, steps=1)
        marks = None if self.policies is None else self.policies.tool_marks(name, arguments)
        return self._call("tool", name, None, None, reservation, metadata, None, marks)

    def step(
        self, name: str, *, kind: str = "system", metadata: Mapping[str, Any] | None = None
    ) -> Call:
        """A block of system work (or ``embedding``/``retrieval``/``memory``) that groups calls."""
        self._check_open()
        _validate.text(name, "step name")
        _validate.text(kind, "kind")
        if kind in ("llm", "tool"):
            raise ValueError(f"use llm_call() or tool_call() for {kind!r} nodes")
        from ampmeter.graph import check_kind

        check_kind(kind)
        return self._call(kind, name, None, None, Usage(kind), metadata)

    def _call(
        self,
        kind: str,
        name: str,
        model: str | None,
        provider: str | None,
        reservation: Usage,
        metadata: Mapping[str, Any] | None,
        size: RequestSize | None = None,
        marks: Any = None,
    ) -> Call:
        parent = self.current_parent_id()
        return make_call(
            self,
            self._chain,
            parent,
            kind,
            name,
            model,
            provider,
            reservation,
            metadata,
            size,
            marks,
        )

    def retry(self, call: Call) -> None:
        """Count one retry on ``call``."""
        call.retry()

    def wrap_llm_call(
        self, fn: Callable[[], object], options: WrapOptions | None = None
    ) -> Decision:
        """Run ``fn`` as an LLM call: HALT if a limit stops it, RETRY if it raised, else ALLOW
        (the specification's interface; ``with ctx.llm_call(...)`` is the usual way)."""
        opts = options or WrapOptions()
        hint = opts.cost_estimate_hint
        call = self.llm_call(opts.operation_name or "llm", model=opts.model, estimate_usd=hint)
        return _wrap(call, fn, hint)

    def wrap_tool_call(
        self, fn: Callable[[], object], options: WrapOptions | None = None
    ) -> Decision:
        """Run ``fn`` as a tool call: HALT if a limit stops it, RETRY if it raised, else ALLOW
        (the specification's interface; ``with ctx.tool_call(...)`` is the usual way)."""
        opts = options or WrapOptions()
        hint = opts.cost_estimate_hint
        call = self.tool_call(opts.operation_name or "tool", estimate_usd=hint)
        return _wrap(call, fn, hint)

    # -- trace records ------------------------------------------------------------------------

    def trace(self, record: TraceRecord) -> None:
        """Update the stats for a trace record, as the matching call would (the
        specification's interface for usage reported after the fact)."""
        level = self._frame.level
        if isinstance(record, ModelCallTrace):
            usage = Usage.checked(
                model=_validate.text(record.model, "model"),
                tokens_in=record.input_tokens,
                tokens_out=record.output_tokens,
                cached_tokens=record.cached_tokens,
                reasoning_tokens=record.reasoning_tokens,
                cost_usd=record.cost_usd,
                calls=1,
            )
            self._kernel.add_usage(level, usage)
            if self.policies is not None:
                self.policies.traced(usage)
        elif isinstance(record, ToolCallTrace):
            if not isinstance(record.tool_name, str) or not record.tool_name:
                raise ValueError(f"tool_name must be a non-empty str, got {record.tool_name!r}")
            usage = Usage("tool", tool=record.tool_name, calls=1)
            self._kernel.add_usage(level, usage)
            if self.policies is not None:
                self.policies.traced(usage)
        elif isinstance(record, ParseErrorTrace):
            if record.error_type == "format":
                keys = (
                    KEY_FORMAT_PARSE_ERROR_TOTAL,
                    KEY_FORMAT_PARSE_ERROR_AT,
                    KEY_FORMAT_PARSE_ERROR_CONSECUTIVE,
                )
            elif record.error_type == "toolchain":
                keys = (
                    KEY_TOOLCHAIN_PARSE_ERROR_TOTAL,
                    KEY_TOOLCHAIN_PARSE_ERROR_AT,
                    KEY_TOOLCHAIN_PARSE_ERROR_CONSECUTIVE,
                )
            else:
                raise ValueError(
                    f"error_type must be 'format' or 'toolchain', got {record.error_type!r}"
                )
            total, at, consecutive = keys
            for key in (total, at + str(self._iteration), consecutive):
                self.stats.incr_counter(key)
        else:
            raise TypeError(
                "trace() takes ModelCallTrace, ToolCallTrace or ParseErrorTrace, "
                f"got {type(record).__name__}"
            )

    def parse_ok(self, kind: Literal["format", "toolchain"]) -> None:
        """A successful parse: reset the matching consecutive parse-error counter."""
        if kind == "format":
            self.stats.reset_counter(KEY_FORMAT_PARSE_ERROR_CONSECUTIVE)
        elif kind == "toolchain":
            self.stats.reset_counter(KEY_TOOLCHAIN_PARSE_ERROR_CONSECUTIVE)
        else:
            raise ValueError(f"kind must be 'format' or 'toolchain', got {kind!r}")

    # -- iterations, cancel, close ------------------------------------------------------------

    def start_iteration(self) -> int:
        """Start a new iteration if every limit allows it, and return its number.

        Limits are checked first, with the new iteration counted as pending: with an iteration
        limit of N exactly N iterations start, and a stop names the limit actually exceeded.
        Raises ``LimitExceeded`` (the iteration does not start) or ``ExecutionCanceled`` once
        this context or an enclosing one was canceled.
        """
        self._check_open()
        if self.canceled:
            raise ExecutionCanceled(f"context {self.name!r} was canceled")
        self._raise_if_exceeded()
        frame = self._frame
        own = tuple(row for row in frame.rows if row[0] is False and row[1] == KEY_ITERATIONS)
        if own:
            found = self._kernel.check(((frame.level, own),), {KEY_ITERATIONS: 1})
            if found is not None:
                self._stop(frame, exceeded(found[1]), TerminationReason.LIMIT_EXCEEDED)
        self._iteration = self._kernel.bump(frame.level, KEY_ITERATIONS)
        return self._iteration

    def end_iteration(self) -> None:
        """An iteration completed: raise ``LimitExceeded`` if a limit is exceeded now."""
        self._check_open()
        self._raise_if_exceeded()

    def _raise_if_exceeded(self) -> None:
        chain = self._chain
        timed = tuple(f for f in chain.guards if f.deadline is not None)
        hit = timed_out(timed) if timed else None
        if hit is None and chain.guard_rows:
            found = self._kernel.check(chain.guard_rows, None)
            if found is not None:
                hit = chain.owner(found)
        if hit is not None:
            self._stop(*hit)

    def _stop(self, owner: Frame, limit: ExceededLimit, reason: TerminationReason) -> None:
        self._frame.stop(owner, limit, reason)
        raise LimitExceeded(f"{self.name}: {limit}", limit, None)

    def cancel(self) -> None:
        """Stop this context: further calls in it (and in its children) are halted."""
        self._frame.canceled = True
        if self.termination_reason is None:
            self.termination_reason = TerminationReason.CONTEXT_CANCELED

    @property
    def canceled(self) -> bool:
        """True once this context or an enclosing one was canceled."""
        return self._frame.any_canceled()

    def close(self, exc: BaseException | None = None) -> None:
        """End the context (idempotent): its node ends and its sinks are flushed.

        Raises the first error a sink reported (here or while flushing) unless the context is
        closing because of ``exc``.
        """
        if self._closed:
            return
        self._closed = True
        OPEN.discard(self)
        self._handoffs.settle()
        if self.termination_reason is None:
            self.termination_reason = _termination(exc)
            if isinstance(exc, LimitExceeded):
                self.exceeded_limit = self.exceeded_limit or exc.exceeded
        reason = self.termination_reason
        if reason is TerminationReason.SUCCESS:
            outcome = Outcome("success")
        elif reason is TerminationReason.ERROR and exc is not None:
            outcome = Outcome(
                "fail", error_class=type(exc).__name__, stop_reason=redact.error_text(exc)
            )
        else:
            if self.exceeded_limit is not None:
                stop = str(self.exceeded_limit)
            elif isinstance(exc, LimitExceeded | ExecutionCanceled):
                stop = str(exc)
            else:
                stop = reason.value if reason is not None else "halt"
            outcome = Outcome("halt", stop_reason=stop)
        node = self._kernel.node(self._node_id)
        if self._kernel.end(node, outcome):
            self._emitter.emit(node)
        self._emitter.flush()
        if self._emitter.errors and exc is None:
            raise self._emitter.errors[0]

    def __enter__(self) -> ExecutionContext:
        self._token = CURRENT.set((self, self._node_id))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        token, self._token = self._token, None
        parent = self.parent
        restore(token, None if parent is None else (parent, parent.node_id))
        self.close(exc)

    async def __aenter__(self) -> ExecutionContext:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)

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
            "gauges": self.stats.gauges(),
            "reserved": self.stats.reserved(),
            "sink_errors": [f"{type(e).__name__}: {e}" for e in self._emitter.errors],
            "sink_failures": sum(self._emitter.failures.values()),
            "limit_events": [] if self.policies is None else self.policies.events(),
            "graph": self.graph.snapshot(),
        }

    def __repr__(self) -> str:
        return f"ExecutionContext(name={self.name!r}, chain_id={self.chain_id!r})"

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"context {self.name!r} is closed")

    # -- hand-off to another process ----------------------------------------------------------

    def handoff(
        self,
        name: str,
        *,
        limits: Sequence[Limit] | None = None,
        max_cost_usd: float | None = None,
        max_steps: int | None = None,
        max_retries: int | None = None,
        timeout_s: float | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> str:
        """Start a child that runs in another process; return its token (no secret in it).

        A ``system`` node is added here for the child. The other process calls
        :meth:`from_handoff` with the token: its calls then count at once toward its own limits
        (these arguments, as for :meth:`spawn_child`) and toward those of this context and of
        every context above it that shares a ledger, through the ledger's scope
        ``<scope>/<hand-off node>``. When this context closes, the child's spend is read from
        the ledger and added to these stats and the graph's aggregates (close it after the
        child is done). Needs a shared ledger (``SqliteLedger`` or ``RedisLedger``) on this
        context or one above it.
        """
        self._check_open()
        _validate.text(name, "name", empty=False)
        own = build_limits(limits, max_cost_usd, max_steps, max_retries)
        timeout = _validate.optional_amount(timeout_s, "timeout_s")
        meta = _validate.metadata(metadata)
        parent_id = self.current_parent_id()
        return self._handoffs.give(
            name,
            lambda: self._kernel.begin(parent_id, "system", name, None, meta),
            self.chain_id,
            own,
            timeout,
        )

    @classmethod
    def from_handoff(
        cls, token: str, *, ledger: Ledger | None = None, sinks: Iterable[Sink] = ()
    ) -> ExecutionContext:
        """The context of a child handed off with :meth:`handoff`, in this process.

        Its calls reserve in the hand-off's ledger scope and every scope above it, so they stop
        at the child's limits and at its parents' remaining budget. ``ledger`` (same backend,
        at or above the hand-off's scope) is needed when the backend wants credentials; else
        one is opened from the token. Nodes reach ``sinks`` with ids of their own under the
        hand-off node and the parent's chain id, so both logs read as one tree.
        """
        import secrets

        from ampmeter.propagation import decode, open_ledger  # ledgers load only when used
        from ampmeter.sinks.relabel import RelabeledSink

        found = decode(token)
        shared = open_ledger(found, ledger)
        prefix = f"{found.node_id}.{secrets.token_hex(3)}."
        wrapped = [
            RelabeledSink(
                sink, prefix=prefix, attach_to=found.node_id, depth_offset=found.depth + 1
            )
            for sink in sinks
        ]
        timeout = None if found.deadline is None else max(found.deadline - time.time(), 0.0)
        ctx = cls.__new__(cls)
        ctx._setup(
            None,
            found.name,
            found.limits,
            None,
            None,
            None,
            timeout,
            found.chain_id,
            {"handoff_from": found.node_id},
            wrapped,
            shared,
            "halt",
            0,
            None,
            PolicyOptions(),
            found,
        )
        ctx.frame.span_prefix = prefix
        return ctx

    def refresh_handoffs(self) -> dict[str, Any]:
        """Read the spend of this context's hand-offs from the ledger again; add what is new.

        A handed-off child may go on spending after this context closed (a background worker):
        its spend reaches these stats (and every context above) when this is called, and
        :meth:`snapshot` calls it. Returns what was added, per key. A ledger that cannot be read
        now adds nothing; the next call catches up.
        """
        return self._handoffs.refresh()


def _wrap(call: Call, fn: Callable[[], object], cost: float) -> Decision:
    try:
        call.start()
    except (LimitExceeded, ExecutionCanceled):
        return Decision.HALT
    try:
        fn()
    except Exception as exc:
        call.finish(exc)
        return Decision.RETRY
    except BaseException as exc:
        call.finish(exc)
        raise
    if call.kind == "llm":
        call.record(cost_usd=cost)
    elif cost:
        call.cost_usd = cost
    call.finish()
    return Decision.ALLOW


def _prompt_estimate(
    prompt_tokens: object, prompt_text: object, model: str | None
) -> tuple[int, RequestSize | None]:
    """A call's estimated prompt tokens (the caller's count, else the estimate from the text)
    and the prompt's measure (None without text), for reservations and learning."""
    if prompt_tokens is not None:
        return _validate.count(prompt_tokens, "prompt_tokens"), None
    if prompt_text is not None:
        from ampmeter.pricing import request_size

        size = request_size.measure_text(_validate.text(prompt_text, "prompt_text"))
        return request_size.input_tokens(size, model), size
    return 0, None


def _termination(exc: BaseException | None) -> TerminationReason:
    if exc is None:
        return TerminationReason.SUCCESS
    if isinstance(exc, LimitExceeded):
        timed_out = exc.exceeded is not None and exc.exceeded.key == KEY_ELAPSED_S
        return TerminationReason.TIMEOUT if timed_out else TerminationReason.LIMIT_EXCEEDED
    if isinstance(exc, ExecutionCanceled):
        return TerminationReason.CONTEXT_CANCELED
    return TerminationReason.ERROR


def build_limits(
    limits: Sequence[Limit] | None,
    max_cost_usd: object,
    max_steps: object,
    max_retries: object,
) -> tuple[Limit, ...]:
    """A context's own limits: ``limits`` and the shortcuts, checked."""
    built: list[Limit] = []
    if limits is not None:
        if isinstance(limits, Limit) or not isinstance(limits, Iterable):
            raise TypeError("limits must be a list of Limit")
        for limit in limits:
            if not isinstance(limit, Limit):
                raise TypeError(f"limits must hold Limit objects, got {type(limit).__name__}")
            built.append(limit)
    cost = _validate.optional_amount(max_cost_usd, "max_cost_usd")
    steps = None if max_steps is None else _validate.count(max_steps, "max_steps")
    retries = None if max_retries is None else _validate.count(max_retries, "max_retries")
    if cost is not None:
        built.append(Limit(KEY_COST, cost))
    if steps is not None:
        built.append(Limit(KEY_STEPS, steps))
    if retries is not None:
        built.append(Limit(KEY_RETRIES, retries))
    return tuple(built)
