"""Standard stats keys.

Every key ampmeter writes starts with ``amp:``; use your own prefix (``myapp:``) for your keys.
Keys ending in ``_FOR`` / ``_AT`` are prefixes: append a model, tool or iteration number.
"""

from __future__ import annotations

from typing import Final

KEY_PREFIX: Final = "amp:"

# Tokens (counters), totals and per model.
KEY_INPUT_TOKENS: Final = "amp:input_tokens"
KEY_INPUT_TOKENS_FOR: Final = "amp:input_tokens:"
KEY_OUTPUT_TOKENS: Final = "amp:output_tokens"
KEY_OUTPUT_TOKENS_FOR: Final = "amp:output_tokens:"
# Input tokens read from a prompt cache, and output tokens spent reasoning: subsets of the above.
KEY_CACHED_INPUT_TOKENS: Final = "amp:cached_input_tokens"
KEY_CACHED_INPUT_TOKENS_FOR: Final = "amp:cached_input_tokens:"
KEY_REASONING_TOKENS: Final = "amp:reasoning_tokens"
KEY_REASONING_TOKENS_FOR: Final = "amp:reasoning_tokens:"

# Cost in USD (gauges), total and per model.
KEY_COST: Final = "amp:cost"
KEY_COST_FOR: Final = "amp:cost:"
# The part of amp:cost charged for holds whose worker died mid-call (their lease ran out before
# a settlement): its requests may have been billed, at most what was reserved.
KEY_UNSETTLED_COST: Final = "amp:unsettled_cost"

# Calls (counters).
KEY_LLM_CALLS: Final = "amp:llm_calls"  # LLM calls sent (success or fail; not halted ones)
KEY_TOOL_CALLS: Final = "amp:tool_calls"  # tool calls made (success or fail)
KEY_TOOL_CALLS_FOR: Final = "amp:tool_calls:"
KEY_STEPS: Final = "amp:steps"  # successful LLM and tool calls
KEY_RETRIES: Final = "amp:retries"  # failed calls plus retries counted by the caller
KEY_UNPRICED_LLM_CALLS: Final = "amp:unpriced_llm_calls"  # LLM calls with no known price

# Iterations of the executor loop: protected, per context; only start_iteration() moves it.
KEY_ITERATIONS: Final = "amp:iterations"

# Parse errors in LLM output (format) and in tool-call payloads (toolchain).
KEY_FORMAT_PARSE_ERROR_TOTAL: Final = "amp:format_parse_error_total"
KEY_FORMAT_PARSE_ERROR_AT: Final = "amp:format_parse_error:"
KEY_FORMAT_PARSE_ERROR_CONSECUTIVE: Final = "amp:format_parse_error_consecutive"
KEY_TOOLCHAIN_PARSE_ERROR_TOTAL: Final = "amp:toolchain_parse_error_total"
KEY_TOOLCHAIN_PARSE_ERROR_AT: Final = "amp:toolchain_parse_error:"
KEY_TOOLCHAIN_PARSE_ERROR_CONSECUTIVE: Final = "amp:toolchain_parse_error_consecutive"

# Wall time of a context in seconds: not stored, reported when a timeout stops a call.
KEY_ELAPSED_S: Final = "amp:elapsed_s"

# Keys the policies stop calls on (a refusal names them; a user may limit them too).
KEY_REPEATS_FOR: Final = "amp:repeats:"
"""Prefix of the loop guard's keys: ``amp:repeats:<hash of the request>``."""
KEY_INPUT_TOKENS_PER_CALL: Final = "amp:input_tokens_per_call"
"""The key a refusal by ``max_input_tokens_per_call`` names."""
KEY_BUDGET_PRESSURE: Final = "amp:budget_pressure"
"""The key a refusal by the ``on_budget_pressure`` hook names (its value: the fraction spent)."""

PROTECTED_KEYS: Final = frozenset({KEY_ITERATIONS})
# Keys that belong to one context only: a child's value never reaches its parent, so a
# successful parse in a child can reset them without leaving stale counts upstairs.
LOCAL_KEYS: Final = frozenset(
    {KEY_ITERATIONS, KEY_FORMAT_PARSE_ERROR_CONSECUTIVE, KEY_TOOLCHAIN_PARSE_ERROR_CONSECUTIVE}
)


# ``amp:`` keys measured in other units: seconds, a fraction of a budget. Every other key above
# that is not money counts whole things (a limit on one is a whole number, never below zero),
# and so does each key of a family (a model, a tool, an iteration or a request appended).
_MEASURE_KEYS: Final = frozenset({KEY_ELAPSED_S, KEY_BUDGET_PRESSURE})
_KNOWN_KEYS: Final = frozenset(
    value
    for name, value in list(globals().items())
    if name.startswith("KEY_") and value != KEY_PREFIX
)
_KEY_FAMILIES: Final = tuple(key for key in _KNOWN_KEYS if key.endswith(":"))


def key_unit(key: str) -> str | None:
    """What a value of ``key`` is: ``"money"`` (dollars), ``"count"`` (a whole number of
    things) or ``"number"`` (any number: the caller's own keys, seconds, fractions); None for
    a key in ampmeter's namespace that ampmeter does not know (a typo such as ``amp:cots``)."""
    if is_money(key):
        return "money"
    if not key.startswith(KEY_PREFIX) or key in _MEASURE_KEYS:
        return "number"
    if key in _KNOWN_KEYS or key.startswith(_KEY_FAMILIES):
        return "count"
    return None


def is_money(key: str) -> bool:
    """True for the keys that hold US dollars (``amp:cost``, ``amp:cost:<model>`` and
    ``amp:unsettled_cost``).

    Money keys are counted in whole nano-dollars inside (see :mod:`ampmeter.money`)."""
    return key in (KEY_COST, KEY_UNSETTLED_COST) or key.startswith(KEY_COST_FOR)


__all__ = [name for name in dir() if name.startswith("KEY_")] + [
    "LOCAL_KEYS",
    "is_money",
    "key_unit",
    "PROTECTED_KEYS",
]
