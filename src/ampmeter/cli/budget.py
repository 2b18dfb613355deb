"""The ``ampmeter budget`` command: an operator's handle on a shared ledger, from any process.

``ampmeter budget show|pause|resume|raise LEDGER SCOPE [KEY VALUE]``: LEDGER is a SQLite file
or a ``redis://`` (``rediss://``, ``unix://``) URL. ``pause`` stops every process from admitting
anything more at SCOPE and below it, from its next admission on; ``resume`` lifts it; ``raise``
sets the ceiling KEY of SCOPE to VALUE (dollars for ``amp:cost`` keys, a whole number else),
higher or lower. Added to the app by :func:`register`; the ledgers load when the command runs.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from decimal import Decimal
from typing import TYPE_CHECKING, Annotated, NoReturn, Optional

import orjson
import typer

from ampmeter.cli.output import fail, missing_module, printable, show

if TYPE_CHECKING:
    from ampmeter.ledgers.base import BudgetView, Ledger

__all__ = ["budget", "register"]

_ACTIONS = ("show", "pause", "resume", "raise")
_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def register(app: typer.Typer) -> None:
    """Add ``ampmeter budget`` to ``app``."""
    app.command("budget")(budget)


def budget(
    action: Annotated[
        str, typer.Argument(help="show, pause, resume or raise.", show_default=False)
    ],
    ledger: Annotated[
        str, typer.Argument(help="A SQLite ledger file or a redis:// URL.", show_default=False)
    ],
    scope: Annotated[str, typer.Argument(help="The budget scope, e.g. team/run-7.")],
    key: Annotated[
        Optional[str], typer.Argument(help="raise: the ceiling's key (amp:cost...).")  # noqa: UP045
    ] = None,
    value: Annotated[
        Optional[str], typer.Argument(help="raise: its new maximum (dollars for amp:cost).")  # noqa: UP045
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="show: print one JSON object.")] = False,
) -> None:
    """Show, pause, resume or raise a budget scope in a shared ledger (SQLite or Redis).

    A pause holds in every process from its next admission on (calls there fail closed);
    ``raise`` sets a ceiling kept in the ledger.
    """
    if action not in _ACTIONS:
        _fail(f"unknown action {action!r}: use one of {', '.join(_ACTIONS)}")
    if action == "raise" and (key is None or value is None):
        _fail("raise needs KEY and VALUE (ampmeter budget raise LEDGER SCOPE amp:cost 2.50)")
    if action != "raise" and (key is not None or value is not None):
        _fail(f"{action} takes no KEY or VALUE")
    from ampmeter.errors import BudgetUnavailable

    try:
        opened = _open(ledger, scope)
    except (BudgetUnavailable, ValueError, TypeError) as error:
        _fail(str(error))
    except ImportError as error:  # redis:// without the redis extra
        _fail(missing_module(error))
    try:
        if action == "pause":
            opened.pause(scope)
        elif action == "resume":
            opened.resume(scope)
        elif action == "raise":
            assert key is not None and value is not None
            opened.set_ceiling(scope, key, _ceiling(key, value))
        _print(opened.show(scope), as_json)
    except (BudgetUnavailable, ValueError, TypeError) as error:
        _fail(str(error))
    finally:
        opened.close()


def _open(where: str, scope: str) -> Ledger:
    """The ledger at ``where``, bound to ``scope``'s tree; a SQLite file must exist already
    (a typo must not create an empty ledger that nobody uses)."""
    if where.startswith(_REDIS_SCHEMES):
        from ampmeter.ledgers.redis import RedisLedger

        return RedisLedger(where, scope, lease_s=None, timeout_s=5.0)
    if not os.path.isfile(where):
        raise ValueError(f"no ledger file at {where!r} (give a SQLite ledger or a redis:// URL)")
    from ampmeter.ledgers.sqlite import SqliteLedger

    return SqliteLedger(where, scope, lease_s=None)


def _ceiling(key: str, value: str) -> str | int:
    from ampmeter.keys import is_money

    if is_money(key):
        return value  # dollars as written
    try:
        return int(value)
    except ValueError:
        message = f"{key} counts whole things: VALUE must be a whole number, got {value!r}"
        raise ValueError(message) from None


def _print(view: BudgetView, as_json: bool) -> None:
    from ampmeter.money import format_usd

    if as_json:
        data = {
            "scope": view.scope,
            "paused": view.paused,
            "paused_by": view.paused_by,
            **{
                name: {key: str(amount) for key, amount in getattr(view, name).items()}
                for name in ("spent", "reserved", "unsettled", "ceilings")
            },
        }
        sys.stdout.write(orjson.dumps(data).decode() + "\n")
        return

    def amounts(found: Mapping[str, Decimal | int]) -> str:
        shown = [
            printable(f"{key} {format_usd(amount) if isinstance(amount, Decimal) else amount}")
            for key, amount in sorted(found.items())
        ]
        return ", ".join(shown) or "-"

    paused = "no" if view.paused_by is None else f"yes (paused at {view.paused_by})"
    # A ledger is written by other processes (and Redis by anyone): its text is escaped.
    show(f"scope      {printable(view.scope)}")
    show(f"paused     {printable(paused)}")
    for name in ("ceilings", "spent", "unsettled", "reserved"):
        show(f"{name:<10} {amounts(getattr(view, name))}")


def _fail(message: str) -> NoReturn:
    fail("budget", message)
