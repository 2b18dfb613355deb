"""The graph's lifecycle does each thing once: the ampmeter functions one begin -> running ->
success enters, by name, so that a check made twice or a layer that only forwards shows here."""

from __future__ import annotations

import pytest

from ampmeter.graph import ExecutionGraph
from support.entered import entered


def _entered(graph: ExecutionGraph, root: str) -> list[str]:
    def lifecycle() -> None:
        node = graph.begin_node(root, "llm", "step", "gpt-4o-mini")
        graph.mark_running(node)
        graph.mark_success(node, 0.00125, 1200, 350)

    return entered(lifecycle, lambda frame: frame.f_globals["__name__"].startswith("ampmeter."))


def test_a_node_lifecycle_checks_each_argument_once_and_finds_the_node_once_per_step() -> None:
    graph = ExecutionGraph()
    root = graph.create_root("run")
    assert _entered(graph, root) == [
        "ExecutionGraph.begin_node",
        "check_node",  # kind, name and model in one call
        "NodeTable.begin",  # the parent's lookup is its id's check; it numbers the node
        "__create_fn__.<locals>.__init__",  # the Node, built once
        "ExecutionGraph.mark_running",
        "NodeTable.node",  # the lookup is the id's check
        "NodeTable.run",
        "ExecutionGraph.mark_success",
        "ExecutionGraph._end",
        "to_nano",  # the cost, read once
        "optional_counts",  # both token counts at once
        "Kernel.end_unowned",  # finds the node once, asks once whether a call owns it
        "NodeTable.node",
        "NodeTable._end_locked",  # (the cost stays whole nano-dollars: no Decimal is made)
    ]
    node = graph.nodes()[-1]
    assert (node.status, node.cost_usd, node.tokens_in, node.tokens_out) == (
        "success",
        graph.aggregates()["total_cost_usd"],
        1200,
        350,
    )


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda g: g.begin_node(["n000001"], "llm", "x"), "parent_id must be a str, got list"),
        (lambda g: g.begin_node(None, "llm", "x"), "parent_id must be a str, got NoneType"),
        (lambda g: g.mark_running({"n": 1}), "node_id must be a str, got dict"),
        (lambda g: g.mark_success(["n000002"], 0.1), "node_id must be a str, got list"),
        (lambda g: g.update_metadata(3, {}), "node_id must be a str, got int"),
        (lambda g: g.node(b"n000002"), "node_id must be a str, got bytes"),
    ],
)
def test_an_id_that_is_no_str_is_a_type_error_naming_it(call: object, message: str) -> None:
    graph = ExecutionGraph()
    root = graph.create_root("run")
    graph.begin_node(root, "llm", "x")
    before = graph.snapshot()["nodes"]
    with pytest.raises(TypeError, match=message):
        call(graph)  # type: ignore[operator]
    assert graph.snapshot()["nodes"] == before


def test_a_parent_id_of_none_makes_no_root() -> None:
    graph = ExecutionGraph()
    with pytest.raises(TypeError, match="parent_id must be a str, got NoneType"):
        graph.begin_node(None, "llm", "x")  # type: ignore[arg-type]
    assert len(graph) == 0 and graph.root_id is None


def test_the_root_takes_no_cost_and_an_ended_node_takes_no_change() -> None:
    graph = ExecutionGraph()
    root = graph.create_root("run")
    with pytest.raises(ValueError, match="the root node carries no cost or tokens"):
        graph.mark_success(root, 0.5)
    assert graph.node(root).status == "running"
    graph.mark_success(root, 0)
    graph.mark_halt(root, cost_usd=0.5)  # ended: no change, as for any node
    assert (graph.node(root).status, graph.aggregates()["total_cost_usd"]) == ("success", 0)


@pytest.mark.parametrize(
    ("kind", "name", "model", "error", "message"),
    [
        (["llm"], 5, None, TypeError, "kind must be a str, got list"),
        ("agent", 5, None, ValueError, "unknown node kind 'agent'"),
        ("llm", 5, 7, TypeError, "name must be a str, got int"),
        ("llm", "x", 7, TypeError, "model must be a str, got int"),
    ],
)
def test_begin_node_checks_its_arguments_at_once_and_names_the_first_bad_one(
    kind: object, name: object, model: object, error: type[Exception], message: str
) -> None:
    graph = ExecutionGraph()
    root = graph.create_root("run")
    with pytest.raises(error, match=message):
        graph.begin_node(root, kind, name, model)  # type: ignore[arg-type]
    assert len(graph) == 1


def test_begin_node_takes_str_subclasses() -> None:
    class Label(str):
        pass

    graph = ExecutionGraph()
    node = graph.begin(graph.create_root("run"), Label("tool"), Label("search"), Label("m"))
    assert (node.kind, node.name, node.model, node.node_id) == ("tool", "search", "m", "n000002")
