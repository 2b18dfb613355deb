"""The package's source keeps the rules a maintainer relies on: small modules, layout decided by
the formatter, and no module reaching into another module's private names."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "ampmeter"
MODULES = sorted(PACKAGE.rglob("*.py"))
MAX_LINES = 500


def _name(path: Path) -> str:
    return str(path.relative_to(PACKAGE.parent))


def _is_module(dotted: str) -> bool:
    path = PACKAGE.parent.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def test_the_rules_see_the_whole_package() -> None:
    assert len(MODULES) > 100
    assert PACKAGE / "_core" / "kernel.py" in MODULES


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_no_module_is_over_700_lines(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{_name(path)} has {lines} lines: split it by what it does"


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_the_formatter_decides_every_layout(path: Path) -> None:
    text = path.read_text()
    assert "fmt: skip" not in text and "fmt: off" not in text, _name(path)


def _private_imports(source: str) -> list[str]:
    """The private names ``source`` imports from other ampmeter modules (not private modules,
    which a package may import: that is what they are for)."""
    return [
        f"{node.module}.{alias.name} (line {node.lineno})"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ampmeter")
        for alias in node.names
        if alias.name.startswith("_")
        and not alias.name.startswith("__")
        and not _is_module(f"{node.module}.{alias.name}")
    ]


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_no_module_imports_another_modules_private_names(path: Path) -> None:
    taken = _private_imports(path.read_text())
    assert taken == [], f"{_name(path)} imports private names (make them public there): {taken}"


def test_the_private_import_rule_finds_a_private_name_and_allows_a_private_module() -> None:
    source = (
        "from ampmeter.analysis._duck import _Hidden, read_inputs\n"
        "from ampmeter import _validate\n"
        "from ampmeter._core import kernel\n"
    )
    assert _private_imports(source) == ["ampmeter.analysis._duck._Hidden (line 1)"]


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_no_call_passes_eight_or_more_arguments_by_position(path: Path) -> None:
    """Eight positional arguments cannot be read without counting: name them (issue 38)."""
    found = [
        f"line {node.lineno}: {ast.unparse(node.func)}({len(node.args)})"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and len(node.args) >= 8
    ]
    assert found == [], f"{_name(path)}: {found}"
