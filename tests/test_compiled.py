"""The compiled hot path: present where it is expected, and the same API as the sources."""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

import ampmeter
from ampmeter import ExecutionContext, ExecutionStats, Limit
from ampmeter.graph import Node

HOT_MODULES = ("keys", "stats", "_limit_check", "graph", "context", "sinks._lines")
EXPECT_COMPILED = os.environ.get("AMPMETER_EXPECT_COMPILED") == "1"
ROOT = Path(__file__).resolve().parent.parent


def _is_extension(module_name: str) -> bool:
    module = importlib.import_module(f"ampmeter.{module_name}")
    path = str(getattr(module, "__file__", ""))
    return path.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


@pytest.mark.skipif(not EXPECT_COMPILED, reason="the plain-source run (make test runs both)")
def test_the_hot_modules_are_the_compiled_ones() -> None:
    """make test sets AMPMETER_EXPECT_COMPILED: a broken compile must not pass as plain Python."""
    assert [m for m in HOT_MODULES if not _is_extension(m)] == []
    assert hasattr(Node, "__mypyc_attrs__")


def test_the_other_modules_are_plain_python() -> None:
    for name in ("limits", "errors", "trace", "executor", "sinks.jsonl"):
        module = importlib.import_module(f"ampmeter.{name}")
        assert Path(str(module.__file__)).suffix == ".py"


def test_compiled_and_plain_agree_on_what_is_all_one_package() -> None:
    assert (
        Path(ampmeter.__file__).parent
        == Path(str(importlib.import_module("ampmeter.context").__file__)).parent
    )


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: ExecutionStats().incr_counter("k", 1.5), "delta must be an int, got float"),
        (lambda: ExecutionStats().incr_gauge("k", True), "delta must be a number, got bool"),
        (lambda: ExecutionContext(max_cost_usd=True), "max_cost_usd must be a number, got bool"),
        (lambda: ExecutionContext().llm_call(model=4), "model must be a str or None, got int"),
        (lambda: Limit("k", True), "max_value must be a number, got bool"),
    ],
)
def test_wrong_types_get_ampmeters_own_message_in_either_build(call: object, message: str) -> None:
    """The compiled build would check annotations itself, with a message naming no argument and
    turning True into 1.0; ampmeter's own checks must run first."""
    assert callable(call)
    with pytest.raises(TypeError) as raised:
        call()
    assert message in str(raised.value)


def test_a_bool_is_not_taken_as_a_number_of_tokens() -> None:
    with ExecutionContext() as ctx, ctx.llm_call("x") as call, pytest.raises(TypeError):
        call.record(tokens_in=True, tokens_out=1)


def _build_wheel(out: Path, **env: str) -> Path:
    uv = os.environ.get("AMPMETER_UV") or shutil.which("uv")
    if not uv:
        pytest.fail("uv is needed to build a wheel (make test installs it and sets AMPMETER_UV)")
    result = subprocess.run(
        [uv, "build", "--wheel", "--out-dir", str(out), str(ROOT)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = out.glob("*.whl")
    return wheel


@pytest.mark.slow
def test_a_built_wheel_ships_the_compiled_hot_path(tmp_path: Path) -> None:
    wheel = _build_wheel(tmp_path, AMPMETER_REQUIRE_COMPILED="1")
    assert not wheel.name.endswith("-py3-none-any.whl")  # tagged for this interpreter
    names = zipfile.ZipFile(wheel).namelist()
    extensions = {n.split(".")[0].replace("/", ".") for n in names if n.endswith(".so")}
    assert {f"ampmeter.{m}" for m in HOT_MODULES} <= extensions
    assert any(e.endswith("__mypyc") for e in extensions)  # mypyc's shared runtime
    assert "ampmeter/context.py" in names  # the sources stay beside the extensions


@pytest.mark.slow
def test_a_pure_python_wheel_can_be_asked_for(tmp_path: Path) -> None:
    wheel = _build_wheel(tmp_path, AMPMETER_PURE_PYTHON="1")
    assert wheel.name.endswith("-py3-none-any.whl")
    assert not [n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".so")]
