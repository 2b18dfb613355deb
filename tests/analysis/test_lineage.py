"""Reading ``metadata.contexts`` (the contexts a call ran in, root first) from logs that may
hold anything: a shape ampmeter never writes is no lineage, never an error or a wrong name."""

from __future__ import annotations

from typing import Any

import pytest

from ampmeter.analysis.lineage import (
    RunContexts,
    is_own_stop,
    lineage_of,
    process_of,
    run_labels,
    stop_owner,
)

ROOT = {"name": "research_run", "limits": {"amp:cost": "0.0004"}, "id": "7", "pid": 42, "host": "h"}
CHILD = {"name": "researcher-0", "limits": {"amp:llm_calls": 2}}
STOP = "limit exceeded: amp:llm_calls = 3 > 2"


@pytest.mark.parametrize(
    "contexts",
    [
        None,
        "research_run",
        [],
        [{"limits": {}}],
        [ROOT, {"name": ""}],
        [ROOT, ["researcher-0"]],
        {"name": "research_run"},
    ],
)
def test_a_shape_ampmeter_never_writes_is_no_lineage(contexts: Any) -> None:
    metadata = {"contexts": contexts}
    run = RunContexts()
    assert lineage_of(metadata) is None and run.add_root(metadata) is None and run.name is None
    assert is_own_stop(metadata, STOP)  # read as before lineages were logged


def test_bad_values_inside_a_lineage_are_left_out() -> None:
    root = {
        "name": "r",
        "limits": {"amp:cost": "NaN", "amp:steps": True, "k": "x", 3: 1},
        "pid": -1,
        "host": 5,
    }
    found = lineage_of({"contexts": [root]})
    assert found is not None and found[0].limits == {} and found[0].pid is None
    assert found[0].host is None and process_of(found, {"pid": "9"}) is None


def test_the_context_that_set_a_limit_owns_its_stop() -> None:
    lineage = lineage_of({"contexts": [ROOT, CHILD]})
    assert lineage is not None
    assert stop_owner(lineage, STOP) == 1
    assert stop_owner(lineage, "limit exceeded: amp:cost = $0.00041 > $0.0004") == 0
    assert stop_owner(lineage, "limit exceeded: amp:cost = $0.2 > $0.1") is None  # no one's
    assert not is_own_stop({"contexts": [ROOT, CHILD]}, STOP)
    assert process_of(lineage, {}) == ("h", 42)


def test_a_run_is_named_by_its_own_process_root_and_labels_tell_names_apart() -> None:
    worker = {"contexts": [{"name": "process 9"}], "pid": 9}
    own = {"contexts": [ROOT]}
    run = RunContexts()
    run.add_root(worker)
    assert run.name == "process 9"
    run.add_root(own)
    assert run.name == "research_run"  # the run's own process's root is taken over another's
    labels = run_labels([("a", "x"), ("b", "x"), ("c", "y"), ("0123456789abcdef", None)])
    assert labels == {"a": "x (a)", "b": "x (b)", "c": "y", "0123456789abcdef": "0123456789abcdef"}
