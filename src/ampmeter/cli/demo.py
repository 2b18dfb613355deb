"""``ampmeter demo``: a small agent on a real local model, under limits."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from ampmeter.cli.output import fail, show
from ampmeter.cli.params import option
from ampmeter.demo.settings import DEFAULT_PRICE_AS, RUN_MAX_COST

__all__ = ["demo_command"]

_PRICE_AS = "(instead of --price-as)"


def demo_command(
    model_path: Annotated[
        Path | None, option("--model", "A GGUF model file (default: SmolLM2-135M).", "PATH")
    ] = None,
    base_url: Annotated[
        str | None, option("--base-url", "Use this OpenAI-compatible server instead.", "URL")
    ] = None,
    model_name: Annotated[
        str | None, option("--model-name", "Model name sent with --base-url.", "NAME")
    ] = None,
    price_in: Annotated[
        float | None, option("--price-in", f"USD per million input tokens {_PRICE_AS}.", "USD")
    ] = None,
    price_out: Annotated[
        float | None, option("--price-out", f"USD per million output tokens {_PRICE_AS}.", "USD")
    ] = None,
    price_as: Annotated[
        str, option("--price-as", "Price the local model's calls as this hosted model.", "MODEL")
    ] = DEFAULT_PRICE_AS,
    free: Annotated[
        bool, option("--free", "Price every call at $0 (no dollar budget can bite).")
    ] = False,
    max_cost: Annotated[
        float, option("--max-cost", "Cost ceiling per question in USD.", "USD")
    ] = 0.01,
    max_steps: Annotated[int, option("--max-steps", "Most LLM calls per question.", "N")] = 6,
    questions: Annotated[int, option("--questions", "How many questions.", "N")] = 4,
    run_max_cost: Annotated[
        float,
        option(
            "--run-max-cost",
            "Cost ceiling of the whole run in USD (default: a little less than the default "
            "questions cost, so a call of the last one is stopped before it is made).",
            "USD",
        ),
    ] = RUN_MAX_COST,
    run_max_llm_calls: Annotated[
        int | None, option("--run-max-llm-calls", "Also cap the whole run's LLM calls.", "N")
    ] = None,
    out_dir: Annotated[Path, option("--out-dir", "Where the logs go.", "DIR")] = Path("runs/demo"),
) -> None:
    """Run a small ReAct agent on a real local model under limits and print what it cost.

    The local model's calls are priced as a hosted model (gpt-4o-mini unless told otherwise) so
    that the run's budget is in dollars; nothing is paid.
    """
    options = dict(locals())  # run_demo's keywords, each as its option gave it
    from ampmeter.demo.run import run_demo
    from ampmeter.errors import DemoError

    try:
        run_demo(**options, echo=show)  # the model's answers reach the terminal escaped
    except DemoError as exc:
        fail("demo", str(exc))
