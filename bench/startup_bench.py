"""What a process pays at start-up for ampmeter: ``instrument()`` and ``ampmeter run``.

Baseline: the same interpreter running ``-c pass``, measured in the same interleaved rounds.
Rows give the time *added* to that baseline (median of the rounds):

* ``instrument()`` in a program that imports no SDK, with openai, anthropic, httpx and httpx2
  installed (they are patched only when imported, so it should cost next to nothing beyond
  importing ampmeter itself);
* ``import ampmeter`` alone (the floor the row above stands on);
* ``ampmeter run -- python -c pass`` (the parent CLI, the metered child, the summary), and
  what it adds beyond ``import ampmeter`` (the parent imports the package, since its entry
  point lives there; the child imports none of it until the program imports something metered).

Target (issue 15): ``ampmeter run -- python -c pass`` adds at most 150 ms.

Run: ``python bench/startup_bench.py [--quick]``.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _options import parse

RUN_TARGET_MS = 150.0


def _ampmeter_cli() -> list[str]:
    script = Path(sys.executable).with_name("ampmeter")
    if script.exists():
        return [str(script)]
    found = shutil.which("ampmeter")
    return [found] if found else [sys.executable, "-m", "ampmeter"]


def _commands() -> dict[str, list[str]]:
    py = sys.executable
    return {
        "baseline": [py, "-c", "pass"],
        "import": [py, "-c", "import ampmeter"],
        "instrument": [py, "-c", "import ampmeter; ampmeter.instrument()"],
        "run": [*_ampmeter_cli(), "run", "--", py, "-c", "pass"],
    }


def _row(name: str, added_ms: float, base_ms: float, target: str | None, met: bool | None) -> Any:
    return {
        "name": name,
        "unit": "ms added",
        "ampmeter": round(added_ms, 1),
        "baseline": round(base_ms, 1),
        "baseline_name": "python -c pass",
        "ratio": None,
        "target": target,
        "met": met,
    }


def run(quick: bool) -> list[dict[str, Any]]:
    rounds = 5 if quick else 15
    commands = _commands()
    times: dict[str, list[float]] = {name: [] for name in commands}
    # An installed wheel runs from compiled bytecode: the warm-up writes it (with
    # PYTHONDONTWRITEBYTECODE=1 every round would time the compiler instead).
    env = {**os.environ}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    for argv in commands.values():  # warm the file cache and write the bytecode once
        subprocess.run(argv, check=True, capture_output=True, env=env)
    for _ in range(rounds):
        for name, argv in commands.items():
            start = time.perf_counter()
            subprocess.run(argv, check=True, capture_output=True, env=env)
            times[name].append((time.perf_counter() - start) * 1000)
    median = {name: statistics.median(values) for name, values in times.items()}
    base = median["baseline"]
    run_added = median["run"] - base
    return [
        _row("import ampmeter", median["import"] - base, base, None, None),
        _row(
            "import ampmeter + instrument(), no SDK imported",
            median["instrument"] - base,
            base,
            None,
            None,
        ),
        _row(
            "ampmeter run -- python -c pass",
            run_added,
            base,
            f"<= {RUN_TARGET_MS:g} ms",
            run_added <= RUN_TARGET_MS,
        ),
        _row(
            "ampmeter run -- python -c pass, beyond import ampmeter",
            median["run"] - median["import"],
            base,
            None,
            None,
        ),
    ]


if __name__ == "__main__":
    for row in run(parse(__doc__).quick):
        print(f"{row['name']:56s} +{row['ampmeter']:8.1f} ms  (baseline {row['baseline']} ms)")
