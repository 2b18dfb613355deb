"""``Usage``: what one call used (or may use), and the one place usage becomes stats keys.

A call's reservation, a trace record and a ledger's amounts are each a :class:`Usage`;
:meth:`Usage.entries` is the only translation from usage to the keys of :mod:`ampmeter.keys`.
What a call used is its :data:`Spent`, which settlement adds from, read as a :class:`Usage`
(:meth:`Usage.of_call`) only where a ledger, a policy or a replay reads one.
"""

from __future__ import annotations

from typing import Any, Final, NamedTuple

from ampmeter import _validate, money
from ampmeter.keys import (
    KEY_CACHED_INPUT_TOKENS,
    KEY_CACHED_INPUT_TOKENS_FOR,
    KEY_COST,
    KEY_COST_FOR,
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
    KEY_UNPRICED_LLM_CALLS,
    is_money,
)

__all__ = ["SPENT_AT", "Entry", "Shape", "Spent", "Usage", "internal_amount"]


def internal_amount(key: str, value: Any) -> Any:
    """An amount of ``key`` as the kernel counts it: money (dollars) as whole nano-dollars."""
    return money.to_nano(value, key, allow_negative=True) if is_money(key) else value


# Field positions, for the kernel's per-shape plans (see Usage.entries).
_IN, _OUT, _CACHED, _REASONING, _COST, _CALLS, _STEPS, _RETRIES, _UNPRICED = range(3, 12)

Entry = tuple[str, int, bool]
"""``(stats key, Usage field position, is_gauge)``: one key a usage adds to."""

Spent = tuple[int, int, int, int, int, int, int, int, int, int, int]
"""What one call used, as its settlement adds it: its checked counts (see
:data:`ampmeter._validate.Counts`), its cost in nano-dollars, its calls (1; a replay's 0), steps,
retries and unpriced calls (each 0 or 1). Its kind decides which count (:meth:`Usage.of_call`)."""

SPENT_AT: Final = dict(zip(range(_IN, _UNPRICED + 1), (0, 1, 2, 4, 6, 7, 8, 9, 10), strict=True))
"""Each amount field of a Usage (``tokens_in`` to ``unpriced``) to its place in a Spent."""

_SHAPES_MAX: Final = 4_096


class Shape:
    """The keys one shape of usage adds to. Shapes are interned (one object per shape, up to
    :data:`_SHAPES_MAX` of them): this is the one shape cache. What a context works out per
    shape (where a reservation is held, which cells a usage adds to, which limits it reaches)
    is kept for interned shapes only, so it is bounded by the same number."""

    __slots__ = ("entries", "interned", "keys")

    def __init__(self, entries: tuple[Entry, ...], interned: bool) -> None:
        self.entries = entries
        self.keys: tuple[str, ...] = tuple(key for key, _, _ in entries)
        self.interned = interned  # False past the cap: worked out again each time


_shapes: dict[tuple[Any, ...], Shape] = {}


