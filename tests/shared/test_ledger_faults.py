"""Shared ledgers across real processes and through real faults: SQLite and Redis.

Workers are forked processes; Redis is a real server that the tests kill, freeze (SIGSTOP) and
restart, SQLite a real file another connection locks; the cluster is three real nodes.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import random
import signal
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from ampmeter.errors import BudgetUnavailable
from ampmeter.ledgers import Ledger, LedgerUnavailable, RedisLedger, Refusal, SqliteLedger
from support.ledger_backends import reserve
from support.processes import gather
from support.redis_server import RedisClusterNodes, RedisServer, redis_server_fixture  # noqa: F401

FORK = multiprocessing.get_context("fork")
Opener = Callable[..., Ledger]


def _nano(dollars: float) -> Decimal:
    """``dollars`` as written, to whole nano-dollars: what a ledger keeps exactly."""
    return Decimal(repr(dollars)).quantize(Decimal("1e-9"))


def _scope() -> str:
    return f"test-{uuid.uuid4().hex}"


@pytest.fixture(params=["sqlite", "redis"])
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    """Opens ledgers (in any process) on one shared SQLite file or Redis server."""
    if request.param == "sqlite":
        path = tmp_path / "ledger.db"

        def open_sqlite(scope: str, **options: Any) -> Ledger:
            return SqliteLedger(path, scope, journal=tmp_path / f"journal-{os.getpid()}", **options)

        yield open_sqlite
    else:
        server: RedisServer = request.getfixturevalue("redis_server")

        def open_redis(scope: str, **options: Any) -> Ledger:
            options.setdefault("timeout_s", 10.0)
            return RedisLedger(
                server.url, scope, journal=tmp_path / f"journal-{os.getpid()}", **options
            )

        yield open_redis


# -- many processes, one ceiling ---------------------------------------------------------------


def _spender(
    open_ledger: Opener, scope: str, name: str, ceiling: float, seed: int, out: Any
) -> None:
    """Reserve an estimate at the worker's child scope under the shared root, commit <= it."""
    rng = random.Random(seed)
    actuals: list[Decimal] = []
    with open_ledger(scope) as root:
        worker = root.child(name)
        for _ in range(60):
            estimate = _nano(rng.uniform(0.05, 1.0))
            held = reserve(
                worker, {"amp:cost": estimate}, {}, ancestors={scope: {"amp:cost": ceiling}}
            )
            if held is not None:
                actual = _nano(float(estimate) * rng.uniform(0.2, 1.0))
                worker.commit(held, {"amp:cost": actual, "calls": 1})
                actuals.append(actual)
    out.put((name, actuals))


def test_processes_on_child_scopes_share_the_parent_ceiling(opener: Opener) -> None:
    scope, ceiling = _scope(), 12.0
    out = FORK.Queue()
    names = [f"w{i}" for i in range(4)]
    workers = [
        FORK.Process(target=_spender, args=(opener, scope, name, ceiling, i, out))
        for i, name in enumerate(names)
    ]
    for process in workers:
        process.start()
    results = dict(out.get(timeout=300) for _ in workers)
    for process in workers:
        process.join(timeout=60)
        assert process.exitcode == 0
    with opener(scope) as ledger:
        total = ledger.spent()
        assert total["amp:cost"] <= ceiling  # actual <= estimate: no overshoot at all
        everything = [actual for actuals in results.values() for actual in actuals]
        assert total["amp:cost"] == sum(everything, Decimal(0))
        assert total["calls"] == len(everything) < 4 * 60  # the ceiling was reached
        for name, actuals in results.items():
            mine = ledger.spent(f"{scope}/{name}")
            assert mine.get("amp:cost", 0) == sum(actuals, Decimal(0))
        assert ledger.reserved() == {}


# -- leases: long calls keep their hold, dead workers lose theirs --------------------------------


def _long_caller(open_ledger: Opener, scope: str, out: Any) -> None:
    """Tries for a few seconds to make one $0.75 call of 1.6 s (longer than the 1 s lease)."""
    made = 0
    with open_ledger(scope, lease_s=1.0) as ledger:
        give_up = time.monotonic() + 5.0
        while time.monotonic() < give_up:
            held = reserve(ledger, {"amp:cost": 0.75}, {"amp:cost": 1.0})
            if held is None:
                time.sleep(0.05)
                continue
            time.sleep(1.6)
            ledger.commit(held, {"amp:cost": 0.75})
            made += 1
    out.put(made)


