"""The ``ampmeter budget`` command: an operator's handle on a shared ledger, from any process
(``show|pause|resume|raise LEDGER SCOPE [KEY VALUE]``: its help says what each does). The
ledgers load when the command runs.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from decimal import Decimal
from typing import TYPE_CHECKING, Annotated, Literal, Optional

import orjson
import typer

from ampmeter.cli.output import fail, missing_module, printable, show
from ampmeter.cli.params import argument, option

if TYPE_CHECKING:
    from ampmeter.ledgers.base import BudgetView, Ledger

__all__ = ["budget"]


def budget(
    action: Annotated[
        Literal["show", "pause", "resume", "raise"],
        argument("What to do: show, pause, resume or raise a ceiling.", "ACTION"),
    ],
    ledger: Annotated[str, argument("A SQLite ledger file or a `redis://` URL.", "LEDGER")],
    scope: Annotated[str, argument("The budget scope, e.g. team/run-7.", "SCOPE")],
    key: Annotated[
        Optional[str],  # noqa: UP045
        typer.Argument(help="raise: the ceiling's key (amp:cost...).", metavar="[KEY]"),
    ] = None,
    value: Annotated[
        Optional[str],  # noqa: UP045
        typer.Argument(help="raise: its new maximum (dollars for amp:cost).", metavar="[VALUE]"),
    ] = None,
    as_json: Annotated[bool, option("--json", "show: print one JSON object.")] = False,
) -> None:
    """Show, pause, resume or raise a budget scope in a shared ledger (SQLite or Redis).

    ``show`` lists what the scope spent and holds, its ceilings, and the calls paused at their
    context's own cap. A pause holds in every process from its next admission on (calls there
    fail closed); ``raise`` sets a ceiling kept in the ledger, checked as every limit is, and
    lets calls paused on the scope go on.
    """
    if action == "raise" and (key is None or value is None):
        fail(
            "budget", "raise needs KEY and VALUE (ampmeter budget raise LEDGER SCOPE amp:cost 2.50)"
        )
    if action != "raise" and (key is not None or value is not None):
        fail("budget", f"{action} takes no KEY or VALUE")
    from ampmeter.errors import BudgetUnavailable
    from ampmeter.ledgers.reach import open_address

    try:
        # The ledger must exist already: a typo must not create an empty one that nobody uses.
        opened = open_address(ledger, scope, lease_s=None, timeout_s=5.0, create=False)
    except (BudgetUnavailable, ValueError, TypeError) as error:
        fail("budget", str(error))
    except ImportError as error:  # redis:// without the redis extra
        fail("budget", missing_module(error))
    try:
        if action == "show" and not opened.exists(scope):
            fail(
                "budget",
                f"no budget scope {scope!r} in this ledger: nothing was reserved, spent, "
                "limited or paused there or below it (scopes are paths such as team/run-7)",
            )
        if action == "pause":
            opened.pause(scope)
        elif action == "resume":
            opened.resume(scope)
        elif action == "raise":
            assert key is not None and value is not None
            _raise(opened, scope, key, value)
        _print(opened.show(scope), as_json)
    except (BudgetUnavailable, ValueError, TypeError) as error:
        fail("budget", str(error))
    finally:
        opened.close()


def _raise(opened: Ledger, scope: str, key: str, value: str) -> None:
    """Set the ceiling (checked as every limit's maximum is) and say when it is below what the
    scope has spent already."""
    opened.set_ceiling(scope, key, _number(key, value))
    ceiling = opened.ceilings(scope)[key]
    spent = opened.spent(scope).get(key, 0)
    if spent > ceiling:
        typer.echo(
            f"ampmeter budget: note: the new ceiling {key} {_amount(ceiling)} is below what "
            f"{scope!r} has spent ({_amount(spent)}): every call there is refused until it is "
            "raised above that",
            err=True,
        )


def _number(key: str, value: str) -> Decimal | int | float:
    """VALUE as the number it reads as (dollars, exactly, for money keys); the ledger checks
    it as every limit's maximum is checked."""
    from ampmeter.keys import is_money
    from ampmeter.money import usd

    what = f"new maximum for {key!r}"
    if is_money(key):
        return usd(value, what, allow_negative=True)  # refused below, as everywhere
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            continue
    raise ValueError(f"{what} must be a number, got {value!r}")


def _amount(amount: Decimal | int) -> str:
    """Dollars for a money key's amount (a Decimal), the count itself for the others."""
    from ampmeter.money import format_usd

    return format_usd(amount) if isinstance(amount, Decimal) else str(amount)


def _print(view: BudgetView, as_json: bool) -> None:
    if as_json:
        data = {
            "scope": view.scope,
            "paused": view.paused,
            "paused_by": view.paused_by,
            **{
                name: {key: str(amount) for key, amount in getattr(view, name).items()}
                for name in ("spent", "reserved", "unsettled", "ceilings")
            },
            "paused_calls": [
                {
                    "key": call.key,
                    "cap": str(call.cap),
                    "context": call.context,
                    "since": call.since,
                }
                for call in view.paused_calls
            ],
        }
        sys.stdout.write(orjson.dumps(data).decode() + "\n")
        return

    def amounts(found: Mapping[str, Decimal | int]) -> str:
        shown = [printable(f"{key} {_amount(amount)}") for key, amount in sorted(found.items())]
        return ", ".join(shown) or "-"

    calls = view.paused_calls
    if view.paused_by is not None:
        paused = f"yes (paused at {view.paused_by})"
    elif calls:
        waits = "1 call waits" if len(calls) == 1 else f"{len(calls)} calls wait"
        paused = f"yes ({waits} at its context's own cap: ampmeter budget raise lets it go on)"
    else:
        paused = "no"
    # A ledger is written by other processes (and Redis by anyone): its text is escaped.
    show(f"scope      {printable(view.scope)}")
    show(f"paused     {printable(paused)}")
    now = time.time()
    for call in calls:
        cap = amounts({call.key: call.cap})
        since = max(now - call.since, 0.0)
        show(printable(f"waiting    {cap} (cap of context {call.context!r}, paused {since:.0f}s)"))
    for name in ("ceilings", "spent", "unsettled", "reserved"):
        show(f"{name:<10} {amounts(getattr(view, name))}")
