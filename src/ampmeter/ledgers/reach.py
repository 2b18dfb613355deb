"""How another process reaches a ledger: each shared ledger's one declaration, kept in one table.

Hand-off tokens (:mod:`ampmeter.propagation`) and the command line find ledgers only through
this table, so a new ledger is its module and one :func:`register` call; nothing outside
:mod:`ampmeter.ledgers` names a backend. A *location* (:meth:`~ampmeter.ledgers.Ledger.location`)
is the declaration's ``describe`` of a ledger plus ``"backend"``, its name. It never holds a
secret (a token carries it); ``"credentials": True`` in it says that another process must bring
its own ledger.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ampmeter.ledgers.base import Ledger

__all__ = [
    "Location",
    "Reach",
    "at_address",
    "location_of",
    "open_address",
    "reach_of",
    "register",
    "settings",
]

Location = Mapping[str, Any]
"""Where a ledger is, as :meth:`~ampmeter.ledgers.Ledger.location` describes it."""

# The modules that declare the built-in shared ledgers, loaded when a location or an address names
# a ledger not registered yet: the Redis one needs the optional redis package, so a process that
# never names it never imports it.
_BUILT_IN = ("ampmeter.ledgers.sqlite", "ampmeter.ledgers.redis")


@dataclass(frozen=True, slots=True, kw_only=True)
class Reach:
    """How a ledger class is reached from another process.

    ``name`` is written in its locations as ``"backend"``. ``describe(ledger)`` says where a
    ledger of ``kind`` is, without secrets; ``reopen(location, scope)`` opens that ledger again
    at ``scope`` in this process. ``place(location)`` is a text naming the store (the same for
    every location of one store, another for another store): a receiving process opens a token's
    ledger only when its place is the one it configured. ``address(text)`` reads an address a
    person writes (``AMPMETER_LEDGER_ALLOW``, ``ampmeter budget``) as a location, or None when
    the text is not one of this ledger's.
    """

    name: str
    kind: type[Ledger]
    describe: Callable[[Any], dict[str, object]]
    reopen: Callable[[Location, str], Ledger]
    place: Callable[[Location], str]
    address: Callable[[str], dict[str, object] | None]


_reaches: dict[str, Reach] = {}


def register(reach: Reach) -> None:
    """Make ``reach`` the way to ``reach.kind`` ledgers (and to locations naming
    ``reach.name``) in this process. Registering a name again replaces its declaration."""
    if not isinstance(reach, Reach):
        raise TypeError(f"register() takes a Reach, got {type(reach).__name__}")
    if not reach.name.isidentifier():
        raise ValueError(f"a ledger's name must be a plain word, got {reach.name!r}")
    _reaches[reach.name] = reach


def reach_of(ledger: Ledger) -> Reach:
    """The declaration of ``ledger``'s class (or of the nearest class it extends), or
    ``TypeError`` for a ledger no other process can reach."""
    for kind in type(ledger).__mro__:
        for reach in _reaches.values():
            if reach.kind is kind:
                return reach
    raise TypeError(
        f"{type(ledger).__name__} lives in this process and cannot be shared with another; "
        f"use a ledger another process can reach ({_known()})"
    )


def location_of(location: Location) -> tuple[Reach, str]:
    """The declaration a location names and the place it names, or ``ValueError``."""
    name = location.get("backend")
    if not isinstance(name, str):
        raise ValueError(f"a ledger's location names its backend, got {name!r}")
    if name not in _reaches:
        _load_built_in()
    reach = _reaches.get(name)
    if reach is None:
        raise ValueError(f"the ledger {name!r} is not one this process can open ({_known()})")
    try:
        return reach, reach.place(location)
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"the location of a {name} ledger is damaged: {error!r}") from None


def settings(location: Location, *names: str) -> dict[str, Any]:
    """The ``names`` a location gives (a ledger's constructor takes them as keywords); those it
    leaves out keep the constructor's defaults."""
    return {name: location[name] for name in names if name in location}


def open_address(address: str, scope: str, **options: Any) -> Ledger:
    """The ledger at ``address`` (a path, a URL: see :func:`at_address`) on ``scope``, opened
    with ``options`` (``lease_s``, ``timeout_s``; ``create=False``: a store that is not there
    yet is an error, not made)."""
    reach, location = at_address(address)
    return reach.reopen({**location, **options}, scope)


def at_address(address: str) -> tuple[Reach, dict[str, object]]:
    """The declaration whose ledgers ``address`` (a path, a URL) names, and its location."""
    for _ in range(2):  # then again with every built-in ledger loaded
        for reach in reversed(_reaches.values()):  # the latest first: it may narrow another
            found = reach.address(address)
            if found is not None:
                return reach, {"backend": reach.name, **found}
        _load_built_in()
    raise ValueError(
        f"{address!r} is not the address of a ledger this process can open ({_known()})"
    )


def _load_built_in() -> None:
    for module in _BUILT_IN:
        importlib.import_module(module)  # each registers its Reach (once: modules are cached)


def _known() -> str:
    return "known: " + ", ".join(sorted(_reaches))
