"""Clean virtualenvs for the benchmarks that measure a tool beside its peers.

Each tool is measured in a virtualenv holding only what it needs, so nothing another tool
imports (an audit hook, a patched method, a larger heap) enters its figure. The virtualenvs live
under ``bench/`` (ignored by git) and are made again when their requirements change.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

__all__ = ["clean_python"]


def clean_python(venv: Path, requirements: list[str]) -> tuple[Path | None, str]:
    """The interpreter of ``venv`` holding exactly ``requirements`` (pip requirement strings,
    ``-e PATH`` included), made first when they changed; or None and why it could not be."""
    python = venv / "bin" / "python"
    stamp = venv / "requirements.sha256"
    wanted = hashlib.sha256("\n".join(requirements).encode()).hexdigest()
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python, ""
    print(f"making {venv} with {' '.join(requirements)} ...", file=sys.stderr, flush=True)
    shutil.rmtree(venv, ignore_errors=True)
    install = [str(python), "-m", "pip", "install", "-q"]
    for requirement in requirements:
        install += requirement.split(" ", 1)  # "-e PATH" is two arguments
    for step in ([sys.executable, "-m", "venv", str(venv)], install):
        done = subprocess.run(step, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            return None, f"`{' '.join(step[:6])} ...` failed: {done.stderr.strip()[-400:]}"
    stamp.write_text(wanted)
    return python, ""