def test_calls_longer_than_the_lease_keep_their_hold(opener: Opener) -> None:
    scope = _scope()
    out = FORK.Queue()
    workers = [FORK.Process(target=_long_caller, args=(opener, scope, out)) for _ in range(2)]
    made = gather(workers, out, join_s=60)
    with opener(scope) as ledger:
        # without renewal the second worker's reserve lands once the first lease runs out
        assert ledger.spent() == {"amp:cost": 0.75}
        assert sorted(made) == [0, 1]
        assert ledger.reserved() == {}


def _holder(open_ledger: Opener, scope: str, ready: Any) -> None:
    ledger = open_ledger(scope, lease_s=1.0)
    held = reserve(ledger, {"amp:cost": 5.0}, {"amp:cost": 5.0})
    ready.put(None if held is None else held.id)
    time.sleep(600)  # renewing all along, until killed


def test_holds_of_a_killed_worker_are_charged_after_the_lease(opener: Opener) -> None:
    scope = _scope()
    ready = FORK.Queue()
    process = FORK.Process(target=_holder, args=(opener, scope, ready))
    process.start()
    held_id = ready.get(timeout=60)
    assert held_id is not None and process.pid is not None
    with opener(scope) as ledger:
        time.sleep(2.5)  # more than two leases: the holder's thread keeps renewing
        assert reserve(ledger, {"amp:cost": 0.5}, {"amp:cost": 5.0}) is None
        os.kill(process.pid, signal.SIGKILL)
        process.join(timeout=30)
        deadline = time.monotonic() + 60
        while ledger.reserved() and time.monotonic() < deadline:
            time.sleep(0.1)  # a read ends expired leases
        assert ledger.reserved() == {}
        # its request may have been billed: the hold is charged as unsettled spend, not freed
        assert ledger.spent() == {"amp:cost": 5} == ledger.unsettled()
        refusal = ledger.try_reserve({"amp:cost": 0.5}, {"amp:cost": 5.0})
        assert isinstance(refusal, Refusal) and not refusal.busy and refusal.spent == 5


def _stuck_call(open_ledger: Opener, scope: str, ready: Any) -> None:
    """A context whose $0.06 call hangs (the provider may already bill it) until killed."""
    from ampmeter import ExecutionContext

    ctx = ExecutionContext("stuck", max_cost_usd=0.10, ledger=open_ledger(scope, lease_s=1.0))
    with ctx.llm_call("hangs", model="m", estimate_usd=0.06):
        ready.put(True)
        time.sleep(600)


def test_a_context_killed_mid_call_leaves_its_call_charged(opener: Opener) -> None:
    """The issue's case: a worker SIGKILLed with a $0.06 call in flight under a $0.10 cap;
    once its lease ends, a second worker must not get another $0.06."""
    from ampmeter import ExecutionContext, LimitExceeded

    scope = _scope()
    ready = FORK.Queue()
    process = FORK.Process(target=_stuck_call, args=(opener, scope, ready))
    process.start()
    assert ready.get(timeout=60) is True and process.pid is not None
    os.kill(process.pid, signal.SIGKILL)
    process.join(timeout=30)
    with opener(scope, lease_s=1.0) as ledger:
        deadline = time.monotonic() + 60
        while ledger.reserved() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ledger.unsettled() == {"amp:cost": Decimal("0.06")}
        ctx = ExecutionContext("second", max_cost_usd=0.10, ledger=ledger)
        with (
            pytest.raises(LimitExceeded, match="amp:cost"),
            ctx.llm_call("more", estimate_usd=0.06),
        ):
            pytest.fail("admitted past the cap")
        with ctx.llm_call("small", model="m", estimate_usd=0.04) as call:  # what is left fits
            call.record(1, 1, cost_usd=0.04)
        ctx.close()
        assert ledger.spent()["amp:cost"] == Decimal("0.1")  # charged $0.06 + $0.04 made


# -- Redis killed, frozen and restarted around commits -----------------------------------------


