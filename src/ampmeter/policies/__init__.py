"""Containment policies beyond plain ceilings.

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

Each policy is a module that declares its options and makes its step of the admission chain
(a :class:`~ampmeter.policies.options.Policy`), listed once in
:mod:`~ampmeter.policies.registry`; a context's chain holds the steps in force there or above
(:mod:`~ampmeter.policies.configured`). :class:`Policies` is the frozen value of a context's
options; :mod:`~ampmeter.policies.shared_totals` holds the shared ledger's totals they read.
"""

from __future__ import annotations

from ampmeter.policies.options import (
    KEY_BUDGET_PRESSURE,
    KEY_INPUT_TOKENS_PER_CALL,
    KEY_REPEATS_FOR,
    META_LIMIT_EVENTS,
    LimitEvent,
    Option,
    Policy,
    final_call,
    request_fingerprint,
)
from ampmeter.policies.registry import POLICIES, Policies
from ampmeter.policies.shared_totals import SHARED_READ_S

__all__ = [
    "KEY_BUDGET_PRESSURE",
    "KEY_INPUT_TOKENS_PER_CALL",
    "KEY_REPEATS_FOR",
    "META_LIMIT_EVENTS",
    "POLICIES",
    "SHARED_READ_S",
    "LimitEvent",
    "Option",
    "Policies",
    "Policy",
    "final_call",
    "request_fingerprint",
]
