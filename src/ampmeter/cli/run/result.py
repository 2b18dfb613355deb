"""``ampmeter run --output json``: the run's result as one JSON document (its keys:
``docs/integrations.md``), and the parts of the run's figures it needs beyond the summary
(spend per model, what the limits reported). Money is an exact decimal string, as every event
wrote it; counts are numbers.
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import orjson

from ampmeter.cli.run.config import RunConfig

if TYPE_CHECKING:
    from ampmeter.analysis.runs import Call
    from ampmeter.cli.run.parent import RunOutcome

__all__ = ["exact_usd", "limit_events", "result_json", "spend_by_model"]

_LIMIT_EVENTS = "limit_events"  # the node metadata each limit event is kept in
_COUNTS = ("llm_calls", "refused_calls", "tokens_in", "tokens_out", "unpriced_calls")


def exact_usd(calls: Iterable[Call]) -> Decimal:
    """The cost of ``calls`` summed exactly, each as its event wrote it."""
    return sum((Decimal(repr(call.cost_usd)) for call in calls), Decimal(0))


def spend_by_model(calls: Iterable[Call]) -> dict[str, dict[str, Any]]:
    """Per model of the run's LLM calls: calls sent and refused, tokens, priced cost (exact)
    and calls without a price."""
    models: dict[str, dict[str, Any]] = {}
    for call in calls:
        if call.kind != "llm":
            continue
        row = models.setdefault(call.model, {**dict.fromkeys(_COUNTS, 0), "cost_usd": Decimal(0)})
        row["refused_calls" if call.status == "halt" else "llm_calls"] += 1
        row["tokens_in"] += call.tokens_in
        row["tokens_out"] += call.tokens_out
        if call.unpriced:
            row["unpriced_calls"] += 1
        else:
            row["cost_usd"] += exact_usd((call,))
    return models


def limit_events(calls: Iterable[Call]) -> list[dict[str, Any]]:
    """What the limits reported on the run's calls, in log order: warnings, pauses and resumes,
    and (kind ``soft_limit``) each limit a dry run let a call pass. ``node_id`` is the call's
    id in the run's log."""
    found = []
    for call in calls:
        for event in call.metadata.get(_LIMIT_EVENTS) or ():
            if isinstance(event, dict):
                found.append({**event, "node_id": call.span_id})
    return found


def result_json(outcome: RunOutcome, config: RunConfig) -> str:
    """The run's result (see the module)."""
    summary = dict(outcome.summary)
    models = summary.pop("models", {})
    events = summary.pop("limit_events", [])
    limits: dict[str, Any] = {limit.key: limit.max_value for limit in config.limits()}
    if config.timeout is not None:
        limits["timeout_s"] = config.timeout
    document = {
        "exit_code": outcome.exit_code,
        "end_reason": summary.pop("termination"),
        "stop_reason": summary.pop("stop_reason"),
        "program_exit_code": outcome.program_exit_code,
        "dry_run": config.dry_run,
        "totals": summary,
        "limits": limits,
        "models": models,
        "limit_events": events,
    }
    return orjson.dumps(document, default=_exact, option=orjson.OPT_INDENT_2).decode()


def _exact(value: object) -> str:
    if isinstance(value, Decimal):
        return format(value, "f")
    raise TypeError(f"not JSON: {type(value).__name__}")
