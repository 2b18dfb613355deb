"""Trace records: the events a context turns into stats updates.

``ctx.trace(ModelCallTrace(...))`` and friends update the standard keys exactly as a call made
through ``ctx.llm_call`` would; model and tool authors only report what happened.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Literal

from ampmeter.keys import (
    KEY_FORMAT_PARSE_ERROR_AT,
    KEY_FORMAT_PARSE_ERROR_CONSECUTIVE,
    KEY_FORMAT_PARSE_ERROR_TOTAL,
    KEY_TOOLCHAIN_PARSE_ERROR_AT,
    KEY_TOOLCHAIN_PARSE_ERROR_CONSECUTIVE,
    KEY_TOOLCHAIN_PARSE_ERROR_TOTAL,
)

if TYPE_CHECKING:
    from ampmeter._core.usage import Usage

__all__ = ["ModelCallTrace", "ParseErrorTrace", "ToolCallTrace", "TraceRecord", "trace_effect"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelCallTrace:
    """One LLM call's usage: tokens in and out (and their cached/reasoning subsets), cost in
    dollars (a float is read as written)."""

    model: str
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | Decimal = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    idempotency_key: str | None = None
    """A key seen before in this run (a replayed step) adds nothing the second time."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallTrace:
    """One tool call."""

    tool_name: str
    idempotency_key: str | None = None
    """A key seen before in this run (a replayed step) adds nothing the second time."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ParseErrorTrace:
    """Output that did not parse: ``format`` (the LLM's text) or ``toolchain`` (a tool call)."""

    error_type: Literal["format", "toolchain"]
    raw_content: str = ""
    error: BaseException | str | None = None


TraceRecord = ModelCallTrace | ToolCallTrace | ParseErrorTrace


def trace_effect(record: object) -> tuple[Usage | None, tuple[str, str, str]]:
    """What a trace record adds: the usage of a model or tool call, or (for a parse error) the
    keys to count, total, per-iteration prefix and consecutive. Errors name the bad field."""
    from ampmeter import _validate
    from ampmeter._core.usage import Usage

    if isinstance(record, ModelCallTrace):
        usage = Usage.checked(
            model=_validate.text(record.model, "model"),
            tokens_in=record.input_tokens,
            tokens_out=record.output_tokens,
            cached_tokens=record.cached_tokens,
            reasoning_tokens=record.reasoning_tokens,
            cost_usd=record.cost_usd,
            calls=1,
        )
        return usage, _NO_KEYS
    if isinstance(record, ToolCallTrace):
        tool = _validate.text(record.tool_name, "tool_name", empty=False)
        return Usage("tool", tool=tool, calls=1), _NO_KEYS
    if isinstance(record, ParseErrorTrace):
        if record.error_type == "format":
            return None, (
                KEY_FORMAT_PARSE_ERROR_TOTAL,
                KEY_FORMAT_PARSE_ERROR_AT,
                KEY_FORMAT_PARSE_ERROR_CONSECUTIVE,
            )
        if record.error_type == "toolchain":
            return None, (
                KEY_TOOLCHAIN_PARSE_ERROR_TOTAL,
                KEY_TOOLCHAIN_PARSE_ERROR_AT,
                KEY_TOOLCHAIN_PARSE_ERROR_CONSECUTIVE,
            )
        raise ValueError(f"error_type must be 'format' or 'toolchain', got {record.error_type!r}")
    raise TypeError(
        "trace() takes ModelCallTrace, ToolCallTrace or ParseErrorTrace, "
        f"got {type(record).__name__}"
    )


_NO_KEYS = ("", "", "")
