"""The ``ampmeter`` command line.

- :mod:`ampmeter.cli.application`: the typer app, its help and error style, its commands;
- :mod:`ampmeter.cli.output`: the error line, escaping of text from logs, the number format;
- :mod:`ampmeter.cli.analysis`: ``summary``, ``amortize``, ``validate``, ``report``;
- :mod:`ampmeter.cli.demo`: ``demo``;
- :mod:`ampmeter.cli.run`: ``run`` (the command, the parent that starts and judges the program,
  the metering of each of its processes, and the ``sitecustomize`` that starts it);
- :mod:`ampmeter.cli.watch`: ``watch`` (the command, the log follower, the state, the view).

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