def test_a_reserve_that_times_out_leaves_no_hold_once_released(tmp_path: Path) -> None:
    with RedisServer() as server:
        ledger = RedisLedger(server.url, _scope(), timeout_s=0.3, journal=tmp_path / "j")
        probe = reserve(ledger, {}, {})  # connected, scripts loaded
        assert probe is not None
        ledger.release(probe)
        server.pause()
        try:
            with pytest.raises(BudgetUnavailable, match=r"(?i)timeout|timed out"):
                reserve(ledger, {"amp:cost": 1.0}, {"amp:cost": 5.0}, reservation_id="call-42")
            # the request sits in the frozen server's socket: it will still run
            with pytest.raises(LedgerUnavailable, match="kept in"):
                ledger.release("call-42")
        finally:
            server.resume()
        ledger.flush()
        assert ledger.reserved() == {}
        assert ledger.reservation_ids() == set()
        assert (
            reserve(ledger, {"amp:cost": 1.0}, {"amp:cost": 5.0}, reservation_id="call-42") is None
        )
        assert reserve(ledger, {"amp:cost": 5.0}, {"amp:cost": 5.0}) is not None
        ledger.close()


def test_spend_committed_while_redis_is_down_is_kept_and_replayed(tmp_path: Path) -> None:
    scope = _scope()
    with RedisServer(persistent=True) as server:
        worker = RedisLedger(server.url, scope, lease_s=6.0, timeout_s=0.3, journal=tmp_path / "a")
        other = RedisLedger(server.url, scope, timeout_s=0.3, journal=tmp_path / "b")
        held = reserve(worker, {"amp:cost": Decimal("0.9")}, {"amp:cost": 1.0})
        assert held is not None
        server.kill()
        with pytest.raises(LedgerUnavailable, match="kept in") as caught:
            worker.commit(
                held, {"amp:cost": Decimal("0.9")}
            )  # the call was made: its spend must not be lost
        assert list((tmp_path / "a").glob("commit-*")) != []
        assert "unavailable" in str(caught.value)
        with pytest.raises(BudgetUnavailable):
            reserve(worker, {"amp:cost": 0.01}, {"amp:cost": 1.0})  # new calls fail closed
        server.restart()
        # Redis came back with its data: the hold is still there, so nobody takes the $0.90
        assert reserve(other, {"amp:cost": 1.0}, {"amp:cost": 1.0}) is None
        # the worker makes no more calls; its renewal thread replays the journal by itself
        deadline = time.monotonic() + 60
        while other.spent() != {"amp:cost": Decimal("0.9")} and time.monotonic() < deadline:
            time.sleep(0.1)
        assert other.spent() == {"amp:cost": Decimal("0.9")}
        assert other.reserved() == {}
        assert list((tmp_path / "a").glob("commit-*")) == []
        assert reserve(other, {"amp:cost": 0.2}, {"amp:cost": 1.0}) is None
        assert reserve(other, {"amp:cost": 0.1}, {"amp:cost": 1.0}) is not None
        worker.close()
        other.close()


def test_a_journal_left_by_a_closed_ledger_is_replayed_by_the_next(tmp_path: Path) -> None:
    scope, journal = _scope(), tmp_path / "journal"
    with RedisServer(persistent=True) as server:
        first = RedisLedger(server.url, scope, lease_s=None, timeout_s=0.3, journal=journal)
        held = reserve(first, {"amp:cost": 1.0}, {})
        assert held is not None
        server.kill()
        with pytest.raises(LedgerUnavailable, match="kept in"):
            first.commit(held, {"amp:cost": 0.75})
        first.close()  # the process ends while Redis is still down: the journal stays
        server.restart()
        second = RedisLedger(server.url, scope, lease_s=None, timeout_s=5.0, journal=journal)
        assert reserve(second, {"amp:cost": 0.25}, {"amp:cost": 1.0}) is not None  # replays first
        assert second.spent() == {"amp:cost": 0.75}
        assert reserve(second, {"amp:cost": 0.25}, {"amp:cost": 1.0}) is None
        second.close()


