"""The ``ampmeter`` command line: :mod:`.application` is the app, each command a module of its
own (``run`` and ``watch`` packages of their own), :mod:`.output` how they all talk.

Importing this package imports nothing else: every process of an ``ampmeter run`` imports
:mod:`ampmeter.cli.run.child`, and must not pay for typer. ``app`` and ``main`` load the app
when first asked for.
"""

from __future__ import annotations

from typing import Any

__all__ = ["app", "main"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from ampmeter.cli import application

        return getattr(application, name)
    raise AttributeError(f"module 'ampmeter.cli' has no attribute {name!r}")
