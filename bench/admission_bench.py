"""How much of a shared cap a workload can use: waiting for calls in flight vs refusing at once.

Rows (measured in this run), for 8, 32 and 128 threads on one ``max_cost_usd`` cap, each call
reserving 1.5x what it then costs (what real estimates from ``max_tokens`` look like):

* ``share of the cap used``: spent / cap when every worker has stopped. Baseline: the same
  workload with ``admission_timeout_s=0`` (a call blocked by holds in flight is refused at
  once, as before waiting existed). ``ratio`` = ampmeter / baseline.
* ``early refusals``: workers refused while what was spent still left room for their call
  (target 0). ``overshoot``: spent above the cap (target 0).

The ``shared ledger`` rows run the same workload with one context per thread on one
``SqliteLedger`` file, so only the ledger coordinates them (as separate processes would be).

Run: ``python bench/admission_bench.py [--quick]``.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from _options import parse
from ampmeter import ExecutionContext, LimitExceeded
from ampmeter.keys import KEY_COST
from ampmeter.ledgers import SqliteLedger

CAP = 1.0
COST = 0.01
ESTIMATE = 0.015


def _run_workers(
    workers: int, context: Callable[[], ExecutionContext], spent: Callable[[], float]
) -> int:
    """Start ``workers`` threads together, each calling in ``context()`` until refused; the
    number refused while ``spent()`` still left room for their call (early refusals)."""
    early = 0
    lock = threading.Lock()
    barrier = threading.Barrier(workers)

    def worker() -> None:
        nonlocal early
        ctx = context()
        barrier.wait()
        while True:
            try:
                with ctx.llm_call("c", estimate_usd=ESTIMATE) as call:
                    time.sleep(0.002)  # the provider's time
                    call.record(tokens_in=1, tokens_out=1, cost_usd=COST)
            except LimitExceeded:
                if spent() + ESTIMATE <= CAP:
                    with lock:
                        early += 1
                return

    threads = [threading.Thread(target=worker) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return early


def _workload(workers: int, wait_s: float) -> tuple[float, int]:
    """Spent money and early refusals when ``workers`` threads share one context's cap."""
    ctx = ExecutionContext(max_cost_usd=CAP, admission_timeout_s=wait_s)
    early = _run_workers(workers, lambda: ctx, ctx.stats.total_cost)
    return ctx.stats.total_cost(), early


def _shared_workload(workers: int, wait_s: float) -> tuple[float, int]:
    """:func:`_workload` with one context per thread on one SQLite ledger file."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "budget.sqlite3")
        ledger = SqliteLedger(path, "bench", journal=os.path.join(tmp, "journal"))

        def spent() -> float:
            return ledger.spent().get(KEY_COST, 0.0)

        def context() -> ExecutionContext:
            return ExecutionContext(max_cost_usd=CAP, ledger=ledger, admission_timeout_s=wait_s)

        early = _run_workers(workers, context, spent)
        total = spent()
        ledger.close()
    return total, early


def run(quick: bool) -> list[dict[str, Any]]:
    """Measure the rows; ``quick`` measures 8 and 32 threads only."""
    rows: list[dict[str, Any]] = []
    counts = (8, 32) if quick else (8, 32, 128)
    runs = [("", _workload, workers) for workers in counts]
    runs += [("shared ledger: ", _shared_workload, workers) for workers in counts]
    for label, workload, workers in runs:
        spent, early = workload(workers, 30.0)
        base_spent, base_early = workload(workers, 0.0)
        rows.append(
            {
                "name": f"{label}share of the cap used, {workers} threads (early refusals "
                f"{early} vs {base_early}, overshoot {max(spent - CAP, 0):.3g})",
                "unit": "share",
                "ampmeter": spent / CAP,
                "baseline": base_spent / CAP,
                "baseline_name": "refused at once (admission_timeout_s=0)",
                "ratio": spent / base_spent if base_spent else None,
                "target": "0 early refusals, 0 overshoot",
                "met": early == 0 and spent <= CAP + 1e-9,
            }
        )
    return rows


if __name__ == "__main__":
    for row in run(quick=parse(__doc__).quick):
        print(
            f"{row['name']:<72} {row['ampmeter']:.3f} vs {row['baseline']:.3f}  "
            f"{'met' if row['met'] else 'MISSED'}"
        )
