"""The ``ampmeter`` console script and ``python -m ampmeter``.

Every command lives in :mod:`ampmeter.cli`, which needs the ``cli`` extra (typer, rich). Without
it, one line says what to install instead of a traceback.
"""

from __future__ import annotations

import importlib.util
import sys


def main(argv: list[str] | None = None) -> None:
    """Run the command line, or exit with status 2 and one line when the CLI extra is missing."""
    missing = [name for name in ("typer", "rich") if importlib.util.find_spec(name) is None]
    if missing:
        hint = "pip install 'ampmeter[cli]'"
        sys.stderr.write(f"ampmeter: the command line needs {' and '.join(missing)}: {hint}\n")
        raise SystemExit(2)
    from ampmeter.cli.application import main as cli_main

    cli_main(argv)
