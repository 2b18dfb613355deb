"""A call in a handed-off context against the same call in a plain context, one SQLite ledger.

The handed-off child reserves at its own scope and its parent's (one transaction) and records
every key the call adds (so its parent can read the child's whole spend); the baseline is a
context on the same file that reserves at one scope. The ratio is baseline / hand-off time.
"""

from __future__ import annotations

import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _options import parse
from ampmeter import ExecutionContext, Limit
from ampmeter.ledgers import SqliteLedger

TARGET_OVERHEAD = 2.0  # a hand-off call may cost at most twice a plain ledger call


def _calls_us(ctx: ExecutionContext, calls: int) -> float:
    samples = []
    for _ in range(calls):
        started = time.perf_counter_ns()
        with ctx.llm_call("bench", model="m", estimate_usd=0.001) as call:
            call.record(100, 10, cost_usd=0.001)
        samples.append((time.perf_counter_ns() - started) / 1000)
    return statistics.median(samples)


def run(quick: bool) -> list[dict[str, Any]]:
    """Measure and return the benchmark row."""
    calls = 200 if quick else 2000
    with tempfile.TemporaryDirectory(prefix="ampmeter-bench-handoff-") as workdir:
        path = str(Path(workdir) / "ledger.db")
        with (
            SqliteLedger(path, "plain") as ledger,
            ExecutionContext("plain", max_cost_usd=1e9, ledger=ledger) as plain,
        ):
            _calls_us(plain, 50)
            plain_us = _calls_us(plain, calls)
        with (
            SqliteLedger(path, "team", handoff_key=secrets.token_hex(16)) as ledger,
            ExecutionContext("boss", max_cost_usd=1e9, ledger=ledger) as boss,
        ):
            token = boss.handoff("child", limits=[Limit("amp:llm_calls", 1e9)])
            with ExecutionContext.from_handoff(token, ledger=ledger) as child:
                _calls_us(child, 50)
                child_us = _calls_us(child, calls)
            assert child.ledger is not None
            child.ledger.close()
    return [
        {
            "name": "llm_call round in a handed-off context (2 scopes) vs a plain ledger context",
            "unit": "µs (median)",
            "ampmeter": child_us,
            "baseline": plain_us,
            "baseline_name": "same call, context with the ledger's own scope only",
            "ratio": plain_us / child_us,
            "target": f"<= {TARGET_OVERHEAD:.0f}x the plain call",
            "met": child_us <= TARGET_OVERHEAD * plain_us,
        }
    ]


def main(argv: list[str] | None = None) -> None:
    """Print the row."""
    for row in run(parse(__doc__, argv).quick):
        print(
            f"{row['name']}\n  ampmeter {row['ampmeter']:.1f} {row['unit']}  |  "
            f"{row['baseline_name']} {row['baseline']:.1f}  |  ratio {row['ratio']:.2f}  |  "
            f"target {row['target']}: {'met' if row['met'] else 'NOT met'}"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
