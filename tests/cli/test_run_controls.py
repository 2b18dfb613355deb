"""``ampmeter run``'s controls (prices, caps, warnings, downgrade, pause, shared budget, dry run,
JSON result), each on a real program whose calls go through the openai SDK to a billing
provider, half of them from a child process the program starts: a control holds for the run's
whole process tree."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ampmeter.cli import app
from ampmeter.cli.run.sources import gather
from ampmeter.testing.billing import BillingProvider

# CALLS calls to MODEL (one tool call before each when TOOLS is set): the first half here, the
# rest in a child process. It prints to stdout, which --output json sends to stderr.
PROGRAM = """
import os, subprocess, sys, openai
from ampmeter import current_context
client = openai.OpenAI(base_url=os.environ["LLM_URL"], api_key="k", max_retries=0)
calls = int(os.environ["CALLS"])
mine = range(calls // 2) if sys.argv[1:] != ["child"] else range(calls // 2, calls)
for i in mine:
    if os.environ.get("TOOLS"):
        with current_context().tool_call("search") as call:
            call.record()
    client.chat.completions.create(model=os.environ["MODEL"], max_tokens=10,
        messages=[{"role": "user", "content": f"Say yes {i}."}])
    print("sent", i, flush=True)
if sys.argv[1:] != ["child"]:
    sys.exit(subprocess.run([sys.executable, __file__, "child"]).returncode)
"""
PRICES = {"gpt-4o": ("2.50", "10"), "gpt-4o-mini": ("0.15", "0.60"), "local-model": ("1", "2")}


def _run(
    tmp_path: Path, bill: BillingProvider, *args: str, calls: int = 4, **env: str
) -> tuple[int, str, str]:
    program = tmp_path / "agent.py"
    program.write_text(PROGRAM)
    environ = {
        **os.environ,
        "LLM_URL": bill.openai_base_url,
        "CALLS": str(calls),
        "MODEL": "gpt-4o-mini",
        **env,
    }
    done = subprocess.run(
        [sys.executable, "-m", "ampmeter", "run", *args, "--", str(program)],
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    return done.returncode, done.stdout, done.stderr


def _sent(bill: BillingProvider) -> list[str]:
    return [request.json()["model"] for request in bill.requests]


def test_price_prices_a_model_the_table_lacks_in_every_process(tmp_path: Path) -> None:
    with BillingProvider(output_tokens=5, prices=PRICES) as bill:
        code, _, err = _run(tmp_path, bill, "--max-cost", "1", MODEL="local-model")
        assert code == 3 and "no price" in err and _sent(bill) == []  # refused, never $0
        price = {"MODEL": "local-model", "AMPMETER_PRICE": "local-model=1/2"}
        code, out, err = _run(tmp_path, bill, "--max-cost", "1", "--output", "json", **price)
        billed = bill.billed_usd
    assert code == 0, err
    result = json.loads(out)  # stdout is the result alone: the program's lines went to stderr
    assert "sent 0" in err and "sent 3" in err
    assert result["end_reason"] == "success" and result["exit_code"] == 0
    assert result["totals"]["processes"] == 2 and result["totals"]["llm_calls"] == 4
    assert Decimal(result["totals"]["cost_usd"]) == billed > 0  # exact, at the user's price
    assert Decimal(result["models"]["local-model"]["cost_usd"]) == billed
    assert {k: Decimal(v) for k, v in result["limits"].items()} == {"amp:cost": 1}


def test_on_unpriced_warn_from_the_budget_file_lets_calls_through(tmp_path: Path) -> None:
    budget = tmp_path / "budget.toml"
    budget.write_text('max_cost = 1\non_unpriced = "warn"\n')
    with BillingProvider(output_tokens=5, prices=PRICES) as bill:
        code, _, err = _run(tmp_path, bill, "--budget-file", str(budget), MODEL="local-model")
        assert len(_sent(bill)) == 4
    assert code == 0, err
    assert "went to a model without a price" in err and "4 unpriced call(s)" in err


@pytest.mark.parametrize(
    ("args", "env", "sent"),
    [
        (["--max-steps", "2"], {}, 2),
        (["--max-tool-calls", "3"], {"TOOLS": "1"}, 3),
        ([], {"AMPMETER_MAX_TOKENS": "25"}, 2),  # output tokens: each call may write 10
    ],
    ids=["steps", "tool-calls", "tokens"],
)
def test_step_tool_and_token_caps_hold_across_the_tree(
    tmp_path: Path, args: list[str], env: dict[str, str], sent: int
) -> None:
    with BillingProvider(output_tokens=10, prices=PRICES) as bill:
        code, _, err = _run(tmp_path, bill, *args, **env)
        assert len(_sent(bill)) == sent
    assert code == 3, err
    assert "limit exceeded: amp:" in err


def test_downgrade_sends_later_calls_to_the_cheaper_model(tmp_path: Path) -> None:
    # One gpt-4o call (9 input tokens and 10 output) costs $0.0001225, past half of $0.0002:
    # every later call goes to gpt-4o-mini (a second gpt-4o call would not have fitted).
    with BillingProvider(output_tokens=10, prices=PRICES) as bill:
        args = ["--max-cost", "0.0002", "--downgrade", "gpt-4o=gpt-4o-mini@0.5"]
        code, _, err = _run(tmp_path, bill, *args, MODEL="gpt-4o")
        sent = _sent(bill)
    assert code == 0, err
    assert sent[0] == "gpt-4o" and sent[1:] == ["gpt-4o-mini"] * 3


def test_dry_run_warns_stops_nothing_and_says_what_it_would_have_stopped(
    tmp_path: Path,
) -> None:
    with BillingProvider(output_tokens=5, prices=PRICES) as bill:
        args = ["--max-llm-calls", "2", "--warn-at", "0.5", "--dry-run", "--output", "json"]
        code, out, err = _run(tmp_path, bill, *args)
        assert len(_sent(bill)) == 4
    assert code == 0, err
    assert err.count("warning: 50% of amp:llm_calls > 2 used: 1") == 1  # once, in one process
    assert "dry run: amp:llm_calls reached 3" in err
    assert "without --dry-run, amp:llm_calls > 2 would have stopped this call" in err
    result = json.loads(out)
    assert result["dry_run"] is True and result["end_reason"] == "success"
    kinds = [e["kind"] for e in result["limit_events"]]
    assert kinds == ["warning", "soft_limit"]
    passed = result["limit_events"][1]
    assert passed["limit"] == "amp:llm_calls > 2 (soft)"
    assert f"dry run          amp:llm_calls > 2 passed at call {passed['node_id']}" in err


def test_runs_with_one_ledger_and_scope_share_one_budget(tmp_path: Path) -> None:
    ledger = tmp_path / "budgets.sqlite3"
    shared = ("--ledger", str(ledger), "--scope", "team/nightly", "--max-llm-calls", "6")
    with BillingProvider(output_tokens=5, prices=PRICES) as bill:
        first = _run(tmp_path, bill, *shared)
        second = _run(tmp_path, bill, *shared)
        sent = len(_sent(bill))
    assert first[0] == 0, first[2]
    assert second[0] == 3 and sent == 6  # the second run had 2 of the 6 calls left


def test_a_paused_call_goes_on_when_the_budget_is_raised(tmp_path: Path) -> None:
    ledger = tmp_path / "budgets.sqlite3"
    program = tmp_path / "agent.py"
    program.write_text(PROGRAM)
    with BillingProvider(output_tokens=5, prices=PRICES) as bill:
        env = {**os.environ, "LLM_URL": bill.openai_base_url, "CALLS": "2", "MODEL": "gpt-4o"}
        args = ["--ledger", str(ledger), "--scope", "ci", "--max-llm-calls", "1"]
        args += ["--on-exhausted", "pause", "--", str(program)]
        run = subprocess.Popen(
            [sys.executable, "-m", "ampmeter", "run", *args],
            env=env,
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
        )
        assert run.stderr is not None
        lines: list[str] = []
        while not any("paused:" in line for line in lines):
            line = run.stderr.readline()
            assert line, "".join(lines)
            lines.append(line)
        assert len(bill.requests) == 1  # the second call waits, unsent
        hint = next(line for line in lines if "paused:" in line)
        assert "a call of process" in hint and "waits at the limit on amp:llm_calls" in hint
        assert f"ampmeter budget raise {ledger} ci amp:llm_calls NEW_MAX" in hint
        raise_it = ["budget", "raise", str(ledger), "ci", "amp:llm_calls", "2"]
        subprocess.run(
            [sys.executable, "-m", "ampmeter", *raise_it],
            check=True,
            capture_output=True,
        )
        code = run.wait(60)
        rest = run.stderr.read()
        assert len(bill.requests) == 2
    assert code == 0, "".join(lines) + rest


def test_a_pause_ends_at_its_timeout(tmp_path: Path) -> None:
    with BillingProvider(output_tokens=5, prices=PRICES) as bill:
        began = time.monotonic()
        args = ["--max-llm-calls", "1", "--on-exhausted", "pause", "--pause-timeout", "0.5"]
        code, _, err = _run(tmp_path, bill, *args, calls=2)
        assert len(bill.requests) == 1
    assert code == 3 and "pause_timeout_s ran out" in err
    assert time.monotonic() - began < 30


def test_the_command_line_beats_the_environment_which_beats_the_file(tmp_path: Path) -> None:
    budget = tmp_path / "budget.toml"
    budget.write_text(
        "max_cost = 3\nmax_steps = 30\nmax_tool_calls = 300\nwarn_at = [0.5, 0.9]\n"
        'price = ["a=1/2"]\ndowngrade = ["gpt-4o=gpt-4o-mini@0.8"]\ndry_run = true\n'
    )
    env = {"AMPMETER_MAX_STEPS": "20", "AMPMETER_MAX_COST": "2", "AMPMETER_PRICE": "b=3/4,c=5/6"}
    config = gather({"max_cost": 1.0}, {**env, "AMPMETER_BUDGET_FILE": str(budget)})
    assert (config.max_cost, config.max_steps, config.max_tool_calls) == (1.0, 20, 300)
    assert config.warn_at == [0.5, 0.9] and config.dry_run is True
    assert config.prices() == {"b": (Decimal(3), Decimal(4)), "c": (Decimal(5), Decimal(6))}
    assert config.ladder() == {0.8: {"gpt-4o": "gpt-4o-mini"}}
    assert all(limit.soft and limit.warn_at == (0.5, 0.9) for limit in config.limits())
    exact = gather({"price": ["m=0.1/0.30000000000000004"]}, {})
    assert exact.prices()["m"] == (Decimal("0.1"), Decimal("0.30000000000000004"))


@pytest.mark.parametrize(
    ("args", "file", "message"),
    [
        (
            ["--price", "gpt=abc"],
            None,
            "--price needs MODEL=IN/OUT (gpt-4o=2.50/10), got 'gpt=abc'",
        ),
        (["--price", "gpt=1/x"], None, "--price gpt=1/x: OUT must be a number of dollars"),
        (["--max-cost", "1", "--downgrade", "a=b@1.5"], None, "--downgrade a=b@1.5: FRACTION must"),
        (["--downgrade", "a=b@0.5"], None, "--downgrade acts at fractions of --max-cost"),
        (["--warn-at", "0.5"], None, "--warn-at warns at fractions of a limit"),
        (["--pause-timeout", "5"], None, "--pause-timeout ends a pause"),
        (["--scope", "team"], None, "--scope names a budget in a shared ledger"),
        (["--ledger", "memory"], None, "--ledger must be a SQLite file or a redis:// URL"),
        ([], "max_cost = 1\nmax_stepz = 3\n", "budget.toml has no key 'max_stepz'"),
        ([], "max_cost = 1\nmax_steps = = 3\n", "is not valid TOML: Invalid value (at line 2"),
        ([], 'max_steps = "3"\n', "budget.toml: max_steps must be a whole number, got '3'"),
        ([], 'price = "a=1/2"\n', "budget.toml: price must be a list of strings"),
    ],
)
def test_a_bad_control_is_one_clear_line_and_starts_nothing(
    tmp_path: Path, args: list[str], file: str | None, message: str
) -> None:
    started = tmp_path / "started"
    if file is not None:
        (tmp_path / "budget.toml").write_text(file)
        args = [*args, "--budget-file", str(tmp_path / "budget.toml")]
    program = ["--", sys.executable, "-c", f"open({str(started)!r}, 'w')"]
    result = CliRunner().invoke(app, ["run", *args, *program])
    assert result.exit_code == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("ampmeter run: error: ") and message in line, line
    assert not started.exists()


def test_a_bad_variable_is_named(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["run", "--", "true"], env={"AMPMETER_DOWNGRADE": "a=b@2", "AMPMETER_MAX_COST": "1"}
    )
    assert result.exit_code == 2
    assert "AMPMETER_DOWNGRADE a=b@2: FRACTION must be in (0, 1]" in result.stderr


def _help() -> Any:
    return CliRunner().invoke(app, ["run", "-h"], env={"COLUMNS": "100"}).stdout


def test_run_help_lists_every_control_in_groups() -> None:
    text = _help()
    for group in ("Limits", "Prices and what happens at a limit", "Shared budget", "Output"):
        assert group in text
    for flag in (
        "--price",
        "--on-unpriced",
        "<refuse|warn|allow>",
        "--max-steps",
        "--max-tool-calls",
        "--max-tokens",
        "--warn-at",
        "--downgrade",
        "--on-exhausted",
        "--pause-timeout",
        "--ledger",
        "--scope",
        "--dry-run",
        "--budget-file",
        "--output",
        "<text|json>",
    ):
        assert flag in text, flag
    assert "beats the environment, which beats the budget file" in " ".join(text.split())
