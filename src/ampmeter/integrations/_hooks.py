"""Post-import hooks: run a callback when a module is imported (at once if it already is).

``instrument()`` uses them so that a program pays nothing for an SDK it never imports: the
patch is applied right after the SDK's own module has run. A finder on ``sys.meta_path`` sees
the import of a watched name, lets the normal finders find it, and wraps that spec's loader's
``exec_module`` so the callbacks run once the module is complete.
"""

from __future__ import annotations

import _thread
import sys
import warnings

# Loaded at the start of every process of an ``ampmeter run`` (see ampmeter/cli/run/_bootstrap),
# so it imports nothing that Python has not loaded already: not typing, not threading.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Any

    Callback = Callable[[ModuleType], object]

__all__ = ["cancel_all", "when_imported"]

_lock = _thread.RLock()
_waiting: dict[str, list[Callback]] = {}
_finding: set[str] = set()  # names whose spec is being looked up (do not recurse)


class _PostImportFinder:
    """A ``sys.meta_path`` finder that finds nothing itself; it arranges for the callbacks of a
    watched module to run. (Not an ``importlib.abc`` subclass: importing that costs more than
    the rest of instrument().)"""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname not in _waiting or fullname in _finding:
            return None
        import importlib.util

        with _lock:
            _finding.add(fullname)
            try:
                spec = importlib.util.find_spec(fullname)
            finally:
                _finding.discard(fullname)
        loader: Any = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return None
        original = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            original(module)
            _run(fullname, module)

        loader.exec_module = exec_module
        return spec


_FINDER = _PostImportFinder()


def _run(name: str, module: ModuleType) -> None:
    with _lock:
        callbacks = _waiting.pop(name, [])
        if not _waiting and _FINDER in sys.meta_path:
            sys.meta_path.remove(_FINDER)
    for callback in callbacks:
        try:
            callback(module)
        except Exception as error:  # a failed patch must not fail the program's own import
            warnings.warn(f"ampmeter could not instrument {name}: {error!r}", stacklevel=2)


def when_imported(name: str, callback: Callback) -> None:
    """Call ``callback(module)`` once ``name`` is imported: now if it already is."""
    with _lock:
        module = sys.modules.get(name)
        if module is None:
            _waiting.setdefault(name, []).append(callback)
            if _FINDER not in sys.meta_path:
                sys.meta_path.insert(0, _FINDER)
            return
    callback(module)


def cancel_all() -> None:
    """Forget every callback still waiting for its module."""
    with _lock:
        _waiting.clear()
        if _FINDER in sys.meta_path:
            sys.meta_path.remove(_FINDER)
