"""The command line every benchmark shares.

``--help`` prints the benchmark's own description (its module docstring), and an option it
does not know is an error: a mistyped ``--quik`` must not start a full timed run.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def parser(description: str | None, **flags: str) -> argparse.ArgumentParser:
    """The parser of a benchmark described by ``description``: ``--quick``, and one switch per
    keyword of ``flags`` (``phases="..."`` is ``--phases``, with that help text)."""
    made = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    made.add_argument(
        "--quick", action="store_true", help="fewer rounds: a quick look, not a figure to record"
    )
    for name, text in flags.items():
        made.add_argument(f"--{name.replace('_', '-')}", action="store_true", help=text)
    return made


def parse(
    description: str | None, argv: Sequence[str] | None = None, **flags: str
) -> argparse.Namespace:
    """The options :func:`parser` reads from ``argv`` (None: the command line)."""
    return parser(description, **flags).parse_args(argv)
