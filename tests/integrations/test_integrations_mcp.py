"""MCP tools metered against a real MCP server started by the test, over stdio and over
streamable HTTP: the calls the server ran equal the tool nodes recorded, a priced tool counts
toward the cost cap, and a tool limit stops the next call before the server sees it."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from decimal import Decimal
from pathlib import Path

import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from ampmeter import ExecutionContext, LimitExceeded, Node
from ampmeter.pricing import clear_tool_prices, set_tool_price, tool_price
from ampmeter.sinks.memory import MemorySink

pytestmark = pytest.mark.usefixtures("instrumented")  # conftest.py

SERVER = r'''
import sys
import time
from mcp.server.mcpserver import MCPServer

log_path = sys.argv[1]
server = MCPServer("ampmeter-test")

def ran(name):
    with open(log_path, "a") as log:
        log.write(name + "\n")

@server.tool()
def web_search(query: str) -> str:
    """A paid search."""
    ran("web_search")
    return f"results for {query}"

@server.tool()
def add(a: int, b: int) -> int:
    """A free tool."""
    ran("add")
    return a + b

@server.tool()
def web_slow(seconds: float) -> str:
    """A paid search that takes its time."""
    ran("web_slow")
    time.sleep(seconds)
    return "late results"

@server.tool()
def broken() -> str:
    """A tool that fails."""
    ran("broken")
    raise ValueError("no")

if len(sys.argv) > 2:
    server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
else:
    server.run()
'''


@pytest.fixture
def server_script(tmp_path: Path) -> Path:
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    return script


@pytest.fixture(autouse=True)
def prices() -> Iterator[None]:
    clear_tool_prices()
    set_tool_price("web_*", usd=0.25)
    yield
    clear_tool_prices()


def tool_nodes(sink: MemorySink) -> list[Node]:
    return [n for n in sink.nodes if n.kind == "tool"]


def ran(log: Path) -> list[str]:
    return log.read_text().split() if log.exists() else []


@asynccontextmanager
async def stdio_session(script: Path, log: Path) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(command=sys.executable, args=[str(script), str(log)])
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


@pytest.fixture
def http_server(server_script: Path, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tmp_path / "http-calls.log"
    process = subprocess.Popen(
        [sys.executable, str(server_script), str(log), str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as client:
                if client.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        else:
            pytest.fail("the MCP server did not start")
        yield f"http://127.0.0.1:{port}/mcp", log
    finally:
        process.terminate()
        process.wait(timeout=10)


async def test_stdio_tools_are_nodes_priced_and_stopped_before_running(
    server_script: Path, tmp_path: Path
) -> None:
    log = tmp_path / "calls.log"
    sink = MemorySink()
    assert tool_price("web_search") == Decimal("0.25")
    async with (
        stdio_session(server_script, log) as session,
        ExecutionContext(max_cost_usd=0.5, sinks=[sink]) as ctx,
    ):
        first = await session.call_tool("web_search", {"query": "paris"})
        added = await session.call_tool("add", arguments={"a": 2, "b": 3})
        failed = await session.call_tool("broken", {})
        second = await session.call_tool("web_search", {"query": "oslo"})
        with pytest.raises(LimitExceeded):  # a third $0.25 search would pass $0.50
            await session.call_tool("web_search", {"query": "rome"})
    assert not first.is_error and not second.is_error and failed.is_error
    assert added.structured_content == {"result": 5}
    assert ran(log) == ["web_search", "add", "broken", "web_search"]  # rome never ran
    nodes = tool_nodes(sink)
    assert [(n.name, n.status) for n in nodes] == [
        ("web_search", "success"),
        ("add", "success"),
        ("broken", "fail"),
        ("web_search", "success"),
        ("web_search", "halt"),
    ]
    assert [n.cost_usd for n in nodes[:4]] == [pytest.approx(0.25), 0, 0, pytest.approx(0.25)]
    assert ctx.stats.get_counter("amp:tool_calls:web_search") == 2
    assert ctx.graph.aggregates()["total_tool_calls"] == 5
    assert all(n.parent_id == ctx.node_id for n in nodes)


async def test_streamable_http_tools_obey_a_per_tool_limit(
    http_server: tuple[str, Path],
) -> None:
    from ampmeter import Limit

    url, log = http_server
    sink = MemorySink()
    limits = [Limit("amp:tool_calls:add", 2)]
    async with (
        streamable_http_client(url) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        async with ExecutionContext(limits=limits, sinks=[sink]) as ctx:
            for n in range(2):
                await session.call_tool("add", {"a": n, "b": 1})
            await session.call_tool("web_search", {"query": "x"})
            with pytest.raises(LimitExceeded):
                await session.call_tool("add", {"a": 9, "b": 9})
    assert ran(log) == ["add", "add", "web_search"]
    statuses = [(n.name, n.status) for n in tool_nodes(sink)]
    assert statuses == [
        ("add", "success"),
        ("add", "success"),
        ("web_search", "success"),
        ("add", "halt"),
    ]
    assert ctx.stats.get_gauge("amp:cost") == pytest.approx(0.25)


async def test_a_paid_tool_the_client_stopped_waiting_for_is_charged_its_price(
    server_script: Path, tmp_path: Path
) -> None:
    """The server ran the paid tool; the client's read timed out (``REQUEST_TIMEOUT``) before
    the answer came, and the call was charged nothing. With no answer, the bill is unknown:
    it is charged its price (its reservation). A tool the server answered is charged as the
    server answered."""
    log = tmp_path / "calls.log"
    sink = MemorySink()
    async with stdio_session(server_script, log) as session:
        async with ExecutionContext(sinks=[sink]) as ctx:
            with pytest.raises(Exception, match="timed out"):
                await session.call_tool("web_slow", {"seconds": 1}, read_timeout_seconds=0.2)
        assert ran(log) == ["web_slow"]
    (node,) = tool_nodes(sink)
    assert (node.name, node.status) == ("web_slow", "fail")
    assert node.cost_usd == Decimal("0.25") and ctx.stats.total_cost() == Decimal("0.25")
