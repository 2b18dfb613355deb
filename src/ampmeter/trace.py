"""Trace records: the events a context turns into stats updates.

``ctx.trace(ModelCallTrace(...))`` and friends update the standard keys exactly as a call made
through ``ctx.llm_call`` would; model and tool authors only report what happened.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["ModelCallTrace", "ParseErrorTrace", "ToolCallTrace", "TraceRecord"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelCallTrace:
    """One LLM call's usage: tokens in and out (and their cached/reasoning subsets), cost."""

    model: str
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    cached_tokens: int = 0
    reasoning_tokens: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallTrace:
    """One tool call."""

    tool_name: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ParseErrorTrace:
    """Output that did not parse: ``format`` (the LLM's text) or ``toolchain`` (a tool call)."""

    error_type: Literal["format", "toolchain"]
    raw_content: str = ""
    error: BaseException | str | None = None


TraceRecord = ModelCallTrace | ToolCallTrace | ParseErrorTrace
