"""Exactly-once accounting across replays: a call with an ``idempotency_key`` counts once per
run (the root context keeps the keys it has seen) and once per shared ledger scope (the ledger
keeps them: ``commit(..., idempotency_key=)``).

A workflow engine that runs a step again after a crash (DBOS, Prefect), or replays recorded
results without sending them again (Temporal), records the same key twice; the second record
adds nothing, and its node says which node counted it (``duplicate_of``). When it was counted
before this run, in a shared ledger (a step re-executed in a new process), the ledger's answer
marks it the same way, with ``duplicate_of`` naming the ledger scope, so this process's stats
agree with the ledger.

Only keys the caller gives, or ampmeter makes, are keys: a provider's response id is not one
unless ``instrument(response_id_keys=True)`` asks for it (a caching gateway), and then only
with the endpoint and the usage it came with. A run remembers at most :data:`KEYS_KEPT` keys,
none longer than :data:`KEEP_S` (the ledgers' ``SETTLED_KEEP_S``): with a key on every call, a
long run would otherwise keep one key per call for ever. The oldest are forgotten first; a key
forgotten here counts again, unless a shared ledger still remembers it (a day), whose answer
then marks the call as above.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from ampmeter import money
from ampmeter.keys import KEY_COST

if TYPE_CHECKING:
    from ampmeter._core.outcome import Outcome
    from ampmeter._core.usage import Usage

__all__ = [
    "KEEP_S",
    "KEYS_KEPT",
    "META_DUPLICATE_OF",
    "META_IDEMPOTENCY_KEY",
    "SeenKeys",
    "counted_before",
    "counted_once",
]

META_IDEMPOTENCY_KEY: Final = "idempotency_key"
META_DUPLICATE_OF: Final = "duplicate_of"
META_FIRST_COST: Final = "first_cost_usd"
KEYS_KEPT: Final = 20_000  # per run: about 7 MB of response-id keys (measured: 32 MB per 100k)
KEEP_S: Final = 86_400.0  # the ledgers remember a key as long (their SETTLED_KEEP_S is this)

First = tuple[str, int]
"""Who counted a key first (a node id, ``"trace"``, or ``"ledger:<scope>"``) and its cost in
nano-dollars."""


class SeenKeys:
    """The idempotency keys one run has counted, oldest first, bounded in number and age."""

    __slots__ = ("_keys", "_lock", "_oldest_at", "keep_s", "max_keys")

    def __init__(self) -> None:
        self.max_keys = KEYS_KEPT
        self.keep_s = KEEP_S
        self._keys: dict[str, tuple[First, float]] = {}
        self._lock = threading.Lock()
        # The time of the oldest key kept (keys are kept in the order of their time, so none
        # runs out before it); -inf while it is not known, so the next claim looks.
        self._oldest_at = -math.inf

    def __len__(self) -> int:
        return len(self._keys)

    def claim(self, key: str, first: First) -> First | None:
        """Who counted ``key`` already, or None after noting ``first`` as its first count."""
        now = time.monotonic()
        with self._lock:
            found = self._keys.get(key)
            if found is not None and now - found[1] <= self.keep_s:
                return found[0]
            if now - self._oldest_at > self.keep_s or len(self._keys) >= self.max_keys:
                self._forget(now)
            if found is not None:  # too old: counted again, as the ledgers do
                self._keys.pop(key, None)  # (unless forgotten just now)
            self._keys[key] = (first, now)
            return None

    def replace(self, key: str, first: First) -> None:
        """Note that ``first`` counted ``key`` (a ledger that had seen it before this run)."""
        with self._lock:
            found = self._keys.get(key)
            self._keys[key] = (first, found[1] if found is not None else time.monotonic())

    def _forget(self, now: float) -> None:
        """Drop keys past their age, then the oldest while there are too many."""
        keys = self._keys
        while keys:
            oldest = next(iter(keys))
            if len(keys) < self.max_keys and now - keys[oldest][1] <= self.keep_s:
                self._oldest_at = keys[oldest][1]
                return
            del keys[oldest]
        self._oldest_at = -math.inf


def counted_once(
    seen: SeenKeys, key: str, node_id: str, usage: Usage, outcome: Outcome
) -> tuple[Usage, Outcome]:
    """The usage the call of node ``node_id`` adds: its own the first time its ``key`` is
    ``seen`` in the run, else nothing (the node notes the first node and the cost it counted).
    ``outcome``'s metadata names the key already (:data:`META_IDEMPOTENCY_KEY`)."""
    first = seen.claim(key, (node_id, outcome.cost_nano))
    if first is None:
        return usage, outcome
    return _nothing(usage), _marked(outcome, {**(outcome.metadata or {})}, first)


def counted_before(
    seen: SeenKeys, key: str, outcome: Outcome, scope: str, amounts: Mapping[str, Any]
) -> Outcome:
    """``outcome`` of a call whose ``key`` a shared ledger at ``scope`` had counted before this
    run (``amounts``: what it counted then): the call adds nothing here either."""
    meta = outcome.metadata or {}
    if META_DUPLICATE_OF in meta:
        return outcome  # this run had counted it already
    first = (f"ledger:{scope}", money.to_nano(amounts.get(KEY_COST, 0)))
    seen.replace(key, first)
    return _marked(outcome, {**meta, META_IDEMPOTENCY_KEY: key}, first)


def _nothing(usage: Usage) -> Usage:
    return type(usage)(usage.kind, usage.model, usage.tool)


def _marked(outcome: Outcome, meta: dict[str, Any], first: First) -> Outcome:
    meta[META_DUPLICATE_OF] = first[0]
    meta[META_FIRST_COST] = float(money.from_nano(first[1]))  # metadata is JSON for the log
    return outcome._replace(cost_nano=0, tokens_in=0, tokens_out=0, metadata=meta)
