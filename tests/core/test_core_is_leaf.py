"""The core is a leaf: ``ampmeter._core`` imports nothing of ampmeter but itself and the shared
vocabulary, not even for the type checker, and the vocabulary imports nothing above it.

Contexts hand the core its steps, prices (by protocol), sinks (by protocol) and ledgers, so
that a change above the core never reaches into it (issue 38, point 1).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "ampmeter"
VOCABULARY = frozenset(
    # What every layer shares; _validate and redact are the checks and the error text the
    # vocabulary itself is made with.
    {"keys", "node", "limits", "errors", "money", "_validate", "redact"}
)


def _imported(path: Path) -> set[str]:
    """Every ampmeter module ``path`` names in an import, wherever the import stands (in a
    function or under ``TYPE_CHECKING`` too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ampmeter"):
            if node.module == "ampmeter":
                found.update(f"ampmeter.{alias.name}" for alias in node.names)
            else:
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("ampmeter"))
    return found


def _part(module: str) -> str:
    return module.split(".")[1]


@pytest.mark.parametrize("path", sorted((SRC / "_core").glob("*.py")), ids=lambda p: p.name)
def test_the_core_imports_only_itself_and_the_vocabulary(path: Path) -> None:
    above = {m for m in _imported(path) if _part(m) != "_core" and _part(m) not in VOCABULARY}
    assert not above, f"_core/{path.name} imports {sorted(above)}: hand it what it needs"


@pytest.mark.parametrize("name", sorted(VOCABULARY))
def test_the_vocabulary_imports_nothing_above_it(name: str) -> None:
    above = {m for m in _imported(SRC / f"{name}.py") if _part(m) not in VOCABULARY}
    assert not above, f"{name}.py imports {sorted(above)}"


@pytest.mark.parametrize(
    "path",
    [*sorted((SRC / "policies").glob("*.py")), *sorted((SRC / "shared").glob("*.py"))],
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_steps_never_import_contexts_or_stats(path: Path) -> None:
    facade = {"context", "call", "stats", "graph", "_calls"}
    reached = {m for m in _imported(path) if _part(m) in facade}
    assert not reached, f"{path.parent.name}/{path.name} imports {sorted(reached)}"


@pytest.mark.parametrize(
    "path",
    [
        *sorted((SRC / "_core").glob("*.py")),
        *sorted((SRC / "policies").glob("*.py")),
        *sorted((SRC / "shared").glob("*.py")),
        *(SRC / f"{name}.py" for name in ("call", "_calls", "context")),
    ],
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_chain_names_one_thing_the_run(path: Path) -> None:
    """ "Chain" is the run's call tree (``chain_id``) only: the admission steps are an
    ``Admission``, the frames or levels up to the root an ``ancestry``."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.ClassDef):
            names.add(node.name)
    assert not names & {"chain", "_chain", "Chain"}, path.name
