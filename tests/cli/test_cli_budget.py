"""``ampmeter budget show|pause|resume|raise`` end to end, as a subprocess, on a real SQLite file
and a real Redis: what the command does is seen by the ledgers of this (another) process."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from ampmeter.ledgers import Ledger, RedisLedger, Refusal, SqliteLedger
from support.redis_server import RedisServer, redis_server_fixture  # noqa: F401

COST = "amp:cost"


def budget(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ampmeter", "budget", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def show(where: str, scope: str) -> dict[str, Any]:
    done = budget("show", where, scope, "--json")
    assert done.returncode == 0, done.stderr
    found: dict[str, Any] = json.loads(done.stdout)
    return found


@pytest.fixture(params=["sqlite", "redis"])
def shared(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Ledger]]:
    """A ledger's LEDGER argument and the ledger itself, at a fresh root scope."""
    root = f"team-{uuid.uuid4().hex[:8]}"
    ledger: Ledger
    if request.param == "sqlite":
        where = str(tmp_path / "budget.sqlite3")
        ledger = SqliteLedger(where, root)
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        where = server.url
        ledger = RedisLedger(where, root)
    yield where, ledger
    ledger.close()


def test_show_pause_resume_and_raise_reach_every_process(shared: tuple[str, Ledger]) -> None:
    where, ledger = shared
    run = ledger.child("run")
    worker = run.child("worker")
    ledger.set_ceilings(run.scope, {COST: 0.10})
    held = worker.reserve({COST: 0.06}, {})
    assert held is not None
    worker.commit(held, {COST: 0.06})

    seen = show(where, run.scope)
    assert seen == {
        "scope": run.scope,
        "paused": False,
        "paused_by": None,
        "spent": {COST: "0.06"},
        "reserved": {},
        "unsettled": {},
        "ceilings": {COST: "0.1"},
    }
    text = budget("show", where, run.scope)
    assert (
        text.returncode == 0 and "amp:cost $0.06" in text.stdout and "paused     no" in text.stdout
    )

    done = budget("pause", where, run.scope)
    assert done.returncode == 0, done.stderr
    assert "paused     yes" in done.stdout
    refusal = worker.try_reserve({COST: 0.01}, {})
    assert isinstance(refusal, Refusal) and refusal.paused and refusal.scope == run.scope
    assert show(where, worker.scope)["paused_by"] == run.scope

    assert budget("resume", where, run.scope).returncode == 0
    assert worker.reserve({COST: 0.06}, {}) is None  # over the kept $0.10
    done = budget("raise", where, run.scope, COST, "0.50")
    assert done.returncode == 0, done.stderr
    assert run.ceilings() == {COST: Decimal("0.5")}
    assert worker.reserve({COST: 0.06}, {}) is not None
    assert show(where, run.scope)["reserved"] == {COST: "0.06"}


def test_mistakes_are_one_line_errors_and_create_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "typo.sqlite3"
    done = budget("pause", str(missing), "team")
    assert done.returncode == 2
    assert done.stderr.startswith("ampmeter budget: error: no ledger file") and not missing.exists()
    path = tmp_path / "budget.sqlite3"
    SqliteLedger(path, "team").close()
    for args, message in [
        (("stop", str(path), "team"), "'stop' is not one of 'show', 'pause', 'resume', 'raise'"),
        (("raise", str(path), "team", COST), "raise needs KEY and VALUE"),
        (("raise", str(path), "team", COST, "lots"), "amp:cost"),
        (("raise", str(path), "team", "amp:llm_calls", "2.5"), "whole number"),
        (("pause", str(path), "team", COST), "pause takes no KEY or VALUE"),
        (("show", str(path), "a//b"), "scope"),
    ]:
        done = budget(*args)
        assert done.returncode == 2, (args, done.stdout)
        assert done.stderr.count("\n") == 1 and message in done.stderr, done.stderr
    assert show(str(path), "team")["ceilings"] == {}
