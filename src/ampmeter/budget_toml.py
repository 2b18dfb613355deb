"""Budget files: TOML read once, every mistake one :class:`BudgetFileError` naming the file, the
table and the key (the proxy's callers and ``ampmeter run``'s controls are read so)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from ampmeter.errors import AmpmeterError

__all__ = ["BudgetFileError", "read_toml", "refuse_unknown", "table_of"]


class BudgetFileError(AmpmeterError, ValueError):
    """The budget file cannot be used as written (the message names the file and the key)."""


def read_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The TOML document at ``path``; a file that cannot be read or parsed is a
    :class:`BudgetFileError` (a syntax error names its line and column)."""
    where = os.fspath(path)
    if sys.version_info >= (3, 11):
        import tomllib as toml
    else:
        try:
            import tomli as toml
        except ImportError:
            raise BudgetFileError(
                f"reading the budget file {where} needs tomli on Python 3.10: pip install tomli"
            ) from None
    try:
        with open(where, "rb") as handle:
            data: dict[str, Any] = toml.load(handle)
            return data
    except OSError as exc:
        raise BudgetFileError(f"cannot read the budget file {where}: {exc.strerror}") from None
    except ValueError as exc:  # TOMLDecodeError: its message says where, "(at line 3, column 9)"
        raise BudgetFileError(f"{where} is not valid TOML: {exc}") from None


def refuse_unknown(table: Mapping[str, Any], known: Iterable[str], label: str) -> None:
    """A :class:`BudgetFileError` for the first key of ``table`` not in ``known`` (a typo must
    not pass as a budget that is not there); ``label`` names the file and table."""
    allowed = set(known)
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise BudgetFileError(
            f"{label} has no key {unknown[0]!r} (its keys: {', '.join(sorted(allowed))})"
        )


def table_of(data: Mapping[str, Any], name: str, label: str) -> dict[str, Any]:
    """The table ``name`` of ``data`` (empty when absent)."""
    found = data.get(name, {})
    if not isinstance(found, dict):
        raise BudgetFileError(f"{label}: [{name}] must be a table")
    return found
