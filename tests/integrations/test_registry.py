"""The integrations' one table: each row says what a library's import patches, and how to undo
it; instrument() and uninstrument() read nothing else."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator

import pytest

import ampmeter.integrations as integrations
from ampmeter.integrations import Integration, instrument, is_instrumented, uninstrument

# A provider module of the test's own: its patch marks the library module it is given.
PROVIDER = types.ModuleType("amp_test_provider")
PROVIDER.patched = []  # type: ignore[attr-defined]


def _patch(module: types.ModuleType) -> None:
    module.metered = True  # type: ignore[attr-defined]
    PROVIDER.patched.append(module.__name__)  # type: ignore[attr-defined]


def _undo() -> None:
    for name in PROVIDER.patched:  # type: ignore[attr-defined]
        vars(sys.modules[name]).pop("metered", None)
    PROVIDER.patched.clear()  # type: ignore[attr-defined]


PROVIDER.patch = _patch  # type: ignore[attr-defined]
PROVIDER.undo = _undo  # type: ignore[attr-defined]


@pytest.fixture
def new_provider(monkeypatch: pytest.MonkeyPatch) -> Iterator[Integration]:
    """One more row in the table, for a library ``amp_test_library`` not imported yet."""
    monkeypatch.setitem(sys.modules, "amp_test_provider", PROVIDER)
    row = Integration(
        "amp_test_library", ("http",), "amp_test_provider:patch", "amp_test_provider:undo"
    )
    monkeypatch.setattr(integrations, "INTEGRATIONS", (*integrations.INTEGRATIONS, row))
    yield row
    uninstrument()
    sys.modules.pop("amp_test_library", None)


def test_every_row_names_a_patch_and_an_undo_that_exist() -> None:
    triggers = [row.trigger for row in integrations.INTEGRATIONS]
    assert len(triggers) == len(set(triggers))  # one row per library module
    for row in integrations.INTEGRATIONS:
        for target in (row.patch, row.undo):
            module, _, name = target.partition(":")
            assert callable(getattr(__import__(module, fromlist=[name]), name)), target
        assert row.switches and set(row.switches) <= {
            "openai",
            "anthropic",
            "http",
            "llama_index",
            "threads",
            "mcp",
        }


def test_a_new_row_is_patched_on_import_and_undone(
    new_provider: Integration, monkeypatch: pytest.MonkeyPatch
) -> None:
    library = types.ModuleType("amp_test_library")
    assert "amp_test_library" not in instrument(http=True)  # not imported yet: armed
    # The import hook patches the module when it is imported.
    import importlib.abc
    import importlib.machinery

    class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name: str, path: object, target: object = None) -> object:
            if name != "amp_test_library":
                return None
            return importlib.machinery.ModuleSpec(name, self)

        def create_module(self, spec: object) -> types.ModuleType:
            return library

        def exec_module(self, module: types.ModuleType) -> None:
            return None

    monkeypatch.setattr(sys, "meta_path", [*sys.meta_path, Finder()])
    imported = importlib.import_module("amp_test_library")
    assert imported.metered is True
    assert is_instrumented()
    uninstrument()
    assert not hasattr(imported, "metered")
    assert PROVIDER.patched == []  # type: ignore[attr-defined]


def test_a_row_is_armed_only_by_its_own_switch(new_provider: Integration) -> None:
    library = types.ModuleType("amp_test_library")
    sys.modules["amp_test_library"] = library
    switches = dict.fromkeys(
        ("openai", "anthropic", "http", "llama_index", "threads", "mcp"), False
    )
    assert "amp_test_library" not in instrument(**switches)
    assert not hasattr(library, "metered")
    assert instrument(**{**switches, "http": True}).count("amp_test_library") == 1
    assert library.metered is True  # type: ignore[attr-defined]
