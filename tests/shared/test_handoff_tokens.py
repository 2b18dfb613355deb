"""Hand-off tokens cannot be forged: signed with HMAC-SHA256, and a receiving process opens
only a ledger it configured. Forged tokens come through ``propagation.extract(headers)``; the
tests check that no file was created and that no connection was made."""

from __future__ import annotations

import base64
import hashlib
import hmac
import socket
import threading
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pytest

from ampmeter import ExecutionContext, LimitExceeded, propagation
from ampmeter.errors import HandoffError
from ampmeter.ledgers import RedisLedger, SqliteLedger
from support.redis_server import RedisServer, redis_server_fixture  # noqa: F401

KEY = "test-handoff-key"


@pytest.fixture(autouse=True)
def handoff_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AMPMETER_HANDOFF_KEY", KEY)
    monkeypatch.delenv("AMPMETER_LEDGER_ALLOW", raising=False)


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[SqliteLedger]:
    opened = SqliteLedger(tmp_path / "budget.sqlite3", "team")
    yield opened
    opened.close()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def forge(token: str, change: Callable[[dict[str, Any]], None], *, sign: str | None = None) -> str:
    """``token`` with its body changed; the old signature is kept unless ``sign`` (a key) is
    given, which signs it anew as someone holding that key would."""
    body, _, signature = token.removeprefix("amp2.").partition(".")
    data = orjson.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    change(data)
    new_body = _b64(orjson.dumps(data))
    if sign is not None:
        signature = _b64(hmac.new(sign.encode(), new_body.encode(), hashlib.sha256).digest())
    return f"amp2.{new_body}.{signature}"


