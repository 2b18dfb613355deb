"""The ``ampmeter run`` and ``ampmeter demo`` commands, added to the app by :func:`register`."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from ampmeter.demo import DEFAULT_PRICE_AS, RUN_MAX_COST

__all__ = ["register"]


def _run(
    command: Annotated[
        list[str] | None,
        typer.Argument(help="The program to run, after `--` (e.g. `-- python agent.py`)."),
    ] = None,
    max_cost: Annotated[
        float | None, typer.Option("--max-cost", help="Cost ceiling in USD.")
    ] = None,
    max_llm_calls: Annotated[
        int | None, typer.Option("--max-llm-calls", help="Most LLM calls.")
    ] = None,
    max_input_tokens: Annotated[
        int | None,
        typer.Option("--max-input-tokens", help="Most input tokens over all calls."),
    ] = None,
    max_tokens_per_model: Annotated[
        list[str] | None,
        typer.Option(
            "--max-tokens-per-model",
            metavar="MODEL=N",
            help="Most input tokens for one model (repeatable).",
        ),
    ] = None,
    timeout: Annotated[
        float | None, typer.Option("--timeout", help="Wall-time limit in seconds.")
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", help="Write TokenTracker JSONL events here.")
    ] = None,
    capture_content: Annotated[
        bool, typer.Option("--capture-content", help="Also log prompt and response text.")
    ] = False,
    ledger: Annotated[
        str | None,
        typer.Option(
            "--ledger",
            metavar="redis://HOST:PORT/DB",
            help="Share the limits through this Redis (processes on many machines); "
            "default: a SQLite ledger for this run's process tree.",
        ),
    ] = None,
) -> None:
    """Run a Python program with its OpenAI/Anthropic calls metered and limited.

    Limits also come from AMPMETER_MAX_COST, AMPMETER_MAX_LLM_CALLS, AMPMETER_MAX_INPUT_TOKENS,
    AMPMETER_MAX_TOKENS_PER_MODEL (MODEL=N,...), AMPMETER_TIMEOUT, AMPMETER_OUT and
    AMPMETER_LEDGER; flags win. The limits hold across every Python process the program starts.
    """
    from ampmeter.runner import RunConfig, format_summary, parse_model_limits, run_command

    if not command:
        raise typer.BadParameter("give the program to run after `--`, e.g. "
                                 "`ampmeter run -- python agent.py`")  # fmt: skip
    try:
        config = RunConfig.from_env(
            os.environ,
            max_cost=max_cost,
            max_llm_calls=max_llm_calls,
            max_input_tokens=max_input_tokens,
            max_tokens_per_model=parse_model_limits(max_tokens_per_model or []),
            timeout=timeout,
            out=str(out) if out is not None else None,
            capture_content=capture_content or None,
            ledger=ledger,
        )
        outcome = run_command(command, config)
    except ValueError as exc:
        typer.echo(f"ampmeter run: error: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo("\nampmeter run summary", err=True)
    if outcome.summary is not None:
        typer.echo(format_summary(outcome.summary), err=True)
    else:
        typer.echo("  (the program ended before ampmeter could write its summary)", err=True)
    if outcome.stop_reason:
        typer.echo(f"ampmeter: run stopped: {outcome.stop_reason}", err=True)
    raise typer.Exit(outcome.exit_code)


def _demo(
    model: Annotated[
        Path | None, typer.Option("--model", help="A GGUF model file (default: SmolLM2-135M).")
    ] = None,
    base_url: Annotated[
        str | None,
        typer.Option("--base-url", help="Use this OpenAI-compatible server instead."),
    ] = None,
    model_name: Annotated[
        str | None, typer.Option("--model-name", help="Model name sent with --base-url.")
    ] = None,
    price_in: Annotated[
        float | None,
        typer.Option("--price-in", help="USD per million input tokens (instead of --price-as)."),
    ] = None,
    price_out: Annotated[
        float | None,
        typer.Option("--price-out", help="USD per million output tokens (instead of --price-as)."),
    ] = None,
    price_as: Annotated[
        str,
        typer.Option("--price-as", help="Price the local model's calls as this hosted model."),
    ] = DEFAULT_PRICE_AS,
    free: Annotated[
        bool, typer.Option("--free", help="Price every call at $0 (no dollar budget can bite).")
    ] = False,
    max_cost: Annotated[
        float, typer.Option("--max-cost", help="Cost ceiling per question (USD).")
    ] = 0.01,
    max_steps: Annotated[int, typer.Option("--max-steps", help="Most LLM calls per question.")] = 6,
    questions: Annotated[int, typer.Option("--questions", help="How many questions.")] = 4,
    run_max_cost: Annotated[
        float,
        typer.Option(
            "--run-max-cost",
            help="Cost ceiling of the whole run in USD (default: a little less than the default "
            "questions cost, so a call of the last one is stopped before it is made).",
        ),
    ] = RUN_MAX_COST,
    run_max_llm_calls: Annotated[
        int | None,
        typer.Option("--run-max-llm-calls", help="Also cap the whole run's LLM calls."),
    ] = None,
    out_dir: Annotated[Path, typer.Option("--out-dir", help="Where the logs go.")] = Path(
        "runs/demo"
    ),
) -> None:
    """Run a small ReAct agent on a real local model under limits and print what it cost.

    The local model's calls are priced as a hosted model (gpt-4o-mini unless told otherwise) so
    that the run's budget is in dollars; nothing is paid.
    """
    from ampmeter.demo import DemoError, run_demo

    try:
        run_demo(
            model_path=model, base_url=base_url, model_name=model_name, price_in=price_in,
            price_out=price_out, price_as=price_as, free=free, max_cost=max_cost,
            max_steps=max_steps, questions=questions, run_max_cost=run_max_cost,
            run_max_llm_calls=run_max_llm_calls, out_dir=out_dir, echo=typer.echo,
        )  # fmt: skip
    except DemoError as exc:
        typer.echo(f"ampmeter demo: error: {exc}", err=True)
        raise typer.Exit(2) from None


def register(app: typer.Typer) -> None:
    """Add the ``run`` and ``demo`` commands to ``app``."""
    app.command(
        "run",
        context_settings={"allow_interspersed_args": False},
    )(_run)
    app.command("demo")(_demo)


def main() -> None:
    """``python -m ampmeter.cli_run``: the two commands on their own."""
    app = typer.Typer(add_completion=False, no_args_is_help=True)
    register(app)
    app(prog_name="ampmeter")


if __name__ == "__main__":
    main()
    sys.exit(0)
