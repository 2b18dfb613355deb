"""RedisLedger against a real Redis: many processes, crashed workers, dead servers, TTL windows."""

from __future__ import annotations

import heapq
import math
import multiprocessing
import os
import random
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
import redis

from ampmeter.ledgers import LedgerUnavailable, RedisLedger, Reservation
from support.ledger_backends import reserve
from support.processes import gather
from support.redis_server import RedisServer, redis_server_fixture  # noqa: F401

WORKERS = 8
CALLS = 200


def _scope() -> str:
    return f"test-{uuid.uuid4().hex}"


@pytest.fixture
def client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    connection = redis.Redis.from_url(redis_server.url, decode_responses=True)
    yield connection
    connection.close()


def _nano(dollars: float) -> Decimal:
    """``dollars`` as written, to whole nano-dollars: what a ledger keeps exactly."""
    return Decimal(repr(dollars)).quantize(Decimal("1e-9"))


def _worker(url: str, scope: str, ceiling: Decimal, seed: int, out: Any) -> None:
    """Reserve an estimate, then commit a random actual cost that may exceed it."""
    rng = random.Random(seed)
    pairs: list[tuple[Decimal, Decimal]] = []
    rejected = 0
    with RedisLedger(url, scope, lease_s=30.0, timeout_s=10.0) as ledger:
        for _ in range(CALLS):
            estimate = _nano(rng.uniform(0.05, 1.0))
            held = reserve(ledger, {"amp:cost": estimate}, {"amp:cost": ceiling})
            if held is None:
                rejected += 1
                continue
            actual = _nano(float(estimate) * rng.uniform(0.3, 1.6))
            ledger.commit(held, {"amp:cost": actual, "calls": 1})
            pairs.append((estimate, actual))
    out.put((pairs, rejected))


def test_many_processes_share_one_ceiling(redis_server: RedisServer, client: redis.Redis) -> None:
    scope, ceiling = _scope(), Decimal(60)
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    workers = [
        ctx.Process(target=_worker, args=(redis_server.url, scope, ceiling, seed, out))
        for seed in range(WORKERS)
    ]
    results = gather(workers, out)
    pairs = [pair for worker_pairs, _ in results for pair in worker_pairs]
    rejected = sum(count for _, count in results)
    ledger = RedisLedger(redis_server.url, scope)
    spent = ledger.spent()
    # Every admission leaves spent + reserved <= ceiling. After the last admission only the
    # reservations then in flight (at most one per worker) can commit more than they reserved,
    # so the overshoot is bounded by the WORKERS largest (actual - estimate) differences, not by
    # a single one: with one call at a time it would be the single largest.
    overshoots = [actual - estimate for estimate, actual in pairs if actual > estimate]
    bound = sum(heapq.nlargest(WORKERS, overshoots), Decimal(0))
    assert spent["amp:cost"] <= ceiling + bound
    assert rejected > 0 and len(pairs) > 0
    assert spent["calls"] == len(pairs)
    assert spent["amp:cost"] == sum((actual for _, actual in pairs), Decimal(0))  # exact
    assert ledger.reserved() == {}
    assert ledger.reservation_ids() == set()
    assert client.zcard(f"ampmeter:{{{scope}}}:leases") == 0
    ledger.close()


def _holder(url: str, scope: str, mode: Any, ready: Any) -> None:
    ledger = RedisLedger(url, scope, lease_s=1.0, timeout_s=10.0, on_expired_hold=mode)
    held = reserve(ledger, {"amp:cost": 5.0}, {"amp:cost": 5.0})
    ready.put(None if held is None else held.id)
    time.sleep(600)


@pytest.mark.parametrize("mode", ["charge", "release"])
def test_hold_of_a_killed_worker_ends_with_its_lease(redis_server: RedisServer, mode: str) -> None:
    scope = _scope()
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Queue()
    process = ctx.Process(target=_holder, args=(redis_server.url, scope, mode, ready))
    process.start()
    held_id = ready.get(timeout=60)
    assert held_id is not None
    assert process.pid is not None
    os.kill(process.pid, signal.SIGKILL)
    process.join(timeout=30)
    assert process.exitcode == -signal.SIGKILL
    ledger = RedisLedger(redis_server.url, scope, lease_s=30.0, timeout_s=10.0)
    deadline = time.monotonic() + 60
    while ledger.reserved() and time.monotonic() < deadline:  # a read ends expired leases
        time.sleep(0.1)
    assert ledger.reservation_ids() == set()
    assert ledger.reserved() == {}
    if mode == "charge":  # the dead worker's request may have been billed: charged, kept
        assert ledger.spent() == {"amp:cost": 5} == ledger.unsettled()
        assert reserve(ledger, {"amp:cost": 0.01}, {"amp:cost": 5.0}) is None
        # a late commit of that call (its worker was only slow) replaces the charge
        ledger.commit(Reservation(held_id, {}, None), {"amp:cost": 1.5})
        assert ledger.spent() == {"amp:cost": Decimal("1.5")} and ledger.unsettled() == {}
    else:
        assert ledger.spent() == {} == ledger.unsettled()
        assert reserve(ledger, {"amp:cost": 5.0}, {"amp:cost": 5.0}) is not None
    ledger.close()


