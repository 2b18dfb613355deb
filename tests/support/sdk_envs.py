"""Virtual environments of their own for SDKs and frameworks that cannot join the development
group (older SDK majors, frameworks with conflicting pins), and programs run in them.

Each environment is made once with ``uv`` from the package registry and kept in the system temp
dir, so later runs reuse it; ampmeter's own sources run there from this checkout. A program
prints, as its last line, one JSON document of what it saw.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

import ampmeter

# What ampmeter itself needs in an environment of its own (its sources come from the checkout).
AMPMETER_DEPS = ("orjson>=3.10", "genai-prices>=0.2")
OLDEST = ("openai==1.40.0", "anthropic==0.40.0")
# openai 1.40 passes `proxies=` to httpx, which httpx 0.28 removed; pydantic 2 as they need.
OLDEST_PINS = ("httpx<0.28", "pydantic>=2,<3", *AMPMETER_DEPS)
SECOND_MAJOR = ("openai>=2,<3", "pydantic>=2,<3", *AMPMETER_DEPS)


@functools.cache
def _uv() -> str | None:
    found = os.environ.get("AMPMETER_UV") or shutil.which("uv")
    if found:
        return found
    try:  # where `make` installs it: the uv package of the system python3
        done = subprocess.run(
            ["python3", "-c", "import uv; print(uv.find_uv_bin())"],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return done.stdout.strip() or None


def sdk_env(name: str, packages: tuple[str, ...]) -> Path:
    """The python of a kept virtual environment ``name`` holding ``packages``."""
    uv = _uv()
    if uv is None:
        pytest.fail("uv is needed to build the SDK environments (set AMPMETER_UV)")
    version = f"py{sys.version_info.major}{sys.version_info.minor}"
    home = Path(tempfile.gettempdir()) / f"ampmeter-{name}-{version}"
    python = home / "bin" / "python"
    ready = home / ".ready"
    if not ready.exists() or ready.read_text() != " ".join(packages):  # made for other pins
        shutil.rmtree(home, ignore_errors=True)
        subprocess.run([uv, "venv", "--quiet", "--python", sys.executable, str(home)], check=True)
        install = [uv, "pip", "install", "--quiet", "--python", str(python), *packages]
        subprocess.run(install, check=True)
        ready.write_text(" ".join(packages))
    return python


def oldest_env() -> Path:
    """openai 1.40 and anthropic 0.40, the oldest SDKs ampmeter declares."""
    return sdk_env("oldest-sdks", (*OLDEST, *OLDEST_PINS))


def openai_2_env() -> Path:
    """The latest openai 2.x."""
    return sdk_env("openai-2", SECOND_MAJOR)


def run_program(python: Path, program: str, *args: str) -> Any:
    """Run ``program`` with ampmeter from this checkout; its last line of output, as JSON."""
    source = Path(ampmeter.__file__).resolve().parents[1]
    done = subprocess.run(
        [str(python), "-c", program, *args],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONPATH": str(source)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
