"""How much of each limit a run used: a stats key's value added up from a run's calls, and
the ceilings that the logs reveal.

ampmeter's logs say every context's own ceilings (:mod:`ampmeter.analysis.lineage`); other
logs may not, but a stopped call's reason names the limit it hit and its ceiling
(``limit exceeded: amp:cost = 0.0031 > 0.003``); :func:`parse_stop_reason` reads it.
"""

from __future__ import annotations

import re
from typing import Final, NamedTuple

from ampmeter import keys
from ampmeter.analysis.runs import Call

__all__ = [
    "StopLimit",
    "call_usage",
    "derivable",
    "parse_stop_reason",
]

_STOP_REASON: Final = re.compile(
    r"(?P<key>[\w:./@-]+) = (?P<value>-?\$?[-+\d.,eE]+) > (?P<cap>-?\$?[-+\d.,eE]+)"
)


class StopLimit(NamedTuple):
    """The limit named in a stop reason: its key, the value it would have reached, its ceiling."""

    key: str
    value: float
    ceiling: float


def parse_stop_reason(reason: str | None) -> StopLimit | None:
    """The limit in ``limit exceeded: KEY = VALUE > CEILING``, or None if it names none."""
    match = _STOP_REASON.search(reason or "")
    if match is None:
        return None
    try:
        return StopLimit(match["key"], _amount(match["value"]), _amount(match["cap"]))
    except ValueError:
        return None


def _amount(text: str) -> float:
    """A number as a stop reason writes it: money as people write it (``$1,234.50``)."""
    return float(text.replace("$", "").replace(",", ""))


_EXACT_KEYS: Final = frozenset(
    {
        keys.KEY_COST,
        keys.KEY_LLM_CALLS,
        keys.KEY_TOOL_CALLS,
        keys.KEY_STEPS,
        keys.KEY_INPUT_TOKENS,
        keys.KEY_OUTPUT_TOKENS,
    }
)
_PREFIX_KEYS: Final = (
    keys.KEY_COST_FOR,
    keys.KEY_TOOL_CALLS_FOR,
    keys.KEY_INPUT_TOKENS_FOR,
    keys.KEY_OUTPUT_TOKENS_FOR,
)


def derivable(key: str) -> bool:
    """True when the logs can tell the value of stats key ``key`` (see :func:`call_usage`)."""
    return key in _EXACT_KEYS or key.startswith(_PREFIX_KEYS)


def call_usage(call: Call) -> dict[str, float]:
    """What one call adds to each stats key that logs can tell.

    A stopped (``halt``) call was never made and adds nothing; tokens come from LLM calls
    only; ``amp:steps`` counts successful LLM and tool calls.
    """
    if call.status == "halt":
        return {}
    model, cost = call.model, call.cost_usd
    usage = {keys.KEY_COST: cost}
    if model:
        usage[keys.KEY_COST_FOR + model] = cost
    if call.kind == "llm":
        usage[keys.KEY_LLM_CALLS] = 1.0
        usage[keys.KEY_INPUT_TOKENS] = float(call.tokens_in)
        usage[keys.KEY_OUTPUT_TOKENS] = float(call.tokens_out)
        if model:
            usage[keys.KEY_INPUT_TOKENS_FOR + model] = float(call.tokens_in)
            usage[keys.KEY_OUTPUT_TOKENS_FOR + model] = float(call.tokens_out)
    elif call.kind == "tool":
        usage[keys.KEY_TOOL_CALLS] = 1.0
        usage[keys.KEY_TOOL_CALLS_FOR + call.name] = 1.0
    if call.kind in ("llm", "tool") and call.status == "success":
        usage[keys.KEY_STEPS] = 1.0
    return usage
