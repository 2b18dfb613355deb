"""A ledger registered from outside ampmeter is reached by a child process through a hand-off
token, with nothing else told about it: its module declares a ``Reach`` and registers it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ampmeter import ExecutionContext, HandoffError, Limit, propagation
from ampmeter.ledgers import InMemoryLedger, reach

# A user's own ledger, as its own module: budgets kept in a folder (one SQLite file in it), with
# addresses written "folder:<directory>".
FOLDER_LEDGER = """
import os

from ampmeter.ledgers import Reach, SqliteLedger, register


class FolderLedger(SqliteLedger):
    def __init__(self, folder, scope, **options):
        os.makedirs(folder, exist_ok=True)
        self.folder = os.path.abspath(folder)
        super().__init__(os.path.join(self.folder, "budget.sqlite3"), scope, **options)


register(
    Reach(
        name="folder",
        kind=FolderLedger,
        describe=lambda ledger: {"folder": ledger.folder, "lease_s": ledger.lease_s},
        reopen=lambda where, scope: FolderLedger(where["folder"], scope, lease_s=where["lease_s"]),
        place=lambda where: os.path.realpath(where["folder"]),
        address=lambda text: (
            {"folder": os.path.abspath(text[7:])} if text.startswith("folder:") else None
        ),
    )
)
"""

CHILD = """
import json, os, sys
if sys.argv[1] == "registered":
    import folder_ledger  # the registration is all the child needs
from ampmeter import ExecutionContext, HandoffError, LimitExceeded

made, stop = 0, None
try:
    with ExecutionContext.from_handoff(os.environ["AMPMETER_HANDOFF"]) as ctx:
        kind = type(ctx.ledger).__name__
        try:
            for _ in range(10):
                with ctx.llm_call("work", model="m", estimate_usd=0.125) as call:
                    call.record(10, 5, cost_usd=0.125)
                made += 1
        except LimitExceeded as exc:
            stop = str(exc)
except HandoffError as exc:
    kind, stop = None, str(exc)
print(json.dumps({"kind": kind, "made": made, "stop": stop}))
"""


@pytest.fixture
def folder_ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The user's module, importable here and in children (``PYTHONPATH``)."""
    (tmp_path / "folder_ledger.py").write_text(FOLDER_LEDGER)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), *sys.path]))
    monkeypatch.setenv("AMPMETER_HANDOFF_KEY", "test-handoff-key")
    import folder_ledger

    yield folder_ledger
    sys.modules.pop("folder_ledger", None)


def run_child(token: str, how: str) -> dict[str, Any]:
    env = {**os.environ, "AMPMETER_HANDOFF": token}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, how], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_a_ledger_registered_outside_ampmeter_reaches_a_child_process(
    folder_ledger: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "budgets"
    ledger = folder_ledger.FolderLedger(folder, "team")
    monkeypatch.setenv("AMPMETER_LEDGER_ALLOW", f"folder:{folder}")
    try:
        with ExecutionContext("boss", max_cost_usd=1.0, ledger=ledger) as ctx:
            token = ctx.handoff("researcher", limits=[Limit("amp:llm_calls", 3)])
            assert propagation.decode(token).ledger["backend"] == "folder"
            child = run_child(token, "registered")
            assert child["kind"] == "FolderLedger"
            assert (child["made"], "amp:llm_calls" in child["stop"]) == (3, True)
            # a process that did not register the ledger cannot open it, and says why
            unknown = run_child(token, "unregistered")
            assert unknown["kind"] is None
            assert "'folder' is not one this process can open" in unknown["stop"]
        assert ctx.stats.total_cost() == pytest.approx(3 * 0.125)
        assert ledger.spent()["amp:cost"] == pytest.approx(3 * 0.125)
    finally:
        ledger.close()


def test_an_address_no_ledger_claims_and_an_unreachable_ledger_are_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not the address of a ledger"):
        reach.open_address("nowhere://x", "team")
    with pytest.raises(ValueError, match="no ledger file"):
        reach.open_address(str(tmp_path / "missing.sqlite3"), "team", create=False)
    assert not (tmp_path / "missing.sqlite3").exists()
    with (
        ExecutionContext("boss", ledger=InMemoryLedger("team")) as ctx,
        pytest.raises(HandoffError, match="cannot be shared with another"),
    ):
        ctx.handoff("worker")