class Usage(NamedTuple):
    """Tokens, cost and call counts of one call, estimated (a reservation) or actual.

    ``kind`` is the node kind (``llm``, ``tool``, ...); ``model`` and ``tool`` are ``""`` when
    there is none. Cached tokens are a subset of ``tokens_in``, reasoning tokens of
    ``tokens_out``. ``calls`` counts LLM calls for ``llm`` usage and tool calls for ``tool``
    usage; ``steps`` successful calls; ``retries`` failed ones (and retries counted by the
    caller); ``unpriced`` LLM calls whose model has no known price. ``cost_nano`` is the cost
    in whole nano-dollars (see :mod:`ampmeter.money`).
    """

    kind: str = "llm"
    model: str = ""
    tool: str = ""
    tokens_in: int = 0
    tokens_out: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    cost_nano: int = 0
    calls: int = 0
    steps: int = 0
    retries: int = 0
    unpriced: int = 0

    @classmethod
    def checked(
        cls,
        *,
        kind: str = "llm",
        model: str = "",
        tool: str = "",
        tokens_in: object = 0,
        tokens_out: object = 0,
        cached_tokens: object = 0,
        reasoning_tokens: object = 0,
        cost_usd: object = 0.0,
        calls: object = 0,
        steps: object = 0,
        retries: object = 0,
    ) -> Usage:
        """A usage from untrusted values: each is checked, errors name the argument."""
        t_in = _validate.count(tokens_in, "tokens_in")
        t_out = _validate.count(tokens_out, "tokens_out")
        cached = _validate.count(cached_tokens, "cached_tokens")
        reasoning = _validate.count(reasoning_tokens, "reasoning_tokens")
        if cached > t_in:
            raise ValueError(f"cached_tokens ({cached}) exceed tokens_in ({t_in})")
        if reasoning > t_out:
            raise ValueError(f"reasoning_tokens ({reasoning}) exceed tokens_out ({t_out})")
        return cls(
            kind=_validate.text(kind, "kind", empty=False),
            model=_validate.text(model, "model"),
            tool=_validate.text(tool, "tool"),
            tokens_in=t_in,
            tokens_out=t_out,
            cached_tokens=cached,
            reasoning_tokens=reasoning,
            cost_nano=_validate.nano(cost_usd, "cost_usd"),
            calls=_validate.count(calls, "calls"),
            steps=_validate.count(steps, "steps"),
            retries=_validate.count(retries, "retries"),
        )

    @classmethod
    def of_call(cls, kind: str, model: str, tool: str, spent: Spent) -> Usage:
        """What a call of ``kind`` (``model``, a tool call's ``tool``) that ``spent`` this adds:
        an LLM call all but its cache writes and tool calls made; an embedding of a model its
        tokens and cost; a tool call its cost and call counts; any other call its cost."""
        t_in, t_out, cached, _, reasoning, _, cost, calls, steps, retries, unpriced = spent
        if kind == "llm":
            return cls(
                kind,
                model,
                tokens_in=t_in,
                tokens_out=t_out,
                cached_tokens=cached,
                reasoning_tokens=reasoning,
                cost_nano=cost,
                calls=calls,
                steps=steps,
                retries=retries,
                unpriced=unpriced,
            )
        if kind == "tool":
            return cls(kind, tool=tool, cost_nano=cost, calls=calls, steps=steps, retries=retries)
        if kind == "embedding" and model:
            return cls(kind, model, tokens_in=t_in, tokens_out=t_out, cost_nano=cost)
        return cls(kind, cost_nano=cost)

    def shape(self) -> Shape:
        """The keys this usage adds to, as an interned :class:`Shape`.

        LLM usage that counts a call always names its input, output and cost keys (a call that
        reported nothing still shows as 0); any other amount is named only when it is not zero.
        Per-model (and per-tool) keys come with their totals. The answer depends only on the
        usage's kind, model, tool and which amounts are zero, so it is computed once per shape.
        """
        # (Spelled out: a map of bool over the amounts runs fewer opcodes but about 2.3k more
        # instructions a call.)
        kind, model, tool, t_in, t_out, cached, reasoning, cost, calls, steps, retries, unpriced = (
            self
        )
        key = (
            kind,
            model,
            tool,
            t_in != 0,
            t_out != 0,
            cached != 0,
            reasoning != 0,
            cost != 0,
            calls != 0,
            steps != 0,
            retries != 0,
            unpriced != 0,
        )
        found = _shapes.get(key)
        if found is None:
            found = Shape(self._translate(), len(_shapes) < _SHAPES_MAX)
            if found.interned:
                _shapes[key] = found
        return found

    def entries(self) -> tuple[Entry, ...]:
        """``(key, field, is_gauge)`` for each key this usage adds to (see :meth:`shape`)."""
        return self.shape().entries

    def amounts(self) -> dict[str, Any]:
        """Every key of :meth:`entries` with its amount as a ledger takes it: money as exact
        Decimal dollars, other keys as ints."""
        fields: tuple[Any, ...] = self
        return {
            key: money.from_nano(fields[field]) if is_money(key) else fields[field]
            for key, field, _ in self.shape().entries
        }

    def _translate(self) -> tuple[Entry, ...]:
        model = self.model
        llm_call = self.kind == "llm" and self.calls != 0  # names in, out and cost even at 0
        found: list[Entry] = []
        for total, per_model, field, gauge in _MODEL_FIELDS:
            if (llm_call and field in (_IN, _OUT, _COST)) or self[field]:
                found.append((total, field, gauge))
                if model:
                    found.append((per_model + model, field, gauge))
        if self.calls:
            if self.kind == "llm":
                found.append((KEY_LLM_CALLS, _CALLS, False))
            elif self.kind == "tool":
                found.append((KEY_TOOL_CALLS, _CALLS, False))
                if self.tool:
                    found.append((KEY_TOOL_CALLS_FOR + self.tool, _CALLS, False))
        if self.steps:
            found.append((KEY_STEPS, _STEPS, False))
        if self.retries:
            found.append((KEY_RETRIES, _RETRIES, False))
        if self.unpriced:
            found.append((KEY_UNPRICED_LLM_CALLS, _UNPRICED, False))
        return tuple(found)


# (total key, per-model prefix, Usage field, is_gauge), in the order keys are first written.
_MODEL_FIELDS: Final = (
    (KEY_INPUT_TOKENS, KEY_INPUT_TOKENS_FOR, _IN, False),
    (KEY_OUTPUT_TOKENS, KEY_OUTPUT_TOKENS_FOR, _OUT, False),
    (KEY_COST, KEY_COST_FOR, _COST, True),
    (KEY_CACHED_INPUT_TOKENS, KEY_CACHED_INPUT_TOKENS_FOR, _CACHED, False),
    (KEY_REASONING_TOKENS, KEY_REASONING_TOKENS_FOR, _REASONING, False),
)
