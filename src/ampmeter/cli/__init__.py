"""The ``ampmeter`` command line: :mod:`.application` is the app, each command a module of its
own (``run`` and ``watch`` packages of their own), :mod:`.output` how they all talk.

Importing this package imports nothing else: every process of an ``ampmeter run`` imports
:mod:`ampmeter.cli.run.child`, and must not pay for typer. ``app`` and ``main`` load the app
when first asked for.
"""

from ampmeter._lazy import lazy_names

__all__ = ["app", "main"]

__getattr__ = lazy_names(__name__, dict.fromkeys(__all__, "ampmeter.cli.application"))