class _Tally:
    """What worker threads did: the actuals they committed and the faults they met."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.committed: list[Decimal] = []
        self.journaled = 0
        self.refused = 0


def _commit_until(ledger: Ledger, seed: int, stop: threading.Event, tally: _Tally) -> None:
    """Reserve and commit until told to stop; reserves that fail closed are tried again."""
    rng = random.Random(seed)
    while not stop.is_set():
        actual = _nano(rng.uniform(0.001, 0.5))
        # Half the workers name their reservations and release a reserve that failed (its
        # request may still land); without a name the ledger journals that release itself.
        reservation_id = uuid.uuid4().hex if seed % 2 else None
        try:
            held = reserve(
                ledger, {"amp:cost": actual}, {"amp:cost": 1e9}, reservation_id=reservation_id
            )
        except BudgetUnavailable:
            with tally.lock:
                tally.refused += 1
            if reservation_id is not None:
                with contextlib.suppress(LedgerUnavailable):  # journaled while down
                    ledger.release(reservation_id)
            time.sleep(0.05)
            continue
        assert held is not None
        time.sleep(rng.uniform(0, 0.02))
        with tally.lock:
            tally.committed.append(actual)  # the call was made: this is owed, whatever happens
        try:
            ledger.commit(held, {"amp:cost": actual, "calls": 1})
        except LedgerUnavailable:
            with tally.lock:
                tally.journaled += 1


def test_every_commit_counts_once_through_kills_and_freezes(tmp_path: Path) -> None:
    scope, tally, stop = _scope(), _Tally(), threading.Event()
    with RedisServer(persistent=True) as server:
        ledger = RedisLedger(server.url, scope, lease_s=5.0, timeout_s=0.2, journal=tmp_path / "j")
        threads = [
            threading.Thread(target=_commit_until, args=(ledger, i, stop, tally)) for i in range(4)
        ]
        for thread in threads:
            thread.start()
        time.sleep(0.3)
        server.kill()
        time.sleep(0.8)
        server.restart()
        time.sleep(0.3)
        server.pause()  # requests sent now reach Redis later, after their senders gave up
        time.sleep(0.8)
        server.resume()
        time.sleep(0.3)
        stop.set()
        for thread in threads:
            thread.join(timeout=300)
            assert not thread.is_alive()
        assert tally.journaled > 0 and tally.refused > 0  # the faults were met
        ledger.flush()
        spent = ledger.spent()
        assert spent["calls"] == len(tally.committed)
        assert spent["amp:cost"] == sum(tally.committed, Decimal(0))
        assert ledger.reserved() == {}
        assert list((tmp_path / "j").iterdir()) == []
        ledger.close()


def test_sqlite_commits_while_the_file_is_locked_are_kept_and_replayed(tmp_path: Path) -> None:
    path, scope = tmp_path / "ledger.db", _scope()
    ledger = SqliteLedger(path, scope, timeout_s=0.2, journal=tmp_path / "j")
    helds = [reserve(ledger, {"amp:cost": 0.5}, {"amp:cost": 2.0}) for _ in range(3)]
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")  # another process holding the write lock for long
    try:
        for held in helds:
            assert held is not None
            with pytest.raises(LedgerUnavailable, match="kept in"):
                ledger.commit(held, {"amp:cost": 0.25})
        with pytest.raises(BudgetUnavailable, match="locked"):
            reserve(ledger, {"amp:cost": 0.5}, {"amp:cost": 2.0})
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert reserve(ledger, {"amp:cost": 1.25}, {"amp:cost": 2.0}) is not None  # replayed first
    assert ledger.spent() == {"amp:cost": 0.75}
    assert ledger.reserved() == {"amp:cost": 1.25}
    ledger.close()


# -- Redis Cluster ------------------------------------------------------------------------------


def _cluster_spender(port: int, scope: str, name: str, ceiling: float, seed: int, out: Any) -> None:
    client = RedisCluster(host="127.0.0.1", port=port, socket_timeout=10.0)  # bytes replies
    rng = random.Random(seed)
    actuals: list[Decimal] = []
    with RedisLedger(client, f"{scope}/{name}", lease_s=30.0) as ledger:
        for _ in range(80):
            estimate = _nano(rng.uniform(0.05, 1.0))
            held = reserve(
                ledger, {"amp:cost": estimate}, {}, ancestors={scope: {"amp:cost": ceiling}}
            )
            if held is not None:
                actual = _nano(float(estimate) * rng.uniform(0.2, 1.0))
                ledger.commit(held, {"amp:cost": actual})
                actuals.append(actual)
    client.close()
    out.put(actuals)


def test_four_processes_on_a_three_node_cluster_share_one_ceiling() -> None:
    with RedisClusterNodes() as cluster:
        client = RedisCluster(host="127.0.0.1", port=cluster.ports[0], decode_responses=True)
        # The tree's keys share one slot, so one node owns them all. The workers talk first to
        # the nodes in turn, so at least two of them reach the owner through redirects. Which
        # node that is, is chance: nothing here depends on it.
        scope, ceiling = _scope(), 15.0
        out = FORK.Queue()
        workers = [
            FORK.Process(
                target=_cluster_spender,
                args=(cluster.ports[i % 3], scope, f"w{i}", ceiling, i, out),
            )
            for i in range(4)
        ]
        for process in workers:
            process.start()
        actuals = [actual for _ in workers for actual in out.get(timeout=300)]
        for process in workers:
            process.join(timeout=60)
            assert process.exitcode == 0
        with RedisLedger(client, scope) as ledger:
            spent = ledger.spent()["amp:cost"]
            assert spent <= ceiling  # no overshoot
            assert spent == sum(actuals, Decimal(0))  # exact spend
            assert len(actuals) < 4 * 80  # the ceiling was reached
            assert ledger.reserved() == {}
            keys = client.keys(f"ampmeter:{{{scope}}}:*", target_nodes=RedisCluster.ALL_NODES)
            assert {client.keyslot(key) for key in keys} == {client.keyslot(keys[0])}
        client.close()


def test_windows_and_claims_on_a_cluster_stay_in_the_tree_slot() -> None:
    with RedisClusterNodes() as cluster:
        client = RedisCluster(host="127.0.0.1", port=cluster.ports[0], decode_responses=True)
        scope = _scope()
        with RedisLedger(client, scope) as root:
            ledger = root.child("run")
            window = (("calls", 3600.0, 2.0),)
            for _ in range(2):
                held = reserve(ledger, {"calls": 1.0}, {}, windows=window)
                assert held is not None
                ledger.commit(held, {"calls": 1.0})
            assert reserve(ledger, {"calls": 1.0}, {}, windows=window) is None
            assert ledger.recent("calls", 3600.0) == 2.0
            assert ledger.claim("warning") and not ledger.claim("warning")
            keys = client.keys(f"ampmeter:{{{scope}}}:*", target_nodes=RedisCluster.ALL_NODES)
            assert {client.keyslot(key) for key in keys} == {client.keyslot(keys[0])}
            assert len(keys) >= 3  # spent, windowed, window events, claims, ...
        client.close()


# -- the journal itself and SQLite's own checks --------------------------------------------------


def test_a_sqlite_ledger_opened_before_a_fork_works_in_the_child(tmp_path: Path) -> None:
    ledger = SqliteLedger(tmp_path / "ledger.db", _scope(), journal=tmp_path / "j")
    held = reserve(ledger, {"amp:cost": 1.0}, {"amp:cost": 2.0})
    assert held is not None
    process = FORK.Process(target=ledger.commit, args=(held, {"amp:cost": 0.75}))
    process.start()
    process.join(timeout=60)
    assert process.exitcode == 0
    assert ledger.spent() == {"amp:cost": 0.75} and ledger.reserved() == {}
    ledger.close()


def test_an_unreadable_journal_entry_is_set_aside_and_the_rest_replayed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path, journal = tmp_path / "ledger.db", tmp_path / "journal"
    ledger = SqliteLedger(path, _scope(), timeout_s=0.2, journal=journal)
    held = reserve(ledger, {"amp:cost": 1.0}, {})
    assert held is not None
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    with pytest.raises(LedgerUnavailable, match="kept in"):
        ledger.commit(held, {"amp:cost": 0.5})
    blocker.execute("ROLLBACK")
    blocker.close()
    (journal / "commit-broken.settlement.json").write_bytes(b'{"op": "commit", "id": ')
    with caplog.at_level("ERROR", logger="ampmeter.ledgers"):
        ledger.flush()
    assert "cannot be read" in caplog.text
    assert [p.name for p in journal.iterdir()] == ["commit-broken.settlement.json.corrupt"]
    assert ledger.spent() == {"amp:cost": 0.5}
    ledger.close()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"lease_s": 0}, ValueError, "lease_s"),
        ({"timeout_s": None}, TypeError, "timeout_s"),
        ({"scope": "a//b"}, ValueError, "scope"),
    ],
)
def test_bad_sqlite_settings_raise(
    tmp_path: Path, kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        SqliteLedger(tmp_path / "ledger.db", **kwargs)


def test_sqlite_path_must_be_a_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="is a directory"):
        SqliteLedger(tmp_path)
    with pytest.raises(TypeError, match="path"):
        SqliteLedger(3)  # type: ignore[arg-type]
    with pytest.raises(BudgetUnavailable, match="unavailable"):
        SqliteLedger(tmp_path / "missing-dir" / "ledger.db")


def test_sqlite_connections_of_ended_threads_are_closed(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    ledger = SqliteLedger(path, _scope(), journal=tmp_path / "j")

    def one_call() -> None:
        held = reserve(ledger, {"amp:cost": 0.01}, {"amp:cost": 10.0})
        assert held is not None
        ledger.commit(held, {"amp:cost": 0.01})

    for _ in range(50):  # a program that starts a thread per call
        thread = threading.Thread(target=one_call)
        thread.start()
        thread.join()
    one_call()
    assert ledger.spent()["amp:cost"] == Decimal("0.51")
    # the main thread's and the last worker's, not one per thread ever started
    assert _open_files(path) <= 2
    ledger.close()
    assert _open_files(path) == 0


def _open_files(path: Path) -> int:
    """How many file descriptors of this process are open on ``path`` (Linux /proc)."""
    found = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            found += os.readlink(f"/proc/self/fd/{fd}") == str(path)
    return found


# -- a reserve whose answer is lost leaves no hold -------------------------------------------------


class _CuttingProxy:
    """A TCP proxy to a Redis server that can drop a connection as the answer arrives (the
    server ran the command, the client never hears of it) or refuse every connection."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.cut_answers = 0  # how many of the next answers to drop
        self.cut = 0  # answers dropped so far
        self.down = False  # refuse new connections and drop every answer
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.down:
                client.close()
                continue
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, answers: bool) -> None:
        try:
            while data := source.recv(65536):
                if answers and (self.down or self.cut_answers > 0):
                    self.cut_answers = max(self.cut_answers - 1, 0)
                    self.cut += 1
                    break
                sink.sendall(data)
        except OSError:
            pass
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
            end.close()

    def close(self) -> None:
        self._closed = True
        self.listener.close()


