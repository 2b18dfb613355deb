"""The ``ampmeter proxy`` command: a metering proxy for agents in any language.

aiohttp (the ``proxy`` extra) loads when it runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ampmeter.cli.output import fail, say
from ampmeter.cli.params import option

if TYPE_CHECKING:
    from ampmeter.proxy import MeteringProxy

__all__ = ["proxy"]


def proxy(
    budget_file: Annotated[
        Path,
        option(
            "--budget-file",
            "The TOML file naming the callers, their limits, the ledger and upstreams.",
            "FILE",
        ),
    ],
    host: Annotated[
        str, option("--host", "Where to listen (loopback unless you say so).", "ADDRESS")
    ] = "127.0.0.1",
    port: Annotated[int, option("--port", "0 picks a free port.", "PORT")] = 0,
    allow_unestimated: Annotated[
        bool,
        option(
            "--allow-unestimated",
            "Forward, unmetered, a POST whose cost cannot be estimated (else refused).",
        ),
    ] = False,
) -> None:
    """Serve the OpenAI and Anthropic APIs to agents in any language, under shared budgets.

    Each request is estimated, admitted or refused against its caller's limits before it is
    sent, forwarded with the caller's own key, and settled from the provider's usage. A
    refusal is the provider's own error shape (HTTP 402, or 429 while the budget is busy).
    Point a client at it by its base URL: OPENAI_BASE_URL=http://HOST:PORT/openai and
    ANTHROPIC_BASE_URL=http://HOST:PORT/anthropic (with /k/KEY before them to name a caller).
    Ctrl-C stops it; the logs are complete when it exits.
    """
    try:
        from ampmeter.proxy import BudgetFileError, MeteringProxy, read_budget_file
    except ImportError as missing:
        fail("proxy", f"{missing.name} is not installed: pip install 'ampmeter[proxy]'")
    try:
        budgets = read_budget_file(budget_file)
        server = MeteringProxy(budgets, host=host, port=port, allow_unestimated=allow_unestimated)
    except (BudgetFileError, ValueError) as error:
        fail("proxy", str(error))
    if host not in ("127.0.0.1", "localhost", "::1"):
        say(f"ampmeter proxy: warning: listening on {host}, not only on this machine")

    def ready(running: MeteringProxy) -> None:
        typer.echo(f"ampmeter proxy: listening on {running.url}")
        names = ", ".join(c.name for c in budgets.callers)
        say(f"ampmeter proxy: {len(budgets.callers)} caller(s): {names}; Ctrl-C stops")

    try:
        server.serve_forever(on_ready=ready)
    except OSError as error:
        fail("proxy", f"cannot listen on {host}:{port}: {error.strerror}")
    except KeyboardInterrupt:
        pass
