"""The ``ampmeter budget`` command: an operator's handle on a shared ledger, from any process.

``ampmeter budget show|pause|resume|raise LEDGER SCOPE [KEY VALUE]``: LEDGER is a SQLite file
or a ``redis://`` (``rediss://``, ``unix://``) URL. ``pause`` stops every process from admitting
anything more at SCOPE and below it, from its next admission on; ``resume`` lifts it; ``raise``
sets the ceiling KEY of SCOPE to VALUE (dollars for ``amp:cost`` keys, a whole number else),
higher or lower. Added to the app by :func:`register`; the ledgers load when the command runs.
"""

from __future__ import annotations

import enum
import os
import sys
from collections.abc import Mapping
from decimal import Decimal
from typing import TYPE_CHECKING, Annotated, NoReturn, Optional

import orjson
import typer

if TYPE_CHECKING:
    from ampmeter.ledgers.base import BudgetView, Ledger

__all__ = ["budget", "register"]

_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def register(app: typer.Typer) -> None:
    """Add ``ampmeter budget`` to ``app``."""
    app.command("budget")(budget)


class Action(str, enum.Enum):
    """What ``ampmeter budget`` does to a scope."""

    show = "show"
    pause = "pause"
    resume = "resume"
    raise_ = "raise"


def budget(
    action: Annotated[
        Action,
        typer.Argument(
            help="What to do: show, pause, resume or raise a ceiling.",
            show_default=False,
            metavar="ACTION",
        ),
    ],
    ledger: Annotated[
        str,
        typer.Argument(
            help="A SQLite ledger file or a `redis://` URL.", show_default=False, metavar="LEDGER"
        ),
    ],
    scope: Annotated[
        str, typer.Argument(help="The budget scope, e.g. team/run-7.", metavar="SCOPE")
    ],
    key: Annotated[
        Optional[str],  # noqa: UP045
        typer.Argument(help="raise: the ceiling's key (amp:cost...).", metavar="[KEY]"),
    ] = None,
    value: Annotated[
        Optional[str],  # noqa: UP045
        typer.Argument(help="raise: its new maximum (dollars for amp:cost).", metavar="[VALUE]"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="show: print one JSON object.")] = False,
) -> None:
    """Show, pause, resume or raise a budget scope in a shared ledger (SQLite or Redis).

    A pause holds in every process from its next admission on (calls there fail closed);
    ``raise`` sets a ceiling kept in the ledger.
    """
    if action == "raise" and (key is None or value is None):
        _fail("raise needs KEY and VALUE (ampmeter budget raise LEDGER SCOPE amp:cost 2.50)")
    if action != "raise" and (key is not None or value is not None):
        _fail(f"{action} takes no KEY or VALUE")
    from ampmeter.errors import BudgetUnavailable

    try:
        opened = _open(ledger, scope)
    except (BudgetUnavailable, ValueError, TypeError) as error:
        _fail(str(error))
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
            f"{key} {format_usd(amount) if isinstance(amount, Decimal) else amount}"
            for key, amount in sorted(found.items())
        ]
        return ", ".join(shown) or "-"

    paused = "no" if view.paused_by is None else f"yes (paused at {view.paused_by})"
    typer.echo(f"scope      {view.scope}")
    typer.echo(f"paused     {paused}")
    for name in ("ceilings", "spent", "unsettled", "reserved"):
        typer.echo(f"{name:<10} {amounts(getattr(view, name))}")


def _fail(message: str) -> NoReturn:
    typer.echo(f"ampmeter budget: error: {message}", err=True)
    raise typer.Exit(2)
