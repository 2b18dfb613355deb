"""ExecutionContext: one per agent (or sub-agent) run; checks, records and contains its calls.

A call goes through four steps:

1. **begin** - a node is created in the shared graph under the current node;
2. **check and reserve** - under the stats tree's lock, the call's reservation (estimated cost,
   prompt and ``max_tokens`` tokens, one step) is added to what is spent and already reserved,
   and the limits of this context and every enclosing one are checked. If one would be exceeded,
   the node is halted and :class:`~ampmeter.LimitExceeded` is raised before any user code runs;
   otherwise the reservation is kept, so concurrent calls see each other;
3. **run** - the user's block (or the SDK request) runs;
4. **settle** - the reservation is replaced by the actual usage in every enclosing context at
   once, the node ends, sinks receive it, and limits are checked again.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from types import TracebackType
from typing import Any, Final, Literal, Protocol

from ampmeter import _calls_async, redact
from ampmeter._limit_check import LimitPlan, check_plan_locked, compile_limits
from ampmeter.errors import BudgetUnavailable, ExecutionCanceled, LimitExceeded
from ampmeter.graph import (
    META_CACHE_WRITE_TOKENS,
    META_CACHED_TOKENS,
    META_CONTEXT,
    META_COST_STATUS,
    META_PRICING_VERSION,
    META_PROVIDER,
    META_REASONING_TOKENS,
    META_TOOL_CALLS_MADE,
    ExecutionGraph,
    Node,
    check_cost,
    check_tokens,
)
from ampmeter.keys import (
    KEY_CACHED_INPUT_TOKENS,
    KEY_CACHED_INPUT_TOKENS_FOR,
    KEY_COST,
    KEY_COST_FOR,
    KEY_ELAPSED_S,
    KEY_FORMAT_PARSE_ERROR_AT,
    KEY_FORMAT_PARSE_ERROR_CONSECUTIVE,
    KEY_FORMAT_PARSE_ERROR_TOTAL,
    KEY_INPUT_TOKENS,
    KEY_INPUT_TOKENS_FOR,
    KEY_LLM_CALLS,
    KEY_OUTPUT_TOKENS,
    KEY_OUTPUT_TOKENS_FOR,
    KEY_REASONING_TOKENS,
    KEY_REASONING_TOKENS_FOR,
    KEY_RETRIES,
    KEY_STEPS,
    KEY_TOOL_CALLS,
    KEY_TOOL_CALLS_FOR,
    KEY_TOOLCHAIN_PARSE_ERROR_AT,
    KEY_TOOLCHAIN_PARSE_ERROR_CONSECUTIVE,
    KEY_TOOLCHAIN_PARSE_ERROR_TOTAL,
    KEY_UNPRICED_LLM_CALLS,
)
from ampmeter.ledgers.base import Ledger, LedgerUnavailable, Reservation
from ampmeter.limits import ExceededLimit, Limit, LimitType
from ampmeter.sinks.base import Sink
from ampmeter.stats import ExecutionStats
from ampmeter.trace import ModelCallTrace, ParseErrorTrace, ToolCallTrace, TraceRecord

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
        check_cost(self.cost_estimate_hint, "cost_estimate_hint")


# -- pricing hooks ------------------------------------------------------------------------------


class _PriceLike(Protocol):
    @property
    def cost_usd(self) -> float | None: ...
    @property
    def pricing_version(self) -> str: ...


class _Pricing(Protocol):
    def price(
        self,
        model: str,
        provider: str | None = None,
        *,
        input_tokens: int,
        output_tokens: int,
        cached_tokens: int = 0,
        cache_write_tokens: int = 0,
        reasoning_tokens: int = 0,
    ) -> _PriceLike: ...

    def estimate(
        self,
        model: str,
        provider: str | None = None,
        *,
        prompt_tokens: int | None = None,
        prompt_text: str | None = None,
        max_tokens: int | None = None,
    ) -> float | None: ...


_pricing: _Pricing | None = None


def use_pricing(pricing: _Pricing | None) -> None:
    """Set the pricing layer contexts use for calls recorded without a cost (None: none)."""
    global _pricing
    _pricing = pricing


# -- the current context ------------------------------------------------------------------------

_CURRENT: contextvars.ContextVar[tuple[ExecutionContext, str] | None] = contextvars.ContextVar(
    "ampmeter_current", default=None
)


def current_context() -> ExecutionContext | None:
    """The innermost context entered in this thread or task, or None."""
    current = _CURRENT.get()
    return current[0] if current is not None else None


def current_node_id() -> str | None:
    """The innermost open node (a call or step block, or a context's own node), or None."""
    current = _CURRENT.get()
    return current[1] if current is not None else None


_NO_PENDING: Final[dict[str, float]] = {}  # shared, never written to
# Where a call's reservation is held: (stats of a guarding context, the keys held there).
_Holds = tuple[tuple[ExecutionStats, tuple[str, ...]], ...]
_LOCAL_TERMINATIONS: Final = frozenset(
    {TerminationReason.LIMIT_EXCEEDED, TerminationReason.TIMEOUT}
)


def _check_limit_value(name: str, value: object, *, integer: bool) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if integer and not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


class Call:
    """One call (LLM, tool or step) in a context: reserve before, record after.

    Use it as ``with ctx.llm_call(...) as call:`` (or ``async with``), and report usage with
    :meth:`record`. Integrations that cannot wrap a block (a stream that ends later) call
    :meth:`start` and :meth:`finish` themselves.
    """

    __slots__ = (
        "_done",
        "_holds",
        "_ledger_holds",
        "_recorded",
        "_reservation",
        "_started",
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
        reservation: dict[str, float],
        metadata: Mapping[str, Any] | None,
    ) -> None:
        self.context = context
        self.kind = kind
        self.name = name
        self.model = model
        self.provider = provider
        self._reservation = reservation
        graph = context.graph
        meta = dict(metadata) if metadata else None
        if provider is not None:
            meta = meta or {}
            meta[META_PROVIDER] = provider
        self.node: Node = graph._begin(context._parent_node_id(), kind, name, model, meta)
        self.node_id = self.node.node_id
        self.tokens_in: int | None = None
        self.tokens_out: int | None = None
        self.cost_usd: float | None = None
        self.cached_tokens = 0
        self.cache_write_tokens = 0
        self.reasoning_tokens = 0
        self.tool_calls_made = 0
        self._recorded = False
        self._started = False
        self._done = False
        self._token: contextvars.Token[tuple[ExecutionContext, str] | None] | None = None
        self._ledger_holds: list[tuple[Ledger, Reservation]] = _NO_HOLDS  # a list once used
        # Where this call's reservation is held: (stats of a guarding context, the keys held
        # there); the amounts are the reservation's.
        self._holds: _Holds = ()

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
        """
        # Exact-type fast paths first (this runs once per call); the full checks on a miss.
        t_in = (
            tokens_in
            if type(tokens_in) is int and tokens_in >= 0
            else check_tokens(tokens_in, "tokens_in")
        )
        t_out = (
            tokens_out
            if type(tokens_out) is int and tokens_out >= 0
            else check_tokens(tokens_out, "tokens_out")
        )
        if type(cost_usd) is float and 0.0 <= cost_usd < math.inf:
            cost: float | None = cost_usd
        else:
            cost = None if cost_usd is None else check_cost(cost_usd)
        cached = cached_tokens if type(cached_tokens) is int and cached_tokens >= 0 else (
            check_tokens(cached_tokens, "cached_tokens") or 0
        )  # fmt: skip
        writes = (
            cache_write_tokens
            if type(cache_write_tokens) is int and cache_write_tokens >= 0
            else check_tokens(cache_write_tokens, "cache_write_tokens") or 0
        )
        reasoning = (
            reasoning_tokens
            if type(reasoning_tokens) is int and reasoning_tokens >= 0
            else check_tokens(reasoning_tokens, "reasoning_tokens") or 0
        )
        tools = (
            tool_calls_made
            if type(tool_calls_made) is int and tool_calls_made >= 0
            else check_tokens(tool_calls_made, "tool_calls_made") or 0
        )
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
        self.context.graph.increment_retries(self.node_id)
        stats = self.context.stats
        with stats.lock:
            stats._add_counter_locked(KEY_RETRIES, 1)

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> Call:
        """Check limits with this call's reservation and mark it running.

        Raises :class:`~ampmeter.LimitExceeded` (the node is halted) when the call would break a
        limit of this context or an enclosing one, and ``ExecutionCanceled`` after ``cancel()``.
        """
        self._start(shared=True)
        return self

    def _start(self, shared: bool) -> None:
        """Admit the call once; ``shared=False`` leaves the ledger part to the caller."""
        if self._started:
            raise RuntimeError(f"call {self.node_id} was already started")
        self._started = True
        try:
            self.context._admit(self, shared)
        except BaseException:
            # Refused: the node is halted and nothing is reserved, so finish() has nothing to do
            # (settling here would release reservations that belong to other calls).
            self._done = True
            raise

    def finish(self, exc: BaseException | None = None) -> None:
        """End the call: success, or ``fail`` with ``exc``'s class (``halt`` if interrupted)."""
        if self._done:
            return
        self._done = True
        self.context._settle(self, exc)

    def __enter__(self) -> Call:
        # start(), inlined: entering a block is the hot path of every call.
        if self._started:
            raise RuntimeError(f"call {self.node_id} was already started")
        self._started = True
        context = self.context
        try:
            context._admit(self)
        except BaseException:
            self._done = True  # refused: see start()
            raise
        self._token = _CURRENT.set((context, self.node_id))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        context = self.context
        token = self._token
        if token is not None:
            try:
                _CURRENT.reset(token)
            except ValueError:
                _reset(token, context, context._node_id)
        if not self._done:  # finish(), inlined
            self._done = True
            if exc is None and self.kind == "llm" and self._started and not self._ledger_holds:
                context._settle_llm(self)  # what _settle would pick, one call sooner
            else:
                context._settle(self, exc)

    # Async entry and exit run in ampmeter._calls_async (plain Python: the compiled build's
    # coroutines and asyncio's cancellation did not mix); these are their synchronous steps.

    def __aenter__(self) -> Coroutine[Any, Any, Call]:
        return _calls_async.aenter(self)

    def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Coroutine[Any, Any, None]:
        return _calls_async.aexit(self, exc_type, exc, tb)

    def _enter_async_local(self) -> bool:
        """Enter as far as no ledger is involved; True if the ledger part is still to do."""
        if not self.context._has_ledger:
            self.__enter__()
            return False
        self._start(shared=False)
        return True

    def _enter_async_shared(self) -> None:
        """The ledger part of entering (on a worker thread: it is a network round trip)."""
        try:
            self.context._admit_shared(self)
        except BaseException:
            self._done = True  # refused by a ledger: the node is halted, nothing is held
            raise

    def _enter_async_cancelled(self, cancel: BaseException) -> None:
        """The entering task was cancelled; the ledger part has ended one way or the other."""
        if self._done:
            return
        self._done = True
        if self.node.status == "running":  # admitted after all: give its holds back
            self.context._settle(self, cancel)

    def _enter_async_done(self) -> Call:
        self._token = _CURRENT.set((self.context, self.node_id))
        return self

    def _exit_async_local(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        """Exit as far as no ledger is involved; True if the ledger commit is still to do."""
        if self._done or not self._ledger_holds:
            self.__exit__(exc_type, exc, tb)
            return False
        _reset(self._token, self.context, self.context._node_id)
        self._done = True
        return True


def _reset(
    token: contextvars.Token[tuple[ExecutionContext, str] | None] | None,
    context: ExecutionContext,
    node_id: str,
) -> None:
    if token is None:
        return
    try:
        _CURRENT.reset(token)
    except ValueError:
        # Exited in another task or thread than it was entered in: restore the enclosing level.
        _CURRENT.set((context, node_id))


class ExecutionContext:
    """One agent run (or sub-agent): its limits, its live stats and its place in the graph.

    ``limits=None`` means no limits beyond the shortcuts: ``max_cost_usd`` (``amp:cost``),
    ``max_steps`` (successful calls, ``amp:steps``), ``max_retries`` (``amp:retries``) and
    ``timeout_s`` (wall time). Sinks receive every node that ends; a ``ledger`` shares cost
    and token ceilings with other processes.
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
        _parent: ExecutionContext | None = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty str, got {name!r}")
        own_limits = _build_limits(limits, max_cost_usd, max_steps, max_retries)
        timeout = _check_limit_value("timeout_s", timeout_s, integer=False)
        if on_ledger_error not in ("halt", "allow"):
            raise ValueError(f"on_ledger_error must be 'halt' or 'allow', got {on_ledger_error!r}")
        if metadata is not None and not isinstance(metadata, Mapping):
            raise TypeError(f"metadata must be a mapping, got {type(metadata).__name__}")
        if ledger is not None and not isinstance(ledger, Ledger):
            raise TypeError(f"ledger must be a Ledger, got {type(ledger).__name__}")
        own_sinks = tuple(sinks)
        for sink in own_sinks:
            if not callable(getattr(sink, "emit", None)):
                raise TypeError(f"sinks must be Sink objects, got {type(sink).__name__}")
        self.name = name
        self.limits: tuple[Limit, ...] = own_limits
        # The limits compiled for the checks, with the object they were compiled from.
        self._limit_plan: tuple[LimitPlan, Sequence[Limit]] = (
            compile_limits(own_limits),
            own_limits,
        )
        self.parent = _parent
        self.ledger = ledger
        self.on_ledger_error = on_ledger_error
        self.data: Any = None
        meta: dict[str, Any] = dict(metadata or {})
        meta[META_CONTEXT] = True
        if _parent is None:
            self.graph = ExecutionGraph(chain_id, max_nodes=max_nodes)
            self.stats = ExecutionStats()
            # One lock for the graph and the stats tree: admitting a call (check, hold, mark it
            # running) and settling it (stats, check, mark it done) each take it once. Nothing
            # holds one of them while calling into the other, so sharing cannot deadlock.
            self.stats._lock = self.graph._lock
            self._node_id = self.graph.create_root(name, meta)
            self._sinks: tuple[Sink, ...] = own_sinks
            self._chain: tuple[ExecutionContext, ...] = (self,)
        else:
            self.graph = _parent.graph
            self.stats = ExecutionStats(_parent.stats)
            self._node_id = self.graph.begin_node(_parent._parent_node_id(), "system", name,
                                                  None, meta)  # fmt: skip
            self.graph.mark_running(self._node_id)
            inherited = _parent._sinks
            self._sinks = inherited + tuple(s for s in own_sinks if s not in inherited)
            self._chain = (self, *_parent._chain)
        self._deadline = time.monotonic() + timeout if timeout is not None else None
        self._timeout_s = timeout
        self._started_at = time.monotonic()
        self._canceled = False
        self._closed = False
        self._iteration = 0
        self._token: contextvars.Token[tuple[ExecutionContext, str] | None] | None = None
        self.termination_reason: TerminationReason | None = None
        self.exceeded_limit: ExceededLimit | None = None
        # Only contexts that can stop a call take part in the check before each call.
        self._guards = tuple(c for c in self._chain if c._can_stop())
        self._watched: dict[str, bool] = {}  # stats key -> whether one of our limits matches it
        # Reservation keys (in order) -> where a call with them holds what (see _holds_for).
        self._hold_plans: dict[tuple[str, ...], _Holds] = {}
        self._has_ledger = any(c.ledger is not None for c in self._guards)

    # -- identity -----------------------------------------------------------------------------

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
        """The current iteration (1-based), 0 before the first ``start_iteration()``."""
        return self._iteration

    @property
    def sinks(self) -> tuple[Sink, ...]:
        """The sinks this context's nodes go to (its own and its parents')."""
        return self._sinks

    def _can_stop(self) -> bool:
        return bool(self.limits) or self._deadline is not None or self.ledger is not None

    def _parent_node_id(self) -> str:
        current = _CURRENT.get()
        if current is not None and current[0] is self:
            return current[1]
        return self._node_id

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
    ) -> ExecutionContext:
        """A context for a sub-agent: a ``system`` node here, stats that roll up into ours."""
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
    ) -> Call:
        """An LLM call to run in a ``with`` block; entering it checks limits and reserves.

        The reservation is ``estimate_usd`` if given, else the price of the prompt (its token
        count, or ``len(prompt_text) / 4``) and ``max_tokens`` output tokens.
        """
        if self._closed:
            self._check_open()
        if model is not None and type(model) is not str:
            raise TypeError(f"model must be a str or None, got {type(model).__name__}")
        if provider is not None and type(provider) is not str:
            raise TypeError(f"provider must be a str or None, got {type(provider).__name__}")
        out_est = 0 if max_tokens is None else check_tokens(max_tokens, "max_tokens") or 0
        in_est = None if prompt_tokens is None else check_tokens(prompt_tokens, "prompt_tokens")
        if in_est is None:
            if prompt_text is not None and not isinstance(prompt_text, str):
                raise TypeError(
                    f"prompt_text must be a str or None, got {type(prompt_text).__name__}"
                )
            in_est = math.ceil(len(prompt_text) / 4) if prompt_text else 0
        if estimate_usd is not None:
            if type(estimate_usd) is float and 0.0 <= estimate_usd < math.inf:
                cost_est = estimate_usd
            else:
                cost_est = check_cost(estimate_usd, "estimate_usd")
        elif model and _pricing is not None:
            # Without max_tokens the pricing layer assumes its default output length: a budget
            # must not treat a call of unknown length as free.
            cost_est = (
                _pricing.estimate(
                    model,
                    provider,
                    prompt_tokens=in_est,
                    max_tokens=None if max_tokens is None else out_est,
                )
                or 0.0
            )
        else:
            cost_est = 0.0
        reservation: dict[str, float] = {KEY_LLM_CALLS: 1, KEY_STEPS: 1}
        if cost_est:
            reservation[KEY_COST] = cost_est
        if in_est:
            reservation[KEY_INPUT_TOKENS] = in_est
        if out_est:
            reservation[KEY_OUTPUT_TOKENS] = out_est
        if model:
            key_in, key_out, key_cost, _, _ = _model_keys(model)
            if cost_est:
                reservation[key_cost] = cost_est
            if in_est:
                reservation[key_in] = in_est
            if out_est:
                reservation[key_out] = out_est
        label = name if name is not None else (model or "llm")
        if type(label) is not str:
            raise TypeError(f"name must be a str, got {type(label).__name__}")
        return Call(self, "llm", label, model, provider, reservation, metadata)

    def tool_call(
        self,
        name: str,
        *,
        estimate_usd: float | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Call:
        """A tool call to run in a ``with`` block (counts ``amp:tool_calls[:<name>]``)."""
        self._check_open()
        if type(name) is not str or not name:
            raise ValueError(f"tool name must be a non-empty str, got {name!r}")
        reservation: dict[str, float] = {KEY_TOOL_CALLS: 1, KEY_TOOL_CALLS_FOR + name: 1,
                                         KEY_STEPS: 1}  # fmt: skip
        if estimate_usd:
            reservation[KEY_COST] = check_cost(estimate_usd, "estimate_usd")
        return Call(self, "tool", name, None, None, reservation, metadata)

    def step(
        self, name: str, *, kind: str = "system", metadata: Mapping[str, Any] | None = None
    ) -> Call:
        """A block of system work (or ``embedding``/``retrieval``/``memory``) that groups calls."""
        self._check_open()
        if not isinstance(name, str):
            raise TypeError(f"step name must be a str, got {type(name).__name__}")
        if not isinstance(kind, str):
            raise TypeError(f"kind must be a str, got {type(kind).__name__}")
        if kind in ("llm", "tool"):
            raise ValueError(f"use llm_call() or tool_call() for {kind!r} nodes")
        return Call(self, kind, name, None, None, {}, metadata)

    def retry(self, call: Call) -> None:
        """Count one retry on ``call``."""
        call.retry()

    def wrap_llm_call(
        self, fn: Callable[[], object], options: WrapOptions | None = None
    ) -> Decision:
        """Run ``fn`` as an LLM call: HALT if a limit stops it, RETRY if it raised, else ALLOW."""
        opts = options or WrapOptions()
        hint = check_cost(opts.cost_estimate_hint, "cost_estimate_hint")
        call = self.llm_call(opts.operation_name or "llm", model=opts.model,
                             estimate_usd=hint)  # fmt: skip
        return self._wrap(call, fn, hint)

    def wrap_tool_call(
        self, fn: Callable[[], object], options: WrapOptions | None = None
    ) -> Decision:
        """Run ``fn`` as a tool call: HALT if a limit stops it, RETRY if it raised, else ALLOW."""
        opts = options or WrapOptions()
        hint = check_cost(opts.cost_estimate_hint, "cost_estimate_hint")
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
        stats = self.stats
        if isinstance(record, ModelCallTrace):
            model = record.model
            counters, gauges = _model_usage(
                model,
                check_tokens(record.input_tokens, "input_tokens") or 0,
                check_tokens(record.output_tokens, "output_tokens") or 0,
                check_tokens(record.cached_tokens, "cached_tokens") or 0,
                check_tokens(record.reasoning_tokens, "reasoning_tokens") or 0,
                check_cost(record.cost_usd),
            )
            counters[KEY_LLM_CALLS] = 1
            with stats.lock:
                stats._apply_locked(counters, gauges)
        elif isinstance(record, ToolCallTrace):
            if type(record.tool_name) is not str or not record.tool_name:
                raise ValueError(f"tool_name must be a non-empty str, got {record.tool_name!r}")
            with stats.lock:
                stats._apply_locked({KEY_TOOL_CALLS: 1, KEY_TOOL_CALLS_FOR + record.tool_name: 1})
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
            with stats.lock:
                stats._apply_locked({total: 1, at + str(self._iteration): 1, consecutive: 1})
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
        """Count a new iteration and check limits; raises ``LimitExceeded`` if one is exceeded.

        Raises ``ExecutionCanceled`` once this context (or an enclosing one) was canceled, so a
        loop that makes no call still stops at its next iteration.
        """
        self._check_open()
        if self.canceled:
            raise ExecutionCanceled(f"context {self.name!r} was canceled")
        stats = self.stats
        with stats.lock:
            self._iteration = stats._bump_iterations_locked()
            hit = self._first_exceeded_locked({})
        if hit is not None:
            owner, exceeded, reason = hit
            self._mark_stopped(owner, exceeded, reason)
            raise LimitExceeded(f"{self.name}: {exceeded}", exceeded, None)
        return self._iteration

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
        """End the context (idempotent): its node ends and its sinks are flushed."""
        if self._closed:
            return
        self._closed = True
        if self.termination_reason is None:
            if exc is None:
                self.termination_reason = TerminationReason.SUCCESS
            elif isinstance(exc, LimitExceeded):
                self.termination_reason = (
                    TerminationReason.TIMEOUT
                    if exc.exceeded is not None and exc.exceeded.key == KEY_ELAPSED_S
                    else TerminationReason.LIMIT_EXCEEDED
                )
                self.exceeded_limit = self.exceeded_limit or exc.exceeded
            elif isinstance(exc, ExecutionCanceled):
                self.termination_reason = TerminationReason.CONTEXT_CANCELED
            else:
                self.termination_reason = TerminationReason.ERROR
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
        errors = self._emit(graph._ref(self._node_id))
        for sink in self._sinks:
            try:
                sink.flush()
            except Exception as error:
                errors.append(error)
        if errors and exc is None:
            raise errors[0]

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
                _CURRENT.set(None if self.parent is None else (self.parent, self.parent._node_id))
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
        """Graph snapshot plus this context's counters, gauges, reservations and termination."""
        exceeded = self.exceeded_limit
        return {
            "name": self.name,
            "chain_id": self.chain_id,
            "node_id": self._node_id,
            "iteration": self._iteration,
            "termination_reason": (
                self.termination_reason.value if self.termination_reason else None
            ),
            "exceeded_limit": None
            if exceeded is None
            else {
                "key": exceeded.key,
                "value": exceeded.value,
                "limit_key": exceeded.limit.key,
                "limit_type": exceeded.limit.type.value,
                "max_value": exceeded.limit.max_value,
            },
            "counters": self.stats.counters(),
            "gauges": self.stats.gauges(),
            "reserved": self.stats.reserved(),
            "graph": self.graph.snapshot(),
        }

    def __repr__(self) -> str:
        return f"ExecutionContext(name={self.name!r}, chain_id={self.chain_id!r})"

    # -- internals ----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"context {self.name!r} is closed")

    def _first_exceeded_locked(
        self, pending: dict[str, float]
    ) -> tuple[ExecutionContext, ExceededLimit, TerminationReason] | None:
        now = -1.0
        for ctx in self._guards:
            plan = ctx._limit_plan
            if plan[1] is not ctx.limits:  # ``limits`` was given a new value: compile it again
                plan = ctx._limit_plan = (compile_limits(ctx.limits), ctx.limits)
            if plan[0]:
                exceeded = check_plan_locked(ctx.stats, plan[0], pending)
                if exceeded is not None:
                    return ctx, exceeded, TerminationReason.LIMIT_EXCEEDED
            if ctx._deadline is not None:
                if now < 0:
                    now = time.monotonic()
                if now > ctx._deadline:
                    timeout = ctx._timeout_s or 0.0
                    exceeded = ExceededLimit(
                        Limit(KEY_ELAPSED_S, timeout), KEY_ELAPSED_S, now - ctx._started_at
                    )
                    return ctx, exceeded, TerminationReason.TIMEOUT
        return None

    def _mark_stopped(
        self, owner: ExecutionContext, exceeded: ExceededLimit, reason: TerminationReason
    ) -> None:
        # The context whose limit fired, and every context between it and the caller, stop.
        for ctx in self._chain:
            if ctx.exceeded_limit is None:
                ctx.exceeded_limit = exceeded
            if ctx.termination_reason is None or ctx.termination_reason not in _LOCAL_TERMINATIONS:
                ctx.termination_reason = reason
            if ctx is owner:
                break

    def _admit(self, call: Call, shared: bool = True) -> None:
        """Check the call's limits with its reservation, hold it, and mark the node running."""
        canceled = False
        for ctx in self._chain:  # the ``canceled`` property, inlined on the hot path
            if ctx._canceled:
                canceled = True
                break
        if canceled:
            self.graph.mark_halt(call.node_id, "context canceled")
            self._emit(call.node)
            raise ExecutionCanceled(f"context {self.name!r} was canceled", call.node_id)
        reservation = call._reservation
        has_ledger = self._has_ledger
        hit = None
        with self.stats.lock:  # the graph's lock as well
            if self._guards:
                holds = self._holds_for(reservation)
                hit = self._first_exceeded_locked(reservation)
                if hit is None:
                    for stats, keys in holds:
                        stats._hold_locked(keys, reservation)
                    call._holds = holds
            if hit is None and not has_ledger:
                self.graph._run_locked(call.node)
        if hit is not None:
            owner, exceeded, reason = hit
            self._mark_stopped(owner, exceeded, reason)
            self.graph.mark_halt(call.node_id, str(exceeded))
            self._emit(call.node)
            raise LimitExceeded(
                f"{call.kind} call {call.name!r} stopped before it ran: {exceeded}",
                exceeded,
                call.node_id,
            )
        if has_ledger and shared:
            self._admit_shared(call)

    def _admit_shared(self, call: Call) -> None:
        """The shared part of admitting a call: its holds in every ledger above, then running."""
        for ctx in self._guards:
            if ctx.ledger is not None:
                self._ledger_reserve(ctx, call)
        self.graph.mark_running(call.node_id)

    def _holds_for(self, reservation: Mapping[str, float]) -> _Holds:
        """Where to hold a call's reservation: each guard, with the keys its limits watch.

        Calls of a context come in a handful of shapes (which keys they reserve), so the answer
        is cached by the reservation's keys.
        """
        shape = tuple(reservation)
        holds = self._hold_plans.get(shape)
        if holds is not None:
            return holds
        found = []
        for ctx in self._guards:
            watched = ctx._watched
            keys = []
            for key in shape:
                watches = watched.get(key)
                if watches is None:
                    watches = any(limit.matches(key) for limit in ctx.limits)
                    if len(watched) < _WATCH_CACHE_MAX:
                        watched[key] = watches
                if watches:
                    keys.append(key)
            if keys:
                found.append((ctx.stats, tuple(keys)))
        holds = tuple(found)
        if len(self._hold_plans) < _WATCH_CACHE_MAX:
            self._hold_plans[shape] = holds
        return holds

    def _ledger_reserve(self, ctx: ExecutionContext, call: Call) -> None:
        """Hold the call's share of ``ctx``'s limits in its shared ledger."""
        reservation = call._reservation
        # Every exact limit takes part, also keys the call reserves nothing for (no estimate):
        # the hold is then 0, but the commit still adds what the call actually used. A prefix
        # limit takes part through the keys of its family this call may add to (its model's or
        # its tool's), each shared on its own, as the local check counts them.
        ceilings: dict[str, float] = {}
        owners: dict[str, Limit] = {}
        candidates: tuple[str, ...] | None = None
        for limit in ctx.limits:
            if limit.type is LimitType.EXACT:
                keys: Iterable[str] = (limit.key,)
            else:
                if candidates is None:
                    candidates = _keys_a_call_adds(call)
                keys = [key for key in candidates if key.startswith(limit.key)]
            for key in keys:
                if key not in ceilings or limit.max_value < ceilings[key]:
                    ceilings[key] = limit.max_value  # the tightest; the first of equals
                    owners[key] = limit
        ledger = ctx.ledger
        if not ceilings or ledger is None:
            return
        amounts = {key: float(reservation.get(key, 0.0)) for key in ceilings}
        try:
            held = ledger.reserve(amounts, ceilings)
        except LedgerUnavailable as error:
            if ctx.on_ledger_error == "allow":
                self.graph.update_metadata(
                    call.node_id, {"budget_enforced": False, "ledger_error": str(error)}
                )
                return
            reason = f"budget ledger unavailable (fail closed): {error}"
            self._abort_admission(call, reason)
            raise BudgetUnavailable(
                f"{call.kind} call {call.name!r} stopped: {reason}", None, call.node_id
            ) from error
        except BaseException as error:
            self._abort_admission(call, f"ledger error: {type(error).__name__}: {error}")
            raise
        if held is None:
            exceeded = _shared_exceeded(ledger, amounts, ceilings, owners)
            self._mark_stopped(ctx, exceeded, TerminationReason.LIMIT_EXCEEDED)
            self._abort_admission(call, f"shared budget {ledger.scope!r}: {exceeded}")
            raise LimitExceeded(
                f"{call.kind} call {call.name!r} stopped before it ran: shared budget "
                f"{ledger.scope!r}: {exceeded}",
                exceeded,
                call.node_id,
            )
        if call._ledger_holds is _NO_HOLDS:
            call._ledger_holds = []
        call._ledger_holds.append((ledger, held))

    def _abort_admission(self, call: Call, stop_reason: str) -> None:
        stats = self.stats
        with stats.lock:
            for held_stats, keys in call._holds:
                held_stats._unhold_locked(keys, call._reservation)
        call._holds = ()
        for ledger, held in call._ledger_holds:
            # If the release fails the lease returns the hold; the stop is what matters.
            with contextlib.suppress(Exception):
                ledger.release(held)
        call._ledger_holds = _NO_HOLDS
        self.graph.mark_halt(call.node_id, stop_reason)
        self._emit(call.node)

    def _settle(self, call: Call, exc: BaseException | None) -> None:
        graph = self.graph
        stats = self.stats
        if not call._started:
            # Never admitted (start() raised, or the block was never entered): nothing reserved.
            if exc is None:
                graph.mark_halt(call.node_id, "never started")
            self._emit(call.node)
            return
        kind = call.kind
        if kind == "llm" and exc is None and not call._ledger_holds:
            self._settle_llm(call)
            return
        model = call.model
        meta: dict[str, Any] = {}
        cost = call.cost_usd
        if kind == "llm":
            cost, status, meta = self._llm_outcome(call)
            counters, gauges = _model_usage(
                model or "", call.tokens_in or 0, call.tokens_out or 0, call.cached_tokens,
                call.reasoning_tokens, cost, per_model=bool(model),
            )  # fmt: skip
            counters[KEY_LLM_CALLS] = 1
            if status == "unpriced":
                # Unpriced is not zero: count such calls so budgets and reports can say so.
                counters[KEY_UNPRICED_LLM_CALLS] = 1
        elif kind == "tool":
            counters = {KEY_TOOL_CALLS: 1, KEY_TOOL_CALLS_FOR + call.name: 1}
            gauges = {KEY_COST: cost} if cost else {}
        else:
            counters, gauges = {}, {}
        interrupted = exc is not None and not isinstance(exc, Exception)
        if exc is None:
            if kind in ("llm", "tool"):
                counters[KEY_STEPS] = 1
        elif kind in ("llm", "tool") and not interrupted:
            counters[KEY_RETRIES] = 1
        hit = None
        with stats.lock:
            for held_stats, keys in call._holds:
                held_stats._unhold_locked(keys, call._reservation)
            stats._apply_locked(counters, gauges)
            if self._guards:  # the check after the call, under the same lock
                hit = self._first_exceeded_locked(_NO_PENDING)
        for ledger, held in call._ledger_holds:
            actual = {key: float(counters.get(key, 0) or gauges.get(key, 0.0)) for key in
                      held.amounts}  # fmt: skip
            try:
                ledger.commit(held, actual)
            except Exception as error:
                meta["ledger_error"] = redact.error_text(error)
        final_cost = cost or 0.0
        if exc is None:
            graph.mark_success(call.node_id, final_cost, call.tokens_in, call.tokens_out,
                               metadata=meta)  # fmt: skip
        elif interrupted:
            graph.mark_halt(
                call.node_id, "interrupted", cost_usd=final_cost, tokens_in=call.tokens_in,
                tokens_out=call.tokens_out, metadata=meta,
            )  # fmt: skip
        else:
            graph.mark_failure(call.node_id, type(exc).__name__, redact.error_text(exc),
                               cost_usd=final_cost, tokens_in=call.tokens_in,
                               tokens_out=call.tokens_out, metadata=meta)  # fmt: skip
        errors = self._emit(call.node) if self._sinks else None
        if hit is not None:
            self._mark_stopped(*hit)
        if errors and exc is None:
            raise errors[0]

    def _settle_llm(self, call: Call) -> None:
        """:meth:`_settle` for a successful LLM call with no ledger holds: the hot path.

        The same effects as the general path, with the usage added through the stats' per-model
        key plan instead of usage dicts built for each call.
        """
        cost, status, meta = self._llm_outcome(call)
        model = call.model or ""
        t_in = call.tokens_in
        t_out = call.tokens_out
        cached = call.cached_tokens
        reasoning = call.reasoning_tokens
        extra: dict[str, int] | None = None
        if cached or reasoning or status == "unpriced":
            extra = {}
            if cached:
                extra[KEY_CACHED_INPUT_TOKENS] = cached
            if reasoning:
                extra[KEY_REASONING_TOKENS] = reasoning
            if model:
                _, _, _, key_cached, key_reasoning = _model_keys(model)
                if cached:
                    extra[key_cached] = cached
                if reasoning:
                    extra[key_reasoning] = reasoning
            if status == "unpriced":
                extra[KEY_UNPRICED_LLM_CALLS] = 1
        stats = self.stats
        reservation = call._reservation
        hit = None
        with stats.lock:  # the graph's lock as well: stats, check and node end in one step
            for held_stats, keys in call._holds:
                held_stats._unhold_locked(keys, reservation)
            if type(cost) is not float or not 0.0 <= cost < math.inf:
                # A pricing layer's answer: a bad one raises here, with the reservation given
                # back and no usage added.
                cost = check_cost(cost)
            stats._settle_llm_locked(model, t_in or 0, t_out or 0, cost)
            if extra:
                stats._apply_locked(extra)
            if self._guards:  # the check after the call
                hit = self._first_exceeded_locked(_NO_PENDING)
            self.graph._succeed_locked(call.node, cost, t_in, t_out, meta)
        errors = self._emit(call.node) if self._sinks else None
        if hit is not None:
            self._mark_stopped(*hit)
        if errors:
            raise errors[0]

    def _llm_outcome(self, call: Call) -> tuple[float, str, dict[str, Any]]:
        """An ended LLM call's cost, its cost status and the usage metadata for its node."""
        cost = call.cost_usd
        if cost is not None:
            status, version = "given", None
        else:
            cost, status, version = self._price(call)
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
        return cost, status, meta

    def _price(self, call: Call) -> tuple[float, str, str | None]:
        if call.cost_usd is not None:
            return call.cost_usd, "given", None
        if not call.model or _pricing is None or not call._recorded:
            return 0.0, "unpriced", None
        result = _pricing.price(
            call.model,
            call.provider,
            input_tokens=call.tokens_in or 0,
            output_tokens=call.tokens_out or 0,
            cached_tokens=call.cached_tokens,
            cache_write_tokens=call.cache_write_tokens,
            reasoning_tokens=call.reasoning_tokens,
        )
        if result.cost_usd is None:
            return 0.0, "unpriced", result.pricing_version
        return result.cost_usd, "priced", result.pricing_version

    def _emit(self, node: Node) -> list[Exception]:
        errors: list[Exception] = []
        chain_id = self.graph.chain_id
        for sink in self._sinks:
            try:
                sink.emit(node, chain_id)
            except Exception as error:
                errors.append(error)
        return errors


def _keys_a_call_adds(call: Call) -> tuple[str, ...]:
    """The stats keys a call may add to when it ends (what its reservation names, plus its
    model's or its tool's own keys)."""
    keys = dict.fromkeys(call._reservation)
    if call.kind == "llm":
        keys.update(dict.fromkeys((KEY_INPUT_TOKENS, KEY_OUTPUT_TOKENS, KEY_COST, KEY_LLM_CALLS,
                                   KEY_CACHED_INPUT_TOKENS, KEY_REASONING_TOKENS)))  # fmt: skip
        if call.model:
            keys.update(dict.fromkeys(_model_keys(call.model)))
    elif call.kind == "tool":
        keys.update(dict.fromkeys((KEY_TOOL_CALLS, KEY_TOOL_CALLS_FOR + call.name, KEY_COST)))
    return tuple(keys)


def _shared_exceeded(
    ledger: Ledger,
    amounts: Mapping[str, float],
    ceilings: Mapping[str, float],
    owners: Mapping[str, Limit],
) -> ExceededLimit:
    """Which shared ceiling refused a reservation: the first (in limit order) now over it.

    The ledger is read after the refusal, so others may have settled meanwhile (then the first
    ceiling is named) or the read may fail (then the value is just this call's amount).
    """
    try:
        spent, held = ledger.spent(), ledger.reserved()
    except Exception:
        spent, held = {}, {}
    values = {key: spent.get(key, 0.0) + held.get(key, 0.0) + amounts[key] for key in ceilings}
    key = next((k for k in ceilings if values[k] > ceilings[k]), next(iter(ceilings)))
    return ExceededLimit(owners[key], key, values[key])


def _model_usage(
    model: str,
    tokens_in: int,
    tokens_out: int,
    cached: int,
    reasoning: int,
    cost: float,
    *,
    per_model: bool = True,
) -> tuple[dict[str, int], dict[str, float]]:
    counters: dict[str, int] = {KEY_INPUT_TOKENS: tokens_in, KEY_OUTPUT_TOKENS: tokens_out}
    gauges: dict[str, float] = {KEY_COST: cost}
    if per_model:
        key_in, key_out, key_cost, key_cached, key_reasoning = _model_keys(model)
        counters[key_in] = tokens_in
        counters[key_out] = tokens_out
        gauges[key_cost] = cost
    if cached:
        counters[KEY_CACHED_INPUT_TOKENS] = cached
        if per_model:
            counters[key_cached] = cached
    if reasoning:
        counters[KEY_REASONING_TOKENS] = reasoning
        if per_model:
            counters[key_reasoning] = reasoning
    return counters, gauges


_NO_HOLDS: Final[list[tuple[Ledger, Reservation]]] = []  # shared, never appended to
_WATCH_CACHE_MAX: Final = 4_096  # per context: which keys its limits watch
_MODEL_KEYS: dict[str, tuple[str, str, str, str, str]] = {}
_MODEL_KEYS_MAX: Final = 4_096


def _model_keys(model: str) -> tuple[str, str, str, str, str]:
    """The per-model keys (input, output, cost, cached, reasoning) of ``model``, cached.

    Reusing one key object per model saves building and hashing the strings on every call, at
    every level the usage reaches. The cache is bounded; past it keys are built each time.
    """
    keys = _MODEL_KEYS.get(model)
    if keys is None:
        keys = (
            KEY_INPUT_TOKENS_FOR + model,
            KEY_OUTPUT_TOKENS_FOR + model,
            KEY_COST_FOR + model,
            KEY_CACHED_INPUT_TOKENS_FOR + model,
            KEY_REASONING_TOKENS_FOR + model,
        )
        if len(_MODEL_KEYS) < _MODEL_KEYS_MAX:
            _MODEL_KEYS[model] = keys
    return keys


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
    cost = _check_limit_value("max_cost_usd", max_cost_usd, integer=False)
    steps = _check_limit_value("max_steps", max_steps, integer=True)
    retries = _check_limit_value("max_retries", max_retries, integer=True)
    if cost is not None:
        built.append(Limit(KEY_COST, cost))
    if steps is not None:
        built.append(Limit(KEY_STEPS, steps))
    if retries is not None:
        built.append(Limit(KEY_RETRIES, retries))
    return tuple(built)
