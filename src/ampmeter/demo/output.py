"""What the demo prints: a usage dict read from a context's stats, one line per question, totals."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from ampmeter.demo.agent import AgentResult
from ampmeter.keys import KEY_LLM_CALLS
from ampmeter.limits import ExceededLimit
from ampmeter.stats import ExecutionStats

__all__ = [
    "USAGE_KEYS",
    "describe_stop",
    "matches",
    "question_line",
    "sum_usage",
    "totals",
    "usage",
]

USAGE_KEYS: Final = ("llm_calls", "tool_calls", "tokens_in", "tokens_out", "cost_usd")


def usage(stats: ExecutionStats) -> dict[str, Any]:
    """A context's own usage (its children's included), read from its live stats."""
    return {
        "llm_calls": stats.get_counter(KEY_LLM_CALLS),
        "tool_calls": stats.tool_call_count(),
        "tokens_in": stats.total_input_tokens(),
        "tokens_out": stats.total_output_tokens(),
        "cost_usd": stats.total_cost(),
    }


def sum_usage(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """The usage figures of several summaries added up."""
    return {key: sum(s[key] for s in summaries) for key in USAGE_KEYS}


def matches(run: dict[str, Any], summed: dict[str, Any]) -> bool:
    """True when the run's figures equal ``summed`` exactly (money is exact decimal)."""
    return all(run[k] == summed[k] for k in USAGE_KEYS)


def describe_stop(result: AgentResult, stopped_by: str | None) -> str:
    """``stopped before LLM call 2: run budget amp:llm_calls = 8 > 7 (node n000023)``."""
    exceeded: ExceededLimit | None = result.stop_exceeded
    why = (
        f"{exceeded.key} = {exceeded.value:.6g} > {exceeded.limit.max_value:.6g}"
        if exceeded is not None
        else result.stopped or "stopped"
    )
    node = f" (node {result.stop_node})" if result.stop_node else ""
    return f"stopped before {result.stop_before}: {stopped_by or 'limit'} {why}{node}"


def question_line(t: int, result: AgentResult, summary: dict[str, Any], solved: bool) -> str:
    """Two lines for question ``t``: what it used and how it ended."""
    if solved:
        verdict = "solved"
    elif result.stopped:
        verdict = describe_stop(result, summary.get("stopped_by"))
    else:
        verdict = f"answered {result.answer!r}"
    return (
        f"[q{t}] {result.question}\n      {summary['llm_calls']} LLM calls, "
        f"{summary['tool_calls']} tool calls, {result.parse_errors} format errors, "
        f"{summary['tokens_in']}/{summary['tokens_out']} tokens, "
        f"${summary['cost_usd']:.6f} -> {verdict}"
    )


def totals(
    run: dict[str, Any],
    summaries: list[dict[str, Any]],
    budget: str,
    seconds: float,
    out: Path,
    run_id: str,
) -> str:
    """The closing block: the run context's totals against its ``budget`` (as the user reads
    it, e.g. ``$0.00028``), the stops, amplification and the logs."""
    n = len(summaries)
    stopped = [s for s in summaries if s["stopped_by"] is not None]
    by_run = sum(1 for s in stopped if s["stopped_by"] == "run budget")
    summed = sum_usage(summaries)
    check = (
        f"equals the sum of the {n} questions"
        if matches(run, summed)
        else f"NOT the sum of the {n} questions: {summed}"
    )
    lines = [
        f"\nsummary: run {run['name']!r}, from its own stats ({check}): "
        f"${run['cost_usd']:.6f} of a {budget} budget, {run['llm_calls']} LLM calls, "
        f"{run['tool_calls']} tool calls, {run['tokens_in']} input / {run['tokens_out']} "
        f"output tokens, {seconds:.1f} s",
        f"stopped by a limit: {len(stopped)} of {n} questions "
        f"({by_run} by the run budget, {len(stopped) - by_run} by a per-question limit)",
    ]
    if not stopped:
        lines.append(
            f"note: no limit stopped a call in this run; give --run-max-cost below "
            f"{run['cost_usd']:.6f} (or --run-max-llm-calls below {run['llm_calls']}) "
            "to see the run budget stop one"
        )
    calls = run["llm_calls"] + run["tool_calls"]
    lines += [
        f"amplification: {calls / max(n, 1):.1f} calls per question",
        f"logs: {out}/{run_id}.calls.jsonl, .problems.jsonl, .stream.jsonl, .token_events.jsonl",
    ]
    return "\n".join(lines)
