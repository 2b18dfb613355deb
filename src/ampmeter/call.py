"""``Call``: one LLM call, tool call or step of a context. Reserve before, record after.

A call goes through four steps:

1. **begin** - its node is created in the graph under the current node (when the call is made);
2. **admit** - the context's admission checks the call's reservation (its estimated counts)
   against every limit above it and holds it, or halts the node and raises
   :class:`~ampmeter.LimitExceeded` before any user code runs;
3. **run** - the user's block (or the SDK request) runs;
4. **settle** - every step replaces its hold by what the call used, the node ends, sinks see it.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Mapping
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from ampmeter import _validate, money, redact
from ampmeter._core.idempotency import META_IDEMPOTENCY_KEY
from ampmeter._core.interrupted import charged_in_flight, is_interrupted_in_flight
from ampmeter._core.outcome import Ending
from ampmeter._core.readonly import ReadOnly
from ampmeter._core.ticket import ADMITTED, DONE, NEW, Reserved, Ticket
from ampmeter._core.usage import Spent
from ampmeter._core.waiting import off_loop, run_async, run_sync
from ampmeter._current import CURRENT, restore
from ampmeter._scoped import Scoped
from ampmeter._validate import Counts
from ampmeter.keys import KEY_UNSETTLED_COST
from ampmeter.node import Node
from ampmeter.pricing import request_size
from ampmeter.pricing.parts import check_parts

if TYPE_CHECKING:
    from ampmeter._core.steps import KindPlan
    from ampmeter.context import ExecutionContext
    from ampmeter.policies.marks import CallMarks
    from ampmeter.pricing.plan import PricePlan

__all__ = ["Call"]

# The counts record() takes, in its order (what an error names).
_RECORDED = (
    "tokens_in",
    "tokens_out",
    "cached_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
    "tool_calls_made",
)
_NO_COUNTS: Counts = (0, 0, 0, 0, 0, 0)
_COUNT = "One count of the call's usage, read-only: :meth:`Call.record` is its only writer."
# A count assigned from outside would be settled unchecked (a negative input count gives a cap
# back), so an assignment is refused, naming what to do instead.
_RECORD = ": report its usage with call.record(...), once, before the call ends"


class Call(Scoped, Ticket):
    """One call (LLM, tool or step) in a context: reserve before, record after.

    Use it as ``with ctx.llm_call(...) as call:`` (or ``async with``), and report usage with
    :meth:`record` once, inside the block. Integrations that cannot wrap a block (a stream that
    ends later) call :meth:`start` and :meth:`finish` themselves.

    Its counts (``tokens_in``, ``tokens_out``, ``cached_tokens``, ``cache_write_tokens``,
    ``reasoning_tokens``, ``tool_calls_made``) are read-only: :meth:`record` is their only
    writer (``tokens_in`` and ``tokens_out`` are None until it gives them).
    """

    __slots__ = (
        "_cost_nano",
        "_counts",
        "_estimated",
        "_parts",
        "_price_plan",
        "_prompt_size",
        "_token",
        "_tokens_in",
        "_tokens_out",
        "context",
    )

    tokens_in: ReadOnly[int | None] = ReadOnly(_COUNT, _RECORD)
    tokens_out: ReadOnly[int | None] = ReadOnly(_COUNT, _RECORD)
    # The rest are kept in ``_counts``, in record()'s order (see _validate.Counts).
    cached_tokens: ReadOnly[int] = ReadOnly(_COUNT, _RECORD, of="_counts", at=2)
    cache_write_tokens: ReadOnly[int] = ReadOnly(_COUNT, _RECORD, of="_counts", at=3)
    reasoning_tokens: ReadOnly[int] = ReadOnly(_COUNT, _RECORD, of="_counts", at=4)
    tool_calls_made: ReadOnly[int] = ReadOnly(_COUNT, _RECORD, of="_counts", at=5)

    def __init__(
        self,
        context: ExecutionContext,
        reserved: Reserved,
        plan: KindPlan,
        *,
        provider: str | None = None,
        marks: Any = None,
        idempotency_key: str | None = None,
        price_plan: PricePlan | None = None,
        prompt_size: Any = None,
    ) -> None:
        """A call reserving ``reserved`` by ``plan`` (its context's for its kind and model),
        made by ``context`` (see :meth:`~ampmeter.ExecutionContext.llm_call`), which begins its
        node; not yet admitted."""
        self.context = context
        self.plan = plan
        self._reserved = reserved
        self._provider = provider
        self._marks = marks
        self._idempotency_key = idempotency_key
        self.phase = NEW
        self.rows = None  # the ceilings a policy chose, if any
        self.ledger_holds = ()  # (ledger, its reservation)
        self.recorded = False
        self._price_plan = price_plan  # the price plan of its model (None: a tool, or no model)
        self._prompt_size = prompt_size  # the request's measure (learned from at the end)
        self._tokens_in: int | None = None  # as given to record() (None: not given)
        self._tokens_out: int | None = None
        self._counts: Counts = _NO_COUNTS  # as record() checked them
        self._cost_nano: int | None = None  # the recorded cost, if any
        self._estimated = False  # the recorded counts are ampmeter's, not the provider's
        self._parts: dict[str, int] | None = None  # billed parts, as record() checked them
        self._token: contextvars.Token[Any] | None = None

    @property
    def node(self) -> Node:
        """A copy of this call's node as it is now (changing it changes nothing)."""
        return self.context.graph.node(self.node_id)

    @property
    def cost_usd(self) -> Decimal | None:
        """The cost recorded, in dollars (None until :meth:`record` gives one)."""
        return None if self._cost_nano is None else money.from_nano(self._cost_nano)

    @property
    def policy(self) -> CallMarks | None:
        """What the context's policies noted about this call (None when none applies)."""
        marks: CallMarks | None = self.marks
        return marks

    def record(
        self,
        tokens_in: int | None = None,
        tokens_out: int | None = None,
        cost_usd: float | Decimal | None = None,
        cached_tokens: int = 0,
        reasoning_tokens: int = 0,
        tool_calls_made: int = 0,
        *,
        cache_write_tokens: int = 0,
        estimated: bool = False,
        parts: Mapping[str, int] | None = None,
    ) -> None:
        """Report the call's usage, once, before the call ends: the only writer of its counts.

        Cached and cache-write tokens are subsets of ``tokens_in``, reasoning tokens of
        ``tokens_out``. Without ``cost_usd`` the pricing layer prices the call when it ends.
        Counts are ints from 0 to 2**53; the cost a finite number >= 0. ``estimated``: the
        counts are an estimate, not the provider's (the call's ``cost_status`` says
        ``"estimated"``). ``parts``: usage the provider bills at rates of its own, by
        genai-prices' names (``{"cache_write_1h_tokens": 900, "input_audio_tokens": 120,
        "web_searches": 2}``; see :data:`ampmeter.pricing.parts.PARTS`), each a subset of the
        count it belongs to (1-hour writes of the cache-write tokens, audio of the input, ...)
        or a server tool's uses; each is priced at its own rate where the model has one and
        shown in the node's metadata under its name. Recording after the call ended, or a
        second time, raises ``RuntimeError``: usage recorded twice would be either lost or
        counted twice, and neither is what the caller meant.
        """
        counts = _validate.usage_counts(
            _RECORDED,
            0 if tokens_in is None else tokens_in,
            0 if tokens_out is None else tokens_out,
            cached_tokens,
            cache_write_tokens,
            reasoning_tokens,
            tool_calls_made,
        )
        cost = None if cost_usd is None else _validate.nano(cost_usd, "cost_usd")
        checked = None if parts is None else check_parts(parts, counts) or None
        if self.phase == DONE:
            raise RuntimeError(
                f"call {self.node_id} ({self.name!r}) has ended: record() its usage inside the "
                "with block (or before finish())"
            )
        if self.recorded:
            raise RuntimeError(
                f"call {self.node_id} ({self.name!r}) was recorded already: record() once, "
                "with the call's whole usage"
            )
        self._tokens_in = None if tokens_in is None else counts[0]
        self._tokens_out = None if tokens_out is None else counts[1]
        self._counts = counts
        self._cost_nano = cost
        self._estimated = estimated
        self._parts = checked
        self.recorded = True

    def note_tool_calls(self, count: int) -> None:
        """Note the tool calls a response asked for when it reported no usage to
        :meth:`record` (instrumentation reading a provider's response): the call stays
        unrecorded, and is priced as such. ``RuntimeError`` as :meth:`record` once it ended."""
        checked = _validate.count(count, "tool_calls_made")
        if self.phase == DONE:
            raise RuntimeError(f"call {self.node_id} ({self.name!r}) has ended")
        self._counts = (*self._counts[:5], checked)

    def offer_idempotency_key(self, key: str) -> bool:
        """Count this call once per ``key`` (see ``llm_call(idempotency_key=...)``), unless it
        has a key already; True if ``key`` is now its key. Must come before the call ends."""
        key = _validate.text(key, "idempotency_key", empty=False)
        if self.phase == DONE:
            raise RuntimeError(f"call {self.node_id} ({self.name!r}) has ended")
        if self._idempotency_key is None:
            self._idempotency_key = key
            return True
        return self._idempotency_key == key

    def retry(self) -> None:
        """Count one retry on this call (its node and ``amp:retries`` everywhere above)."""
        admission = self.plan.admission
        admission.kernel.retry(self.kernel_node, admission.level)

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> Call:
        """Check limits with this call's reservation and mark it running.

        Raises :class:`~ampmeter.LimitExceeded` (the node is halted) when the call would break a
        limit of this context or an enclosing one, and ``ExecutionCanceled`` after ``cancel()``.
        """
        waits = self.plan.admission.admit(self, threading.get_ident(), self._reserved)
        if waits is not None:  # (a step waits: for room, or on a shared ledger)
            run_sync(waits)
        return self

    def finish(
        self, exc: BaseException | None = None, metadata: dict[str, Any] | None = None
    ) -> None:
        """End the call: success, or ``fail`` with ``exc``'s class (``halt`` if interrupted).
        ``metadata`` (what an integration read from the response) is merged into the node's as
        it ends, in the same step."""
        if self.phase == DONE:
            return
        self.phase = DONE
        spent, ending = self._ended(exc, metadata)
        self.plan.admission.settle(self, spent, ending)

    def _enter(self) -> None:
        self.start()
        self._make_current()

    def _make_current(self) -> None:
        try:
            self._token = CURRENT.set((self.context, self.kernel_node.node_id))
        except BaseException as exc:  # interrupted right after admission: give the hold back
            self.finish(exc)
            raise

    def _leave(self, exc: BaseException | None) -> None:
        try:
            self.finish(exc)
        finally:
            restore(self._token, self.context)

    async def _aenter(self) -> None:
        waits = self.plan.admission.admit(self, None, self._reserved)
        if waits is not None:
            await run_async(waits)
        self._make_current()

    async def _aleave(self, exc: BaseException | None) -> None:
        # (A coroutine closed unfinished, GeneratorExit, can await nothing: it settles here.)
        if self.phase != ADMITTED or not self.ledger_holds or isinstance(exc, GeneratorExit):
            self._leave(exc)
            return
        restore(self._token, self.context)
        self.phase = DONE
        spent, ending = self._ended(exc)
        # Committing to a ledger is a network round trip: on a worker thread, the loop goes on.
        await off_loop(lambda: self.plan.admission.settle(self, spent, ending))

    def _ended(
        self, exc: BaseException | None, read: dict[str, Any] | None = None
    ) -> tuple[Spent, Ending]:
        """What the call spent and how it ended (priced now when no cost was recorded; an
        interrupt in flight charges the reservation: see :mod:`ampmeter._core.interrupted`),
        with what an integration ``read`` from the response under the call's own metadata."""
        if exc is not None and is_interrupted_in_flight(self, exc):
            spent, ending = charged_in_flight(self, exc, read)
            if spent[6]:  # (its cost)
                admission = self.plan.admission
                admission.kernel.add(admission.level, KEY_UNSETTLED_COST, spent[6], True)
            return spent, ending
        # Success without exc (a step), ``fail`` with an Exception (a retry), else ``halt``: an
        # interrupt (a BaseException that is not an Exception) is neither.
        if exc is None:
            status, error, reason, succeeded, failed = "success", None, None, 1, 0
        elif isinstance(exc, Exception):
            status, error, reason = "fail", type(exc).__name__, redact.error_text(exc)
            succeeded, failed = 0, 1
        else:
            status, error, reason, succeeded, failed = "halt", None, "interrupted", 0, 0
        node = self.kernel_node
        kind, model = node.kind, node.model
        counts = self._counts
        meta: dict[str, Any] = {**read} if read else {}  # what its price says goes in too
        if kind == "llm" or (kind == "embedding" and model):
            plan = self._price_plan
            assert plan is not None  # every model call has one (CallMaker.model_call)
            cost, unpriced = plan.price(
                counts,
                self._cost_nano,
                meta,
                recorded=self.recorded,
                estimated=self._estimated,
                parts=self._parts,
            )
            size = self._prompt_size  # (None: nothing to learn from)
            # (An estimate teaches nothing: it would only confirm itself.)
            learns = size is not None and exc is None and not self._estimated and counts[0]
            if learns and kind == "llm":
                request_size.learn(model or "", size, counts[0])
        else:  # (no price: its cost is what it recorded, if anything)
            cost, unpriced = self._cost_nano or 0, 0
        if self._idempotency_key is not None:
            meta[META_IDEMPOTENCY_KEY] = self._idempotency_key
        spent = (*counts, cost, 1, succeeded, failed, unpriced)
        return spent, (status, cost, self._tokens_in, self._tokens_out, error, reason, meta)