class Listener:
    """A socket listening on 127.0.0.1 that counts the connections it accepts."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.sock.getsockname()[1]
        self.accepted = 0
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()


def spend_all(ctx: ExecutionContext, cost: float, calls: int) -> int:
    made = 0
    try:
        for _ in range(calls):
            with ctx.llm_call("work", model="m", estimate_usd=cost) as call:
                call.record(10, 5, cost_usd=cost)
            made += 1
    except LimitExceeded:
        pass
    return made


def test_a_token_is_signed_and_carries_no_secret(tmp_path: Path) -> None:
    secret = "ledger-signing-secret-123"
    path = tmp_path / "keyed.sqlite3"
    with SqliteLedger(path, "team", handoff_key=secret) as keyed:
        with ExecutionContext("boss", max_cost_usd=1.0, ledger=keyed) as ctx:
            token = ctx.handoff("worker", max_cost_usd=0.2)
        assert secret not in token and KEY not in token
        assert propagation.decode(token, ledger=keyed).scope.startswith("team/")
        with pytest.raises(HandoffError, match="signature does not match"):
            propagation.decode(token)  # the environment's key is another one
        with (
            SqliteLedger(path, "team", handoff_key=secret) as same_key,
            ExecutionContext.from_handoff(token, ledger=same_key) as child,
        ):
            assert spend_all(child, 0.05, 10) == 4  # its own cap, from the ledger


def test_no_key_anywhere_is_an_error_naming_the_variable(
    ledger: SqliteLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AMPMETER_HANDOFF_KEY")
    with (
        ExecutionContext("boss", ledger=ledger) as ctx,
        pytest.raises(HandoffError, match="AMPMETER_HANDOFF_KEY"),
    ):
        ctx.handoff("worker")


@pytest.mark.parametrize(
    "change",
    [
        lambda data: data.update(limits=[["amp:cost", "1000.0", "exact"]]),  # limits raised
        lambda data: data.update(ancestors=[]),  # ancestors dropped
        lambda data: data.update(scope=data["scope"].rpartition("/")[0] + "/other"),
    ],
    ids=["limits-raised", "ancestors-dropped", "scope-moved"],
)
def test_an_edited_token_fails_its_signature(ledger: SqliteLedger, change: Any) -> None:
    with ExecutionContext("boss", max_cost_usd=0.10, ledger=ledger) as ctx:
        token = ctx.handoff("worker", max_cost_usd=0.05)
        forged = forge(token, change)
        with pytest.raises(HandoffError, match="signature does not match"):
            propagation.extract({"ampmeter-handoff": forged})
        with pytest.raises(HandoffError, match="signature does not match"):
            ExecutionContext.from_handoff(forged, ledger=ledger)


def test_a_validly_signed_token_still_cannot_lift_the_ceilings_kept_in_the_ledger(
    ledger: SqliteLedger,
) -> None:
    """Even someone holding the key cannot raise a child's limits or drop its ancestors:
    the parent wrote them to the ledger, and the child obeys the ledger."""
    with ExecutionContext("boss", max_cost_usd=0.10, ledger=ledger) as ctx:
        token = ctx.handoff("worker", max_cost_usd=0.06)

        def lift(data: dict[str, Any]) -> None:
            data.update(limits=[["amp:cost", "1000.0", "exact"]], ancestors=[])

        forged = forge(token, lift, sign=KEY)
        with ExecutionContext.from_handoff(forged, ledger=ledger) as child:
            made = spend_all(child, 0.02, 50)
    assert made == 3  # $0.06, the child's kept ceiling, not $1.00
    assert ledger.spent()["amp:cost"] == Decimal("0.06")
    assert ledger.ceilings(propagation.decode(token).scope) == {"amp:cost": Decimal("0.06")}
    assert ledger.ceilings() == {"amp:cost": Decimal("0.1")}


def test_a_sibling_cannot_spend_past_the_parent_by_dropping_ancestors(
    ledger: SqliteLedger,
) -> None:
    with ExecutionContext("boss", max_cost_usd=0.10, ledger=ledger) as ctx:
        first = ctx.handoff("a", max_cost_usd=1.0)
        second = ctx.handoff("b", max_cost_usd=1.0)
        forged = forge(second, lambda data: data.update(ancestors=[]), sign=KEY)
        with ExecutionContext.from_handoff(first, ledger=ledger) as child:
            assert spend_all(child, 0.03, 2) == 2
        with ExecutionContext.from_handoff(forged, ledger=ledger) as child:
            assert spend_all(child, 0.03, 50) == 1  # the parent's $0.10 holds
    assert ledger.spent()["amp:cost"] == Decimal("0.09")


def test_a_token_naming_another_sqlite_file_creates_nothing(
    ledger: SqliteLedger, tmp_path: Path
) -> None:
    evil = tmp_path / "elsewhere" / "evil.sqlite3"
    evil.parent.mkdir()
    with ExecutionContext("boss", max_cost_usd=0.10, ledger=ledger) as ctx:
        token = ctx.handoff("worker")

    def move(data: dict[str, Any]) -> None:
        data["ledger"]["path"] = str(evil)

    with pytest.raises(HandoffError, match="signature does not match"):
        propagation.extract({"Ampmeter-Handoff": forge(token, move)})
    signed = forge(token, move, sign=KEY)
    found = propagation.extract({"Ampmeter-Handoff": signed})
    assert found == signed
    with pytest.raises(HandoffError, match="did not configure"):
        ExecutionContext.from_handoff(signed)
    with pytest.raises(HandoffError, match="not the hand-off's ledger"):
        ExecutionContext.from_handoff(signed, ledger=ledger)
    assert list(evil.parent.iterdir()) == []  # no file, no journal, nothing


def test_a_token_naming_another_redis_connects_nowhere(ledger: SqliteLedger) -> None:
    listener = Listener()
    try:
        with ExecutionContext("boss", ledger=ledger) as ctx:
            token = ctx.handoff("worker")

        def redirect(data: dict[str, Any]) -> None:
            url = f"redis://127.0.0.1:{listener.port}/3"
            data["ledger"] = {"backend": "redis", "url": url, "credentials": False}

        with pytest.raises(HandoffError, match="signature does not match"):
            propagation.extract({"ampmeter-handoff": forge(token, redirect)})
        signed = forge(token, redirect, sign=KEY)
        with pytest.raises(HandoffError, match="did not configure"):
            ExecutionContext.from_handoff(propagation.extract({"ampmeter-handoff": signed}))
        assert listener.accepted == 0
    finally:
        listener.close()


def test_ledger_must_be_the_tokens_own(
    ledger: SqliteLedger, tmp_path: Path, redis_server: RedisServer
) -> None:
    with ExecutionContext("boss", max_cost_usd=0.10, ledger=ledger) as ctx:
        token = ctx.handoff("worker")
    with (
        SqliteLedger(tmp_path / "other.sqlite3", "team") as other,
        pytest.raises(HandoffError, match="not the hand-off's ledger"),
    ):
        ExecutionContext.from_handoff(token, ledger=other)
    # a Redis parent: another database of the same server is another ledger
    with RedisLedger(redis_server.url, "tenant") as parent:
        with ExecutionContext("boss", ledger=parent) as ctx:
            redis_token = ctx.handoff("worker")
        other_db = redis_server.url.rsplit("/", 1)[0] + "/5"
        with (
            RedisLedger(other_db, "tenant") as wrong,
            pytest.raises(HandoffError, match="not the hand-off's ledger"),
        ):
            ExecutionContext.from_handoff(redis_token, ledger=wrong)
        with RedisLedger(redis_server.url, "tenant") as right:
            ExecutionContext.from_handoff(redis_token, ledger=right).close()


def test_an_allowed_ledger_is_opened_from_the_token(
    ledger: SqliteLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AMPMETER_LEDGER_ALLOW", f"/nowhere.db, {ledger.path}")
    with ExecutionContext("boss", max_cost_usd=0.10, ledger=ledger) as ctx:
        token = ctx.handoff("worker", max_cost_usd=0.04)
        with ExecutionContext.from_handoff(token) as child:
            assert spend_all(child, 0.02, 5) == 2
