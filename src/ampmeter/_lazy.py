"""Names a package imports on first use (PEP 562), so that importing it stays cheap.

A package lists where each lazy name lives and sets ``__getattr__ = lazy_names(__name__,
{...})``; the first lookup imports the module and keeps the value on the package, so later
lookups are plain attributes. A name that maps to the module of that same name is the module.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(package: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package`` that finds each name of ``where`` in its
    module (a full dotted name) on first use."""

    def __getattr__(name: str) -> Any:
        module_name = where.get(name)
        if module_name is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(module_name)
        value = module if module_name == f"{package}.{name}" else getattr(module, name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
