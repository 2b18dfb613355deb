"""How every command declares its options and arguments: the help text and the placeholder
(``USD``, ``N``, ``PATH``, ``LOG...``) given where each is named, in one call."""

from __future__ import annotations

from typing import Any

import typer

__all__ = ["argument", "option"]


def option(flags: str, text: str, metavar: str | None = None, **more: Any) -> Any:
    """A typer option named ``flags`` (``"--output"``, or ``"-o --output"``), with help."""
    return typer.Option(*flags.split(), help=text, metavar=metavar, **more)


def argument(text: str, metavar: str, **more: Any) -> Any:
    """A typer argument with help; its placeholder is ``metavar`` (a required one shows no
    default)."""
    return typer.Argument(help=text, metavar=metavar, show_default=False, **more)
