"""``ampmeter run``: config parsing, and end-to-end runs of real programs in a subprocess."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from ampmeter.cli import app as cli_app
from ampmeter.cli.run.config import RunConfig, parse_model_limits
from ampmeter.cli.run.parent import EXIT_LIMIT, run_command
from ampmeter.cli.run.sources import gather
from ampmeter.local_llm import LocalLLMServer
from ampmeter.logs.schema import validate_event

LOOP = """
import os, openai
client = openai.OpenAI(base_url=os.environ["LLM_URL"], api_key="k", max_retries=0)
for i in range(100):
    client.chat.completions.create(model=os.environ["LLM_MODEL"], max_tokens=2,
        messages=[{"role": "user", "content": "Say yes. " * (i + 1)}])
    print("call", i, flush=True)
"""


def app() -> typer.Typer:
    return cli_app


def test_parse_model_limits() -> None:
    assert parse_model_limits(["gpt-4o=100", " a=b=7 "]) == {"gpt-4o": 100, "a=b": 7}
    for bad in ("gpt-4o", "=5", "m=x", "m=-1"):
        with pytest.raises(
            ValueError, match=r"^--max-tokens-per-model .*(MODEL=N|whole number|>= 0)"
        ):
            gather({"max_tokens_per_model": [bad]}, {})


def test_config_from_env_and_flags_win() -> None:
    env = {
        "AMPMETER_MAX_COST": "0.5",
        "AMPMETER_MAX_LLM_CALLS": "9",
        "AMPMETER_MAX_TOKENS_PER_MODEL": "m1=10,m2=20",
        "AMPMETER_OUT": "x.jsonl",
    }
    config = gather({"max_llm_calls": 3}, env)
    assert (config.max_cost, config.max_llm_calls, config.out) == (0.5, 3, "x.jsonl")
    assert config.max_tokens_per_model == {"m1": 10, "m2": 20}
    assert {limit.key for limit in config.limits()} == {
        "amp:cost",
        "amp:llm_calls",
        "amp:input_tokens:m1",
        "amp:input_tokens:m2",
    }


@pytest.mark.parametrize("env", [{"AMPMETER_MAX_COST": "lots"}, {"AMPMETER_MAX_LLM_CALLS": "2.5"}])
def test_bad_env_value_is_named(env: dict[str, str]) -> None:
    with pytest.raises(ValueError, match=next(iter(env))):
        gather({}, env)


def test_negative_or_nan_limits_are_refused() -> None:
    with pytest.raises(ValueError, match=r"^--max-cost must be a finite number >= 0"):
        RunConfig(max_cost=-1.0)
    with pytest.raises(ValueError, match=r"^--timeout must be"):
        RunConfig(timeout=float("nan"))
    with pytest.raises(ValueError, match=r"^--grace must be"):
        RunConfig(grace=-2.0)
    with pytest.raises(ValueError, match="no command"):
        run_command([], RunConfig())


def test_exit_code_passes_through_and_existing_sitecustomize_still_runs(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os\nos.environ['USER_SITE_RAN'] = '1'\n")
    script = tmp_path / "prog.py"
    script.write_text(
        "import os, sys\nfrom ampmeter.integrations import is_instrumented\n"
        "assert os.environ.get('USER_SITE_RAN') == '1'\n"
        "assert is_instrumented()\nsys.exit(7)\n"
    )
    env = {**__import__("os").environ, "PYTHONPATH": str(site)}
    outcome = run_command([str(script)], RunConfig(), env=env)
    assert outcome.exit_code == 7
    assert outcome.summary is not None and outcome.summary["llm_calls"] == 0


def test_cli_requires_a_command() -> None:
    result = CliRunner().invoke(app(), ["run"])
    assert result.exit_code != 0


def test_cli_bad_per_model_flag_is_a_clear_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app(), ["run", "--max-tokens-per-model", "oops", "--", sys.executable, "-c", "pass"]
    )
    assert result.exit_code == 2
    assert "MODEL=N" in result.output


def test_loop_on_local_model_is_stopped_by_limit(
    tmp_path: Path, llm_server: LocalLLMServer
) -> None:
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    out = tmp_path / "events.jsonl"
    env = {"LLM_URL": llm_server.base_url, "LLM_MODEL": llm_server.model}
    result = CliRunner().invoke(
        app(),
        ["run", "--max-llm-calls", "2", "--out", str(out), "--", sys.executable, str(script)],
        env=env,
    )
    assert result.exit_code == EXIT_LIMIT
    assert "ampmeter run: stopped: limit exceeded: amp:llm_calls" in result.output
    assert "LLM calls" in result.output and "context growth" in result.output
    events = [json.loads(line) for line in out.read_text().splitlines()]
    for event in events:
        validate_event(event)
    statuses = [e["metadata"]["status"] for e in events if e["event_type"] == "llm_completion"]
    assert statuses == ["success", "success", "halt"]
    first, second = (e["usage"]["prompt_tokens"] for e in events[:2])
    assert second > first  # the prompt grew, and the log shows it