def test_dead_server_raises_ledger_unavailable() -> None:
    server = RedisServer().start()
    ledger = RedisLedger(server.url, _scope(), timeout_s=0.5)
    held = reserve(ledger, {"amp:cost": 1.0}, {"amp:cost": 2.0})
    assert held is not None
    server.stop()
    started = time.monotonic()
    with pytest.raises(LedgerUnavailable, match=r"127\.0\.0\.1:\d+ is unavailable"):
        reserve(ledger, {"amp:cost": 1.0}, {"amp:cost": 2.0})
    with pytest.raises(LedgerUnavailable):
        ledger.commit(held, {"amp:cost": 1.0})
    with pytest.raises(LedgerUnavailable):
        ledger.release(held)
    with pytest.raises(LedgerUnavailable):
        ledger.spent()
    assert time.monotonic() - started < 10  # a hang guard, not a speed claim
    ledger.close()


def test_silent_server_times_out_with_ledger_unavailable() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        accepted: list[socket.socket] = []
        stop = threading.Event()

        def accept() -> None:  # accept connections, never answer
            listener.settimeout(0.1)
            while not stop.is_set():
                try:
                    accepted.append(listener.accept()[0])
                except OSError:
                    continue

        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        try:
            ledger = RedisLedger(f"redis://127.0.0.1:{port}/0", "silent", timeout_s=0.3)
            started = time.monotonic()
            with pytest.raises(LedgerUnavailable, match=r"(?i)timeout|timed out"):
                reserve(ledger, {"amp:cost": 1.0}, {"amp:cost": 2.0})
            assert time.monotonic() - started < 10  # a hang guard, not a speed claim
            ledger.close()
        finally:
            stop.set()
            thread.join(timeout=10)
            for connection in accepted:
                connection.close()


def test_two_ledgers_on_one_scope_share_state(redis_server: RedisServer) -> None:
    scope = _scope()
    with RedisLedger(redis_server.url, scope) as one, RedisLedger(redis_server.url, scope) as two:
        held = reserve(one, {"amp:cost": 0.75}, {"amp:cost": 1.0})
        assert held is not None
        assert reserve(two, {"amp:cost": 0.5}, {"amp:cost": 1.0}) is None
        two.commit(held, {"amp:cost": 0.25})  # any process may settle any reservation
        assert one.spent() == {"amp:cost": 0.25}
        assert one.reserved() == {}


def test_keys_share_a_cluster_hash_tag(redis_server: RedisServer, client: redis.Redis) -> None:
    scope = _scope()
    with RedisLedger(redis_server.url, scope) as ledger:
        held = reserve(ledger, {"amp:cost": 1.0}, {})
        assert held is not None
        ledger.commit(held, {"amp:cost": 1.0})
    keys = set(client.keys(f"ampmeter:{{{scope}}}:*"))
    assert {f"ampmeter:{{{scope}}}:spent", f"ampmeter:{{{scope}}}:committed"} <= keys
    assert client.hgetall(f"ampmeter:{{{scope}}}:spent") == {"amp:cost": "1000000000"}


def test_lease_expiry_uses_the_server_clock(redis_server: RedisServer, client: redis.Redis) -> None:
    with RedisLedger(redis_server.url, _scope(), lease_s=7.5) as ledger:
        before = client.time()
        held = reserve(ledger, {"amp:cost": 1.0}, {})
        after = client.time()
        assert held is not None and held.expires_at is not None
        assert before[0] + before[1] / 1e6 + 7.5 <= held.expires_at
        assert held.expires_at <= after[0] + after[1] / 1e6 + 7.5
    with RedisLedger(redis_server.url, _scope(), lease_s=None) as forever:
        kept = reserve(forever, {"amp:cost": 1.0}, {})
        assert kept is not None and kept.expires_at is None


def test_ttl_window_expires_every_key_and_starts_fresh(
    redis_server: RedisServer, client: redis.Redis
) -> None:
    scope = _scope()
    with RedisLedger(redis_server.url, scope, ttl_s=0.5) as ledger:
        held = reserve(ledger, {"amp:cost": 1.0}, {"amp:cost": 1.0})
        assert held is not None
        ledger.commit(held, {"amp:cost": 1.0})
        keys = client.keys(f"ampmeter:{{{scope}}}:*")
        assert keys and all(0 < client.pttl(key) <= 500 for key in keys)
        assert reserve(ledger, {"amp:cost": 1.0}, {"amp:cost": 1.0}) is None
        deadline = time.monotonic() + 30
        while client.exists(f"ampmeter:{{{scope}}}:window") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert reserve(ledger, {"amp:cost": 1.0}, {"amp:cost": 1.0}) is not None  # a new window
        assert ledger.spent() == {}


