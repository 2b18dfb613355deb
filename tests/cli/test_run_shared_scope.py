"""Runs given one ``--ledger`` and ``--scope`` share one budget scope, and each run's holds are
its own: a run that ended waited for every hold at the scope (another run's live worker's too,
a whole lease) and then recorded every dead worker's hold there as its own unsettled spend, so
the run whose worker died reported $0 for a call its provider billed. A run now names its
processes' holds (the ledger's ``hold_prefix``), and waits for and records only those."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

from ampmeter import ExecutionContext
from ampmeter.cli.run.config import RunConfig
from ampmeter.cli.run.leftover import RUN_LEASE_S
from ampmeter.cli.run.parent import run_command
from ampmeter.keys import KEY_COST
from ampmeter.ledgers import Reservation, SqliteLedger
from ampmeter.shared.unsettled import UNSETTLED_NAME
from ampmeter.testing.billing import BillingProvider
from support.ledger_backends import MakeLedger, make_ledger_fixture  # noqa: F401
from support.redis_server import redis_server_fixture  # noqa: F401

# Run B: two metered workers each send a call the provider holds; once the file argv[1] appears
# one is killed (its hold is left to run out), the other lives on, holding, until argv[2]
# appears (then Ctrl-C ends its call).
TWO_WORKERS = """
import os, signal, subprocess, sys, time
CALL = (
    "import os, httpx; httpx.post(os.environ['LLM_URL'] + '/chat/completions', timeout=120, "
    "json={'model': 'gpt-4o-mini', 'max_tokens': 50, "
    "'messages': [{'role': 'user', 'content': 'Hi'}]})"
)
dead, live = [subprocess.Popen([sys.executable, "-c", CALL]) for _ in range(2)]
def wait_for(path):
    while not os.path.exists(path):
        time.sleep(0.02)
wait_for(sys.argv[1])
dead.kill()
dead.wait()
wait_for(sys.argv[2])
live.send_signal(signal.SIGINT)
live.wait()
"""
# Run A meters nothing: it ends when the file argv[1] appears.
WAITS = """
import os, sys, time
while not os.path.exists(sys.argv[1]):
    time.sleep(0.02)
"""


def _until(done: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 60
    while not done():
        assert time.monotonic() < deadline, f"no {what} within 60 s"
        time.sleep(0.05)


def _charged(out: Path) -> list[dict[str, Any]]:
    events = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    return [e for e in events if e["metadata"].get("cost_status") == "unsettled"]


def test_a_run_ending_beside_another_records_and_waits_for_its_own_holds_only(
    tmp_path: Path,
) -> None:
    (tmp_path / "b.py").write_text(TWO_WORKERS)
    (tmp_path / "a.py").write_text(WAITS)
    kill, end, go = (tmp_path / name for name in ("kill", "end", "go"))
    shared = tmp_path / "shared.sqlite3"
    outcomes: dict[str, Any] = {}
    with BillingProvider(delay_s=60, prices={"gpt-4o-mini": ("0.15", "0.60")}) as provider:
        env = {**os.environ, "LLM_URL": provider.openai_base_url}

        def run(name: str, *argv: str) -> threading.Thread:
            out = str(tmp_path / f"{name}.jsonl")
            config = RunConfig(ledger=str(shared), scope="team", max_cost=1.0, out=out)
            command = [str(tmp_path / f"{name}.py"), *argv]
            runner = threading.Thread(
                target=lambda: outcomes.setdefault(name, run_command(command, config, env=env))
            )
            runner.start()
            return runner

        b = run("b", str(kill), str(end))
        _until(lambda: len(provider.requests) == 2, "calls of run b")
        kill.touch()
        a = run("a", str(go))
        with SqliteLedger(shared, "team") as ledger:
            _until(lambda: bool(ledger.unsettled()), "run b's dead hold charged")
            go.touch()
            started = time.monotonic()
            a.join(60)
            took = time.monotonic() - started
            still_held = ledger.reserved().get(KEY_COST, 0)
        end.touch()
        b.join(60)
    # Run a recorded none of run b's holds, and did not wait out the live one's lease.
    assert _charged(tmp_path / "a.jsonl") == [] and outcomes["a"].summary["cost_usd"] == 0
    assert took < RUN_LEASE_S, took
    assert still_held > 0  # run b's live worker held on all along
    # Run b charged both of its calls: the killed worker's hold, and the one ended by Ctrl-C.
    charged = {e["metadata"]["error_class"] for e in _charged(tmp_path / "b.jsonl")}
    assert charged == {"UnsettledHold", "KeyboardInterrupt"}
    assert outcomes["b"].summary["unsettled_calls"] == 2


def test_a_context_records_the_dead_holds_of_its_own_ledgers_prefix_only(
    make_ledger: MakeLedger,
) -> None:
    """The same rule at the scope itself, on every backend: a dead worker's hold of run b
    is left to run b's context, and recorded there once."""
    ledger = make_ledger(lease_s=0.3)
    ledger.hold_prefix = "run-b-"
    held = ledger.try_reserve({KEY_COST: "0.25"}, {KEY_COST: 1})
    assert isinstance(held, Reservation) and held.id.startswith("run-b-")
    del held  # its worker is gone: nothing renews it
    _until(lambda: bool(ledger.unsettled()), "hold charged as unsettled")
    recorded = {}
    for run in ("a", "b"):
        ledger.hold_prefix = f"run-{run}-"
        ctx = ExecutionContext(f"run {run}", ledger=ledger)
        ctx.close()
        recorded[run] = [n for n in ctx.graph.nodes() if n.name == UNSETTLED_NAME]
    assert recorded["a"] == []
    (node,) = recorded["b"]
    assert node.cost_usd == Decimal("0.25") and node.metadata["cost_status"] == "unsettled"
