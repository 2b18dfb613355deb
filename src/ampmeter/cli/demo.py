"""``ampmeter demo``: a small agent on a real local model, under limits."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ampmeter.cli.output import fail, show
from ampmeter.demo.settings import DEFAULT_PRICE_AS, RUN_MAX_COST

__all__ = ["register"]


def _demo(
    model: Annotated[
        Path | None,
        typer.Option("--model", help="A GGUF model file (default: SmolLM2-135M).", metavar="PATH"),
    ] = None,
    base_url: Annotated[
        str | None,
        typer.Option(
            "--base-url", help="Use this OpenAI-compatible server instead.", metavar="URL"
        ),
    ] = None,
    model_name: Annotated[
        str | None,
        typer.Option("--model-name", help="Model name sent with --base-url.", metavar="NAME"),
    ] = None,
    price_in: Annotated[
        float | None,
        typer.Option(
            "--price-in",
            help="USD per million input tokens (instead of --price-as).",
            metavar="USD",
        ),
    ] = None,
    price_out: Annotated[
        float | None,
        typer.Option(
            "--price-out",
            help="USD per million output tokens (instead of --price-as).",
            metavar="USD",
        ),
    ] = None,
    price_as: Annotated[
        str,
        typer.Option(
            "--price-as",
            help="Price the local model's calls as this hosted model.",
            metavar="MODEL",
        ),
    ] = DEFAULT_PRICE_AS,
    free: Annotated[
        bool, typer.Option("--free", help="Price every call at $0 (no dollar budget can bite).")
    ] = False,
    max_cost: Annotated[
        float, typer.Option("--max-cost", help="Cost ceiling per question in USD.", metavar="USD")
    ] = 0.01,
    max_steps: Annotated[
        int, typer.Option("--max-steps", help="Most LLM calls per question.", metavar="N")
    ] = 6,
    questions: Annotated[
        int, typer.Option("--questions", help="How many questions.", metavar="N")
    ] = 4,
    run_max_cost: Annotated[
        float,
        typer.Option(
            "--run-max-cost",
            help="Cost ceiling of the whole run in USD (default: a little less than the default "
            "questions cost, so a call of the last one is stopped before it is made).",
            metavar="USD",
        ),
    ] = RUN_MAX_COST,
    run_max_llm_calls: Annotated[
        int | None,
        typer.Option(
            "--run-max-llm-calls", help="Also cap the whole run's LLM calls.", metavar="N"
        ),
    ] = None,
    out_dir: Annotated[
        Path, typer.Option("--out-dir", help="Where the logs go.", metavar="DIR")
    ] = Path("runs/demo"),
) -> None:
    """Run a small ReAct agent on a real local model under limits and print what it cost.

    The local model's calls are priced as a hosted model (gpt-4o-mini unless told otherwise) so
    that the run's budget is in dollars; nothing is paid.
    """
    from ampmeter.demo.run import run_demo
    from ampmeter.errors import DemoError

    try:
        run_demo(
            model_path=model,
            base_url=base_url,
            model_name=model_name,
            price_in=price_in,
            price_out=price_out,
            price_as=price_as,
            free=free,
            max_cost=max_cost,
            max_steps=max_steps,
            questions=questions,
            run_max_cost=run_max_cost,
            run_max_llm_calls=run_max_llm_calls,
            out_dir=out_dir,
            echo=show,  # the model's answers reach the terminal escaped
        )
    except DemoError as exc:
        fail("demo", str(exc))


def register(app: typer.Typer) -> None:
    """Add the ``demo`` command to ``app``."""
    app.command("demo")(_demo)
