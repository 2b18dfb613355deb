"""Does a shared cost cap hold on agent-shaped traffic, and how much of it can be used?

The workload behind the README's claim that concurrent calls cannot overshoot a cap, made the
way agents call: W worker threads share one ``ExecutionContext(max_cost_usd=CAP)`` and call
``chat.completions.create`` through the real, instrumented ``openai`` SDK until ampmeter
refuses them. Every request carries a 1,180-character system prompt, a 500-character user
prompt and T tool schemas (about 660 characters each, 13.3k for 20). The provider is
:class:`ampmeter.testing.BillingProvider` on loopback: it bills everything the request sends
(tools, framing) at C characters a token, and always writes the whole ``max_tokens`` (so no
slack in the output reservation hides an input under-estimate). Each cell's cap is what
``CALLS`` such calls cost at that cell's billing, so every cell spends about the same number
of calls.

Cells: T in 0, 10, 20 tools; W in 8, 32, 128 threads; C in 4 and 2.5 characters a token;
``estimate="learned"`` and ``"bound"``. For each:

* ``billed/cap``: what the provider billed over the cap. Target <= 1.000 with ``"bound"``
  everywhere, and with ``"learned"`` at 4 characters a token.
* ``cap used``: the share of the cap billed, at most 1 (target >= 95% with ``"learned"``,
  >= 85% with ``"bound"``).
* ``recorded = billed``: ampmeter's total equals the provider's bill to the nano-dollar.

When ``ExecutionContext`` has no ``estimate=`` parameter the ``"bound"`` cells are skipped and
the table says so. Run: ``python bench/cap_bench.py [--quick]`` (quick: 0 and 20 tools, 8 and
128 threads, fewer calls per cap). Not a timed test: the figures do not depend on speed.
"""

from __future__ import annotations

import contextvars
import inspect
import sys
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import openai

import ampmeter
from _options import parse
from ampmeter import ExecutionContext, LimitExceeded, money
from ampmeter.pricing import request_size
from ampmeter.testing import BillingProvider
from ampmeter.testing.agent_requests import SYSTEM_PROMPT, USER_PROMPT, tool_schemas

MODEL = "gpt-4o-mini"
PRICES = {MODEL: ("0.15", "0.60")}  # USD per million tokens, as the price table has them
MAX_TOKENS = 100
TOOLS = (0, 10, 20)
WORKERS = (8, 32, 128)
CHARS_PER_TOKEN = (4.0, 2.5)
MODES = ("learned", "bound")
CALLS = 100  # fewer than the most workers: their first calls, admitted together, can pass the cap
PROVIDER_S = 0.5  # the provider's time per call, long enough for every worker to be in flight


@dataclass(frozen=True)
class Cell:
    """One measured combination and what it gave."""

    tools: int
    workers: int
    chars_per_token: float
    mode: str
    calls: int
    peak_in_flight: int
    errors: int
    cap: Decimal
    billed: Decimal
    recorded_equal: bool

    @property
    def billed_over_cap(self) -> float:
        return float(self.billed / self.cap)

    @property
    def used(self) -> float:
        return min(self.billed_over_cap, 1.0)

    @property
    def met(self) -> bool:
        holds = self.mode == "bound" or self.chars_per_token == 4.0
        floor = 0.95 if self.mode == "learned" else 0.85
        within = self.billed <= self.cap or not holds
        return within and self.used >= floor and self.recorded_equal and not self.errors


def estimate_modes() -> bool:
    """Whether this ampmeter takes ``ExecutionContext(..., estimate=...)``."""
    return "estimate" in inspect.signature(ExecutionContext).parameters


def one_call_cost(server: BillingProvider, body: Mapping[str, Any]) -> Decimal:
    """What the provider bills for one request ``body`` (with its whole ``max_tokens``)."""
    tokens_in = server.input_tokens("chat", body)
    rate_in, rate_out = (Decimal(rate) for rate in PRICES[MODEL])
    return (tokens_in * rate_in + MAX_TOKENS * rate_out) / 1_000_000


