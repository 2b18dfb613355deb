"""Wheel build hook: ship ampmeter's hot path compiled with mypyc (``scripts/compile_core.py``).

A wheel built here carries the compiled graph, stats, limit check and context beside their
sources, tagged for this interpreter and platform. Without a working C compiler (or with
``AMPMETER_PURE_PYTHON=1``) the wheel is pure Python and only slower; set
``AMPMETER_REQUIRE_COMPILED=1`` to make a failed compile fail the build instead. Editable installs
are never compiled, so edits to the sources always take effect.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class CompileHotPath(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel" or version == "editable":
            return
        if os.environ.get("AMPMETER_PURE_PYTHON") == "1":
            return
        sys.path.insert(0, str(Path(self.root) / "scripts"))
        try:
            from compile_core import compile_into
        finally:
            sys.path.pop(0)
        out = Path(self.root) / "build" / "wheel-mypyc"
        out.mkdir(parents=True, exist_ok=True)
        try:
            built = compile_into(out)
        except (RuntimeError, OSError) as error:
            if os.environ.get("AMPMETER_REQUIRE_COMPILED") == "1":
                raise
            warnings.warn(
                f"ampmeter: building a pure-Python wheel (slower hot path): {error}", stacklevel=1
            )
            return
        for path in built:
            build_data["force_include"][str(path)] = path.relative_to(out).as_posix()
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
