"""What a process pays before its first metered call: ``import ampmeter`` and the first price.

Rows (each a median over fresh interpreter processes, measured in this run):

* ``import ampmeter``: ms added to a bare ``python -c pass`` (the interpreter's own start is
  subtracted). Target <= 100 ms. Baseline: ``import openai``, what an instrumented program
  imports anyway.
* ``first priced call``: ms of the first ``ampmeter.price(...)`` of a process, after ``import
  ampmeter``, with the price index already written by an earlier process (the usual case: every
  process but the first on a machine). Target <= 50 ms. Baseline: the first
  ``genai_prices.calc_price`` of a process, which loads the whole table.

Run: ``python bench/cold_start_bench.py [--quick]``.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
from typing import Any

from _options import parse

IMPORT_TARGET_MS = 100.0
PRICE_TARGET_MS = 50.0

_TIMED = (
    "import time; t0 = time.perf_counter(); {setup}; t1 = time.perf_counter(); {work}; "
    "t2 = time.perf_counter(); print((t1 - t0) * 1e3, (t2 - t1) * 1e3)"
)


def _ms(setup: str, work: str, env: dict[str, str]) -> tuple[float, float]:
    out = subprocess.run(
        [sys.executable, "-c", _TIMED.format(setup=setup, work=work)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return float(out[0]), float(out[1])


def run(quick: bool) -> list[dict[str, Any]]:
    """Measure the rows; ``quick`` uses fewer processes."""
    rounds = 5 if quick else 15
    with tempfile.TemporaryDirectory(prefix="ampmeter-bench-cache-") as cache:
        # An installed wheel runs from compiled bytecode: let the warm-up runs write it (a
        # PYTHONDONTWRITEBYTECODE=1 environment would time the compiler on every import).
        env = {**os.environ, "AMPMETER_CACHE_DIR": cache}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        price = "ampmeter.price('gpt-4o', input_tokens=1000, output_tokens=100)"
        _ms("import ampmeter", price, env)  # writes the price index (and the bytecode) once
        _ms("import openai; import genai_prices", "pass", env)
        imports, firsts, openai_imports, table_firsts = [], [], [], []
        for _ in range(rounds):  # interleaved, so load on the machine hits both sides alike
            imported, priced = _ms("import ampmeter", price, env)
            imports.append(imported)
            firsts.append(priced)
            openai_imports.append(_ms("import openai", "pass", env)[0])
            table_firsts.append(
                _ms(
                    "import genai_prices",
                    "genai_prices.calc_price(genai_prices.Usage(input_tokens=1000, "
                    "output_tokens=100), 'gpt-4o')",
                    env,
                )[1]
            )
    amp_import = statistics.median(imports)
    amp_price = statistics.median(firsts)
    base_import = statistics.median(openai_imports)
    base_price = statistics.median(table_firsts)
    return [
        {
            "name": "import ampmeter",
            "unit": "ms",
            "ampmeter": amp_import,
            "baseline": base_import,
            "baseline_name": "import openai",
            "ratio": base_import / amp_import,
            "target": f"<= {IMPORT_TARGET_MS:g} ms",
            "met": amp_import <= IMPORT_TARGET_MS,
        },
        {
            "name": "first priced call of a process (index written)",
            "unit": "ms",
            "ampmeter": amp_price,
            "baseline": base_price,
            "baseline_name": "first genai_prices.calc_price (loads the table)",
            "ratio": base_price / amp_price,
            "target": f"<= {PRICE_TARGET_MS:g} ms",
            "met": amp_price <= PRICE_TARGET_MS,
        },
    ]


if __name__ == "__main__":
    for row in run(quick=parse(__doc__).quick):
        print(
            f"{row['name']:<50} {row['ampmeter']:8.1f} {row['unit']}  baseline "
            f"{row['baseline']:8.1f} ({row['baseline_name']})  ratio {row['ratio']:.1f}x  "
            f"target {row['target']}  {'met' if row['met'] else 'MISSED'}"
        )
