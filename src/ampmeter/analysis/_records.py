"""Reading the contract's JSONL files record by record, with errors that name ``file:line``.

Parsing rules (blank lines, invalid JSON, a cut-off last line, best-effort mode) belong to
:func:`ampmeter.logs.read_jsonl`; this module only checks the fields analysis needs.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any, Final, TypeVar

from ampmeter.errors import AnalysisError
from ampmeter.logs import read_jsonl
from ampmeter.logs.events import json_kind

__all__ = [
    "EXTENDED_COLUMNS",
    "V0_COLUMNS",
    "AnalysisError",
    "event_fields",
    "problem_fields",
    "read_records",
    "stream_fields",
]

V0_COLUMNS: Final = ("t", "cumulative_api_cost_usd", "cumulative_solved", "cost_per_solved")
"""The columns of the TokenTracker v0 amortization CSV."""
EXTENDED_COLUMNS: Final = (
    "t",
    "cum_accuracy",
    "attempt_success_rate_p50",
    "tokens_total_p50",
    "latency_ms_p50",
    "latency_ms_p95",
    "cost_usd_pipeline_avg",
    "cost_usd_total_avg",
)
"""The columns of the extended amortization CSV (``t`` and the run's quality and cost)."""

T = TypeVar("T")

# (t, cumulative_api_cost_usd, cumulative_solved, cost_per_solved)
StreamRow = tuple[int, float, int, float]
# (t, solved, attempt_success_rate, tokens_total, latency_total_ms)
ProblemRow = tuple[int, bool, "float | None", "int | None", "float | None"]
# (t, is_pipeline, cost_usd)
EventRow = tuple[int, bool, float]


class _FieldError(ValueError):
    """A record is unusable; the caller adds where it came from."""


def _t(value: object, where: str = "t") -> int:
    if value is None:
        raise _FieldError(f"missing {where!r} (an int is required)")
    if type(value) is not int:
        raise _FieldError(f"{where!r} must be an int, got {json_kind(value)}")
    return value


def _number(obj: dict[str, Any], key: str) -> float:
    if key not in obj:
        raise _FieldError(f"missing {key!r} (a number is required)")
    value = obj[key]
    if type(value) not in (int, float):
        raise _FieldError(f"{key!r} must be a number, got {json_kind(value)}")
    return float(value)  # type: ignore[arg-type, unused-ignore]


def _opt_number(obj: dict[str, Any], key: str) -> float | None:
    value = obj.get(key)
    if value is None:
        return None
    if type(value) not in (int, float):
        raise _FieldError(f"{key!r} must be a number or null, got {json_kind(value)}")
    return float(value)  # type: ignore[arg-type, unused-ignore]


def stream_fields(obj: dict[str, Any]) -> StreamRow:
    """The four v0 fields of a ``*.stream.jsonl`` record."""
    t = _t(obj.get("t"))
    cost = _number(obj, "cumulative_api_cost_usd")
    solved = obj.get("cumulative_solved")
    if "cumulative_solved" not in obj:
        raise _FieldError("missing 'cumulative_solved' (an int is required)")
    if type(solved) is not int:
        raise _FieldError(f"'cumulative_solved' must be an int, got {json_kind(solved)}")
    return t, cost, solved, _number(obj, "cost_per_solved")


def problem_fields(obj: dict[str, Any]) -> ProblemRow:
    """``t``, ``solved``, ``attempt_success_rate``, ``tokens_total`` and ``latency_total_ms``
    of a ``*.problems.jsonl`` record; the last three may be null."""
    t = _t(obj.get("t"))
    solved = obj.get("solved")
    if type(solved) is not bool:
        what = "missing 'solved'" if "solved" not in obj else f"got {json_kind(solved)}"
        raise _FieldError(f"'solved' must be true or false ({what})")
    tokens = obj.get("tokens_total")
    if tokens is not None and type(tokens) is not int:
        raise _FieldError(f"'tokens_total' must be an int or null, got {json_kind(tokens)}")
    return (
        t,
        solved,
        _opt_number(obj, "attempt_success_rate"),
        tokens,
        _opt_number(obj, "latency_total_ms"),
    )


def event_fields(obj: dict[str, Any]) -> EventRow:
    """``t`` (from ``metadata``, else the top level), Track A membership and ``cost_usd`` of a
    TokenTracker event."""
    meta = obj.get("metadata")
    t = meta.get("t") if type(meta) is dict else None
    where = "metadata.t"
    if t is None:
        t, where = obj.get("t"), "t"
        if t is None:
            raise _FieldError("missing 't' (an int is required in metadata or at the top level)")
    return _t(t, where), obj.get("component") == "pipeline", _number(obj, "cost_usd")


def read_records(
    path: str | os.PathLike[str],
    fields: Callable[[dict[str, Any]], T],
    *,
    best_effort: bool = False,
) -> list[T]:
    """Every record of ``path`` through ``fields``, in file order.

    Raises :class:`ampmeter.logs.JsonlError` for bad JSON (unless ``best_effort``) and
    :class:`AnalysisError` naming ``file:line`` for a record ``fields`` rejects (in every mode:
    a record that is valid JSON but breaks the contract is never skipped silently).
    """
    name = os.fspath(path)
    with read_jsonl(name, best_effort=best_effort) as reader:
        try:
            return [fields(obj) for obj in reader]
        except _FieldError as exc:
            raise AnalysisError(name, reader.line, str(exc)) from None


def record_line(path: str, index: int, best_effort: bool) -> int | None:
    """Line number (1-based) of the ``index``-th record (0-based) of ``path``, read again by
    the reader's rules (only for an error message, so the first pass keeps no line numbers)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the first pass has already told them
        with read_jsonl(path, best_effort=best_effort) as reader:
            for seen, _ in enumerate(reader):
                if seen == index:
                    return reader.line
    return None
