"""The compiled policies of one context: what they check before a call and after it.

* **unpriced models**: under a cost limit (of the context or an enclosing one) a call to a model
  the pricing layer cannot price is refused before it is sent (``on_unpriced="refuse"``, the
  default), reported (``"warn"``) or let through (``"allow"``);
* **warnings** (``Limit(..., warn_at=(0.5, 0.8))``) and **soft limits** (``soft=True``, which
  set ``ctx.wrap_up`` instead of refusing), reported as :class:`LimitEvent`;
* a **final-answer reserve** (``final_reserve_usd``) only calls marked final may spend;
* **windowed limits** (``Limit(key, max, window_s=60)``);
* a **loop guard** (``max_repeats``): the same request or tool call with the same arguments
  more than N times is refused;
* a **per-call input cap** (``max_input_tokens_per_call``);
* a **budget-pressure hook** that may change or refuse an instrumented request once a fraction
  of the cost budget is spent.

Through a shared ledger (a context with ``ledger=``) windowed limits, the loop guard, warnings
and soft limits count what every process sharing the ledger's scope did: the windows and the
repeat counts are checked in the ledger's reserve, warnings and soft limits read the shared
total after each settlement (a warning fires once per scope across processes, through
:meth:`~ampmeter.ledgers.Ledger.claim`), and the budget pressure reads the shared spend.

A context compiles its policies (its own options and those it inherits) once, when it is made:
a context that uses none has ``policies is None`` and pays one ``if`` per call. Otherwise the
context calls :meth:`Policies.admit` before the kernel's check (it may refuse the call and it
chooses the ceilings the check uses) and :meth:`Policies.settled` once the call's usage is
added.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Final

from ampmeter import money
from ampmeter._core.outcome import TerminationReason
from ampmeter.keys import KEY_COST, KEY_UNPRICED_LLM_CALLS
from ampmeter.limits import DerivedCeiling, ExceededLimit, Limit, LimitType
from ampmeter.policies.options import (
    KEY_BUDGET_PRESSURE,
    KEY_INPUT_TOKENS_PER_CALL,
    KEY_REPEATS_FOR,
    META_LIMIT_EVENTS,
    LimitEvent,
    OnUnpriced,
    PolicyOptions,
    fingerprint,
    is_cost_ceiling,
    request_fingerprint,
)
from ampmeter.policies.shared_totals import SharedTotals, shared_totals

if TYPE_CHECKING:
    from ampmeter._core.check import Guard, LimitRow
    from ampmeter._core.usage import Usage
    from ampmeter.call import Call
    from ampmeter.context import ExecutionContext

__all__ = ["CallMarks", "Policies"]

_MATCHED_MAX: Final = 4_096  # per context: usage shapes with their watched (limit, key) pairs

SharedTerms = tuple[dict[str, Any], dict[str, Limit], dict[str, Any], tuple[Limit, ...]]
Refusal = tuple["ExecutionContext", ExceededLimit, TerminationReason]


def _watches_cost(limit: Limit) -> bool:
    return limit.matches(KEY_COST) or (limit.key.startswith(KEY_COST) and not limit.soft)


def _spent_cost(ctx: ExecutionContext) -> Decimal:
    """What ``ctx``'s cost budget has spent, in dollars: through a shared ledger, every
    process's spend (read at most every :data:`SHARED_READ_S`); else this process's."""
    local: Decimal = ctx.stats.get_gauge(KEY_COST)
    if ctx.ledger is None:
        return local
    totals = shared_totals(ctx.ledger).read()
    return local if totals is None else max(local, Decimal(totals.get(KEY_COST, 0)))


def _first(
    shared: SharedTotals | None, kind: str, limit: Limit, key: str, threshold: float | None
) -> bool:
    """Whether this process reports the event (through a shared ledger, the first one does)."""
    if shared is None:
        return True
    return shared.claim(f"{kind} {limit.describe()} {key} {threshold}")


class CallMarks:
    """What the policies need to know about one call, set when it is made."""

    __slots__ = ("final", "fingerprint", "input_tokens", "model", "priced", "refusal")

    def __init__(
        self,
        model: str | None,
        priced: bool,
        input_tokens: int,
        final: bool,
        fingerprint: str | None,
    ) -> None:
        self.model = model
        self.priced = priced
        self.input_tokens = input_tokens
        self.final = final
        self.fingerprint = fingerprint
        self.refusal: ExceededLimit | None = None  # set by the budget-pressure hook


class Owned:
    """The limits and policies one context declares, with their state."""

    __slots__ = (
        "context",
        "done",
        "events",
        "fired",
        "lock",
        "matched",
        "max_repeats",
        "on_event",
        "repeats",
        "shared",
        "watched",
        "windows",
        "wrapped",
    )

    def __init__(
        self,
        ctx: ExecutionContext,
        on_event: Callable[[LimitEvent], None] | None,
        max_repeats: int | None,
    ) -> None:
        self.context = ctx
        self.on_event = on_event
        self.lock = threading.Lock()
        self.events: list[LimitEvent] = []
        self.watched = tuple(lim for lim in ctx.limits if lim.warn_at or lim.soft)
        self.windows = tuple(Window(lim) for lim in ctx.limits if lim.window_s is not None)
        self.fired: set[tuple[int, str, float | None]] = set()
        self.done: set[tuple[int, str]] = set()  # (limit, key) pairs with nothing left to fire
        self.matched: dict[tuple[tuple[str, int, bool], ...], tuple[Any, ...]] = {}
        self.wrapped = False
        self.max_repeats = max_repeats
        self.repeats: dict[str, int] = {}
        self.shared = shared_totals(ctx.ledger) if ctx.ledger is not None else None

    @property
    def declares(self) -> bool:
        return bool(self.watched or self.windows or self.max_repeats is not None)


class Window:
    """What settled in the last ``window_s`` seconds for a windowed limit's key."""

    __slots__ = ("expired", "limit", "lock", "recent")

    def __init__(self, limit: Limit) -> None:
        self.limit = limit
        self.lock = threading.Lock()
        # (monotonic time, amount as the kernel counts it: money in nano-dollars)
        self.recent: deque[tuple[float, Any]] = deque()
        self.expired: Any = 0  # settled amounts that have left the window

    def add(self, amount: Any) -> None:
        with self.lock:
            self.recent.append((time.monotonic(), amount))

    def left_window(self) -> Any:
        """The settled amount older than the window (it only grows)."""
        assert self.limit.window_s is not None
        start = time.monotonic() - self.limit.window_s
        with self.lock:
            recent = self.recent
            while recent and recent[0][0] <= start:
                self.expired += recent.popleft()[1]
            return self.expired


