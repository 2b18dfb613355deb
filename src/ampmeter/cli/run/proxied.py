"""``ampmeter run --proxy``: the run's metering proxy, for the processes that are not Python
(what it sets and where it forwards: ``docs/proxy.md``).

Its one caller is the run: its context has the run's limits, on the run's ledger scope and
chain, and logs into the run's events under the run's root, so a request from a Node, Go or
Rust process is one node of the run, capped with everything else.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, MutableMapping
from typing import Any

from ampmeter.cli.run.config import RunConfig
from ampmeter.cli.run.leftover import open_run_ledger
from ampmeter.integrations.proxy_mark import PROXY_URL_ENV

__all__ = ["run_proxy"]

# The variables a provider SDK reads its base URL from, by the proxy's route for it.
_BASE_URL_ENV = {"openai": "OPENAI_BASE_URL", "anthropic": "ANTHROPIC_BASE_URL"}


@contextlib.contextmanager
def run_proxy(
    config: RunConfig, tree: dict[str, Any], child_env: MutableMapping[str, str]
) -> Iterator[None]:
    """Serve the run's proxy while the block runs, and point ``child_env`` at it."""
    try:
        from ampmeter.proxy.budget_file import DEFAULT_UPSTREAMS, CallerBudget, ProxyBudgets
        from ampmeter.proxy.server import MeteringProxy
    except ImportError as missing:
        raise ValueError(f"--proxy needs {missing.name}: pip install 'ampmeter[proxy]'") from None
    upstreams = {
        route: (child_env.get(variable) or DEFAULT_UPSTREAMS[route]).rstrip("/")
        for route, variable in _BASE_URL_ENV.items()
    }
    upstreams.update(config.upstream)
    budgets = ProxyBudgets((CallerBudget("proxy", None, tree["scope"]),), upstreams)
    closing = contextlib.ExitStack()

    def the_runs_context(caller: CallerBudget) -> Any:
        from ampmeter.sinks.jsonl import JsonlSink

        ledger = closing.enter_context(open_run_ledger(tree))
        log = os.path.join(tree["events"], f"{time.time_ns()}-proxy.jsonl")
        sink = closing.enter_context(JsonlSink(log, flush="line"))
        return config.context("proxy", tree, ledger, sink, "proxy")

    config.set_prices()  # the proxy prices its calls in this process
    key = child_env["AMPMETER_HANDOFF_KEY"].encode()
    with closing:
        proxy = MeteringProxy(budgets, make_context=the_runs_context, trusted_key=key)
        try:
            proxy.__enter__()
        except OSError as exc:
            raise ValueError(f"--proxy: cannot listen on loopback: {exc.strerror}") from None
        try:
            child_env.update(proxy.base_urls())
            child_env[PROXY_URL_ENV] = proxy.url
            yield
        finally:
            proxy.stop()
