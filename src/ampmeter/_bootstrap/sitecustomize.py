"""Loaded by every Python started by ``ampmeter run``: meter this interpreter's SDK calls.

Any ``sitecustomize`` that would have run without ampmeter (found further along ``sys.path``)
is imported first, so a project's own site customisation keeps working.
"""

from __future__ import annotations

import importlib
import os
import sys


def _chain_existing() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    saved_path = list(sys.path)
    this_module = sys.modules.pop("sitecustomize", None)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    try:
        importlib.import_module("sitecustomize")
    except ImportError:
        pass
    finally:
        sys.path[:] = saved_path
        if this_module is not None:
            sys.modules["sitecustomize"] = this_module


def _setup() -> None:
    try:
        from ampmeter.runner import child_setup

        child_setup()
    except Exception as exc:  # the run must not go on unmetered without saying so
        print(f"ampmeter run: could not set up metering: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc


_chain_existing()
_setup()
