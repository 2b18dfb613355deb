"""``ampmeter budget show|pause|resume|raise`` end to end, as a subprocess, on a real SQLite file
and a real Redis: what the command does is seen by the ledgers of this (another) process."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pytest

from ampmeter.ledgers import Ledger, RedisLedger, Refusal, SqliteLedger
from support.ledger_backends import reserve
from support.redis_server import RedisServer, redis_server_fixture  # noqa: F401

COST = "amp:cost"


def budget(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ampmeter", "budget", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def invoke(*args: str) -> Any:
    """``ampmeter budget ...`` run in this process (the same command, without a start-up)."""
    from typer.testing import CliRunner

    from ampmeter.cli import app

    return CliRunner().invoke(app, ["budget", *args])


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
    held = reserve(worker, {COST: 0.06}, {})
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
        "paused_calls": [],
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
    assert reserve(worker, {COST: 0.06}, {}) is None  # over the kept $0.10
    done = budget("raise", where, run.scope, COST, "0.50")
    assert done.returncode == 0, done.stderr
    assert run.ceilings() == {COST: Decimal("0.5")}
    assert reserve(worker, {COST: 0.06}, {}) is not None
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
    with SqliteLedger(path, "team") as ledger:
        assert ledger.ceilings() == {} and not ledger.exists()


def forged_token(token: str, key: bytes, change: Any) -> str:
    """``token`` with its body changed by ``change`` and signed again with ``key``."""
    import base64
    import hashlib
    import hmac

    import orjson

    body = token[len("amp2.") :].partition(".")[0]
    data = orjson.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    change(data)
    forged = base64.urlsafe_b64encode(orjson.dumps(data)).rstrip(b"=").decode()
    signature = hmac.new(key, forged.encode(), hashlib.sha256).digest()
    return f"amp2.{forged}.{base64.urlsafe_b64encode(signature).rstrip(b'=').decode()}"


def test_a_limit_value_is_refused_alike_wherever_it_is_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ampmeter import ExecutionContext, HandoffError, Limit
    from ampmeter.propagation import decode

    path = tmp_path / "budget.sqlite3"
    monkeypatch.setenv("AMPMETER_HANDOFF_KEY", "k")
    monkeypatch.setenv("AMPMETER_LEDGER_ALLOW", str(path))
    with SqliteLedger(path, "team") as ledger:
        with ExecutionContext(max_cost_usd=1.0, max_steps=5, ledger=ledger) as ctx:
            token = ctx.handoff("child")
            for key, value, number, refusal in [
                ("amp:steps", "-3", -3, "must be >= 0, got -3"),
                ("amp:steps", "1.5", 1.5, "must be a whole number, got 1.5"),
                (COST, "1e400", Decimal("1e400"), "is too large to count"),
                (COST, "-0.5", Decimal("-0.5"), "must be >= 0"),
                ("amp:bogus", "3", 3, "'amp:bogus' is not a key ampmeter counts"),
            ]:
                # the operator's command and the API say the same, word for word
                done = invoke("raise", str(path), "team", key, "--", value)
                assert done.exit_code == 2, (key, value, done.stdout)
                with pytest.raises((ValueError, TypeError)) as api:
                    ctx.raise_limit(key, number)
                assert done.stderr == f"ampmeter budget: error: {api.value}\n"
                assert refusal in str(api.value)
                with pytest.raises((ValueError, TypeError), match=re.escape(refusal)):
                    ledger.set_ceiling("team", key, number)
                # a context's own limits, and a hand-off token carrying one, refuse it too
                with pytest.raises((ValueError, TypeError), match=re.escape(refusal)):
                    ExecutionContext(limits=[Limit(key, number)])
                written = value if key == COST else number
                bad = forged_token(
                    token,
                    b"k",
                    lambda data, k=key, v=written: data["limits"].append([k, v, "exact"]),
                )
                with pytest.raises(HandoffError, match=re.escape(refusal)):
                    decode(bad)
            assert [lim.max_value for lim in ctx.limits] == [1, 5]  # nothing changed
        assert ledger.ceilings() == {"amp:steps": 5, COST: 1}  # the hand-off's, kept
    with pytest.raises(ValueError, match=r"max_steps must be a whole number, got 1\.5"):
        ExecutionContext(max_steps=1.5)


def test_raise_says_when_the_new_ceiling_is_below_what_is_spent(
    shared: tuple[str, Ledger],
) -> None:
    where, ledger = shared
    held = reserve(ledger, {COST: 0.06}, {})
    assert held is not None
    ledger.commit(held, {COST: 0.06})
    done = budget("raise", where, ledger.scope, COST, "0.05")
    assert done.returncode == 0, done.stderr
    assert done.stderr == (
        f"ampmeter budget: note: the new ceiling amp:cost $0.05 is below what "
        f"'{ledger.scope}' has spent ($0.06): every call there is refused until it is raised "
        "above that\n"
    )
    assert ledger.ceilings() == {COST: Decimal("0.05")}
    quiet = invoke("raise", where, ledger.scope, COST, "0.50")
    assert quiet.exit_code == 0 and quiet.stderr == ""


def test_show_says_when_a_scope_does_not_exist(shared: tuple[str, Ledger]) -> None:
    where, ledger = shared
    worker = ledger.child("run").child("worker")
    held = reserve(worker, {COST: 0.01}, {})
    assert held is not None
    missing = budget("show", where, ledger.scope + "/rnu")
    assert missing.returncode == 2
    assert missing.stderr == (
        f"ampmeter budget: error: no budget scope '{ledger.scope}/rnu' in this ledger: nothing "
        "was reserved, spent, limited or paused there or below it (scopes are paths such as "
        "team/run-7)\n"
    )
    # a scope that only holds scopes below it exists, and so does one with only a ceiling
    for scope in (ledger.scope, ledger.scope + "/run"):
        assert invoke("show", where, scope).exit_code == 0
    assert invoke("show", where, worker.scope + "/x").exit_code == 2
    ledger.set_ceiling(worker.scope + "/x", COST, "0.5")
    assert invoke("show", where, worker.scope + "/x").exit_code == 0


def test_show_lists_a_call_paused_at_its_own_cap(shared: tuple[str, Ledger]) -> None:
    import threading
    import time

    from ampmeter import ExecutionContext

    where, ledger = shared
    ctx = ExecutionContext(
        "nightly", max_cost_usd=0.10, ledger=ledger, on_exhausted="pause", pause_timeout_s=30
    )
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with ctx:
                for name in ("first", "second"):
                    with ctx.llm_call(name, estimate_usd=0.06) as call:
                        call.record(cost_usd=0.06)
        except BaseException as error:
            errors.append(error)

    worker = threading.Thread(target=run)
    worker.start()
    deadline = time.monotonic() + 20
    while not ledger.paused_calls() and time.monotonic() < deadline:
        time.sleep(0.05)
    text = budget("show", where, ledger.scope)  # another process sees it
    assert text.returncode == 0, text.stderr
    assert "paused     yes (1 call waits at its context's own cap" in text.stdout
    assert "waiting    amp:cost $0.10 (cap of context 'nightly', paused " in text.stdout
    data = orjson.loads(invoke("show", where, ledger.scope, "--json").stdout)
    (paused,) = data["paused_calls"]
    assert (paused["key"], paused["cap"], paused["context"]) == (COST, "0.1", "nightly")
    assert invoke("raise", where, ledger.scope, COST, "0.20").exit_code == 0
    worker.join(20)
    assert not worker.is_alive() and errors == []
    assert ledger.paused_calls() == ()
    after = invoke("show", where, ledger.scope)
    assert "paused     no" in after.stdout and "waiting" not in after.stdout
    assert ledger.spent()[COST] == Decimal("0.12")
