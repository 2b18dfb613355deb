"""How every ampmeter command talks: one error line, escaped text from logs, one number format.

Errors a user can cause (a missing file, invalid JSON, a record breaking the contract, a
mistyped option) are printed as one line on stderr, ``ampmeter <command>: error: <what>``, and
exit with status 2; there is never a traceback or a boxed panel. Text from logs (run ids, stop
reasons, file names) is printed as plain text, never as markup, with control characters and
terminal escape sequences shown escaped (``\\x1b``). Numbers are written one way everywhere:
whole numbers with thousands separators (``1,198,000``), fractions to four significant digits
without an exponent (``0.0123``, ``1,198,000.5``), money with
:func:`ampmeter.report.charts.dollars`, latency in whole milliseconds (``22,436 ms``).
"""

from __future__ import annotations

import contextlib
import decimal
import errno
import math
import os
import re
import warnings
from collections.abc import Iterator
from typing import Final, NoReturn

import typer

__all__ = [
    "fail",
    "missing_module",
    "number",
    "os_error_message",
    "print_error",
    "printable",
    "say",
    "show",
    "terminal_lines",
    "user_errors",
]

# C0 and C1 control characters (ESC starts every terminal escape sequence), DEL, and the
# characters that reorder or break displayed text (bidi overrides, line/paragraph separators).
_UNPRINTABLE: Final = re.compile(
    "[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]"
)


def say(line: str) -> None:
    """Write one line of a command's messages to stderr, as plain text (never markup). Text
    from logs must pass through :func:`printable` first (so that its line breaks are escaped
    too); whatever else reaches the terminal is made safe here by :func:`terminal_lines`."""
    typer.echo(terminal_lines(line), err=True)


def show(text: str) -> None:
    """Write ``text`` to stdout, as :func:`say` writes to stderr."""
    typer.echo(terminal_lines(text))


def printable(text: str) -> str:
    """``text`` with every control character written as an escape (``\\x1b``, ``\\n``).

    The one place where text for a terminal is made safe: log and provider text reaches the
    terminal only through it, so no escape sequence in a log can clear the screen, set the
    window title, write the clipboard or hide a link.
    """
    return _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def terminal_lines(text: str) -> str:
    """``text`` with each of its lines through :func:`printable`: its own line breaks kept,
    every other control character escaped."""
    return "\n".join(printable(line) for line in text.split("\n"))


def print_error(where: str, message: str) -> None:
    """The one error line every ampmeter command prints: ``<where>: error: <message>``."""
    say(f"{where}: error: {printable(message)}")


def fail(command: str, message: str) -> NoReturn:
    """Print the error line of ``ampmeter <command>`` and exit with status 2."""
    print_error(f"ampmeter {command}", message)
    raise typer.Exit(2)


def number(value: float | int | decimal.Decimal | None) -> str:
    """A number as every command shows it: ``1,198,000``, ``1,198,000.5``, ``0.0123``, ``-``.

    Never an exponent: a p95 beside the values it summarises reads in the same digits.
    """
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    exact = decimal.Decimal(value) if isinstance(value, float) else value
    if exact == exact.to_integral_value():
        return f"{int(exact):,}"
    # Four significant digits for a fraction; a large number keeps its whole part.
    digits = max(4 - exact.adjusted() - 1, 1)
    return f"{exact:,.{digits}f}".rstrip("0").rstrip(".")


# What the OS's own texts for these errors mean for a file named on the command line.
_OS_REASONS: Final = {
    errno.ENOENT: "no such file",
    errno.EISDIR: "is a directory, not a file",
    errno.ENOTDIR: "a part of the path is not a directory",
    errno.EACCES: "permission denied",
    errno.EROFS: "read-only file system",
    errno.ENOSPC: "no space left on the device",
}


def os_error_message(exc: OSError) -> str:
    """``<file>: <what>`` for an ``OSError``: ampmeter's own wording when it raised it, a short
    plain reason for the OS's."""
    reason = exc.strerror or str(exc)
    if exc.errno is not None and reason == os.strerror(exc.errno):
        reason = _OS_REASONS.get(exc.errno, reason[:1].lower() + reason[1:])
    return f"{exc.filename}: {reason}" if exc.filename else reason


# The extra that installs each optional module a command may import.
_EXTRA_OF: Final = {
    "numpy": "analysis",
    "duckdb": "analysis",
    "matplotlib": "analysis",
    "jsonschema": "analysis",
    "redis": "redis",
}


def missing_module(exc: ImportError) -> str:
    """What an ``ImportError`` of an optional module means, with the extra that installs it."""
    name = (exc.name or "").partition(".")[0]
    extra = _EXTRA_OF.get(name)
    if extra is None:  # ampmeter's own message, which names the extra already
        return str(exc)
    return f"{name} is not installed: pip install 'ampmeter[{extra}]'"


@contextlib.contextmanager
def user_errors(command: str, *, best_effort_flag: bool = False) -> Iterator[None]:
    """Turn the errors a user can cause (a missing optional module included) into one line on
    stderr and exit status 2; show
    warnings (such as a cut-off last line) as one line each. ``best_effort_flag``: the command
    has ``--best-effort``, and a bad line's error says so."""
    from ampmeter.errors import AnalysisError, JsonlError

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield
        except JsonlError as exc:
            hint = " (--best-effort skips bad lines and counts them)" if best_effort_flag else ""
            fail(command, f"{exc}{hint}")
        except (AnalysisError, ValueError) as exc:
            fail(command, str(exc))
        except OSError as exc:
            fail(command, os_error_message(exc))
        except ImportError as exc:  # an optional module a command needs is not installed
            fail(command, missing_module(exc))
        finally:
            for item in caught:
                message = printable(f"ampmeter {command}: warning: {item.message}")
                say(message)
