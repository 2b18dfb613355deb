"""ExecutionContext: one per agent (or sub-agent) run; checks, records and contains its calls.

A call goes through four steps:

1. **begin** - a node is created in the shared graph under the current node;
2. **admit** - the call's reservation (a :class:`~ampmeter.usage.Usage` estimate: cost, prompt
   and ``max_tokens`` tokens, one step) is checked, with what is spent and already reserved,
   against the limits of this context and every enclosing one. If one would be exceeded the node
   is halted and :class:`~ampmeter.LimitExceeded` is raised before any user code runs; otherwise
   the reservation is held, so concurrent calls see each other;
3. **run** - the user's block (or the SDK request) runs;
4. **settle** - the hold is replaced by the actual usage in every enclosing context at once, the
   node ends, sinks receive it, and limits are checked again.

Steps 2 and 4 each happen in one step of the accounting kernel (:mod:`ampmeter._kernel`).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import threading
import time
import uuid
import warnings
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar

from ampmeter import _validate, redact
from ampmeter._kernel import Busy, Guard, Hit, Level
from ampmeter.errors import (
    BudgetBusy,
    BudgetUnavailable,
    ExecutionCanceled,
    HandoffError,
    LimitExceeded,
)
from ampmeter.graph import ExecutionGraph
from ampmeter.keys import (
    KEY_COST,
    KEY_COST_FOR,
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
    KEY_UNPRICED_LLM_CALLS,
)
from ampmeter.limits import ExceededLimit, Limit, LimitType, compile_limits, exceeded
from ampmeter.node import (
    META_CACHE_WRITE_TOKENS,
    META_CACHED_TOKENS,
    META_CONTEXT,
    META_COST_STATUS,
    META_PRICING_VERSION,
    META_PROVIDER,
    META_REASONING_TOKENS,
    META_TOOL_CALLS_MADE,
    TERMINAL_STATUSES,
    Node,
)
from ampmeter.policies import (
    KEY_REPEATS_FOR,
    CallMarks,
    LimitEvent,
    Policies,
    PolicyOptions,
    PressureHook,
)
from ampmeter.pricing import request_size
from ampmeter.pricing.request_size import RequestSize
from ampmeter.sinks.base import Sink
from ampmeter.stats import ExecutionStats
from ampmeter.trace import ModelCallTrace, ParseErrorTrace, ToolCallTrace, TraceRecord
from ampmeter.usage import Shape, Usage, picker

if TYPE_CHECKING:
    from ampmeter.ledgers.base import Ledger, Refusal, Reservation
    from ampmeter.propagation import Handoff

_T = TypeVar("_T")

__all__ = [
    "Call",
    "Decision",
    "ExecutionContext",
    "TerminationReason",
    "WrapOptions",
    "current_context",
    "current_node_id",
    "use_pricing",
]


class TerminationReason(str, Enum):
    """Why a context (or an executor run) ended."""

    SUCCESS = "success"
    ERROR = "error"
    CONTEXT_CANCELED = "context_canceled"
    HOOK_ABORT = "hook_abort"
    LIMIT_EXCEEDED = "limit_exceeded"
    TIMEOUT = "timeout"

    def __str__(self) -> str:
        return self.value


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


# -- pricing ------------------------------------------------------------------------------------


class _DefaultPricing:
    """``ampmeter.pricing``, imported when the first call needs a price (it loads the table);
    from then on the module itself stands in :data:`_pricing`."""

    def price(self, *args: Any, **kwargs: Any) -> Any:
        return self._module().price(*args, **kwargs)

    def estimate(self, *args: Any, **kwargs: Any) -> Any:
        return self._module().estimate(*args, **kwargs)

    def load(self) -> None:
        self._module().load()

    def _module(self) -> Any:
        global _pricing
        from ampmeter import pricing

        if _pricing is self:
            _pricing = pricing  # later calls skip the import statement and this hop
        return pricing


_pricing: Any = _DefaultPricing()  # or a stand-in with the same price() and estimate()


def use_pricing(layer: Any) -> None:
    """Price calls recorded without a cost with ``layer`` (``ampmeter.pricing`` by default;
    None prices nothing: such calls are ``unpriced``). Wiring for tests and embedders."""
    global _pricing
    _pricing = layer


# -- the current context ------------------------------------------------------------------------

_CURRENT: contextvars.ContextVar[tuple[ExecutionContext, str] | None] = contextvars.ContextVar(
    "ampmeter_current", default=None
)


def current_context() -> ExecutionContext | None:
    """The innermost context entered in this thread or task, or None."""
    current = _CURRENT.get()
    return current[0] if current is not None else None


def open_contexts() -> list[ExecutionContext]:
    """Contexts made and not yet closed, in any thread (to explain an unmetered call)."""
    return list(_OPEN)


def any_open_context() -> bool:
    """Whether any context is open, in any thread (without copying the set, as every SDK call
    outside a context asks)."""
    return bool(_OPEN)


_OPEN: weakref.WeakSet[ExecutionContext] = weakref.WeakSet()


def current_node_id() -> str | None:
    """The innermost open node (a call or step block, or a context's own node), or None."""
    current = _CURRENT.get()
    return current[1] if current is not None else None


def _restore(token: contextvars.Token[Any] | None, context: ExecutionContext) -> None:
    """Undo ``_CURRENT.set``; from another task or thread, fall back to the context's level."""
    if token is None:
        return
    try:
        _CURRENT.reset(token)
    except ValueError:
        _CURRENT.set((context, context.node_id))


ADMISSION_TIMEOUT_S: Final = 30.0
"""How long a call that does not fit only because of calls in flight waits for them by default."""

_NEW, _ADMITTED, _DONE = 0, 1, 2
_DUST: Final = 1e-9  # relative: holds below this share of a ceiling are float residue
# Pauses of a call waiting for room: the first, doubled up to the longest (jittered).
_FIRST_PAUSE_S: Final = 0.005
_LONGEST_PAUSE_S: Final = 0.1
_INF: Final = float("inf")
_MAX_COUNT: Final = _validate.MAX_COUNT
# Usage from already-checked values, without the Python-level __new__ of a named tuple.
_usage: Final = tuple.__new__
_NO_HOLDS: Final[tuple[tuple[Ledger, Reservation], ...]] = ()
_LOCAL_TERMINATIONS: Final = frozenset(
    {TerminationReason.LIMIT_EXCEEDED, TerminationReason.TIMEOUT}
)
_CACHE_MAX: Final = 4_096  # per context: reservation shapes with a resolved hold plan


class Call:
    """One call (LLM, tool or step) in a context: reserve before, record after.

    Use it as ``with ctx.llm_call(...) as call:`` (or ``async with``), and report usage with
    :meth:`record`. Integrations that cannot wrap a block (a stream that ends later) call
    :meth:`start` and :meth:`finish` themselves.
    """

    __slots__ = (
        "__weakref__",
        "_ledger_holds",
        "_prompt_size",
        "_recorded",
        "_reservation",
        "_state",
        "_token",
        "cache_write_tokens",
        "cached_tokens",
        "context",
        "cost_usd",
        "kind",
        "model",
        "name",
        "node",
        "node_id",
        "policy",
        "provider",
        "reasoning_tokens",
        "tokens_in",
        "tokens_out",
        "tool_calls_made",
    )

    def __init__(
        self,
        context: ExecutionContext,
        kind: str,
        name: str,
        model: str | None,
        provider: str | None,
        reservation: Usage,
        metadata: Mapping[str, Any] | None,
        prompt_size: RequestSize | None = None,
    ) -> None:
        meta = {} if metadata is None else _validate.metadata(metadata)
        meta.setdefault("context", context.name)  # the event log's metadata.context
        if provider is not None:
            meta[META_PROVIDER] = provider
        self.context = context
        self.kind = kind
        self.name = name
        self.model = model
        self.provider = provider
        current = _CURRENT.get()
        parent = context._node_id
        if current is not None and current[0] is context and current[1] != parent:
            parent = context._parent_node_id()  # inside another call of this context
        self.node: Node = context._kernel.begin(parent, kind, name, model, meta)
        self.node_id = self.node.node_id
        self.tokens_in: int | None = None
        self.tokens_out: int | None = None
        self.cost_usd: float | None = None
        self.cached_tokens = 0
        self.cache_write_tokens = 0
        self.reasoning_tokens = 0
        self.tool_calls_made = 0
        self._reservation = reservation
        self._prompt_size = prompt_size
        self._recorded = False
        self._state = _NEW
        self._token: contextvars.Token[Any] | None = None
        self._ledger_holds = _NO_HOLDS
        self.policy: CallMarks | None = None  # set when the context has policies

    def record(
        self,
        tokens_in: int | None = None,
        tokens_out: int | None = None,
        cost_usd: float | None = None,
        cached_tokens: int = 0,
        reasoning_tokens: int = 0,
        tool_calls_made: int = 0,
        *,
        cache_write_tokens: int = 0,
    ) -> None:
        """Report the call's usage (may be called again to replace it, e.g. as a stream grows).

        Cached and cache-write tokens are subsets of ``tokens_in``, reasoning tokens of
        ``tokens_out``. Without ``cost_usd`` the pricing layer prices the call when it ends.
        Counts are ints from 0 to 2**53; the cost a finite number >= 0.
        """
        # Exact-type tests first (this runs once per call); the full checks name the argument.
        t_in = (
            tokens_in
            if type(tokens_in) is int and 0 <= tokens_in <= _MAX_COUNT
            else _validate.optional_count(tokens_in, "tokens_in")
        )
        t_out = (
            tokens_out
            if type(tokens_out) is int and 0 <= tokens_out <= _MAX_COUNT
            else _validate.optional_count(tokens_out, "tokens_out")
        )
        cost = (
            cost_usd
            if type(cost_usd) is float and 0.0 <= cost_usd < _INF
            else _validate.optional_amount(cost_usd, "cost_usd")
        )
        cached, writes = cached_tokens, cache_write_tokens
        reasoning, tools = reasoning_tokens, tool_calls_made
        if (type(cached) is not int or type(writes) is not int or type(reasoning) is not int
                or type(tools) is not int or cached or writes or reasoning or tools):  # fmt: skip
            if not (type(cached) is int and 0 <= cached <= _MAX_COUNT):
                cached = _validate.count(cached, "cached_tokens")
            if not (type(writes) is int and 0 <= writes <= _MAX_COUNT):
                writes = _validate.count(writes, "cache_write_tokens")
            if not (type(reasoning) is int and 0 <= reasoning <= _MAX_COUNT):
                reasoning = _validate.count(reasoning, "reasoning_tokens")
            if not (type(tools) is int and 0 <= tools <= _MAX_COUNT):
                tools = _validate.count(tools, "tool_calls_made")
            # (all four 0: nothing can exceed the input or output)
            if cached + writes > (t_in or 0):
                raise ValueError(
                    f"cached_tokens ({cached}) + cache_write_tokens ({writes}) exceed "
                    f"tokens_in ({t_in}); they are counted as part of the input"
                )
            if reasoning > (t_out or 0):
                raise ValueError(
                    f"reasoning_tokens ({reasoning}) exceed tokens_out ({t_out}); "
                    "they are counted as part of the output"
                )
        self.tokens_in = t_in
        self.tokens_out = t_out
        self.cost_usd = cost
        self.cached_tokens = cached
        self.cache_write_tokens = writes
        self.reasoning_tokens = reasoning
        self.tool_calls_made = tools
        self._recorded = True

    def retry(self) -> None:
        """Count one retry on this call (its node and ``amp:retries`` everywhere above)."""
        self.context.stats.kernel.retry(self.node, self.context.stats.level)

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> Call:
        """Check limits with this call's reservation and mark it running.

        Raises :class:`~ampmeter.LimitExceeded` (the node is halted) when the call would break a
        limit of this context or an enclosing one, and ``ExecutionCanceled`` after ``cancel()``.
        """
        self.context._admit(self, True)
        return self

    def finish(self, exc: BaseException | None = None) -> None:
        """End the call: success, or ``fail`` with ``exc``'s class (``halt`` if interrupted)."""
        if self._state == _DONE:
            return
        self._state = _DONE
        self.context._settle(self, exc)

    def __enter__(self) -> Call:
        self.context._admit(self, True)
        try:
            self._token = _CURRENT.set((self.context, self.node_id))
        except BaseException as exc:  # interrupted right after admission: give the hold back
            self.finish(exc)
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if self._state != _DONE:  # finish(), inlined: this is every call's exit
                self._state = _DONE
                self.context._settle(self, exc)
        finally:
            token = self._token
            if token is not None:
                try:
                    _CURRENT.reset(token)
                except ValueError:  # left in another task or thread than it was entered in
                    _CURRENT.set((self.context, self.context.node_id))

    async def __aenter__(self) -> Call:
        context = self.context
        if context._kernel.open and context._guard_rows:
            # Calls in flight: while only their holds are in the way, await them here (the
            # kernel's own wait would block the event loop they run on).
            try:
                await context._room_for(self)
            except BaseException:
                self._state = _DONE
                raise
        if not context._has_ledger:
            return self.__enter__()
        context._admit(self, False)
        # The ledger's reserve is a network round trip: run it on a worker thread, so the event
        # loop goes on meanwhile. A task cancelled while it runs waits for it and gives back
        # what it got.
        try:
            await context._admit_shared_async(self)
        except BaseException as exc:
            if self.node.status == "running":  # admitted after all: give the holds back
                self.finish(exc)
            else:
                self._state = _DONE
            raise
        self._token = _CURRENT.set((context, self.node_id))
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._state == _DONE or not self._ledger_holds:
            self.__exit__(exc_type, exc, tb)
            return
        _restore(self._token, self.context)
        self._state = _DONE
        await _off_loop(functools.partial(self.context._settle, self, exc))


async def _off_loop(work: Callable[[], _T]) -> _T:
    """Run blocking ledger work on a worker thread; a cancelled caller still waits for it."""
    import asyncio

    future = asyncio.ensure_future(asyncio.to_thread(work))
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        await asyncio.wait([future])
        raise


class ExecutionContext:
    """One agent run (or sub-agent): its limits, its live stats and its place in the graph.

    ``limits=None`` means no limits beyond the shortcuts: ``max_cost_usd`` (``amp:cost``),
    ``max_steps`` (successful calls, ``amp:steps``), ``max_retries`` (``amp:retries``) and
    ``timeout_s`` (wall time). The limits are fixed when the context is made (``limits`` is
    read-only): a sub-agent that needs other limits gets them from :meth:`spawn_child`. Sinks
    receive every node that ends; a ``ledger`` shares the limits with other processes.

    A call that would fit what is spent but not what calls in flight hold waits for them to
    settle, up to ``admission_timeout_s`` (30 s; children inherit it), then raises
    :class:`~ampmeter.BudgetBusy`; a call that does not fit what is spent is refused at once.

    A sink that fails never fails the call that produced the node: the call's accounting is
    kept, the error is kept in :attr:`sink_errors` (with one warning), and :meth:`close` raises
    the first one.
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
        _parent: ExecutionContext | None = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty str, got {name!r}")
        own_limits = _build_limits(limits, max_cost_usd, max_steps, max_retries)
        # Policy options (see ampmeter.policies), checked before anything is made.
        options = PolicyOptions.checked(
            on_unpriced=on_unpriced, warn_at=warn_at, on_limit_event=on_limit_event,
            final_reserve_usd=final_reserve_usd, max_repeats=max_repeats,
            max_input_tokens_per_call=max_input_tokens_per_call,
            on_budget_pressure=on_budget_pressure, pressure_at=pressure_at,
        )  # fmt: skip
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
        load = getattr(_pricing, "load", None)
        if timeout is not None and load is not None:
            load()  # the price table's first load never counts against the timeout
        self.name = name
        self._limits = own_limits
        self._rows = compile_limits(own_limits)
        self.parent = _parent
        self.ledger = ledger
        self.on_ledger_error = on_ledger_error
        self.data: Any = None
        if _parent is None:
            self.graph = ExecutionGraph(chain_id, max_nodes=max_nodes)
            self.stats = ExecutionStats(graph=self.graph)
            self._node_id = self.graph.create_root(name, meta)
            self._sinks: tuple[Sink, ...] = own_sinks
            self._chain: tuple[ExecutionContext, ...] = (self,)
        else:
            self.graph = _parent.graph
            self.stats = ExecutionStats(_parent.stats)
            node = self.graph.begin(_parent._parent_node_id(), "system", name, None, meta)
            self._node_id = node.node_id
            self.graph.mark_running(self._node_id)
            inherited = _parent._sinks
            self._sinks = inherited + tuple(s for s in own_sinks if s not in inherited)
            self._chain = (self, *_parent._chain)
        self._kernel = self.stats.kernel
        self._level: Level = self.stats.level
        self._started_at = time.monotonic()
        self._deadline = self._started_at + timeout if timeout is not None else None
        self._timeout_s = timeout
        if wait is None:
            wait = _parent._admission_timeout_s if _parent is not None else ADMISSION_TIMEOUT_S
        self._admission_timeout_s: float = wait
        self._canceled = False
        self._closed = False
        self._iteration = 0
        self._token: contextvars.Token[Any] | None = None
        self._sink_errors: list[Exception] = []  # the first error of each failing sink
        self._sink_failures: dict[int, int] = {}  # id(sink) -> how many times it failed
        self.termination_reason: TerminationReason | None = None
        self.exceeded_limit: ExceededLimit | None = None
        # Only contexts that can stop a call take part in the check before each call.
        self._guards = tuple(c for c in self._chain if c._can_stop())
        self._guard_rows: tuple[Guard, ...] = tuple((c._level, c._rows) for c in self._guards)
        self._timed = tuple(c for c in self._guards if c._deadline is not None)
        self._has_ledger = any(c.ledger is not None for c in self._guards)
        # Reservation shape -> (where it is held, the keys any guard watches, their fields).
        self._hold_plans: dict[Shape, _HoldPlan] = {}
        # Policies, compiled once: None when none applies (the calls' hot path tests only that).
        self.policy_options: PolicyOptions = options.inherit(
            _parent.policy_options if _parent else None
        )
        self.policies: Policies | None = Policies.compile(
            self, self._chain, self._guards, self._guard_rows
        )
        # Hand-offs: the open ones made here, and the one this context was made from.
        self._handoffs: list[_HandoffSpend] = []
        self._handoff_from: Handoff | None = None
        self._span_prefix = ""  # prepended to this process's node ids in a multi-process run
        _OPEN.add(self)

    # -- identity -----------------------------------------------------------------------------

    @property
    def limits(self) -> tuple[Limit, ...]:
        """This context's own limits (read-only: they are fixed when the context is made)."""
        return self._limits

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
    def sinks(self) -> tuple[Sink, ...]:
        """The sinks this context's nodes go to (its own and its parents')."""
        return self._sinks

    @property
    def sink_errors(self) -> tuple[Exception, ...]:
        """The first error of each sink that failed on this context's nodes (the calls
        themselves went on); ``snapshot()["sink_failures"]`` counts every failure."""
        return tuple(self._sink_errors)

    @property
    def wrap_up(self) -> bool:
        """True once a soft limit of this context or an enclosing one was exceeded: the agent
        should finish with what it has (hard limits still hold)."""
        return self.policies is not None and self.policies.wrap_up

    def _can_stop(self) -> bool:
        return bool(self._limits) or self._deadline is not None or self.ledger is not None

    def _parent_node_id(self) -> str:
        current = _CURRENT.get()
        if current is None or current[0] is not self or current[1] == self._node_id:
            return self._node_id
        found = self._kernel.open_ancestor(current[1], self._node_id)
        if found != current[1]:
            _CURRENT.set((self, found))  # a block ended without restoring it: mend it here
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
        return ExecutionContext(
            name,
            limits=limits,
            max_cost_usd=max_cost_usd,
            max_steps=max_steps,
            max_retries=max_retries,
            timeout_s=timeout_s,
            metadata=metadata,
            sinks=sinks,
            ledger=ledger,
            on_ledger_error=self.on_ledger_error,
            _parent=self,
            **policy_options,
        )

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
        if self._closed:
            self._check_open()
        # Exact-type tests first (this runs once per call); the full checks name the argument.
        if model is not None and type(model) is not str:
            _validate.text(model, "model")
        if provider is not None and type(provider) is not str:
            _validate.text(provider, "provider")
        label = name if name is not None else (model or "llm")
        if type(label) is not str:
            _validate.text(label, "name")
        out_est = 0 if max_tokens is None else _validate.count(max_tokens, "max_tokens")
        if prompt_tokens is None and prompt_text is None:
            in_est, chars = 0, None
        else:
            in_est, chars = _prompt_estimate(prompt_tokens, prompt_text, model)
        # Priced by the caller (estimate_usd; no model or no pricing layer to look up) or the table.
        priced = True
        if type(estimate_usd) is float and 0.0 <= estimate_usd < _INF:
            cost_est = estimate_usd
        elif estimate_usd is not None:
            cost_est = _validate.amount(estimate_usd, "estimate_usd")
        elif model and _pricing is not None:
            # Without max_tokens the pricing layer assumes its default output length: a budget
            # must not treat a call of unknown length as free.
            estimated = _pricing.estimate(
                model,
                provider,
                prompt_tokens=in_est,
                max_tokens=None if max_tokens is None else out_est,
            )
            priced = estimated is not None
            cost_est = estimated or 0.0
        else:
            cost_est = 0.0
        reservation = _usage(Usage, ("llm", model or "", "", in_est, out_est, 0, 0, cost_est, 1, 1,
                                     0, 0))  # fmt: skip
        call = Call(self, "llm", label, model, provider, reservation, metadata, chars)
        policies = self.policies
        if policies is not None and (policies.marks_all or not priced):
            call.policy = policies.llm_marks(model, priced, in_est, prompt_text, final)
        return call

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
        in_est, chars = _prompt_estimate(prompt_tokens, prompt_text, model)
        if estimate_usd is not None:
            cost_est = _validate.amount(estimate_usd, "estimate_usd")
        elif model and _pricing is not None:
            cost_est = _pricing.estimate(model, provider, prompt_tokens=in_est, max_tokens=0) or 0.0
        else:
            cost_est = 0.0
        reservation = Usage("embedding", model or "", "", in_est, cost_usd=cost_est)
        return Call(self, "embedding", label, model, provider, reservation, metadata, chars)

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
        if type(name) is not str or not name:
            raise ValueError(f"tool name must be a non-empty str, got {name!r}")
        cost = _validate.optional_amount(estimate_usd, "estimate_usd") or 0.0
        reservation = Usage("tool", "", name, cost_usd=cost, calls=1, steps=1)
        call = Call(self, "tool", name, None, None, reservation, metadata)
        if self.policies is not None:
            call.policy = self.policies.tool_marks(name, arguments)
        return call

    def step(
        self, name: str, *, kind: str = "system", metadata: Mapping[str, Any] | None = None
    ) -> Call:
        """A block of system work (or ``embedding``/``retrieval``/``memory``) that groups calls."""
        self._check_open()
        _validate.text(name, "step name")
        _validate.text(kind, "kind")
        if kind in ("llm", "tool"):
            raise ValueError(f"use llm_call() or tool_call() for {kind!r} nodes")
        return Call(self, kind, name, None, None, Usage(kind), metadata)

    def retry(self, call: Call) -> None:
        """Count one retry on ``call``."""
        call.retry()

    def wrap_llm_call(
        self, fn: Callable[[], object], options: WrapOptions | None = None
    ) -> Decision:
        """Run ``fn`` as an LLM call: HALT if a limit stops it, RETRY if it raised, else ALLOW."""
        opts = options or WrapOptions()
        hint = opts.cost_estimate_hint
        call = self.llm_call(opts.operation_name or "llm", model=opts.model, estimate_usd=hint)
        return self._wrap(call, fn, hint)

    def wrap_tool_call(
        self, fn: Callable[[], object], options: WrapOptions | None = None
    ) -> Decision:
        """Run ``fn`` as a tool call: HALT if a limit stops it, RETRY if it raised, else ALLOW."""
        opts = options or WrapOptions()
        hint = opts.cost_estimate_hint
        call = self.tool_call(opts.operation_name or "tool", estimate_usd=hint)
        return self._wrap(call, fn, hint)

    def _wrap(self, call: Call, fn: Callable[[], object], cost: float) -> Decision:
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

    # -- trace records ------------------------------------------------------------------------

    def trace(self, record: TraceRecord) -> None:
        """Update the stats for a trace record, as the matching call would."""
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
            self._kernel.add_usage(self._level, usage)
            if self.policies is not None:
                self.policies.traced(usage)
        elif isinstance(record, ToolCallTrace):
            if type(record.tool_name) is not str or not record.tool_name:
                raise ValueError(f"tool_name must be a non-empty str, got {record.tool_name!r}")
            usage = Usage("tool", tool=record.tool_name, calls=1)
            self._kernel.add_usage(self._level, usage)
            if self.policies is not None:
                self.policies.traced(usage)
        elif isinstance(record, ParseErrorTrace):
            if record.error_type == "format":
                keys = (KEY_FORMAT_PARSE_ERROR_TOTAL, KEY_FORMAT_PARSE_ERROR_AT,
                        KEY_FORMAT_PARSE_ERROR_CONSECUTIVE)  # fmt: skip
            elif record.error_type == "toolchain":
                keys = (KEY_TOOLCHAIN_PARSE_ERROR_TOTAL, KEY_TOOLCHAIN_PARSE_ERROR_AT,
                        KEY_TOOLCHAIN_PARSE_ERROR_CONSECUTIVE)  # fmt: skip
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
        own = tuple(row for row in self._rows if row[0] is False and row[1] == KEY_ITERATIONS)
        if own:
            found = self._kernel.check(((self._level, own),), {KEY_ITERATIONS: 1})
            if found is not None:
                self._stop(self, exceeded(found[1]), TerminationReason.LIMIT_EXCEEDED)
        self._iteration = self._kernel.bump(self._level, KEY_ITERATIONS)
        return self._iteration

    def end_iteration(self) -> None:
        """An iteration completed: raise ``LimitExceeded`` if a limit is exceeded now."""
        self._check_open()
        self._raise_if_exceeded()

    def _raise_if_exceeded(self) -> None:
        hit = self._first_exceeded(None)
        if hit is not None:
            self._stop(*hit)

    def _stop(
        self, owner: ExecutionContext, limit: ExceededLimit, reason: TerminationReason
    ) -> None:
        self._mark_stopped(owner, limit, reason)
        raise LimitExceeded(f"{self.name}: {limit}", limit, None)

    def cancel(self) -> None:
        """Stop this context: further calls in it (and in its children) are halted."""
        self._canceled = True
        if self.termination_reason is None:
            self.termination_reason = TerminationReason.CONTEXT_CANCELED

    @property
    def canceled(self) -> bool:
        """True once this context or an enclosing one was canceled."""
        return any(c._canceled for c in self._chain)

    def close(self, exc: BaseException | None = None) -> None:
        """End the context (idempotent): its node ends and its sinks are flushed.

        Raises the first error a sink reported (here or while flushing) unless the context is
        closing because of ``exc``.
        """
        if self._closed:
            return
        self._closed = True
        _OPEN.discard(self)
        if self._handoffs:
            self._settle_handoffs()
        if self.termination_reason is None:
            self.termination_reason = _termination(exc)
            if isinstance(exc, LimitExceeded):
                self.exceeded_limit = self.exceeded_limit or exc.exceeded
        reason = self.termination_reason
        graph = self.graph
        if reason is TerminationReason.SUCCESS:
            graph.mark_success(self._node_id, 0.0)
        elif reason is TerminationReason.ERROR and exc is not None:
            graph.mark_failure(self._node_id, type(exc).__name__, redact.error_text(exc))
        else:
            if self.exceeded_limit is not None:
                stop = str(self.exceeded_limit)
            elif isinstance(exc, LimitExceeded | ExecutionCanceled):
                stop = str(exc)
            else:
                stop = reason.value
            graph.mark_halt(self._node_id, stop)
        self._emit(graph.kernel.node(self._node_id))
        for sink in self._sinks:
            try:
                sink.flush()
            except Exception as error:
                self._sink_failed(sink, error)
        if self._sink_errors and exc is None:
            raise self._sink_errors[0]

    def __enter__(self) -> ExecutionContext:
        self._token = _CURRENT.set((self, self._node_id))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        token, self._token = self._token, None
        if token is not None:
            try:
                _CURRENT.reset(token)
            except ValueError:
                parent = self.parent
                _CURRENT.set(None if parent is None else (parent, parent._node_id))
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
        if self._handoffs:
            self.refresh_handoffs()
        limit = self.exceeded_limit
        return {
            "name": self.name,
            "chain_id": self.chain_id,
            "node_id": self._node_id,
            "iteration": self._iteration,
            "termination_reason": (
                self.termination_reason.value if self.termination_reason else None
            ),
            "exceeded_limit": None
            if limit is None
            else {
                "key": limit.key,
                "value": limit.value,
                "limit_key": limit.limit.key,
                "limit_type": limit.limit.type.value,
                "max_value": limit.limit.max_value,
            },
            "counters": self.stats.counters(),
            "gauges": self.stats.gauges(),
            "reserved": self.stats.reserved(),
            "sink_errors": [f"{type(e).__name__}: {e}" for e in self._sink_errors],
            "sink_failures": sum(self._sink_failures.values()),
            "limit_events": [] if self.policies is None else self.policies.events(),
            "graph": self.graph.snapshot(),
        }

    def __repr__(self) -> str:
        return f"ExecutionContext(name={self.name!r}, chain_id={self.chain_id!r})"

    # -- internals ----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"context {self.name!r} is closed")

    def _first_exceeded(
        self, pending: Mapping[str, float] | None
    ) -> tuple[ExecutionContext, ExceededLimit, TerminationReason] | None:
        if self._timed:
            now = time.monotonic()
            for ctx in self._timed:
                assert ctx._deadline is not None
                if now > ctx._deadline:
                    limit = Limit(KEY_ELAPSED_S, ctx._timeout_s or 0.0)
                    elapsed = ExceededLimit(limit, KEY_ELAPSED_S, now - ctx._started_at)
                    return ctx, elapsed, TerminationReason.TIMEOUT
        if not self._guard_rows:
            return None
        found = self._kernel.check(self._guard_rows, pending)
        return None if found is None else self._owner(found)

    def _owner(
        self, found: tuple[int, Hit]
    ) -> tuple[ExecutionContext, ExceededLimit, TerminationReason]:
        index, hit = found
        return self._guards[index], exceeded(hit), TerminationReason.LIMIT_EXCEEDED

    def _mark_stopped(
        self, owner: ExecutionContext, limit: ExceededLimit, reason: TerminationReason
    ) -> None:
        # The context whose limit fired, and every context between it and the caller, stop.
        for ctx in self._chain:
            if ctx.exceeded_limit is None:
                ctx.exceeded_limit = limit
            if ctx.termination_reason is None or ctx.termination_reason not in _LOCAL_TERMINATIONS:
                ctx.termination_reason = reason
            if ctx is owner:
                break

    def _hold_plan(self, shape: Shape) -> _HoldPlan:
        """Where a reservation of this shape is held (each guard, with the keys its limits
        watch), which of its keys any guard watches, and a function picking their amounts."""
        plan = self._hold_plans.get(shape)
        if plan is None:
            holds = []
            watched: dict[str, int] = {}
            for ctx in self._guards:
                keys = tuple(k for k in shape.keys if any(lim.matches(k) for lim in ctx.limits))
                if keys:
                    holds.append((ctx._level, keys))
                    watched.update((k, f) for k, f, _ in shape.entries if k in keys)
            plan = (tuple(holds), tuple(watched), picker(tuple(watched.values())))
            self._kernel.note(plan[0])
            if len(self._hold_plans) < _CACHE_MAX:
                self._hold_plans[shape] = plan
        return plan

    def _refuse_busy(self, call: Call, index: int, busy_hit: Hit) -> None:
        limit = exceeded(busy_hit)
        reason = f"waited {self._admission_timeout_s:g}s for calls in flight to settle: {limit}"
        self._refuse(call, reason)
        raise BudgetBusy(
            f"{call.kind} call {call.name!r} stopped before it ran: what is spent leaves room, "
            f"but calls in flight held the rest ({reason}); raise admission_timeout_s to wait "
            "longer",
            limit,
            call.node_id,
        )

    def _admit(self, call: Call, shared: bool) -> None:
        """Check the call's limits with its reservation, hold it, and mark the node running
        (``shared``: also hold it in the ledgers, else the caller does that next).

        A call that does not fit only because of other calls in flight waits for them up to
        the context's ``admission_timeout_s``, then raises :class:`~ampmeter.BudgetBusy`.
        """
        if call._state != _NEW:
            raise RuntimeError(f"call {call.node_id} was already started")
        # Refused: the node is halted and nothing is held, so finish() has nothing to do.
        call._state = _DONE
        for ctx in self._chain:
            if ctx._canceled:
                break
        else:
            ctx = None
        if ctx is not None:
            self._refuse(call, "context canceled")
            raise ExecutionCanceled(f"context {self.name!r} was canceled", call.node_id)
        if self._timed:
            hit = self._first_exceeded(None)
            if hit is not None and hit[2] is TerminationReason.TIMEOUT:
                self._refuse_on(call, *hit)
        reservation = call._reservation
        guard_rows = self._guard_rows
        if call.policy is not None:  # the policies may refuse, and pick the ceilings to check
            assert self.policies is not None  # (a call without marks has nothing to ask them)
            guard_rows, refusal = self.policies.admit(call)
            if refusal is not None:
                self._refuse_on(call, *refusal)
        if guard_rows:
            shape = reservation.shape()
            plan = self._hold_plans.get(shape) or self._hold_plan(shape)
            holds, keys, pick = plan
            pending: dict[str, float] = dict(zip(keys, pick(reservation)))  # noqa: B905 (hot)
        else:
            holds, pending = (), {}
        found = self._kernel.admit(call.node, call, pending, holds, guard_rows,
                                   not self._has_ledger, self._admission_timeout_s)  # fmt: skip
        if found is not None:
            index, (limit, key, value) = found
            if isinstance(limit, Busy):
                self._refuse_busy(call, index, busy_hit=(limit.limit, key, value))
            self._refuse_on(call, *self._owner(found))
        if self._has_ledger and shared:
            self._admit_shared(call)
        call._state = _ADMITTED

    async def _room_for(self, call: Call) -> None:
        """Await, up to ``admission_timeout_s``, while ``call`` fits what is spent but not what
        other calls in flight hold; then :class:`~ampmeter.BudgetBusy`. A call that fits, or
        that does not fit what is spent, goes on to :meth:`_admit` at once (which decides)."""
        import asyncio

        reservation = call._reservation
        shape = reservation.shape()
        _, keys, pick = self._hold_plans.get(shape) or self._hold_plan(shape)
        pending: dict[str, float] = dict(zip(keys, pick(reservation), strict=True))
        wait: _Wait | None = None
        while True:
            found = self._kernel.check(self._guard_rows, pending)
            if found is None or self._kernel.check(self._guard_rows, pending, holds=False):
                return
            if not self._others_hold(call):
                return  # only the calls it runs inside hold the rest: _admit refuses at once
            wait = wait or _Wait(self._admission_timeout_s)
            pause = wait.next_pause()
            if pause is None:
                index, (limit, key, value) = found
                self._refuse_busy(call, index, (limit, key, value))
            try:
                await asyncio.sleep(pause or 0.0)
            except BaseException as error:
                interrupted = not isinstance(error, Exception)
                self._refuse(call, "interrupted" if interrupted else redact.error_text(error))
                raise

    def _others_hold(self, call: Call) -> bool:
        """True if a call in flight other than those ``call`` runs inside holds anything."""
        enclosing = set()
        nodes = self._kernel.nodes
        parent = nodes.get(call.node.parent_id or "")
        while parent is not None:
            enclosing.add(parent.node_id)
            parent = nodes.get(parent.parent_id or "")
        return any(node_id not in enclosing for node_id in list(self._kernel.open))

    def _refuse(self, call: Call, reason: str) -> None:
        self.graph.mark_halt(call.node_id, reason)
        self._emit(call.node)

    def _refuse_on(
        self,
        call: Call,
        owner: ExecutionContext,
        limit: ExceededLimit,
        reason: TerminationReason,
    ) -> None:
        self._mark_stopped(owner, limit, reason)
        self._refuse(call, str(limit))
        raise LimitExceeded(
            f"{call.kind} call {call.name!r} stopped before it ran: {limit}", limit, call.node_id
        )

    def _admit_shared(self, call: Call) -> None:
        """The shared part of admitting a call: its holds in every ledger above, then running.

        A ledger that refuses only because of reservations in flight is asked again after a
        pause, up to ``admission_timeout_s`` (see :meth:`_ledger_pause`); the thread sleeps
        meanwhile, holding no lock.
        """
        try:
            for ctx in self._guards:
                if ctx.ledger is None:
                    continue
                request = self._ledger_request(ctx, call)
                wait: _Wait | None = None
                while request is not None and (refusal := self._ledger_try(call, request)):
                    wait = wait or _Wait(self._admission_timeout_s)
                    time.sleep(self._ledger_pause(call, request, refusal, wait, same_thread=True))
        except BaseException as error:
            self._abort_unless_ended(call, error)
            raise
        self.graph.mark_running(call.node_id)

    async def _admit_shared_async(self, call: Call) -> None:
        """:meth:`_admit_shared` for ``async with``: each ledger round trip runs on a worker
        thread and the pauses are ``asyncio.sleep``, so the event loop goes on meanwhile."""
        import asyncio

        try:
            for ctx in self._guards:
                if ctx.ledger is None:
                    continue
                request = self._ledger_request(ctx, call)
                wait: _Wait | None = None
                while request is not None and (
                    refusal := await _off_loop(functools.partial(self._ledger_try, call, request))
                ):
                    wait = wait or _Wait(self._admission_timeout_s)
                    pause = self._ledger_pause(call, request, refusal, wait, same_thread=False)
                    await asyncio.sleep(pause)
        except BaseException as error:
            self._abort_unless_ended(call, error)
            raise
        self.graph.mark_running(call.node_id)

    def _abort_unless_ended(self, call: Call, error: BaseException) -> None:
        """Give back what an admission interrupted half-way holds (a refusal has already)."""
        if call.node.status not in TERMINAL_STATUSES:
            interrupted = not isinstance(error, Exception)
            reason = (
                "interrupted" if interrupted else f"admission failed: {redact.error_text(error)}"
            )
            self._abort_admission(call, reason)

    def _ledger_request(self, ctx: ExecutionContext, call: Call) -> _LedgerRequest | None:
        """What the call reserves in ``ctx``'s shared ledger, and against which ceilings (None:
        nothing there watches it)."""
        ledger = ctx.ledger
        assert ledger is not None
        # Every exact limit takes part, also keys the call reserves nothing for (no estimate):
        # the hold is then 0, but the commit still adds what the call actually used. A prefix
        # limit takes part through the keys of its family this call may add to (its model's or
        # its tool's), each shared on its own, as the local check counts them.
        reservation = call._reservation.amounts()
        candidates = tuple(_keys_a_call_adds(call))
        ceilings, owners = _shared_ceilings(ctx.limits, candidates)
        extra: dict[str, float | None] = {}
        windows: tuple[Limit, ...] = ()
        if self.policies is not None:  # the reserve, the loop guard, windows, watched keys
            ceilings, owners, extra, windows = self.policies.shared_terms(
                ctx, call, ceilings, owners
            )
        # A context made from a hand-off also holds at the scopes of the contexts above it,
        # and records every key a call adds (retries too), so the parent can read the child's
        # whole spend.
        link = ctx._handoff_from
        scopes = {ledger.scope: (ceilings, owners)}
        if link is not None:
            for scope, limits in link.ancestors:
                scopes[scope] = _shared_ceilings(limits, candidates)
        elif not ceilings and not extra:
            return None
        keys = dict.fromkeys(k for c, _ in scopes.values() for k in c)
        keys.update(dict.fromkeys(extra))
        if link is not None:
            keys.update(dict.fromkeys(candidates))
            keys[KEY_RETRIES] = None
            if call.kind == "llm":
                keys[KEY_UNPRICED_LLM_CALLS] = None  # unpriced is not zero, also for the parent
        amounts = {key: _amount(extra.get(key), reservation, key) for key in keys}
        ancestors = {scope: found[0] for scope, found in scopes.items() if scope != ledger.scope}
        spans = tuple((lim.key, lim.window_s or 0.0, lim.max_value) for lim in windows)
        return _LedgerRequest(ctx, ledger, amounts, ceilings, ancestors or None, scopes, windows,
                              spans)  # fmt: skip

    def _ledger_try(self, call: Call, request: _LedgerRequest) -> Refusal | None:
        """Ask the ledger once: None when the call holds there now (or may go on without it),
        the refusal when only reservations in flight are in the way; a refusal by what is
        spent raises :class:`~ampmeter.LimitExceeded` at once."""
        from ampmeter.ledgers.base import Refusal

        ctx, ledger = request.owner, request.ledger
        try:
            if request.spans:
                held = ledger.try_reserve(
                    request.amounts,
                    request.ceilings,
                    ancestors=request.ancestors,
                    windows=request.spans,
                )
            else:  # the call a ledger without windows (an older subclass) understands too
                held = ledger.try_reserve(
                    request.amounts, request.ceilings, ancestors=request.ancestors
                )  # fmt: skip
        except BudgetUnavailable as error:
            if ctx.on_ledger_error == "allow":
                self.graph.update_metadata(
                    call.node_id,
                    {"budget_enforced": False, "ledger_error": redact.error_text(error)},
                )
                return None
            reason = f"budget ledger unavailable (fail closed): {error}"
            self._abort_admission(call, reason)
            raise BudgetUnavailable(
                f"{call.kind} call {call.name!r} stopped: {reason}", None, call.node_id
            ) from error
        except BaseException as error:
            self._abort_admission(call, f"ledger error: {redact.error_text(error)}")
            raise
        if isinstance(held, Refusal):
            if held.busy:
                return held
            scope, stop = request.stop(held)
            self._mark_stopped(ctx, stop, TerminationReason.LIMIT_EXCEEDED)
            self._abort_admission(call, f"shared budget {scope!r}: {stop}")
            raise LimitExceeded(
                f"{call.kind} call {call.name!r} stopped before it ran: shared budget "
                f"{scope!r}: {stop}",
                stop,
                call.node_id,
            )
        call._ledger_holds = (*call._ledger_holds, (ledger, held))
        return None

    def _ledger_pause(
        self,
        call: Call,
        request: _LedgerRequest,
        refusal: Refusal,
        wait: _Wait,
        *,
        same_thread: bool,
    ) -> float:
        """How long to pause before asking the ledger again, or :class:`~ampmeter.BudgetBusy`
        when the wait is over: out of time, or only holds this call would wait for in vain
        (its enclosing calls' and, on a thread, that thread's own) stand in the way."""
        pause = wait.next_pause()
        own = self._own_ledger_holds(call, refusal, same_thread)
        if pause is None or refusal.reserved - own <= _DUST * max(1.0, abs(refusal.ceiling)):
            scope, stop = request.stop(refusal)
            waited = f"waited {wait.waited():.3g}s of admission_timeout_s={wait.limit_s:g}"
            reason = f"calls in flight held the rest of shared budget {scope!r} ({waited}): {stop}"
            self._abort_admission(call, reason)
            raise BudgetBusy(
                f"{call.kind} call {call.name!r} stopped before it ran: what is spent leaves "
                f"room, but {reason}; raise admission_timeout_s to wait longer",
                stop,
                call.node_id,
            )
        return pause

    def _own_ledger_holds(self, call: Call, refusal: Refusal, same_thread: bool) -> float:
        """What this process's calls that ``call`` cannot outwait hold at the refusing ceiling:
        the calls it runs inside and, when ``same_thread``, every call of its thread."""
        enclosing: set[str] = set()
        nodes = self._kernel.nodes
        parent = nodes.get(call.node.parent_id or "")
        while parent is not None:
            enclosing.add(parent.node_id)
            parent = nodes.get(parent.parent_id or "")
        me = threading.get_ident()
        total = 0.0
        for ticket in list(self._kernel.open.values()):
            other = ticket.owner()
            if not isinstance(other, Call) or other is call:
                continue
            if ticket.node.node_id in enclosing or (same_thread and ticket.thread == me):
                for _, held in other._ledger_holds:
                    if refusal.scope in held.scopes:
                        total += held.amounts.get(refusal.key or "", 0.0)
        return total

    def _abort_admission(self, call: Call, stop_reason: str) -> None:
        self._kernel.release(call.node)
        for ledger, held in call._ledger_holds:
            # If the release fails the lease returns the hold; the stop is what matters.
            with contextlib.suppress(Exception):
                ledger.release(held)
        call._ledger_holds = _NO_HOLDS
        self._refuse(call, stop_reason)

    def _settle(self, call: Call, exc: BaseException | None) -> None:
        """End a call: its usage, its node, its ledger holds, its sinks, the check after it."""
        node = call.node
        kind = call.kind
        if exc is None:
            status, error_class, reason = "success", None, None
            succeeded, failed = 1, 0
        elif not isinstance(exc, Exception):  # interrupted
            status, error_class, reason = "halt", None, "interrupted"
            succeeded = failed = 0
        else:
            status, error_class, reason = "fail", type(exc).__name__, redact.error_text(exc)
            succeeded, failed = 0, 1
        meta: dict[str, Any] | None = None
        cost = call.cost_usd or 0.0
        if kind == "llm":
            cost, meta, unpriced = self._llm_outcome(call)
            usage = _usage(Usage, ("llm", call.model or "", "", call.tokens_in or 0,
                                   call.tokens_out or 0, call.cached_tokens,
                                   call.reasoning_tokens, cost, 1, succeeded, failed,
                                   unpriced))  # fmt: skip
            if exc is None and call._prompt_size is not None and call.tokens_in:
                request_size.learn(call.model or "", call._prompt_size, call.tokens_in)
        elif kind == "tool":
            usage = Usage("tool", "", call.name, 0, 0, 0, 0, cost, 1, succeeded, failed)
        elif kind == "embedding" and call.model:
            cost, meta, _ = self._llm_outcome(call)
            usage = Usage("embedding", call.model, "", call.tokens_in or 0, call.tokens_out or 0,
                          cost_usd=cost)  # fmt: skip
        else:
            usage = Usage(kind, cost_usd=cost)
        if node.status == "created" and call.node_id not in self._kernel.open:
            # Never admitted (start() was refused or never called): nothing was used.
            if exc is None:
                self.graph.mark_halt(call.node_id, "never started")
            else:
                self.graph.mark_failure(call.node_id, error_class or "interrupted", reason)
            self._emit(node)
            return
        if call._ledger_holds:
            failure = self._ledger_commit(call, usage)
            if failure:
                meta = {**(meta or {}), "ledger_error": failure}
        found = self._kernel.settle(node, self._level, usage, status, cost, call.tokens_in,
                                    call.tokens_out, error_class, reason, meta,
                                    self._guard_rows)  # fmt: skip
        if self.policies is not None and self.policies.watches:
            self.policies.settled(node, usage)
        if self._sinks:
            self._emit(node)
        if found is not None:
            self._mark_stopped(*self._owner(found))

    @staticmethod
    def _ledger_commit(call: Call, usage: Usage) -> str | None:
        """Commit the call's usage to the ledgers that hold it; the last error, if any."""
        actual_amounts = usage.amounts()
        if call.node.retries_used:  # counted on the node as they happen, shared at the end
            actual_amounts[KEY_RETRIES] = float(call.node.retries_used)
        failure = None
        for ledger, held in call._ledger_holds:
            actual = {key: actual_amounts.get(key, 0.0) for key in held.amounts}
            for key in actual:
                if key.startswith(KEY_REPEATS_FOR):  # a repeat counts as held, whatever the end
                    actual[key] = held.amounts[key]
            try:
                ledger.commit(held, actual)
            except Exception as error:
                failure = redact.error_text(error)
        return failure

    def _llm_outcome(self, call: Call) -> tuple[float, dict[str, Any], int]:
        """An ended LLM call's cost, the usage metadata for its node, and 1 if unpriced."""
        cost = call.cost_usd
        version: str | None = None
        if cost is not None:
            status = "given"
        elif not call.model or not call._recorded or _pricing is None:
            cost, status = 0.0, "unpriced"
        else:
            result = _pricing.price(
                call.model,
                call.provider,
                input_tokens=call.tokens_in or 0,
                output_tokens=call.tokens_out or 0,
                cached_tokens=call.cached_tokens,
                cache_write_tokens=call.cache_write_tokens,
                reasoning_tokens=call.reasoning_tokens,
            )
            version = result.pricing_version
            if result.cost_usd is None:
                cost, status = 0.0, "unpriced"
            else:
                cost, status = result.cost_usd, "priced"
        meta: dict[str, Any] = {META_COST_STATUS: status}
        if version:
            meta[META_PRICING_VERSION] = version
        if call.cached_tokens:
            meta[META_CACHED_TOKENS] = call.cached_tokens
        if call.cache_write_tokens:
            meta[META_CACHE_WRITE_TOKENS] = call.cache_write_tokens
        if call.reasoning_tokens:
            meta[META_REASONING_TOKENS] = call.reasoning_tokens
        meta[META_TOOL_CALLS_MADE] = call.tool_calls_made
        return cost, meta, int(status == "unpriced")

    def _emit(self, node: Node) -> None:
        if not self._sinks:
            return
        chain_id = self.graph.chain_id
        for sink in self._sinks:
            try:
                sink.emit(node, chain_id)
            except Exception as error:
                self._sink_failed(sink, error)

    def _sink_failed(self, sink: Sink, error: Exception) -> None:
        """Keep a sink's first error (and count the rest); warn once per context."""
        failures = self._sink_failures
        if not failures:
            warnings.warn(
                f"ampmeter: sink {type(sink).__name__} failed ({error}); the call went on and "
                f"was counted; context {self.name!r} raises the error at close()",
                RuntimeWarning,
                stacklevel=5,
            )
        count = failures.get(id(sink))
        if count is None:
            self._sink_errors.append(error)
            failures[id(sink)] = 1
        else:
            failures[id(sink)] = count + 1

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
        the ledger and added to these stats (close it after the child is done). Needs a shared
        ledger (``SqliteLedger`` or ``RedisLedger``) on this context or one above it.
        """
        from ampmeter.propagation import Handoff, encode  # ledgers load only when used

        self._check_open()
        _validate.text(name, "name", empty=False)
        own = _build_limits(limits, max_cost_usd, max_steps, max_retries)
        timeout = _validate.optional_amount(timeout_s, "timeout_s")
        meta = _validate.metadata(metadata)
        owner = next((ctx for ctx in self._chain if ctx.ledger is not None), None)
        if owner is None or owner.ledger is None:
            raise HandoffError(
                f"context {self.name!r} cannot hand off {name!r}: a hand-off needs a shared "
                "ledger, so give this context (or one above it) ledger=SqliteLedger(path) for "
                "processes of one machine or ledger=RedisLedger(url, scope) for many"
            )
        ledger = owner.ledger
        try:
            location = ledger.location()
        except TypeError as error:
            raise HandoffError(f"cannot hand off {name!r}: {error}") from None
        node = self.graph.begin(self._parent_node_id(), "system", name, None, meta)
        self.graph.mark_running(node.node_id)
        root = self._chain[-1]  # the context that owns the graph: its ids are logged prefixed
        logged_id = root._span_prefix + node.node_id
        scope = ledger.child(f"{logged_id}-{uuid.uuid4().hex[:8]}").scope
        above = owner._handoff_from
        # Soft and windowed limits are the owner's policies, not ceilings a child may not pass.
        ceilings = tuple(limit for limit in owner.limits if limit.is_ceiling)
        ancestors = ((ledger.scope, ceilings), *(above.ancestors if above else ()))
        depth = node.depth + (root._handoff_from.depth + 1 if root._handoff_from else 0)
        deadline = None if timeout is None else time.time() + timeout
        self._handoffs.append(_HandoffSpend(node, ledger, scope))
        return encode(
            Handoff(
                self.chain_id, logged_id, depth, name, scope, location, own, ancestors, deadline
            )
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
        ctx = cls(
            found.name,
            limits=found.limits,
            timeout_s=timeout,
            chain_id=found.chain_id,
            metadata={"handoff_from": found.node_id},
            sinks=wrapped,
            ledger=shared,
        )
        ctx._handoff_from = found
        ctx._span_prefix = prefix
        return ctx

    def refresh_handoffs(self) -> dict[str, float]:
        """Read the spend of this context's hand-offs from the ledger again; add what is new.

        A handed-off child may go on spending after this context closed (a background worker):
        its spend reaches these stats (and every context above) when this is called, and
        :meth:`snapshot` calls it. Returns what was added, per key. A ledger that cannot be read
        now adds nothing; the next call catches up.
        """
        added: dict[str, float] = {}
        for handoff in list(self._handoffs):
            try:
                spent = handoff.ledger.spent(handoff.scope)
            except Exception as error:
                handoff.error = error
                continue
            for key, delta in handoff.take_new(spent).items():
                gauge = key == KEY_COST or key.startswith(KEY_COST_FOR)
                self._kernel.add(self._level, key, delta, gauge)
                added[key] = added.get(key, 0.0) + delta
        return added

    def _settle_handoffs(self) -> None:
        """End the hand-off nodes made here, adding each child's spend (read from the ledger)
        to these stats; the nodes themselves carry no cost, so logs do not count it twice.
        The hand-offs are kept: :meth:`refresh_handoffs` adds what a child spends later."""
        self.refresh_handoffs()
        for handoff in self._handoffs:
            node = handoff.node
            if handoff.error is not None:
                self.graph.mark_failure(
                    node.node_id,
                    type(handoff.error).__name__,
                    f"the hand-off's spend could not be read: {handoff.error}",
                )
            else:
                meta = {"handoff_scope": handoff.scope, "handoff_spent": dict(handoff.counted)}
                self.graph.mark_success(node.node_id, 0.0, metadata=meta)
            self._emit(node)


class _HandoffSpend:
    """A hand-off made by a context, and how much of its spend the context has counted."""

    __slots__ = ("counted", "error", "ledger", "lock", "node", "scope")

    def __init__(self, node: Node, ledger: Ledger, scope: str) -> None:
        self.node = node
        self.ledger = ledger
        self.scope = scope
        self.counted: dict[str, float] = {}
        self.error: Exception | None = None  # the last read's, None once one succeeded
        self.lock = threading.Lock()

    def take_new(self, spent: Mapping[str, float]) -> dict[str, float]:
        """What ``spent`` (a fresh read) holds beyond what was counted; now counted too."""
        with self.lock:
            self.error = None
            new = {k: v - self.counted.get(k, 0.0) for k, v in spent.items()}
            new = {k: d for k, d in new.items() if d > 0.0}
            self.counted.update((k, spent[k]) for k in new)
            return new


class _LedgerRequest:
    """What one call asks of one context's shared ledger, kept while it waits for room."""

    __slots__ = ("amounts", "ancestors", "ceilings", "ledger", "owner", "scopes", "spans",
                 "windows")  # fmt: skip

    def __init__(
        self,
        owner: ExecutionContext,
        ledger: Ledger,
        amounts: dict[str, float],
        ceilings: dict[str, float],
        ancestors: dict[str, dict[str, float]] | None,
        scopes: dict[str, tuple[dict[str, float], dict[str, Limit]]],
        windows: tuple[Limit, ...] = (),
        spans: tuple[tuple[str, float, float], ...] = (),
    ) -> None:
        self.owner = owner
        self.ledger = ledger
        self.amounts = amounts
        self.ceilings = ceilings
        self.ancestors = ancestors
        self.scopes = scopes  # scope -> (its ceilings, the limit each comes from)
        self.windows = windows  # the windowed limits the ledger checks at its own scope
        self.spans = spans  # the same, as the ledger takes them: (key, window_s, max)

    def stop(self, refusal: Refusal) -> tuple[str, ExceededLimit]:
        """The scope and the exceeded limit a ledger's refusal names (with the note of the
        policy behind it: a window, the loop guard)."""
        if refusal.window_s is not None:
            for limit in self.windows:
                if limit.key == refusal.key and limit.window_s == refusal.window_s:
                    note = f"limit exceeded in {limit.window_s:g}s"
                    return self.ledger.scope, ExceededLimit(limit, limit.key, refusal.value, note)
        found = self.scopes.get(refusal.scope or "")
        if found is not None and refusal.key in found[1]:
            stop = ExceededLimit(found[1][refusal.key], refusal.key, refusal.value)
            return refusal.scope or "", Policies.shared_refusal(stop)
        # A refusal without a ceiling (a settled id): the first ceiling stands for it.
        first = next(((s, f) for s, f in self.scopes.items() if f[0]), None)
        if first is None:  # only windows were asked for
            limit = self.windows[0]
            return self.ledger.scope, ExceededLimit(limit, limit.key, refusal.value)
        scope, (ceilings, owners) = first
        key = next(iter(ceilings))
        return scope, ExceededLimit(owners[key], key, refusal.value)


class _Wait:
    """A bounded wait with growing, jittered pauses (so waiters do not ask all at once)."""

    __slots__ = ("_pause", "deadline", "limit_s", "started")

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self.started = time.monotonic()
        self.deadline = self.started + limit_s
        self._pause = _FIRST_PAUSE_S

    def next_pause(self) -> float | None:
        """Seconds to pause before the next try, or None when the time is up."""
        left = self.deadline - time.monotonic()
        if left <= 0.0:
            return None
        import random

        pause = self._pause * random.uniform(0.5, 1.0)  # jitter, not a secret
        self._pause = min(self._pause * 2.0, _LONGEST_PAUSE_S)
        return min(pause, left)

    def waited(self) -> float:
        """Seconds since the wait began."""
        return time.monotonic() - self.started


_HoldPlan = tuple[
    tuple[tuple[Level, tuple[str, ...]], ...], tuple[str, ...], Callable[[Usage], tuple[Any, ...]]
]


def _prompt_estimate(
    prompt_tokens: object, prompt_text: object, model: str | None
) -> tuple[int, RequestSize | None]:
    """A call's estimated prompt tokens (the caller's count, else the estimate from the text)
    and the prompt's measure (None without text), for reservations and learning."""
    if prompt_tokens is not None:
        return _validate.count(prompt_tokens, "prompt_tokens"), None
    if prompt_text is not None:
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


def _keys_a_call_adds(call: Call) -> Iterable[str]:
    """The stats keys a call may add to when it ends: its reservation's, and its model's or its
    tool's cached and reasoning keys."""
    possible = call._reservation._replace(cached_tokens=1, reasoning_tokens=1, tokens_in=1,
                                          tokens_out=1)  # fmt: skip
    return dict.fromkeys(key for key, _, _ in possible.entries())


def _shared_ceilings(
    limits: Iterable[Limit], candidates: Sequence[str]
) -> tuple[dict[str, float], dict[str, Limit]]:
    """The ledger ceilings of ``limits`` for a call that may add to ``candidates``, and the
    limit each comes from.

    Every exact limit takes part, also keys the call reserves nothing for (no estimate): the
    hold is then 0, but the commit still adds what the call actually used. A prefix limit takes
    part through the keys of its family this call may add to (its model's or its tool's), each
    shared on its own, as the local check counts them.
    """
    ceilings: dict[str, float] = {}
    owners: dict[str, Limit] = {}
    for limit in limits:
        if not limit.is_ceiling:
            continue  # soft and windowed limits: the policies' shared terms (shared_terms)
        if limit.type is LimitType.EXACT:
            keys: Iterable[str] = (limit.key,)
        else:
            keys = [key for key in candidates if key.startswith(limit.key)]
        for key in keys:
            if key not in ceilings or limit.max_value < ceilings[key]:
                ceilings[key] = limit.max_value  # the tightest; the first of equals
                owners[key] = limit
    return ceilings, owners


def _amount(fixed: float | None, reservation: Mapping[str, float], key: str) -> float:
    """What a ledger holds for ``key``: a policy's ``fixed`` amount, else the call's estimate."""
    return reservation.get(key, 0.0) if fixed is None else fixed


def _build_limits(
    limits: Sequence[Limit] | None,
    max_cost_usd: object,
    max_steps: object,
    max_retries: object,
) -> tuple[Limit, ...]:
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
