"""What ``ampmeter run`` imports: the parent only the CLI framework every command shares (no
other command's libraries), a child nothing until it needs to.

Not timings (those are in bench/startup_bench.py): which modules get imported, read from
``-X importtime`` and ``sys.modules``, so the test holds on a slow machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ampmeter.cli.run.config import RunConfig
from ampmeter.cli.run.parent import run_command
from ampmeter.testing.billing import BillingProvider

# What the other commands need (validation, tables, figures), which a metered run never pays for.
OTHER_COMMANDS = ("jsonschema", "duckdb", "numpy", "matplotlib")


def imported_modules(importtime_stderr: str) -> set[str]:
    names = set()
    for line in importtime_stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip())
    return names


def test_the_run_command_imports_nothing_of_the_other_commands_in_the_parent() -> None:
    launch = "import sys; from ampmeter._console_script import main; main(sys.argv[1:])"
    done = subprocess.run(
        [
            sys.executable,
            "-X",
            "importtime",
            "-c",
            launch,
            "run",
            "--max-llm-calls",
            "5",
            "--",
            sys.executable,
            "-c",
            "pass",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    parent = imported_modules(done.stderr)
    assert "ampmeter.cli.run.command" in parent  # the check reads the right process
    assert not {name for name in parent if name.split(".")[0] in OTHER_COMMANDS}
    assert "ampmeter run summary" in done.stderr


def test_a_child_that_imports_nothing_metered_does_not_load_ampmeter(tmp_path: Path) -> None:
    report = tmp_path / "modules.json"
    program = tmp_path / "plain.py"
    program.write_text(
        "import json, sys\n"
        f"json.dump(sorted(m for m in sys.modules if m.startswith('ampmeter')), open({str(report)!r}, 'w'))\n"  # noqa: E501
    )
    outcome = run_command([str(program)], RunConfig(max_llm_calls=1))
    assert outcome.exit_code == 0
    assert json.loads(report.read_text()) == ["ampmeter.integrations._hooks"]
    assert outcome.summary is not None
    assert outcome.summary["termination"] == "success" and outcome.summary["processes"] == 1


def test_a_child_that_never_metered_still_reports_its_failure(tmp_path: Path) -> None:
    program = tmp_path / "fails.py"
    program.write_text("raise ValueError('boom')\n")
    outcome = run_command([str(program)], RunConfig())
    assert outcome.exit_code == 1
    assert outcome.summary is not None and outcome.summary["termination"] == "error"


def test_importing_an_sdk_starts_metering_with_the_run_limits(tmp_path: Path) -> None:
    program = tmp_path / "late.py"
    program.write_text(
        "import sys\n"
        "assert not [m for m in sys.modules if m.startswith('ampmeter.context')]\n"
        "import openai, ampmeter\n"
        "from openai._base_client import SyncAPIClient\n"
        "ctx = ampmeter.current_context()\n"
        "assert ctx is not None and ctx.name == 'ampmeter_run', ctx\n"
        "assert hasattr(SyncAPIClient.request, '__wrapped__')\n"  # the SDK's door, metered
        "assert [l.max_value for l in ctx.limits] == [2], ctx.limits\n"
    )
    outcome = run_command([str(program)], RunConfig(max_llm_calls=2))
    assert outcome.exit_code == 0
    assert outcome.summary is not None and outcome.summary["processes"] == 1


# Three chat calls through a library below the SDKs alone: urllib (http.client) or requests
# (urllib3). The process imports none of the SDKs, yet its calls are billed all the same.
RAW_PROGRAM = """
import json, os, sys
body = json.dumps({"model": "gpt-4o-mini", "max_tokens": 10,
                   "messages": [{"role": "user", "content": "Say yes."}]}).encode()
url = os.environ["LLM_URL"] + "/chat/completions"
headers = {"Content-Type": "application/json", "Authorization": "Bearer k"}
for _ in range(3):
    if sys.argv[1] == "urllib":
        import urllib.request
        urllib.request.urlopen(urllib.request.Request(url, data=body, headers=headers)).read()
    else:
        import requests
        requests.post(url, data=body, headers=headers).raise_for_status()
"""


@pytest.mark.parametrize("library", ["urllib", "requests"])
def test_a_child_calling_through_http_client_alone_is_metered(tmp_path: Path, library: str) -> None:
    """http.client (urllib, requests) is metered, so importing it starts metering: before, such
    a program ran its three calls unmetered past --max-llm-calls 1, and the run said $0."""
    program = tmp_path / "raw.py"
    program.write_text(RAW_PROGRAM)
    prices = {"gpt-4o-mini": ("0.15", "0.60")}
    with BillingProvider(output_tokens=5, prices=prices) as bill:
        env = {**os.environ, "LLM_URL": bill.openai_base_url}
        outcome = run_command(
            [str(program), library], RunConfig(max_llm_calls=1, max_cost=1.0), env=env
        )
        billed = bill.billed_usd
    assert len(bill.requests) == 1  # the second call was stopped before it was sent
    assert outcome.exit_code == 3
    assert (outcome.summary["llm_calls"], outcome.summary["halted_calls"]) == (2, 1)
    assert outcome.summary["cost_usd"] == billed > 0
