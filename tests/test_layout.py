"""The test tree stays runnable on the core install, and its folders stay apart.

``pytest tests/core`` runs with nothing but the core package and the test runner installed. Building
such an environment in the suite would be slow, so this checks the same thing statically: every
module that run imports at load time (the root conftest and its plugins, each module under
tests/core, and every project module they reach) imports only the standard library, the core's own
dependencies and the test runner. Imports inside functions are left out: they run on demand, and
that is how the core reaches an extra only when asked to.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src"
AREAS = ("core", "context", "policies", "shared", "pricing", "integrations", "analysis", "cli")
RUNNER = frozenset({"pytest", "pytest-asyncio", "pytest-timeout", "hypothesis"})


def _normalized(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()


def core_distributions() -> frozenset[str]:
    """The distributions the core install brings: ampmeter's requirements without an extra."""
    requirements = importlib.metadata.requires("ampmeter") or []
    names = set()
    for requirement in requirements:
        if "extra ==" in requirement:
            continue
        match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
        assert match is not None, requirement
        names.add(_normalized(match.group()))
    return frozenset(names)


def module_file(name: str) -> Path | None:
    """The file of a project module (``ampmeter...`` in src, ``support...`` in tests)."""
    parts = name.split(".")
    if parts[0] == "ampmeter":
        base = SRC.joinpath(*parts)
    elif parts[0] == "support":
        base = TESTS.joinpath(*parts)
    else:
        return None
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _load_time_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Statements that run when the module is imported: not function bodies, nor the branch
    taken only by type checkers."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from _load_time_statements(node.body)
            yield from _load_time_statements(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody):
                yield from _load_time_statements(block)
            for handler in node.handlers:
                yield from _load_time_statements(handler.body)
        elif isinstance(node, (ast.With, ast.ClassDef)):
            yield from _load_time_statements(node.body)


def _package_of(path: Path, name: str) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def imported_names(path: Path, name: str) -> Iterator[str]:
    """Every module name the file imports at load time, submodules of ``from`` imports included,
    and the plugins a conftest registers."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in _load_time_statements(tree.body):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = _package_of(path, name).split(".")
                anchor = ".".join(package[: len(package) - node.level + 1])
                base = f"{anchor}.{base}" if base else anchor
            yield base
            for alias in node.names:
                if module_file(f"{base}.{alias.name}") is not None:
                    yield f"{base}.{alias.name}"
        elif isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "pytest_plugins"
            for target in node.targets
        ):
            plugins = ast.literal_eval(node.value)
            yield from [plugins] if isinstance(plugins, str) else plugins


def _with_parents(name: str) -> Iterator[str]:
    parts = name.split(".")
    for end in range(1, len(parts) + 1):
        yield ".".join(parts[:end])


def third_party_imports(start: dict[str, Path]) -> dict[str, str]:
    """Each third-party module reached from ``start``, mapped to the chain of modules that
    imports it (for the failure message)."""
    seen: dict[str, str] = {}
    found: dict[str, str] = {}
    todo = [(name, path, name) for name, path in start.items()]
    while todo:
        name, path, chain = todo.pop()
        if name in seen:
            continue
        seen[name] = chain
        for imported in imported_names(path, name):
            for module in _with_parents(imported):
                file = module_file(module)
                if file is not None:
                    todo.append((module, file, f"{chain} -> {module}"))
                    continue
                top = module.partition(".")[0]
                if top in ("ampmeter", "support") or top in sys.stdlib_module_names:
                    continue
                found.setdefault(top, f"{chain} -> {imported}")
                break
    return found


def core_run_modules() -> dict[str, Path]:
    """What ``pytest tests/core`` loads: the root conftest and every module under tests/core."""
    modules = {"conftest": TESTS / "conftest.py"}
    for path in sorted((TESTS / "core").rglob("*.py")):
        modules[f"core.{path.relative_to(TESTS / 'core').with_suffix('').as_posix()}"] = path
    return modules


def allowed_distributions() -> frozenset[str]:
    return core_distributions() | RUNNER


def test_the_core_tests_and_the_root_conftest_need_only_the_core_install() -> None:
    distributions = importlib.metadata.packages_distributions()
    allowed = allowed_distributions()
    outside = {
        top: chain
        for top, chain in third_party_imports(core_run_modules()).items()
        if not {_normalized(d) for d in distributions.get(top, [])} & allowed
    }
    assert outside == {}, (
        "tests/core must run on the core install (pip install ampmeter, plus the test runner); "
        f"these imports need something else: {outside}. Move the test to the folder of its area."
    )


def test_the_check_sees_an_extra_reached_through_a_project_module(tmp_path: Path) -> None:
    """The walk follows project modules: a core test reaching the OpenTelemetry sink (whose
    module imports the SDK, guarded by a clearer error) is caught through it."""
    probe = tmp_path / "test_probe.py"
    probe.write_text(
        "from ampmeter.sinks.jsonl import JsonlSink\nfrom ampmeter.sinks.otel import OtelSink\n",
        encoding="utf-8",
    )
    found = third_party_imports({"core.test_probe": probe})
    assert set(found) == {"opentelemetry", "orjson"}
    assert found["opentelemetry"].startswith("core.test_probe -> ampmeter.sinks.otel")


def test_the_core_install_is_read_from_the_package_metadata() -> None:
    distributions = core_distributions()
    assert "orjson" in distributions
    assert distributions.isdisjoint({"openai", "anthropic", "redis", "typer", "duckdb"})


@pytest.mark.parametrize("area", AREAS)
def test_each_area_has_its_own_test_folder(area: str) -> None:
    assert sorted((TESTS / area).glob("test_*.py")), f"tests/{area} holds no test module"


def test_test_modules_do_not_import_each_other() -> None:
    """Builders shared between test modules live in tests/support, so a folder runs alone."""
    tests = {path.stem for path in TESTS.rglob("test_*.py")}
    offenders = [
        f"{path.relative_to(TESTS)} imports {imported}"
        for path in sorted(TESTS.rglob("*.py"))
        for imported in imported_names(path, path.stem)
        if imported.partition(".")[0] in tests
    ]
    assert offenders == []
