"""Checking log files line by line, reporting every problem (not only the first).

TokenTracker event logs are checked against the v0 schema; ``*.stream.jsonl`` and
``*.problems.jsonl`` files against the fields the amortization analysis needs, and
``*.calls.jsonl`` for an int ``t``. An incomplete last line is allowed (a cut-off write) and
reported as a warning.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from ampmeter.analysis._records import (
    _FieldError,
    _t,
    problem_fields,
    raw_lines,
    stream_fields,
)
from ampmeter.logs import event_errors
from ampmeter.logs.reader import LongLine

__all__ = ["LineProblem", "file_kind", "validate_file"]


@dataclass(frozen=True, slots=True)
class LineProblem:
    """One problem of one line; ``warning`` problems do not make a file invalid."""

    path: str
    line: int
    reason: str
    warning: bool = False

    def __str__(self) -> str:
        tag = "warning: " if self.warning else ""
        return f"{self.path}:{self.line}: {tag}{self.reason}"


def file_kind(path: str) -> str:
    """``"stream"``, ``"problems"``, ``"calls"`` or ``"events"``, from the file name."""
    name = path[:-3] if path.endswith(".gz") else path
    for kind in ("stream", "problems", "calls"):
        if name.endswith(f".{kind}.jsonl"):
            return kind
    return "events"


def _checker(kind: str) -> Callable[[dict[str, Any]], list[str]]:
    def fields(check: Callable[[dict[str, Any]], object]) -> Callable[[dict[str, Any]], list[str]]:
        def run(obj: dict[str, Any]) -> list[str]:
            try:
                check(obj)
            except _FieldError as exc:
                return [str(exc)]
            return []

        return run

    if kind == "stream":
        return fields(stream_fields)
    if kind == "problems":
        return fields(problem_fields)
    if kind == "calls":
        return fields(lambda obj: _t(obj.get("t")))
    return event_errors


def validate_file(path: str | os.PathLike[str], kind: str | None = None) -> Iterator[LineProblem]:
    """Every problem of ``path``, in line order (``kind`` defaults to :func:`file_kind`).

    Lines are read one at a time, each at most :func:`ampmeter.logs.reader.max_line_bytes`
    long (a longer one is a problem, read past without being held). Raises
    ``FileNotFoundError``/``OSError`` if the file cannot be read.
    """
    name = os.fspath(path)
    check = _checker(kind or file_kind(name))
    pending: tuple[int, bytes | LongLine] | None = None
    lines = (
        (n, raw)
        for n, raw in enumerate(raw_lines(name), 1)
        if isinstance(raw, LongLine) or raw.strip()
    )
    pending = next(lines, None)
    while pending is not None:
        number, raw = pending
        pending = next(lines, None)
        if isinstance(raw, LongLine):
            yield LineProblem(name, number, raw.reason())
            continue
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            if pending is None:
                yield LineProblem(name, number, "incomplete last line ignored", warning=True)
            else:
                yield LineProblem(name, number, f"invalid JSON ({exc})")
            continue
        if type(obj) is not dict:
            yield LineProblem(name, number, "not a JSON object")
            continue
        for reason in check(obj):
            yield LineProblem(name, number, reason)
