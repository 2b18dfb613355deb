"""Loaded by every Python started by ``ampmeter run``: meter this interpreter's LLM calls.

Any ``sitecustomize`` that would have run without ampmeter (found further along ``sys.path``)
is imported first, so a project's own site customisation keeps working.

Start-up stays nearly free: this module imports no part of ampmeter but its post-import hooks.
Metering (``instrument()``, the process's context, ledger and log file) starts when the program
first imports a library whose calls ampmeter meters, or ampmeter itself; a process that imports
none of them cannot make a call to meter. Every process leaves a mark that it joined the run
as it starts (:mod:`ampmeter.cli.run.tree` names the Python processes that left none).
"""

import importlib
import os
import sys
from types import ModuleType

# Importing one of these starts metering (after the outermost of them being imported is complete:
# openai imports httpx, and openai must not be patched half-initialised): every library
# instrument() meters a call through (http.client carries urllib's and requests' calls).
_TRIGGERS = (
    "ampmeter",
    "openai",
    "anthropic",
    "httpx",
    "httpx2",
    "aiohttp",
    "http.client",
    "urllib3",  # imports http.client, and must not be patched half-initialised either
    "websockets",
)
_ENV_CONFIG = "AMPMETER_RUN_CONFIG"  # these four names are ampmeter.cli.run.parent's
_ENV_TREE = "AMPMETER_RUN_TREE"
_ENV_TOP_TAKEN = "AMPMETER_RUN_TOP_TAKEN"
_ENV_PROCESSES = "AMPMETER_RUN_PROCESSES"


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


def _hooks() -> ModuleType:
    """``ampmeter.integrations._hooks``, loaded from its file without importing the package
    (which would import the accounting core); the package finds it in ``sys.modules`` later."""
    name = "ampmeter.integrations._hooks"
    module = sys.modules.get(name)
    if module is None:
        from importlib.machinery import ModuleSpec, SourceFileLoader

        here = os.path.dirname(os.path.abspath(__file__))
        package = os.path.dirname(os.path.dirname(os.path.dirname(here)))  # ampmeter/
        path = os.path.join(package, "integrations", "_hooks.py")
        loader = SourceFileLoader(name, path)
        module = ModuleType(name)
        module.__spec__ = ModuleSpec(name, loader, origin=path)
        module.__file__ = path
        module.__loader__ = loader
        sys.modules[name] = module
        loader.exec_module(module)
    return module


class _Process:
    """This interpreter's part of the run until metering starts."""

    def __init__(self, top: bool, processes: str) -> None:  # (no __future__ import: ms)
        self.top = top  # the run's first Python process: its context is the tree's root
        self.started = False
        self.processes = processes  # the run's directory of marks
        self.joined()

    def start(self, module: ModuleType) -> None:
        # (``module`` itself is still marked initialising while its post-import hooks run.)
        if self.started or any(_initializing(n) for n in _TRIGGERS if n != module.__name__):
            return
        self.started = True
        try:
            from ampmeter.cli.run.child import child_setup

            child_setup(top=self.top)
        except Exception as exc:  # the run must not go on unmetered without saying so
            print(f"ampmeter run: could not set up metering: {exc}", file=sys.stderr)
            raise SystemExit(2) from exc

    def forked(self) -> None:
        self.top = False
        self.joined()

    def joined(self) -> None:
        """Leave a mark that this process joined the run (``ampmeter run`` counts the marks,
        and names the Python processes of its tree that left none)."""
        try:
            with open(os.path.join(self.processes, f"{os.getpid()}-joined"), "w"):
                pass
        except OSError:
            pass  # the run's directory is gone: the parent has stopped waiting


def _initializing(name: str) -> bool:
    module = sys.modules.get(name)
    return module is not None and getattr(module.__spec__, "_initializing", False) is True


def _setup() -> None:
    if _ENV_CONFIG not in os.environ or _ENV_TREE not in os.environ:
        return
    process = _Process(_ENV_TOP_TAKEN not in os.environ, os.environ.get(_ENV_PROCESSES, ""))
    os.environ[_ENV_TOP_TAKEN] = "1"  # the programs this one starts are not the top
    hooks = _hooks()
    for name in _TRIGGERS:
        hooks.when_imported(name, process.start)
    os.register_at_fork(after_in_child=process.forked)


_chain_existing()
_setup()
