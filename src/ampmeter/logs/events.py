"""What every reader of TokenTracker events requires of a record, beyond being a JSON object.

One check, :func:`event_problem`, used by ``summary``, ``report``, ``watch`` and ``validate``
alike (through :func:`ampmeter.logs.read_jsonl`'s ``check``), so no tool accepts a line that
another refuses. It names the field and what is wrong with it: a missing or mistyped field the
tools need, a count that is not a whole number from 0 to 2⁶³-1 (a larger integer in the file
has already lost its exactness on reading), a cost or latency that is negative or out of range.
Numbers that are not finite (``NaN``, ``Infinity``, ``1e400``) never get this far: they are not
JSON, and the reader names their field (see :func:`non_finite_field`); nor does a line nested
deeper than :data:`MAX_DEPTH` (see :func:`nesting_problem`), which no tool could walk.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Final

from ampmeter.money import NANO_PER_USD

__all__ = [
    "MAX_COST_USD",
    "MAX_COUNT",
    "MAX_DEPTH",
    "event_problem",
    "json_kind",
    "nesting_problem",
    "non_finite_field",
]

MAX_COUNT: Final = 2**63 - 1
"""The largest token or retry count a log may hold (what SQLite and DuckDB integers hold)."""
MAX_COST_USD: Final = MAX_COUNT / NANO_PER_USD
"""The largest cost of one event: what the ledgers can hold as integer nano-dollars."""

MAX_DEPTH: Final = 1024
"""The deepest nesting of arrays and objects a log line may have: the JSON parser's own limit.
A deeper line is refused by name (a hostile log must not exhaust the reader's stack)."""

_COUNTS: Final = ("prompt_tokens", "completion_tokens", "total_tokens", "tokens_saved")


def json_kind(value: object) -> str:
    """What a JSON value is, for a message saying what was found instead: ``null``, ``a
    boolean (true)``, ``a string ('x')``, ``a float (1.5)``, ``an array``, ``an object``, or
    an int itself."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, str):
        return f"a string ({value[:40]!r})"
    if isinstance(value, (list, dict)):
        return "an array" if isinstance(value, list) else "an object"
    return f"a float ({value!r})" if isinstance(value, float) else repr(value)


def _count_problem(value: object) -> str | None:
    if type(value) is int and 0 <= value <= MAX_COUNT:
        return None
    if type(value) is int:
        return f"must be a whole number from 0 to {MAX_COUNT:,}, got {value:,}"
    return f"must be a whole number from 0 to {MAX_COUNT:,}, got {json_kind(value)}"


def _amount_problem(value: object, limit: float) -> str | None:
    if type(value) not in (int, float):
        return f"must be a number, got {json_kind(value)}"
    number: float = value  # type: ignore[assignment]
    if not math.isfinite(number) or number < 0 or number > limit:
        return f"must be a number from 0 to {limit:,.0f}, got {number!r}"
    return None


def event_problem(obj: dict[str, Any]) -> str | None:
    """``field 'x': what is wrong`` for the first field of ``obj`` that no reader accepts, or
    None when every reader can use the event."""
    for name in ("event_type", "run_id"):
        value = obj.get(name)
        if type(value) is not str:
            return f"field {name!r}: must be a string, got {json_kind(value)}"
    usage = obj.get("usage")
    if type(usage) is not dict:
        return f"field 'usage': must be an object, got {json_kind(usage)}"
    for name in _COUNTS:
        value = usage.get(name)
        if value is not None:
            problem = _count_problem(value)
            if problem is not None:
                return f"field 'usage.{name}': {problem}"
    if "cost_usd" not in obj:
        return "field 'cost_usd': missing (a number is required)"
    problem = _amount_problem(obj["cost_usd"], MAX_COST_USD)
    if problem is not None:
        return f"field 'cost_usd': {problem}"
    latency = obj.get("latency_ms")
    if latency is not None:
        problem = _amount_problem(latency, float(MAX_COUNT))
        if problem is not None:
            return f"field 'latency_ms': {problem}"
    meta = obj.get("metadata")
    if type(meta) is dict:
        retries = meta.get("retries_used")
        if retries is not None:
            problem = _count_problem(retries)
            if problem is not None:
                return f"field 'metadata.retries_used': {problem}"
    return None


def nesting_problem(raw: bytes | str) -> str | None:
    """``nested N levels deep, ...`` when the arrays and objects of a line nest deeper than
    :data:`MAX_DEPTH`, else None. Counted without parsing (and without recursion), so it is
    safe on any line; only called for a line the fast parser refused."""
    depth = nesting_depth(raw)
    if depth <= MAX_DEPTH:
        return None
    return f"arrays and objects nested {depth:,} levels deep, more than the {MAX_DEPTH:,} allowed"


# A JSON string (escapes included): brackets inside strings do not nest anything.
_STRING: Final = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?')
_NOT_BRACKET: Final = re.compile(rb"[^\[\]{}]+")


def nesting_depth(raw: bytes | str) -> int:
    """How deep the arrays and objects of a JSON text nest (0 for a scalar), found in one pass
    over its brackets outside strings; a text that is not JSON gets the depth it reaches."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    brackets = _NOT_BRACKET.sub(b"", _STRING.sub(b"", data))
    depth = deepest = 0
    for byte in brackets:
        if byte in b"[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def non_finite_field(raw: bytes | str) -> str | None:
    """``field 'x': ...`` naming the first number of a line that is not finite (``NaN``,
    ``Infinity``, ``1e400``), or None when the line has none (or is not JSON at all).

    Only called for a line the fast parser refused, to say why in the user's terms.
    """
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError):  # nested deeper than Python's parser goes: say less
        return None
    found = _first_non_finite(obj)
    if found is None:
        return None
    path, value = found
    where = f"field {path!r}" if path else "the line"
    return f"{where}: must be a finite number, got {value!r} (NaN, Infinity or too large)"


def _first_non_finite(value: object) -> tuple[str, float] | None:
    # Depth first, in document order, with a stack of its own: a line may nest 1,024 deep.
    stack: list[tuple[str, object]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return path, item
        if isinstance(item, dict):
            inner = [(f"{path}.{key}" if path else str(key), v) for key, v in item.items()]
        elif isinstance(item, list):
            inner = [(f"{path}[{index}]", v) for index, v in enumerate(item)]
        else:
            continue
        stack.extend(reversed(inner))
    return None
