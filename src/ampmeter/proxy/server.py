"""The metering proxy: an aiohttp server that holds every caller's budget.

:class:`MeteringProxy` opens one :class:`~ampmeter.ExecutionContext` per caller of the budget
file (on the configured ledger, so several proxies share one cap through Redis or one SQLite
file), serves the provider routes (docs/proxy.md) on a loopback port by default, and closes
everything when it stops. A route prefix stands for its upstream's base URL (``/openai/...``,
``/anthropic/...``); a caller is named by its proxy key in the path (``/k/<key>/openai/...``)
or the ``x-ampmeter-key`` header, and one configured without a key takes requests that name
none.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from aiohttp import web

from ampmeter.context import ExecutionContext
from ampmeter.limits import Limit
from ampmeter.proxy.budget_file import CallerBudget, ProxyBudgets
from ampmeter.proxy.relay import Relay

__all__ = ["MeteringProxy"]

_ROUTES = ("/{route:openai|anthropic}/{tail:.*}", "/k/{key}/{route:openai|anthropic}/{tail:.*}")
_MAX_BODY = 64 * 1024 * 1024  # bytes: a request larger than this is refused (HTTP 413)


class MeteringProxy:
    """A running proxy for the callers of ``budgets`` (see the module's documentation).

    ``with MeteringProxy(budgets) as proxy:`` serves on a thread of its own until the block
    ends; :meth:`serve_forever` serves on the calling thread. ``host`` is loopback unless told
    otherwise; ``port`` 0 picks a free one (:attr:`url` says which). ``make_context`` makes a
    caller's context (default: from its budget, with the file's ledger and logs); the proxy
    closes it when it stops. ``trusted_key``: see :class:`~ampmeter.proxy.relay.Relay`.
    """

    def __init__(
        self,
        budgets: ProxyBudgets,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        allow_unestimated: bool = False,
        make_context: Callable[[CallerBudget], ExecutionContext] | None = None,
        trusted_key: bytes | None = None,
    ) -> None:
        if not budgets.callers:
            raise ValueError("the budget file names no caller: add a [callers.NAME] table")
        self._budgets = budgets
        self._host = host
        self._port = port
        self._allow_unestimated = allow_unestimated
        self._make_context = make_context or self._context_for
        self._trusted_key = trusted_key
        self._closing = ExitStack()
        self._contexts: dict[str | None, ExecutionContext] = {}
        self._by_name: dict[str, ExecutionContext] = {}
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._stopped: asyncio.Event | None = None
        self._failure: BaseException | None = None
        self.url = ""

    # -- the callers' contexts ----------------------------------------------------------------

    def context(self, caller: str) -> ExecutionContext:
        """The open context of caller ``caller`` (its stats, graph and limits)."""
        return self._by_name[caller]

    def base_urls(self, caller: str | None = None) -> dict[str, str]:
        """The environment that points an OpenAI or Anthropic SDK at this proxy (for
        ``caller``'s key; None: the caller without a key)."""
        prefix = self.url
        if caller is not None:
            key = next(c.key for c in self._budgets.callers if c.name == caller)
            if key is not None:
                prefix = f"{self.url}/k/{key}"
        return {
            "OPENAI_BASE_URL": f"{prefix}/openai",
            "ANTHROPIC_BASE_URL": f"{prefix}/anthropic",
        }

    def _open_contexts(self) -> None:
        for caller in self._budgets.callers:
            ctx = self._make_context(caller)
            self._closing.callback(ctx.close)
            self._contexts[caller.key] = ctx
            self._by_name[caller.name] = ctx

    def _context_for(self, caller: CallerBudget) -> ExecutionContext:
        sinks: list[Any] = []
        if self._budgets.log_dir is not None:
            from ampmeter.sinks.jsonl import JsonlSink

            os.makedirs(self._budgets.log_dir, exist_ok=True)
            path = os.path.join(self._budgets.log_dir, f"{caller.name}.jsonl")
            sinks.append(self._closing.enter_context(JsonlSink(path, flush="line")))
        ledger = None
        if self._budgets.ledger is not None:
            from ampmeter.ledgers.reach import open_address

            ledger = open_address(self._budgets.ledger, caller.scope)
            self._closing.callback(ledger.close)
        limits = [Limit(key, value) for key, value in caller.limits.items()]
        # Opened, never entered: the proxy's contexts are current nowhere, each request names
        # its caller's context itself.
        return ExecutionContext(
            caller.name, limits=limits, ledger=ledger, sinks=sinks, **caller.context_options
        )

    # -- serving -----------------------------------------------------------------------------

    def __enter__(self) -> MeteringProxy:
        self._thread = threading.Thread(target=self._serve, name="ampmeter-proxy", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._failure is not None:
            self._thread.join()
            raise self._failure
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop serving (requests in flight end), then close every caller's context."""
        if self._loop is not None and self._stopped is not None:
            self._loop.call_soon_threadsafe(self._stopped.set)
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def serve_forever(self, on_ready: Any = None) -> None:
        """Serve on this thread until :meth:`stop` (from another thread) or a signal."""
        asyncio.run(self._main(on_ready))

    def _serve(self) -> None:
        try:
            asyncio.run(self._main(None))
        except BaseException as exc:
            self._failure = exc
            self._ready.set()

    async def _main(self, on_ready: Any) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        relay = None
        runner = None
        try:
            self._open_contexts()
            relay = Relay(
                self._contexts,
                self._budgets.upstreams,
                allow_unestimated=self._allow_unestimated,
                trusted_key=self._trusted_key,
            )
            await relay.open()
            app = web.Application(client_max_size=_MAX_BODY)
            for route in _ROUTES:
                app.router.add_route("*", route, relay.handle)
            # No access log: its lines would carry the proxy keys in paths.
            runner = web.AppRunner(app, access_log=None, handle_signals=False)
            await runner.setup()
            site = web.TCPSite(runner, self._host, self._port)
            await site.start()
            host, port = runner.addresses[0][:2]
            shown = f"[{host}]" if ":" in host else host
            self.url = f"http://{shown}:{port}"
            self._ready.set()
            if on_ready is not None:  # serving in the foreground: SIGINT and SIGTERM stop it
                for signum in (signal.SIGINT, signal.SIGTERM):
                    self._loop.add_signal_handler(signum, self._stopped.set)
                on_ready(self)
            await self._stopped.wait()
        finally:
            if runner is not None:
                await runner.cleanup()
            if relay is not None:
                await relay.close()
            self._closing.close()
            self._ready.set()
