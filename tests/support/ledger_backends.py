"""The ``make_ledger`` fixture: fresh ledgers of each backend (memory, SQLite, a real Redis), and
``reserve``: a reserve that answers None when refused."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from ampmeter.ledgers import InMemoryLedger, Ledger, RedisLedger, Reservation, SqliteLedger
from support.redis_server import RedisServer

__all__ = ["MakeLedger", "make_ledger_fixture", "reserve"]

MakeLedger = Callable[..., Ledger]


def reserve(
    ledger: Ledger, amounts: Mapping[str, Any], ceilings: Mapping[str, Any], **options: Any
) -> Reservation | None:
    """``ledger.try_reserve(...)`` with a refusal as None: what most ledger tests ask."""
    held = ledger.try_reserve(amounts, ceilings, **options)
    return held if isinstance(held, Reservation) else None


@pytest.fixture(params=["memory", "sqlite", "redis"], name="make_ledger")
def make_ledger_fixture(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MakeLedger]:
    """A factory of fresh ledgers (each with its own scope) of one backend; keyword arguments
    go to the ledger's constructor."""
    made: list[Ledger] = []

    def make(lease_s: float | None = None, **options: Any) -> Ledger:
        scope = f"test-{uuid.uuid4().hex}"
        ledger: Ledger
        if request.param == "memory":
            ledger = InMemoryLedger(scope, lease_s=lease_s, **options)
        elif request.param == "sqlite":
            ledger = SqliteLedger(
                tmp_path / "ledger.db",
                scope,
                lease_s=lease_s,
                journal=tmp_path / "journal",
                **options,
            )
        else:
            server: RedisServer = request.getfixturevalue("redis_server")
            ledger = RedisLedger(
                server.url,
                scope,
                lease_s=lease_s,
                timeout_s=5.0,
                journal=tmp_path / "journal",
                **options,
            )
        made.append(ledger)
        return ledger

    yield make
    for ledger in made:
        ledger.close()