def test_a_ledger_with_a_ttl_never_wipes_a_tree_kept_without_one(
    redis_server: RedisServer, client: redis.Redis
) -> None:
    """A tree written without ``ttl_s`` holds spend for good: a ledger opened on it with a TTL
    took it for an ended window and deleted every key on its first read, so $0.90 spent of a
    $1 ceiling became $0 and the next $0.50 call was let through. Now that ledger fails closed,
    naming the mismatch; one without a TTL on a window's tree (``ampmeter budget show``) spends
    in the window, and what it writes ends with it."""
    scope = _scope()
    with RedisLedger(redis_server.url, scope) as kept:
        held = reserve(kept, {"amp:cost": 0.9}, {"amp:cost": 1.0})
        assert held is not None
        kept.commit(held, {"amp:cost": 0.9})
        windowed = RedisLedger(redis_server.url, scope, ttl_s=3600)
        with windowed, pytest.raises(LedgerUnavailable, match="ttl_s"):
            windowed.spent()
        assert kept.spent() == {"amp:cost": Decimal("0.9")}
        assert reserve(kept, {"amp:cost": 0.5}, {"amp:cost": 1.0}) is None
    windowed_scope = _scope()
    with RedisLedger(redis_server.url, windowed_scope, ttl_s=3600) as windowed:
        windowed.spent()
        with RedisLedger(redis_server.url, windowed_scope) as forever:
            held = reserve(forever, {"amp:cost": 0.5}, {"amp:cost": 1.0})
            assert held is not None
            forever.commit(held, {"amp:cost": 0.5})
        assert windowed.spent() == {"amp:cost": Decimal("0.5")}
        keys = client.keys(f"ampmeter:{{{windowed_scope}}}:*")
        assert keys and all(0 < client.pttl(key) <= 3_600_000 for key in keys)


def test_scripts_run_by_sha_and_survive_a_script_flush(
    redis_server: RedisServer, client: redis.Redis
) -> None:
    def evalsha_calls() -> int:
        stats = client.info("commandstats").get("cmdstat_evalsha", {})
        return int(stats.get("calls", 0))

    with RedisLedger(redis_server.url, _scope()) as ledger:
        before = evalsha_calls()
        held = reserve(ledger, {"amp:cost": 1.0}, {})
        assert held is not None
        client.script_flush()
        ledger.commit(held, {"amp:cost": 1.0})  # NOSCRIPT -> loaded again, then run
        assert evalsha_calls() >= before + 2
        assert ledger.spent() == {"amp:cost": 1.0}


def test_sums_stay_exact_over_many_commits(redis_server: RedisServer) -> None:
    rng = random.Random(7)
    actuals = [_nano(rng.uniform(0, 0.01) * 10 ** rng.randint(-6, 2)) for _ in range(400)]
    with RedisLedger(redis_server.url, _scope()) as ledger:
        for actual in actuals:
            held = reserve(ledger, {"amp:cost": rng.random()}, {})
            assert held is not None
            ledger.commit(held, {"amp:cost": actual})
        assert ledger.spent()["amp:cost"] == sum(actuals, Decimal(0))
        assert ledger.reserved() == {}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"ttl_s": 0}, "ttl_s"),
        ({"lease_s": -1}, "lease_s"),
        ({"timeout_s": None}, "timeout_s"),
        ({"timeout_s": math.nan}, "timeout_s"),
    ],
)
def test_bad_settings_raise(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises((ValueError, TypeError), match=match):
        RedisLedger("redis://127.0.0.1:1/0", "scope", **kwargs)


def test_url_must_be_a_string() -> None:
    with pytest.raises(TypeError, match="url"):
        RedisLedger(b"redis://127.0.0.1:1/0", "scope")  # type: ignore[arg-type]


def test_a_ready_client_with_bytes_replies_is_used_and_left_open(
    redis_server: RedisServer, tmp_path: Any
) -> None:
    client = redis.Redis.from_url(redis_server.url)  # no decode_responses: replies are bytes
    scope = _scope()
    ledger = RedisLedger(client, scope, journal=tmp_path / "j")
    child = ledger.child("run")
    held = reserve(
        child, {"amp:cost": 0.5}, {"amp:cost": 1.0}, ancestors={scope: {"amp:cost": 0.5}}
    )
    assert held is not None
    assert reserve(child, {"amp:cost": 0.5}, {"amp:cost": 1.0}, reservation_id=held.id) == held
    assert ledger.reserved() == {"amp:cost": 0.5} == child.reserved()
    child.commit(held, {"amp:cost": 0.25})
    assert ledger.spent() == {"amp:cost": 0.25} == ledger.spent(child.scope)
    assert ledger.renew(held) is False
    # one tree, one hash tag: the child's amounts are fields of the root's hashes
    assert client.hgetall(f"ampmeter:{{{scope}}}:spent") == {
        b"amp:cost": b"250000000",
        b"run\x1famp:cost": b"250000000",
    }
    child.close()  # a child leaves the shared backend open
    assert ledger.spent() == {"amp:cost": 0.25}
    ledger.close()
    assert client.ping()  # the caller's client stays open
    client.close()
