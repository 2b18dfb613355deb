"""How much of each limit a run used: a stats key's value added up from a run's calls, and
the ceilings that the logs reveal.

Logs do not carry limits, but a stopped call's reason names the limit it hit and its ceiling
(``limit exceeded: amp:cost = 0.0031 > 0.003``); :func:`ceilings_from_stops` collects those.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Final, NamedTuple

from ampmeter.analysis.runs import Call
from ampmeter.keys import (
    KEY_COST,
    KEY_COST_FOR,
    KEY_INPUT_TOKENS,
    KEY_INPUT_TOKENS_FOR,
    KEY_LLM_CALLS,
    KEY_OUTPUT_TOKENS,
    KEY_OUTPUT_TOKENS_FOR,
    KEY_STEPS,
    KEY_TOOL_CALLS,
    KEY_TOOL_CALLS_FOR,
)

__all__ = ["StopLimit", "ceilings_from_stops", "parse_stop_reason", "usage_for_key"]

_STOP_REASON: Final = re.compile(
    r"(?P<key>[\w:./@-]+) = (?P<value>[-+\d.eE]+) > (?P<cap>[-+\d.eE]+)"
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
        return StopLimit(match["key"], float(match["value"]), float(match["cap"]))
    except ValueError:
        return None


def ceilings_from_stops(calls: Iterable[Call]) -> dict[str, float]:
    """Ceilings named by the stopped (``halt``) calls, by stats key."""
    found: dict[str, float] = {}
    for call in calls:
        if call.status == "halt":
            limit = parse_stop_reason(call.stop_reason)
            if limit is not None:
                found[limit.key] = limit.ceiling
    return found


def usage_for_key(calls: Sequence[Call], key: str) -> float | None:
    """The value of stats key ``key`` added up from ``calls`` (None: not derivable from logs).

    Stopped calls were never made and count for nothing; tokens come from LLM calls only.
    """
    made = [c for c in calls if c.status != "halt"]
    llm = [c for c in made if c.kind == "llm"]
    if key == KEY_COST:
        return sum(c.cost_usd for c in made)
    if key.startswith(KEY_COST_FOR):
        return sum(c.cost_usd for c in made if c.model == key[len(KEY_COST_FOR) :])
    if key == KEY_LLM_CALLS:
        return float(len(llm))
    if key == KEY_TOOL_CALLS:
        return float(sum(1 for c in made if c.kind == "tool"))
    if key.startswith(KEY_TOOL_CALLS_FOR):
        tool = key[len(KEY_TOOL_CALLS_FOR) :]
        return float(sum(1 for c in made if c.kind == "tool" and c.name == tool))
    if key == KEY_STEPS:
        return float(sum(1 for c in made if c.kind in ("llm", "tool") and c.status == "success"))
    if key == KEY_INPUT_TOKENS:
        return float(sum(c.tokens_in for c in llm))
    if key == KEY_OUTPUT_TOKENS:
        return float(sum(c.tokens_out for c in llm))
    for prefix, attr in ((KEY_INPUT_TOKENS_FOR, "tokens_in"),
                         (KEY_OUTPUT_TOKENS_FOR, "tokens_out")):  # fmt: skip
        if key.startswith(prefix):
            model = key[len(prefix) :]
            return float(sum(getattr(c, attr) for c in llm if c.model == model))
    return None