def measure(tools: int, workers: int, cpt: float, mode: str, calls: int) -> Cell:
    """Run one cell: ``workers`` threads on one cap worth ``calls`` calls."""
    forget = getattr(request_size, "forget", None)
    if forget is not None:
        forget()  # every cell learns from nothing
    messages = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": USER_PROMPT},
    ]
    schemas = tool_schemas(tools)
    extra: dict[str, Any] = {"tools": schemas} if schemas else {}
    body = {"model": MODEL, "messages": messages, "max_tokens": MAX_TOKENS, **extra}
    options: dict[str, Any] = {"estimate": mode} if estimate_modes() else {}
    errors = 0
    lock = threading.Lock()
    with BillingProvider(
        chars_per_token=cpt, output_tokens=MAX_TOKENS, prices=PRICES, delay_s=PROVIDER_S
    ) as server:
        cap = (calls * one_call_cost(server, body)).quantize(Decimal("0.000001"))
        client = openai.OpenAI(
            base_url=server.openai_base_url, api_key="bench-key", max_retries=0, timeout=120
        )
        ctx = ExecutionContext("cap_bench", max_cost_usd=float(cap), **options)
        barrier = threading.Barrier(workers)

        def worker() -> None:
            nonlocal errors
            barrier.wait()
            while True:
                try:
                    client.chat.completions.create(
                        model=MODEL, messages=messages, max_tokens=MAX_TOKENS, **extra
                    )
                except LimitExceeded:
                    return  # refused: this worker is done
                except Exception as error:
                    with lock:
                        errors += 1
                    print(f"cap_bench: a call failed: {error!r}", file=sys.stderr)
                    return

        with ctx:
            threads = [
                threading.Thread(target=contextvars.copy_context().run, args=(worker,))
                for _ in range(workers)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            recorded = ctx.stats.total_cost()
        client.close()
        billed = server.billed_usd
        made = len(server.calls)
        peak = server.peak_in_flight
    return Cell(
        tools,
        workers,
        cpt,
        mode,
        made,
        peak,
        errors,
        cap,
        billed,
        money.to_nano(recorded) == money.to_nano(billed),
    )


def cells(quick: bool) -> list[tuple[int, int, float, str]]:
    """The (tools, workers, chars per token, mode) combinations to run."""
    tools = (0, 20) if quick else TOOLS
    workers = (8, 128) if quick else WORKERS
    modes = MODES if estimate_modes() else ("learned",)
    return [(t, w, c, m) for m in modes for c in CHARS_PER_TOKEN for t in tools for w in workers]


def measured(quick: bool) -> Iterator[Cell]:
    """Run the cells one after the other (SDKs instrumented), yielding each as it ends."""
    ampmeter.instrument(http=False)
    for tools, workers, cpt, mode in cells(quick):
        yield measure(tools, workers, cpt, mode, CALLS)


def run(quick: bool) -> list[dict[str, Any]]:
    """The rows for ``bench/run.py``: one per cell, ``ampmeter`` = billed/cap."""
    rows = []
    for cell in measured(quick):
        bound = cell.mode == "bound" or cell.chars_per_token == 4.0
        floor = "95%" if cell.mode == "learned" else "85%"
        rows.append(
            {
                "name": f"{cell.tools} tools, {cell.workers} threads, {cell.chars_per_token:g} "
                f"chars/token, estimate={cell.mode}: billed/cap (cap used {cell.used:.1%}, "
                f"{cell.calls} calls)",
                "unit": "billed/cap",
                "ampmeter": round(cell.billed_over_cap, 3),
                "baseline": None,
                "baseline_name": "",
                "ratio": None,
                "target": ("billed <= cap, " if bound else "") + f"used >= {floor}",
                "met": cell.met,
            }
        )
    return rows


def table(found: list[Cell]) -> str:
    """The cells as a Markdown table."""
    lines = [
        "| tools | threads | chars/token | estimate | calls | peak in flight | billed/cap | "
        "cap used | recorded = billed | met |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for cell in found:
        lines.append(
            f"| {cell.tools} | {cell.workers} | {cell.chars_per_token:g} | {cell.mode} | "
            f"{cell.calls} | {cell.peak_in_flight} | {cell.billed_over_cap:.3f} | "
            f"{cell.used:.1%} | "
            f"{'yes' if cell.recorded_equal else 'NO'} | {'yes' if cell.met else '**no**'} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    quick = parse(__doc__, argv).quick
    if not estimate_modes():
        print(
            "ExecutionContext(..., estimate=...) is not available in this ampmeter: only the "
            'default estimate ("learned") is measured; the "bound" cells are skipped.',
            flush=True,
        )
    found = []
    for cell in measured(quick):
        found.append(cell)
        print(
            f"{cell.tools:>2} tools {cell.workers:>3} threads {cell.chars_per_token:>3g} c/t "
            f"{cell.mode:<7} calls {cell.calls:>4} peak {cell.peak_in_flight:>3}  "
            f"billed/cap {cell.billed_over_cap:.3f}  "
            f"used {cell.used:6.1%}  errors {cell.errors}  {'met' if cell.met else 'MISSED'}",
            flush=True,
        )
    print()
    print(table(found))


if __name__ == "__main__":
    main(sys.argv[1:])