# -- the compiled policies of one context --------------------------------------------------------


class Policies:
    """The policies in force for one context's calls (its own and those it inherits)."""

    __slots__ = (
        "chain_owned",
        "context",
        "cost_ceilings",
        "cost_owner",
        "guard_rows",
        "marks_all",
        "max_input",
        "options",
        "ordinary_rows",
        "owned",
        "pressure",
        "unpriced",
        "watches",
        "window_slots",
    )

    def __init__(
        self,
        ctx: ExecutionContext,
        options: PolicyOptions,
        chain: tuple[ExecutionContext, ...],
        guards: tuple[ExecutionContext, ...],
        guard_rows: tuple[Guard, ...],
    ) -> None:
        self.context = ctx
        self.options = options
        self.guard_rows = guard_rows
        parent = ctx.parent.policies if ctx.parent is not None else None
        self.owned = Owned(ctx, options.on_limit_event, options.max_repeats)
        inherited = parent.chain_owned if parent is not None else ()
        self.chain_owned: tuple[Owned, ...] = (self.owned, *inherited)
        # The nearest context with a cost limit, and every cost ceiling above (for pressure).
        self.cost_owner = next((c for c in chain if any(map(_watches_cost, c.limits))), None)
        self.cost_ceilings = tuple(
            (c, lim.max_value)
            for c in chain
            for lim in c.limits
            if is_cost_ceiling(lim) and lim.max_value > 0
        )
        mode = options.on_unpriced or "refuse"
        self.unpriced: OnUnpriced | None = (
            mode if mode != "allow" and self.cost_owner is not None else None
        )
        self.max_input = options.max_input_tokens_per_call
        self.pressure = (
            options.on_budget_pressure
            if options.on_budget_pressure is not None and self.cost_ceilings
            else None
        )
        self.ordinary_rows = self._reserve_rows(guards, guard_rows)
        # (guard index, windows of that guard's context)
        windows = {id(owned.context): owned.windows for owned in self.chain_owned}
        self.window_slots = tuple(
            (index, windows[id(c)]) for index, c in enumerate(guards) if windows.get(id(c))
        )

        # Only the unpriced check in force (a cost limit and nothing else): a priced call needs no
        # marks, and its admission no work beyond one test.
        self.marks_all = bool(
            self.max_input is not None
            or self.pressure is not None
            or self.ordinary_rows is not None
            or self.window_slots
            or any(owned.declares for owned in self.chain_owned)
        )

        # Whether a settlement has anything to do (windows, warnings, soft limits, the input cap).
        self.watches = bool(
            self.max_input is not None
            or any(owned.watched or owned.windows for owned in self.chain_owned)
        )

    def refresh(self, guards: tuple[ExecutionContext, ...], guard_rows: tuple[Guard, ...]) -> None:
        """Take ``guard_rows`` as the ceilings from now on (a limit was raised)."""
        self.guard_rows = guard_rows
        self.ordinary_rows = self._reserve_rows(guards, guard_rows)

    @staticmethod
    def _reserve_rows(
        guards: tuple[ExecutionContext, ...], guard_rows: tuple[Guard, ...]
    ) -> tuple[Guard, ...] | None:
        """The guards with each final-answer reserve taken off its context's cost ceilings."""
        found = False
        rows: list[Guard] = []
        for ctx, (level, base) in zip(guards, guard_rows, strict=True):
            reserve = ctx.policy_options.final_reserve_usd
            if reserve is None:
                rows.append((level, base))
                continue
            found = True
            lowered: list[LimitRow] = []
            for limit in ctx.limits:
                if is_cost_ceiling(limit):
                    top = limit.max_value - reserve
                    kept = money.format_usd(reserve)
                    ceiling = DerivedCeiling(
                        Limit(KEY_COST, top),
                        0,
                        f"final-answer reserve ({kept} kept for a call marked final)",
                    )
                    lowered.append(
                        (False, KEY_COST, money.to_nano(top, allow_negative=True), ceiling)
                    )
            rows.append((level, (*base, *lowered)))
        return tuple(rows) if found else None

    @classmethod
    def compile(
        cls,
        ctx: ExecutionContext,
        chain: tuple[ExecutionContext, ...],
        guards: tuple[ExecutionContext, ...],
        guard_rows: tuple[Guard, ...],
    ) -> Policies | None:
        """The policies of ``ctx`` (made last in its ``__init__``), or None when none apply."""
        policies = cls(ctx, ctx.policy_options, chain, guards, guard_rows)
        return policies if policies.active else None

    @property
    def active(self) -> bool:
        """Whether any policy applies to this context's calls."""
        return self.unpriced is not None or self.marks_all

    @property
    def wrap_up(self) -> bool:
        """Whether a soft limit of this context or an enclosing one was exceeded (through a
        shared ledger: by the total of every process, read at most every
        :data:`SHARED_READ_S`)."""
        for owned in self.chain_owned:
            if owned.wrapped:
                return True
            if owned.shared is not None and owned.watched:
                totals = owned.shared.read()
                if totals is not None and any(
                    limit.soft and totals.get(limit.key, 0.0) > limit.max_value
                    for limit in owned.watched
                ):
                    owned.wrapped = True
                    return True
        return False

    @property
    def tracks_repeats(self) -> bool:
        """Whether a loop guard counts this context's calls."""
        return any(owned.max_repeats is not None for owned in self.chain_owned)

    def events(self) -> list[dict[str, Any]]:
        """This context's own limit events, as dicts."""
        with self.owned.lock:
            return [event.to_dict() for event in self.owned.events]

    # -- making a call --------------------------------------------------------------------------

    def llm_marks(
        self,
        model: str | None,
        priced: bool,
        input_tokens: int,
        prompt_text: str | None,
        final: bool,
    ) -> CallMarks | None:
        """The marks of an LLM call (``priced``: by the table, a set price or the caller);
        None when no policy needs them."""
        if priced and not self.marks_all:
            return None
        key = None
        if prompt_text is not None and self.tracks_repeats:
            key = fingerprint("llm", model, prompt_text)
        return CallMarks(model, priced, input_tokens, final, key)

    def tool_marks(self, name: str, arguments: object) -> CallMarks | None:
        """The marks of a tool call (a loop-guard identity when ``arguments`` are given)."""
        if not self.marks_all:
            return None
        key = None
        if arguments is not None and self.tracks_repeats:
            key = fingerprint("tool", name, arguments)
        return CallMarks(None, True, 0, False, key)

    def mark_request(
        self, call: Call, request: Mapping[str, Any], refused: ExceededLimit | None
    ) -> None:
        """An instrumented request's marks: its identity, and the pressure hook's refusal."""
        marks = call.policy
        if marks is None:
            return
        marks.refusal = refused
        if self.tracks_repeats:
            marks.fingerprint = request_fingerprint(request)

    def pressure_fraction(self) -> float:
        """The largest share of a cost ceiling here or above that is spent."""
        return max(float(_spent_cost(c) / top) for c, top in self.cost_ceilings)

    def relieve_pressure(
        self, ctx: ExecutionContext, request: dict[str, Any]
    ) -> ExceededLimit | None:
        """Pass ``request`` (an SDK call's keyword arguments) to ``on_budget_pressure`` once
        ``pressure_at`` of a cost budget is spent (a budget shared through a ledger: what all
        its processes spent, read at most every :data:`SHARED_READ_S`): its answer replaces
        the request in place, or (None) refuses it; the refusal is returned."""
        hook = self.pressure
        assert hook is not None
        at = self.options.pressure_at if self.options.pressure_at is not None else 0.8
        spent = self.pressure_fraction()
        if spent < at:
            return None
        changed = hook(ctx, dict(request))
        if changed is None:
            name = getattr(hook, "__qualname__", type(hook).__name__)
            note = f"refused by on_budget_pressure hook {name}"
            return ExceededLimit(Limit(KEY_BUDGET_PRESSURE, at), KEY_BUDGET_PRESSURE, spent, note)
        if not isinstance(changed, Mapping):
            raise TypeError(
                f"on_budget_pressure must return the request (a dict) or None, "
                f"got {type(changed).__name__}"
            )
        request.clear()
        request.update(changed)
        return None

    # -- admission ------------------------------------------------------------------------------

    def admit(
        self, kind: str, marks: CallMarks, node_id: str
    ) -> tuple[tuple[Guard, ...], Refusal | None]:
        """The ceilings a call's admission is checked against, or why it is refused."""
        if marks.refusal is not None:
            return self.guard_rows, self._refusal(self.context, marks.refusal)
        if kind == "llm":
            refused = self._check_llm(node_id, marks)
            if refused is not None:
                return self.guard_rows, refused
        if marks.fingerprint is not None:
            refused = self._count_repeat(marks.fingerprint)
            if refused is not None:
                return self.guard_rows, refused
        rows = self.guard_rows
        if self.ordinary_rows is not None and not marks.final:
            rows = self.ordinary_rows
        if self.window_slots:
            rows = self._with_windows(rows)
        return rows, None

    def shared_terms(
        self,
        owner: ExecutionContext,
        marks: CallMarks | None,
        ceilings: dict[str, Any],
        owners: dict[str, Limit],
    ) -> SharedTerms:
        """What ``owner``'s shared ledger checks ``call`` against, beyond its plain ceilings:

        * its cost ceiling less ``owner``'s final-answer reserve unless the call is final;
        * under ``owner``'s loop guard, the request's repeat key (held 1, ceiling max_repeats:
          the count of every process sharing the scope);
        * ``owner``'s windowed limits, checked by the ledger over its sliding window;
        * the exact keys of ``owner``'s warned and soft limits, held so that the ledger keeps
          their shared total.

        ``extra`` maps each key to hold beyond the ceilings' to its amount (None: the call's
        own estimate for it).
        """
        reserve = owner.policy_options.final_reserve_usd
        if reserve is not None and KEY_COST in ceilings and not (marks is not None and marks.final):
            top = ceilings[KEY_COST] - reserve
            ceilings = {**ceilings, KEY_COST: top}
            owners = {**owners, KEY_COST: Limit(KEY_COST, top)}
        owned = next((o for o in self.chain_owned if o.context is owner), None)
        if owned is None:
            return ceilings, owners, {}, ()
        extra: dict[str, float | None] = {}
        windows = tuple(window.limit for window in owned.windows)
        for limit in (*windows, *owned.watched):
            if limit.type is LimitType.EXACT:
                extra[limit.key] = None
        most = owned.max_repeats
        if most is not None and marks is not None and marks.fingerprint is not None:
            key = KEY_REPEATS_FOR + marks.fingerprint
            ceilings = {**ceilings, key: float(most)}
            owners = {**owners, key: Limit(key, most)}
            extra[key] = 1.0
        return ceilings, owners, extra, windows

    def _check_llm(self, node_id: str, marks: CallMarks) -> Refusal | None:
        limit = self.max_input
        if limit is not None and marks.input_tokens > limit:
            cap = Limit(KEY_INPUT_TOKENS_PER_CALL, limit)
            note = "input too large for one call (max_input_tokens_per_call)"
            over = ExceededLimit(cap, KEY_INPUT_TOKENS_PER_CALL, marks.input_tokens, note)
            return self._refusal(self.context, over)
        if self.unpriced is None or marks.priced:
            return None
        model = marks.model
        owner = self.cost_owner
        assert owner is not None
        note = (
            f"model {model!r} has no price and context {owner.name!r} has a cost limit; "
            f"price it with ampmeter.set_price({model!r}, input_per_mtok=..., "
            f"output_per_mtok=...) (patterns like 'ft:gpt-4o-mini*' work), give the call an "
            f"estimate_usd, or set on_unpriced='warn' or 'allow'"
        )
        if self.unpriced == "refuse":
            stop = ExceededLimit(Limit(KEY_UNPRICED_LLM_CALLS, 0), KEY_UNPRICED_LLM_CALLS, 1, note)
            return self._refusal(owner, stop)
        warnings.warn(f"ampmeter: {note}", RuntimeWarning, stacklevel=5)
        limit_obj = Limit(KEY_UNPRICED_LLM_CALLS, 0)
        event = LimitEvent(
            "unpriced", limit_obj, KEY_UNPRICED_LLM_CALLS, 1.0, 1.0, node_id, self.context.name
        )
        self._report(self.owned, event)
        return None

    def _count_repeat(self, key: str) -> Refusal | None:
        for owned in self.chain_owned:
            most = owned.max_repeats
            if most is None:
                continue
            with owned.lock:
                seen = owned.repeats.get(key, 0) + 1
                owned.repeats[key] = seen
            if seen > most:
                full = KEY_REPEATS_FOR + key
                note = f"loop detected (the same request {seen} times, max_repeats={most})"
                return self._refusal(
                    owned.context, ExceededLimit(Limit(full, most), full, seen, note)
                )
        return None

    def _with_windows(self, rows: tuple[Guard, ...]) -> tuple[Guard, ...]:
        # A windowed limit is checked as a ceiling on the running total raised by what has left
        # the window, in the same kernel step as every other ceiling (so with the holds).
        changed = list(rows)
        for index, windows in self.window_slots:
            level, base = changed[index]
            extra: list[LimitRow] = []
            for window in windows:
                gone = window.left_window()
                limit = window.limit
                ceiling = DerivedCeiling(limit, gone, f"limit exceeded in {limit.window_s:g}s")
                extra.append((False, limit.key, limit.internal_max + gone, ceiling))
            changed[index] = (level, (*base, *extra))
        return tuple(changed)

    def _refusal(self, owner: ExecutionContext, stop: ExceededLimit) -> Refusal:
        return owner, stop, TerminationReason.LIMIT_EXCEEDED

    # -- settlement -----------------------------------------------------------------------------

    def settled(self, node_id: str, usage: Usage) -> list[dict[str, Any]]:
        """After a call's ``usage`` was added: windows, warnings, soft limits, the input cap.

        Events go to the owning context's list and to its ``on_limit_event``; they are returned
        (as dicts) for the node's metadata (``limit_events``).
        """
        found = self._after(usage, node_id)
        for owned, event in found:
            self._report(owned, event)
        return [event.to_dict() for _, event in found]

    def traced(self, usage: Usage) -> None:
        """After a trace record's ``usage`` was added: as :meth:`settled`, with the events on
        the context's own node."""
        if not self.watches:
            return
        ctx = self.context
        events = self.settled(ctx.node_id, usage)
        if events:
            ended = ctx.graph.node(ctx.node_id).metadata.get(META_LIMIT_EVENTS, ())
            ctx.graph.update_metadata(ctx.node_id, {META_LIMIT_EVENTS: [*ended, *events]})

    def _after(self, usage: Usage, node_id: str) -> list[tuple[Owned, LimitEvent]]:
        entries = usage.entries()
        for owned in self.chain_owned:
            for window in owned.windows:
                for key, field, _ in entries:
                    if key == window.limit.key and usage[field]:
                        window.add(usage[field])
        found: list[tuple[Owned, LimitEvent]] = []
        for owned in self.chain_owned:
            if owned.watched:
                self._watch(owned, entries, node_id, found)
        limit = self.max_input
        if limit is not None and usage.kind == "llm" and usage.tokens_in > limit:
            cap = Limit(KEY_INPUT_TOKENS_PER_CALL, limit)
            event = LimitEvent(
                "input_over_limit",
                cap,
                KEY_INPUT_TOKENS_PER_CALL,
                float(usage.tokens_in),
                usage.tokens_in / max(limit, 1),
                node_id,
                self.context.name,
            )
            found.append((self.owned, event))
        return found

    @staticmethod
    def _watch(
        owned: Owned,
        entries: tuple[tuple[str, int, bool], ...],
        node_id: str,
        found: list[tuple[Owned, LimitEvent]],
    ) -> None:
        watched = owned.matched.get(entries)
        if watched is None:  # which (limit, key) pairs a usage of this shape reaches, once
            watched = tuple(
                (index, limit, key, gauge)
                for index, limit in enumerate(owned.watched)
                for key, _, gauge in entries
                if limit.matches(key)
            )
            if len(owned.matched) < _MATCHED_MAX:
                owned.matched[entries] = watched
        stats = owned.context.stats
        shared = owned.shared
        totals = None
        if shared is not None and any((i, k) not in owned.done for i, _, k, _ in watched):
            totals = shared.read(fresh=True)  # the shared total, this call's commit included
        for index, limit, key, gauge in watched:
            if (index, key) in owned.done:
                continue
            top = limit.max_value
            value: Any  # Decimal dollars for money keys
            if totals is not None and key in totals:
                value = totals[key]
            else:
                value = stats.get_gauge(key) if gauge else float(stats.get_counter(key))
            fraction = float(value / top) if top > 0 else (1.0 if value > top else 0.0)
            name = owned.context.name
            with owned.lock:
                for threshold in limit.warn_at:
                    mark = (index, key, threshold)
                    if fraction >= threshold and mark not in owned.fired:
                        owned.fired.add(mark)
                        if _first(shared, "warning", limit, key, threshold):
                            found.append(
                                (
                                    owned,
                                    LimitEvent(
                                        "warning",
                                        limit,
                                        key,
                                        value,
                                        fraction,
                                        node_id,
                                        name,
                                        threshold,
                                    ),
                                )
                            )
                if limit.soft and value > top and (index, key, None) not in owned.fired:
                    owned.fired.add((index, key, None))
                    owned.wrapped = True
                    if _first(shared, "soft_limit", limit, key, None):
                        found.append(
                            (
                                owned,
                                LimitEvent(
                                    "soft_limit", limit, key, value, fraction, node_id, name
                                ),
                            )
                        )
                if all((index, key, t) in owned.fired for t in limit.warn_at) and (
                    not limit.soft or (index, key, None) in owned.fired
                ):
                    owned.done.add((index, key))  # nothing left to report for this key

    @staticmethod
    def _report(owned: Owned, event: LimitEvent) -> None:
        with owned.lock:
            owned.events.append(event)
        callback = owned.on_event
        if callback is None:
            return
        try:
            callback(event)
        except Exception as error:
            # The call is settled and counted; a failing callback must not change that.
            warnings.warn(
                f"ampmeter: on_limit_event failed ({type(error).__name__}: {error}); the event "
                "is kept in the context's snapshot",
                RuntimeWarning,
                stacklevel=2,
            )
