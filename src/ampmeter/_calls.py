"""The calls a context makes: LLM and embedding calls, tool calls, steps, iterations, and the
specification's compatibility paths (``wrap_*`` with a :class:`~ampmeter.wrapping.Decision`, and
``trace`` records for usage reported after the fact).

:class:`CallMaker` is the part of :class:`~ampmeter.ExecutionContext` that makes calls; the
context gives it its admission, its frame and its policies when it is made.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Literal

from ampmeter import _validate
from ampmeter._core.idempotency import META_IDEMPOTENCY_KEY
from ampmeter._core.steps import Stop
from ampmeter._core.ticket import Reserved
from ampmeter._current import CURRENT
from ampmeter._lineage import META_CONTEXTS, Lineage
from ampmeter.call import Call
from ampmeter.errors import ExecutionCanceled, LimitExceeded
from ampmeter.graph import check_node
from ampmeter.keys import (
    KEY_FORMAT_PARSE_ERROR_CONSECUTIVE,
    KEY_ITERATIONS,
    KEY_TOOLCHAIN_PARSE_ERROR_CONSECUTIVE,
)
from ampmeter.node import META_PROVIDER
from ampmeter.policies.options import META_LIMIT_EVENTS
from ampmeter.pricing.plan import plan_for
from ampmeter.trace import TraceRecord, trace_effect
from ampmeter.wrapping import Decision, WrapOptions, run_wrapped

if TYPE_CHECKING:
    from ampmeter._core.frame import Frame
    from ampmeter._core.kernel import Kernel
    from ampmeter._core.steps import Admission
    from ampmeter.graph import ExecutionGraph
    from ampmeter.limits import ExceededLimit
    from ampmeter.policies.configured import ConfiguredPolicies
    from ampmeter.pricing.plan import PricePlan
    from ampmeter.pricing.request_size import RequestSize
    from ampmeter.pricing.source import Pricing
    from ampmeter.stats import ExecutionStats

__all__ = ["CallMaker"]

_MODEL_NAMES = ("name", "model", "provider")  # a model call's names, in order
_NAMED = (*_MODEL_NAMES, "idempotency_key")
_NOTHING: Reserved = (0, 0, 0, 0)  # what a step reserves


class CallMaker:
    """Makes a context's calls (see the module docstring)."""

    name: str
    _lineage: Lineage
    _admission: Admission
    _frame: Frame
    _kernel: Kernel
    _estimate: str
    _pricing: Pricing
    _iteration: int
    _closed: bool
    _node_id: str
    _policies: ConfiguredPolicies
    stats: ExecutionStats
    graph: ExecutionGraph

    def _check_open(self) -> None:
        raise NotImplementedError

    # -- calls --------------------------------------------------------------------------------

    def llm_call(
        self,
        name: str | None = None,
        model: str | None = None,
        estimate_usd: float | Decimal | None = None,
        max_tokens: int | None = None,
        *,
        prompt_tokens: int | None = None,
        prompt_text: str | None = None,
        request: RequestSize | None = None,
        provider: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        final: bool = False,
        idempotency_key: str | None = None,
    ) -> Call:
        """An LLM call to run in a ``with`` block; entering it checks limits and reserves.

        The reservation is ``estimate_usd`` if given, else the price of the input (its token
        count ``prompt_tokens``, else the estimate from the request's measure ``request``, else
        from ``prompt_text``, in the context's ``estimate`` mode) and the output (``max_tokens``;
        see :class:`ExecutionContext` for ``estimate="bound"``). A model without a price (``""``
        included) is unpriced. A ``final`` call (the final answer) may spend the context's
        ``final_reserve_usd``. An ``idempotency_key`` (a replayed workflow step's) counts the
        call once per run and per shared ledger scope: a key seen before adds nothing, here or
        in the ledger (the node notes ``duplicate_of``: the node that counted it, or
        ``"ledger:<scope>"`` when another process did). A provider's response id is never a
        key unless ``instrument(response_id_keys=True)`` asks for it (a caching gateway). A run
        remembers its latest 20,000 keys for at most a day.
        """
        _validate.optional_texts(_NAMED, name, model, provider, idempotency_key)
        meta = {} if metadata is None else _validate.metadata(metadata)
        return self.model_call(
            "llm",
            meta,
            (name, model, provider),
            estimate_usd,
            prompt_tokens,
            prompt_text,
            max_tokens=max_tokens,
            request=request,
            final=final,
            idempotency_key=idempotency_key,
        )

    def embedding_call(
        self,
        name: str | None = None,
        model: str | None = None,
        *,
        prompt_text: str | None = None,
        prompt_tokens: int | None = None,
        estimate_usd: float | Decimal | None = None,
        provider: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Call:
        """An embedding request: an ``embedding`` node whose input tokens and cost count toward
        ``amp:input_tokens[:<model>]`` and ``amp:cost[:<model>]`` (and their limits) like an LLM
        call's, without counting an LLM call or a step. Priced on exit unless recorded with a
        cost; the reservation is ``estimate_usd``, else the price of the input estimate."""
        _validate.optional_texts(_MODEL_NAMES, name, model, provider)
        meta = {} if metadata is None else _validate.metadata(metadata)
        return self.model_call(
            "embedding", meta, (name, model, provider), estimate_usd, prompt_tokens, prompt_text
        )

    def model_call(
        self,
        kind: Literal["llm", "embedding"],
        metadata: dict[str, Any],
        names: tuple[str | None, str | None, str | None],
        estimate_usd: float | Decimal | None = None,
        prompt_tokens: int | None = None,
        prompt_text: str | None = None,
        *,
        max_tokens: int | None = 0,
        request: RequestSize | None = None,
        final: bool | None = False,
        idempotency_key: str | None = None,
        sent: Mapping[str, Any] | None = None,
        refused: ExceededLimit | None = None,
    ) -> Call:
        """An LLM call or an embedding request (``max_tokens`` 0: it writes nothing), its
        reservation estimated from its model, from its checked ``names`` (name, model,
        provider) and its own ``metadata`` (a dict made for it): what :meth:`llm_call` and
        :meth:`embedding_call` make once they checked their arguments, and what an SDK's
        instrumentation asks for with the values it checked where it read the request. Its
        ``sent`` (what the request sends: its keyword arguments or JSON body) identifies it for
        the loop guard; ``refused`` is a budget-pressure hook's refusal, reported when the call
        is admitted; ``final`` None: final inside :func:`~ampmeter.final_call`."""
        name, model, provider = names
        label = name if name is not None else (model or kind)
        plan = plan_for(self._pricing, model, provider)
        tokens_in, tokens_out, cost, priced, size = plan.reserve(
            estimate_usd=estimate_usd,
            max_tokens=max_tokens,
            prompt_tokens=prompt_tokens,
            prompt_text=prompt_text,
            request=request,
            mode=self._estimate,  # type: ignore[arg-type]
        )
        # An LLM call reserves one call and one step; an embedding none.
        reserved = (tokens_in, tokens_out, cost, int(kind == "llm"))
        policies = self._policies
        marks = None
        # (A priced call's marks only when a step marks priced calls; an unpriced one's when
        # any policy step is in force.)
        if kind == "llm" and (policies.marking if priced else policies.steps):
            marks = policies.llm_marks(model, priced, tokens_in, final, prompt_text, sent, refused)
        return self._begin(
            metadata,
            (kind, label, model),
            reserved,
            priced,
            price_plan=plan,
            provider=provider,
            prompt_size=size,
            marks=marks,
            idempotency_key=idempotency_key,
        )

    def tool_call(
        self,
        name: str,
        *,
        estimate_usd: float | Decimal | None = None,
        metadata: Mapping[str, Any] | None = None,
        arguments: object = None,
        idempotency_key: str | None = None,
    ) -> Call:
        """A tool call to run in a ``with`` block (counts ``amp:tool_calls[:<name>]``).

        ``arguments`` (JSON-like) identify the call for the loop guard (``max_repeats``);
        ``idempotency_key`` counts it once (see :meth:`llm_call`)."""
        _validate.optional_text(idempotency_key, "idempotency_key")
        if not isinstance(name, str) or not name:
            raise ValueError(f"tool name must be a non-empty str, got {name!r}")
        cost = (
            0
            if estimate_usd is None
            else _validate.nano(estimate_usd, "estimate_usd", round_up=True)
        )
        marks = self._policies.tool_marks(name, arguments)
        meta = {} if metadata is None else _validate.metadata(metadata)
        node = ("tool", name, None)
        reserved = (0, 0, cost, 1)  # its cost, one call and one step
        return self._begin(meta, node, reserved, marks=marks, idempotency_key=idempotency_key)

    def step(
        self, name: str, *, kind: str = "system", metadata: Mapping[str, Any] | None = None
    ) -> Call:
        """A block of system work (or ``embedding``/``retrieval``/``memory``) that groups calls."""
        _validate.text(name, "step name")
        _validate.text(kind, "kind")
        if kind in ("llm", "tool"):
            raise ValueError(f"use llm_call() or tool_call() for {kind!r} nodes")
        check_node(kind, name, None)
        meta = {} if metadata is None else _validate.metadata(metadata)
        return self._begin(meta, (kind, name, None), _NOTHING)

    def _begin(
        self,
        meta: dict[str, Any],
        node: tuple[str, str, str | None],
        reserved: Reserved,
        priced: bool = True,
        *,
        provider: str | None = None,
        marks: Any = None,
        idempotency_key: str | None = None,
        price_plan: PricePlan | None = None,
        prompt_size: RequestSize | None = None,
    ) -> Call:
        """A call reserving ``reserved``, with the other fields of its
        :class:`~ampmeter.Call`, following its context's plan for its kind and model or tool
        (``priced`` or not), its node (kind, name, model) begun under the current node with
        ``meta`` (the call's own dict); not yet admitted. A closed context makes no calls."""
        if self._closed:
            self._check_open()
        kind, name, model = node
        tool = name if kind == "tool" else ""
        admission = self._admission
        plan = admission.plans.get((kind, model, tool, priced)) or admission.plan(
            kind, model, tool, priced
        )
        call = Call(
            self,  # type: ignore[arg-type]
            reserved,
            plan,
            provider=provider,
            marks=marks,
            idempotency_key=idempotency_key,
            price_plan=price_plan,
            prompt_size=prompt_size,
        )
        meta.setdefault("context", self.name)  # the event log's metadata.context, for views
        meta.setdefault(META_CONTEXTS, self._lineage)  # and the contexts it ran in, root first
        if provider is not None:
            meta[META_PROVIDER] = provider
        if idempotency_key is not None:  # (on its node from the start: see ticket.stand_in)
            meta[META_IDEMPOTENCY_KEY] = idempotency_key
        parent = self.current_parent_id()
        call.kernel_node = self._kernel.begin(parent, kind, name, model, meta, call)
        return call

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
        return run_wrapped(call, fn, hint)

    def wrap_tool_call(
        self, fn: Callable[[], object], options: WrapOptions | None = None
    ) -> Decision:
        """Run ``fn`` as a tool call: HALT if a limit stops it, RETRY if it raised, else ALLOW
        (the specification's interface; ``with ctx.tool_call(...)`` is the usual way)."""
        opts = options or WrapOptions()
        hint = opts.cost_estimate_hint
        call = self.tool_call(opts.operation_name or "tool", estimate_usd=hint)
        return run_wrapped(call, fn, hint)

    # -- trace records ------------------------------------------------------------------------

    def trace(self, record: TraceRecord) -> None:
        """Update the stats for a trace record, as the matching call would (the
        specification's interface for usage reported after the fact)."""
        usage, keys = trace_effect(record)
        key = getattr(record, "idempotency_key", None)
        if usage is not None and key is not None:
            seen = self._frame.seen  # the run's keys, shared with its calls
            if seen.claim(_validate.text(key, "idempotency_key", empty=False), ("trace", 0)):
                return  # a replayed record: counted once already
        if usage is not None:
            self._kernel.add_usage(self._frame.level, usage)
            events = self._policies.traced(usage)
            if events:  # what a call's settlement would report, on the context's own node
                graph, node_id = self.graph, self._node_id
                ended = graph.node(node_id).metadata.get(META_LIMIT_EVENTS, ())
                graph.update_metadata(node_id, {META_LIMIT_EVENTS: [*ended, *events]})
        else:
            total, at, consecutive = keys
            for key in (total, at + str(self._iteration), consecutive):
                self.stats.incr_counter(key)

    def parse_ok(self, kind: Literal["format", "toolchain"]) -> None:
        """A successful parse: reset the matching consecutive parse-error counter."""
        if kind == "format":
            self.stats.reset_counter(KEY_FORMAT_PARSE_ERROR_CONSECUTIVE)
        elif kind == "toolchain":
            self.stats.reset_counter(KEY_TOOLCHAIN_PARSE_ERROR_CONSECUTIVE)
        else:
            raise ValueError(f"kind must be 'format' or 'toolchain', got {kind!r}")

    # -- iterations ---------------------------------------------------------------------------

    def start_iteration(self) -> int:
        """Start a new iteration if every limit allows it, and return its number.

        Limits are checked first, with the new iteration counted as pending: with an iteration
        limit of N exactly N iterations start, and a stop names the limit actually exceeded.
        Raises ``LimitExceeded`` (the iteration does not start) or ``ExecutionCanceled`` once
        this context or an enclosing one was canceled.
        """
        self._check_open()
        if self._frame.any_canceled():
            raise ExecutionCanceled(f"context {self.name!r} was canceled")
        self._stop_at(self._admission.exceeded_now())
        self._stop_at(self._admission.iteration_refused())
        self._iteration = self._kernel.bump(self._frame.level, KEY_ITERATIONS)
        return self._iteration

    def end_iteration(self) -> None:
        """An iteration completed: raise ``LimitExceeded`` if a limit is exceeded now."""
        self._check_open()
        self._stop_at(self._admission.exceeded_now())

    def _stop_at(self, found: Stop | None) -> None:
        """Stop the context at ``found``'s limit (``LimitExceeded``), if a limit was found."""
        if found is not None:
            owner, limit, reason = found
            self._frame.stop(owner, limit, reason)
            raise LimitExceeded(f"{self.name}: {limit}", limit, None)