def _released_ids(server_url: str, scope: str) -> set[str]:
    client = redis.Redis.from_url(server_url, decode_responses=True)
    try:
        return set(client.zrange(f"ampmeter:{{{scope}}}:released", 0, -1))
    finally:
        client.close()


def test_a_reserve_whose_answer_is_lost_is_released_by_its_id(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    scope = _scope()
    proxy = _CuttingProxy(redis_server.port)
    url = f"redis://127.0.0.1:{proxy.port}/0"
    ledger = RedisLedger(url, scope, lease_s=None, timeout_s=2.0, journal=tmp_path / "j")
    try:
        probe = reserve(ledger, {}, {})  # connected, scripts loaded
        assert probe is not None
        ledger.release(probe)
        proxy.cut_answers = 1
        with pytest.raises(LedgerUnavailable, match="Connection"):
            reserve(ledger, {"amp:cost": 1.0}, {"amp:cost": 5.0})
        assert proxy.cut == 1  # Redis answered: it had taken the hold
        with RedisLedger(redis_server.url, scope) as direct:
            assert direct.reserved() == {} and direct.reservation_ids() == set()
            assert reserve(direct, {"amp:cost": 5.0}, {"amp:cost": 5.0}) is not None
        assert len(_released_ids(redis_server.url, scope) - {probe.id}) == 1  # by its id
    finally:
        ledger.close()
        proxy.close()


def test_a_lost_reserve_without_a_lease_is_released_once_redis_is_reachable_again(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    scope = _scope()
    proxy = _CuttingProxy(redis_server.port)
    url = f"redis://127.0.0.1:{proxy.port}/0"
    ledger = RedisLedger(url, scope, lease_s=None, timeout_s=1.0, journal=tmp_path / "j")
    try:
        probe = reserve(ledger, {}, {})
        assert probe is not None
        ledger.release(probe)
        proxy.down = True  # the reserve's answer is lost, and so is the release that follows
        with pytest.raises(LedgerUnavailable):
            reserve(ledger, {"amp:cost": 1.0}, {"amp:cost": 5.0}, reservation_id="call-9")
        assert proxy.cut >= 1
        with RedisLedger(redis_server.url, scope) as direct:
            assert direct.reserved() == {"amp:cost": 1}  # a phantom hold, for now
            assert list((tmp_path / "j").glob("release-*"))  # its release is journaled
            proxy.down = False
            deadline = time.monotonic() + 30
            while direct.reserved() and time.monotonic() < deadline:
                time.sleep(0.1)  # no lease, no caller: the ledger's own thread replays it
            assert direct.reserved() == {} and direct.reservation_ids() == set()
        assert "call-9" in _released_ids(redis_server.url, scope)
    finally:
        ledger.close()
        proxy.close()
