"""Checking log files line by line, reporting every problem (not only the first).

Lines are read by the one reading every tool shares (:func:`ampmeter.logs.read_jsonl`, with
:func:`ampmeter.logs.event_problem` for event logs), so ``validate`` refuses exactly the lines
``summary``, ``report`` and ``watch`` refuse; event logs are then also checked against the v0
schema, and ``*.stream.jsonl``, ``*.problems.jsonl`` and ``*.calls.jsonl`` files against the
fields the amortization analysis needs. An incomplete last line without its newline is allowed
(a cut-off write) and reported as a warning.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ampmeter.analysis._records import problem_fields, stream_fields
from ampmeter.logs import event_errors, event_problem, read_jsonl
from ampmeter.logs.reader import TruncatedLineWarning

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


def _fields(check: Callable[[dict[str, Any]], object]) -> Callable[[dict[str, Any]], str | None]:
    def run(obj: dict[str, Any]) -> str | None:
        try:
            check(obj)
        except ValueError as exc:  # the analysis reader's field error, which names the field
            return str(exc)
        return None

    return run


def _calls_t(obj: dict[str, Any]) -> None:
    t = obj.get("t")
    if type(t) is not int:
        raise ValueError(f"'t' must be an int, got {t!r}")


_CHECKS: dict[str, Callable[[dict[str, Any]], str | None]] = {
    "events": event_problem,
    "stream": _fields(stream_fields),
    "problems": _fields(problem_fields),
    "calls": _fields(_calls_t),
}


def validate_file(path: str | os.PathLike[str], kind: str | None = None) -> Iterator[LineProblem]:
    """Every problem of ``path``, in line order (``kind`` defaults to :func:`file_kind`).

    Lines are read one at a time, each at most :func:`ampmeter.logs.reader.max_line_bytes`
    long (a longer one is a problem, read past without being held). Raises
    ``FileNotFoundError``/``OSError`` if the file cannot be read.
    """
    name = os.fspath(path)
    kind = kind or file_kind(name)
    found: list[LineProblem] = []

    def skipped(line: int, reason: str) -> None:
        found.append(LineProblem(name, line, reason))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TruncatedLineWarning)
        with read_jsonl(name, best_effort=True, check=_CHECKS[kind], on_skip=skipped) as reader:
            for obj in reader:
                yield from found
                found.clear()
                if kind == "events":
                    for reason in event_errors(obj):
                        yield LineProblem(name, reader.line, reason)
            yield from found
            if reader.summary.truncated_last_line:
                yield LineProblem(
                    name, reader.summary.lines, "incomplete last line ignored", warning=True
                )
    for item in caught:
        if not issubclass(item.category, TruncatedLineWarning):
            warnings.warn_explicit(item.message, item.category, item.filename, item.lineno)
