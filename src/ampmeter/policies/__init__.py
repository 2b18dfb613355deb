"""Containment policies beyond plain ceilings (``docs/containment.md`` describes each): unpriced
models, warnings and soft limits, a final-answer reserve, windowed limits, a loop guard, a
per-call input cap and a budget-pressure hook (or a downgrade ladder).

Each policy is a module that declares its options and makes its step of the admission chain
(a :class:`~ampmeter.policies.options.Policy`), listed once in
:mod:`~ampmeter.policies.registry`; a context's chain holds the steps in force there or above
(:mod:`~ampmeter.policies.configured`). :class:`Policies` is the frozen value of a context's
options; :mod:`~ampmeter.policies.shared_totals` holds the shared ledger's totals they read.
"""

from __future__ import annotations

from ampmeter.keys import KEY_BUDGET_PRESSURE, KEY_INPUT_TOKENS_PER_CALL, KEY_REPEATS_FOR
from ampmeter.policies.options import (
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
