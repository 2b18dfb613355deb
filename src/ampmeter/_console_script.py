"""The ``ampmeter`` console script and ``python -m ampmeter``.

Every command lives in :mod:`ampmeter.cli`, which needs the ``cli`` extra (typer, rich). Without
it, one line says what to install instead of a traceback.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Final

CLI_EXTRA_HINT: Final = "pip install 'ampmeter[cli]'"
_CLI_MODULES: Final = ("typer", "rich")


def missing_cli_modules() -> list[str]:
    """The modules of the ``cli`` extra that are not installed."""
    return [name for name in _CLI_MODULES if importlib.util.find_spec(name) is None]


def main(argv: list[str] | None = None) -> None:
    """Run the command line, or exit with status 2 and one line when the CLI extra is missing."""
    missing = missing_cli_modules()
    if missing:
        sys.stderr.write(
            f"ampmeter: the command line needs {' and '.join(missing)}: {CLI_EXTRA_HINT}\n"
        )
        raise SystemExit(2)
    from ampmeter.cli.application import main as cli_main

    cli_main(argv)
