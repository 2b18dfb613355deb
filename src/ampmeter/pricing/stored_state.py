"""The size of state a provider keeps between requests, as far as ampmeter saw it grow.

A Responses request that names a ``previous_response_id`` or a ``conversation`` is billed for
the whole stored conversation as input, while its body carries only the new turn. The stored
conversation of a response is the input it was billed for plus the output it wrote (its own
input already held what it continued), so every response ampmeter reads is remembered here by
its id, and by its conversation's id when it has one: the next request that continues either
is estimated with that size (:func:`stored_tokens`). State ampmeter never saw (made by another
process, or grown by items added outside a response) is unknown: then the estimate takes the
model's context window in ``"bound"`` mode, and in ``"learned"`` mode the largest input seen
for the model (:func:`ampmeter.pricing.plan.largest_input`, noted where a call is priced), else
the context window.

The table of sizes is bounded (the latest :data:`MAX_KEPT` ids), per process.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Final

__all__ = [
    "MAX_KEPT",
    "forget",
    "forget_conversation",
    "remember",
    "stored_tokens",
    "unknown_state_tokens",
]

MAX_KEPT: Final = 100_000
"""Ids (responses and conversations) remembered, latest first out last."""
_MAX_ID: Final = 256  # longer ids are no provider's: not kept

_sizes: OrderedDict[str, int] = OrderedDict()
_lock = threading.Lock()


def _id_of(value: object) -> str | None:
    """An id as a request or response names it: a string, or an object with an ``id``
    (``conversation={"id": ...}``)."""
    if isinstance(value, Mapping):
        value = value.get("id")
    elif value is not None and not isinstance(value, str):
        value = getattr(value, "id", None)
    if isinstance(value, str) and 0 < len(value) <= _MAX_ID:
        return value
    return None


def remember(response_id: object, conversation: object, tokens: int) -> None:
    """A response ``response_id`` (in ``conversation``, if any) left ``tokens`` of stored
    state: its billed input plus its output."""
    keys = [f"response:{found}" for found in (_id_of(response_id),) if found]
    keys += [f"conversation:{found}" for found in (_id_of(conversation),) if found]
    if not keys or tokens < 0:
        return
    with _lock:
        for key in keys:
            _sizes[key] = tokens
            _sizes.move_to_end(key)
        while len(_sizes) > MAX_KEPT:
            _sizes.popitem(last=False)


def forget_conversation(conversation: object) -> None:
    """Items were added to ``conversation`` outside a response: its size is unknown now."""
    found = _id_of(conversation)
    if found is not None:
        with _lock:
            _sizes.pop(f"conversation:{found}", None)


def stored_tokens(previous_response_id: object, conversation: object) -> int | None:
    """The tokens of stored state a request continues: 0 when it continues none, None when
    it continues state of unknown size (an id not seen here, or not an id at all)."""
    total = 0
    for prefix, value in (("response", previous_response_id), ("conversation", conversation)):
        if value is None:
            continue
        found = _id_of(value)
        with _lock:
            size = None if found is None else _sizes.get(f"{prefix}:{found}")
        if size is None:
            return None
        total += size
    return total


def forget() -> None:
    """Forget every size (for tests)."""
    from ampmeter.pricing.plan import forget_inputs

    with _lock:
        _sizes.clear()
    forget_inputs()


def unknown_state_tokens(model: str | None, mode: str) -> int:
    """The tokens to reserve for stored state of unknown size continued by a request to
    ``model``: its context window in ``"bound"`` mode (no request can be billed more input);
    in ``"learned"`` mode the largest input seen for the model, else its context window."""
    from ampmeter.pricing.genai_table import context_window
    from ampmeter.pricing.plan import largest_input

    if mode == "learned":
        seen = largest_input(model)
        if seen is not None:
            return seen
    return context_window(model)
