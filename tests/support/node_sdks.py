"""The official Node SDKs (``openai``, ``@anthropic-ai/sdk``) of ``tests/support/node``, pinned in
its ``package.json`` and installed with ``npm ci`` on first use (the lock file records no
download addresses). Without Node.js a test is skipped on a developer's machine and fails
under CI, where it must run."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

__all__ = ["NODE_DIR", "node_with_sdks"]

NODE_DIR = Path(__file__).resolve().parent / "node"


def node_with_sdks() -> str:
    """The ``node`` binary, with the SDKs installed in :data:`NODE_DIR`."""
    found, npm = shutil.which("node"), shutil.which("npm")
    if found is None or npm is None:
        if os.environ.get("CI"):
            pytest.fail("Node.js and npm are needed for the proxy's Node tests")
        pytest.skip("Node.js and npm are not installed")
    if not (NODE_DIR / "node_modules" / "openai").is_dir():
        done = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts"],
            cwd=NODE_DIR,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-2000:]
    return found
