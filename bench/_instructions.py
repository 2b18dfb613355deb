"""Instructions per round under callgrind, for benchmarks that compare a round with a baseline.

Wall time on a shared machine moves with its load; the instructions a round executes do not.
:func:`per_round` runs ``module.ROUNDS[name](rounds)`` in a fresh Python under valgrind's
callgrind, once with ``rounds`` rounds and once with none, and divides the difference by
``rounds``: start-up, imports and set-up cancel out, every thread of the process counts (an
exporter's worker thread too), and ``PYTHONHASHSEED=0`` keeps dict layouts alike between the
two runs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["per_round", "print_beside_span"]

HERE = Path(__file__).resolve().parent


def _collected(module: str, name: str, rounds: int) -> int:
    code = f"import {module}; {module}.ROUNDS[{name!r}]({rounds})"
    with tempfile.TemporaryDirectory(prefix="instructions.") as tmp:
        done = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={os.path.join(tmp, 'callgrind.out')}",
                sys.executable,
                "-c",
                code,
            ],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": _path()},
            check=False,
            cwd=HERE,
        )
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"callgrind failed for {module} {name}:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def _path() -> str:
    given = os.environ.get("PYTHONPATH")
    return os.pathsep.join([str(HERE), given] if given else [str(HERE)])


def per_round(module: str, name: str, rounds: int = 2_000) -> float:
    """Instructions one round of ``module.ROUNDS[name]`` executes (see the module docstring)."""
    return (_collected(module, name, rounds) - _collected(module, name, 0)) / rounds


def print_beside_span(module: str, what: str, target: float) -> None:
    """Print the instructions of one ``what`` (``module.ROUNDS["ampmeter"]``) beside one
    OpenTelemetry span (``module.ROUNDS["otel"]``), and how many times cheaper it is."""
    if shutil.which("valgrind") is None:
        sys.exit("--instructions needs valgrind (apt-get install valgrind)")
    amp, span = per_round(module, "ampmeter"), per_round(module, "otel")
    print(f"{what}: {amp / 1000:.1f}k instructions; one OTel span: {span / 1000:.1f}k")
    print(f"ratio (span / {what}): {span / amp:.2f}x (target >= {target:g}x)")
