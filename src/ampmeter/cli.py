"""The ``ampmeter`` command line (placeholder until the CLI work lands)."""

from __future__ import annotations

import sys

from ampmeter.graph import ExecutionGraph


def _demo() -> int:
    graph = ExecutionGraph(chain_id="demo")
    root = graph.create_root("agent_run")
    for step in range(1, 4):
        llm = graph.begin_node(root, "llm", f"step_{step}", model="gpt-4o-mini")
        graph.mark_running(llm)
        graph.mark_success(llm, cost_usd=0.0003 * step, tokens_in=400 * step, tokens_out=60)
        tool = graph.begin_node(llm, "tool", "calculator")
        graph.mark_running(tool)
        graph.mark_success(tool, cost_usd=0.0)
    halted = graph.begin_node(root, "llm", "step_4", model="gpt-4o-mini")
    graph.mark_halt(halted, stop_reason="limit amp:cost exceeded")
    graph.mark_success(root, 0.0)
    agg = graph.snapshot()["aggregates"]
    for key, value in agg.items():
        print(f"{key:>22}  {value}")
    return 0


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``ampmeter`` console script."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["demo"]:
        raise SystemExit(_demo())
    print("usage: ampmeter demo", file=sys.stderr)
    raise SystemExit(2)
