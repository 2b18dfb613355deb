"""How far past one shared dollar cap does each budget tool let concurrent calls go?

The workload users compare ampmeter with its peers on: W worker threads (8, 32, 128) share one
dollar cap worth about ``CALLS`` calls of gpt-4o-mini, and call the model until the tool under
test stops them. Every request is agent-shaped (:mod:`ampmeter.testing.agent_requests`: a
1,180-character system prompt, a 502-character user task, and 0 or 10 tool schemas) with
``max_tokens=100``. The provider is :class:`ampmeter.testing.BillingProvider` on loopback: it
bills what each request sends at 4 characters a token, always writes the whole ``max_tokens``,
and takes ``PROVIDER_S`` per call, so every worker is in flight at once. Its bill is the truth;
each tool's own accounting is not consulted.

Each tool is set up the way its documentation tells users to cap spend:

* ``ampmeter``: one ``ExecutionContext(max_cost_usd=CAP)`` around the workers, the real
  ``openai`` SDK instrumented by ``ampmeter.instrument()``.
* ``shekel``: its budgets are per thread ("not thread-safe when shared across threads"), so
  each worker opens ``budget(max_usd=CAP, name=N, backend=RedisBackend(url))`` with the same
  name: the documented way to share one cap, on a real ``redis-server`` this script starts.
* ``agentbudget``: one ``AgentBudget(max_spend=CAP).session()`` and one client attached to it
  with ``wrap_client()``, shared by the workers. Its loop detector (10 calls to one model in
  60 s by default) would stop every worker long before the cap, so it is turned off
  (``max_repeated_calls`` = 10**9): the dollar cap is what is measured.
* ``veronica-core``: ``patch_openai()`` and one ``@veronica_guard(max_cost_usd=CAP)`` function
  that runs the workers (its quickstart), ``max_steps`` raised so only the cap stops them.
* ``pydantic-ai``: one ``Agent`` (instructions, the tool schemas as ``Tool.from_schema``), and
  a cap shared across concurrent runs the only way it has: every run gets the same
  ``usage=RunUsage()`` and ``usage_limits=UsageLimits(cost_limit=CAP, request_limit=None)``.
  Each thread has its own ``OpenAIChatModel`` (its own async client: a client is bound to the
  event loop of the thread that runs it), pointed at the provider's base URL.
* ``litellm``: ``litellm.max_budget = CAP`` and ``litellm.completion()`` (its budget manager's
  global cap), with ``api_base`` at the provider.

For each tool and cell: ``billed/cap`` from the provider's bill, the calls billed, the calls
the tool refused before sending (attempts the provider never saw), and the stops the tool
raised only after a call had been billed. A worker ends at its first stop; a tool that never
stops is cut at ``ATTEMPT_BOUND`` attempts and reported as such.

The peers run in their own virtualenv (``bench/.peers-venv``, made by this script from
``bench/peers-requirements.txt``), one child process per cell that reads its orders on stdin
and reports on stdout; ampmeter runs in this process. Run: ``python bench/peer_cap_bench.py
[--quick] [--peers shekel,litellm]`` (quick: no tools, 8 and 128 threads). Not a timed test:
the figures do not depend on speed.

Options for harder providers (not in the default run): ``--density 1,1.6,2.5`` bills text at
that many times characters/4 (dense text, code, CJK: the provider counts 1.6 or 2.5 times more
tokens than prose), each density its own cells; ``--repeated-ids N`` has the provider draw its
response ids from N values (1: one id for every answer, as some gateways and mock servers do;
999: like Ollama); ``--estimate bound`` runs ampmeter's context with ``estimate="bound"``;
``--tokenizer`` switches ampmeter's offline tokenizer on and has the provider count text with
gpt-4o-mini's own encoding (o200k_base) instead of characters. ``--peers ''`` measures ampmeter
alone. Every ampmeter cell starts with nothing learned, as a fresh process would.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib.metadata
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from _options import parser
from _venvs import clean_python

HERE = Path(__file__).resolve().parent
REQUIREMENTS = HERE / "peers-requirements.txt"
VENV = HERE / ".peers-venv"
PEERS: tuple[str, ...] = (
    "shekel",
    "agentbudget",
    "veronica-core",
    "pydantic-ai",
    "litellm",
    "litellm-budget-manager",
)
DISTRIBUTIONS = {
    "shekel": "shekel",
    "agentbudget": "agentbudget",
    "veronica-core": "veronica-core",
    "pydantic-ai": "pydantic-ai-slim",
    "litellm": "litellm",
    "litellm-budget-manager": "litellm",
}
TOOLS = (0, 10)
WORKERS = (8, 32, 128)
CALLS = 100  # the cap is worth this many calls
ATTEMPT_BOUND = 5 * CALLS  # a tool that never stops its workers is cut here
PROVIDER_S = 0.5  # the provider's time per call: every worker is in flight at once
CHILD_TIMEOUT_S = 600
RESULT = "peer-cap-result "  # marks the child's one line of results on stdout

Call = Callable[[], object]


# --- the workload, the same in this process and in a peer's ---------------------------------------


@dataclass
class Tally:
    """What the workers did: attempts, stops raised by the tool, other errors."""

    attempts: int = 0
    stops: int = 0
    errors: int = 0
    first_error: str = ""
    note: str = ""
    bounded: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def report(self) -> dict[str, Any]:
        return {
            "attempts": self.attempts,
            "stops": self.stops,
            "errors": self.errors,
            "first_error": self.first_error,
            "note": self.note,
            "bounded": self.bounded,
        }


def hammer(
    workers: int,
    calls: Callable[[], contextlib.AbstractContextManager[Call]],
    stop: tuple[type[BaseException], ...],
) -> Tally:
    """Run ``workers`` threads that call until the tool raises one of ``stop``.

    ``calls()`` is entered once in each thread and yields that thread's call: the same call for
    most tools, a per-thread budget or model for those that need one.
    """
    tally = Tally()
    barrier = threading.Barrier(workers)

    def worker() -> None:
        try:
            with calls() as call:
                barrier.wait()
                while True:
                    with tally.lock:
                        if tally.attempts >= ATTEMPT_BOUND:
                            tally.bounded = True
                            return
                        tally.attempts += 1
                    try:
                        call()
                    except stop:
                        with tally.lock:
                            tally.stops += 1
                        return
        except stop:
            with tally.lock:
                tally.stops += 1  # raised on leaving the tool's scope
        except Exception as error:
            barrier.abort()  # a worker that failed to start must not leave the others waiting
            with tally.lock:
                tally.errors += 1
                tally.first_error = tally.first_error or repr(error)[:300]

    threads = [
        threading.Thread(target=contextvars.copy_context().run, args=(worker,))
        for _ in range(workers)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return tally


def request(spec: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of one chat call from the orders ``spec``."""
    extra = {"tools": spec["tools"]} if spec["tools"] else {}
    return {
        "model": spec["model"],
        "messages": spec["messages"],
        "max_tokens": spec["max_tokens"],
        **extra,
    }


def openai_client(spec: dict[str, Any]) -> Any:
    import openai

    return openai.OpenAI(base_url=spec["base_url"], api_key="bench-key", max_retries=0, timeout=120)


# --- each peer, run in the peers' virtualenv ------------------------------------------------------


def run_shekel(spec: dict[str, Any]) -> Tally:
    import shekel
    from shekel.backends.redis import RedisBackend
    from shekel.exceptions import BudgetExceededError

    if not spec.get("redis_url"):
        raise RuntimeError("no redis-server: shekel shares a cap across workers only through Redis")
    backend = RedisBackend(url=spec["redis_url"])
    name = f"peer-cap-{os.getpid()}-{time.time_ns()}"
    client = openai_client(spec)
    kwargs = request(spec)

    @contextlib.contextmanager
    def calls() -> Iterator[Call]:
        with shekel.budget(max_usd=float(spec["cap"]), name=name, backend=backend):
            yield lambda: client.chat.completions.create(**kwargs)

    return hammer(spec["workers"], calls, (BudgetExceededError,))


def run_agentbudget(spec: dict[str, Any]) -> Tally:
    from agentbudget import AgentBudget, wrap_client
    from agentbudget.exceptions import BudgetExhausted

    budget = AgentBudget(max_spend=float(spec["cap"]), max_repeated_calls=10**9)
    kwargs = request(spec)
    with budget.session() as session:
        client = wrap_client(openai_client(spec), session)
        return hammer(
            spec["workers"],
            lambda: contextlib.nullcontext(lambda: client.chat.completions.create(**kwargs)),
            (BudgetExhausted,),
        )


def run_veronica(spec: dict[str, Any]) -> Tally:
    from veronica_core import veronica_guard
    from veronica_core.inject import VeronicaHalt
    from veronica_core.patch import patch_openai

    patch_openai()
    client = openai_client(spec)
    kwargs = request(spec)

    def run() -> Tally:
        return hammer(
            spec["workers"],
            lambda: contextlib.nullcontext(lambda: client.chat.completions.create(**kwargs)),
            (VeronicaHalt,),
        )

    guarded = veronica_guard(max_cost_usd=float(spec["cap"]), max_steps=10**9)(run)
    result: Tally = guarded()
    return result


def run_pydantic_ai(spec: dict[str, Any]) -> Tally:
    import openai
    from pydantic_ai import Agent, Tool
    from pydantic_ai.exceptions import UsageLimitExceeded
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider
    from pydantic_ai.usage import RunUsage, UsageLimits

    def never_called(**arguments: Any) -> str:
        raise AssertionError("the provider never asks for a tool")

    tools = [
        Tool.from_schema(
            never_called,
            name=schema["function"]["name"],
            description=schema["function"]["description"],
            json_schema=schema["function"]["parameters"],
        )
        for schema in spec["tools"]
    ]
    system, user = (message["content"] for message in spec["messages"])
    agent: Agent[None, str] = Agent(
        instructions=system, tools=tools, model_settings={"max_tokens": spec["max_tokens"]}
    )
    shared = RunUsage()
    limits = UsageLimits(cost_limit=Decimal(spec["cap"]), request_limit=None)

    def calls() -> contextlib.AbstractContextManager[Call]:
        client = openai.AsyncOpenAI(
            base_url=spec["base_url"], api_key="bench-key", max_retries=0, timeout=120
        )
        model = OpenAIChatModel(spec["model"], provider=OpenAIProvider(openai_client=client))
        return contextlib.nullcontext(
            lambda: agent.run_sync(user, model=model, usage=shared, usage_limits=limits)
        )

    tally = hammer(spec["workers"], calls, (UsageLimitExceeded,))
    tally.note = f"the shared RunUsage recorded {shared.requests} requests, cost {shared.cost}"
    return tally


def run_litellm(spec: dict[str, Any]) -> Tally:
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # no price-map download
    import litellm
    from litellm.exceptions import BudgetExceededError

    litellm.max_budget = float(spec["cap"])
    kwargs = request(spec)
    kwargs["model"] = f"openai/{spec['model']}"

    def call() -> object:
        return litellm.completion(
            **kwargs, api_base=spec["base_url"], api_key="bench-key", num_retries=0
        )

    tally = hammer(spec["workers"], lambda: contextlib.nullcontext(call), (BudgetExceededError,))
    # The budget manager's documented running total (its quick start prints it).
    tally.note = f"litellm._current_cost ended at {litellm._current_cost!r}"
    return tally


class OverBudget(Exception):
    """The caller's own refusal, as LiteLLM's budget manager docs write it (an if/else)."""


def run_litellm_budget_manager(spec: dict[str, Any]) -> Tally:
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    import litellm
    from litellm.budget_manager import BudgetManager

    manager: Any = BudgetManager(project_name="peer_cap_bench")
    user = "bench-user"
    manager.create_budget(total_budget=float(spec["cap"]), user=user)
    kwargs = request(spec)
    kwargs["model"] = f"openai/{spec['model']}"

    def call() -> object:
        if manager.get_current_cost(user=user) > manager.get_total_budget(user):
            raise OverBudget
        response = litellm.completion(
            **kwargs, api_base=spec["base_url"], api_key="bench-key", num_retries=0
        )
        manager.update_cost(completion_obj=response, user=user)
        return response

    tally = hammer(spec["workers"], lambda: contextlib.nullcontext(call), (OverBudget,))
    tally.note = f"the budget manager recorded {manager.get_current_cost(user=user)!r} USD"
    return tally


RUNNERS: dict[str, Callable[[dict[str, Any]], Tally]] = {
    "shekel": run_shekel,
    "agentbudget": run_agentbudget,
    "veronica-core": run_veronica,
    "pydantic-ai": run_pydantic_ai,
    "litellm": run_litellm,
    "litellm-budget-manager": run_litellm_budget_manager,
}


def child(peer: str) -> None:
    """A peer's cell: orders on stdin, one line of results on stdout."""
    spec = json.loads(sys.stdin.read())
    report: dict[str, Any] = {"version": importlib.metadata.version(DISTRIBUTIONS[peer])}
    try:
        report.update(RUNNERS[peer](spec).report())
    except Exception as error:
        report.update(Tally(errors=1, first_error=f"set-up failed: {error!r}"[:300]).report())
    print(RESULT + json.dumps(report), flush=True)


# --- the peers' virtualenv and Redis, made by this process ----------------------------------------


def peers_python() -> tuple[Path | None, str]:
    """The peers' interpreter, installing them first when the pins changed; or why not."""
    pins = [line.strip() for line in REQUIREMENTS.read_text().splitlines()]
    return clean_python(VENV, [pin for pin in pins if pin and not pin.startswith("#")])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def redis_server() -> Iterator[str | None]:
    """A throwaway ``redis-server`` on loopback (None when it is not installed)."""
    program = shutil.which("redis-server")
    if program is None:
        yield None
        return
    port = free_port()
    server = subprocess.Popen(
        [program, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        server.terminate()
        server.wait(10)


# --- one cell, measured against the provider's bill -----------------------------------------------


@dataclass(frozen=True)
class Provider:
    """How the loopback provider bills and answers (the options of a run)."""

    density: float = 1.0  # text billed at this many times characters/4
    distinct_ids: int | None = None  # response ids drawn from this many values
    tokenizer: bool = False  # text counted by o200k_base (density then unused)

    def billing(self) -> dict[str, Any]:
        """The ``BillingProvider`` arguments."""
        found: dict[str, Any] = {
            "chars_per_token": 4.0 / self.density,
            "id_pool": self.distinct_ids,
        }
        if self.tokenizer:
            import bpe_openai

            encoding = bpe_openai.get_encoding("o200k_base")
            found["text_tokens"] = lambda text: len(encoding.encode(text, disallowed_special=()))
        return found

    @property
    def label(self) -> str:
        return "o200k" if self.tokenizer else f"x{self.density:g}"


@dataclass(frozen=True)
class Cell:
    """One tool on one workload, and what the provider billed."""

    tool: str
    version: str
    tools: int
    workers: int
    density: str
    cap: Decimal
    billed: Decimal
    billed_calls: int
    peak_in_flight: int
    tally: dict[str, Any]

    @property
    def billed_over_cap(self) -> float:
        return float(self.billed / self.cap)

    @property
    def refused_before(self) -> int:
        """Attempts the provider never saw: refused by the tool before sending."""
        return max(int(self.tally["attempts"]) - self.billed_calls, 0)

    @property
    def stopped_after(self) -> int:
        """Stops the tool raised on a call that had already been sent and billed."""
        return max(int(self.tally["stops"]) - self.refused_before, 0)

    @property
    def how(self) -> str:
        if self.tally["bounded"]:
            return f"never stopped (cut at {ATTEMPT_BOUND} attempts)"
        if self.tally["stops"] == 0:
            return "did not stop"
        if self.stopped_after == 0:
            return "refused before sending"
        if self.refused_before == 0:
            return "raised after a billed call"
        return "both"


def spec_for(tools: int, workers: int) -> dict[str, Any]:
    from ampmeter.testing.agent_requests import SYSTEM_PROMPT, USER_PROMPT, tool_schemas
    from cap_bench import MAX_TOKENS, MODEL

    return {
        "model": MODEL,
        "max_tokens": MAX_TOKENS,
        "messages": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": USER_PROMPT},
        ],
        "tools": tool_schemas(tools),
        "workers": workers,
    }


def run_ampmeter(spec: dict[str, Any]) -> Tally:
    from ampmeter import ExecutionContext, LimitExceeded
    from ampmeter.pricing import request_size

    request_size.forget()  # the first wave is reserved with nothing learned, as in a new process
    client = openai_client(spec)
    kwargs = request(spec)
    estimate = spec.get("estimate", "learned")
    with ExecutionContext("peer_cap_bench", max_cost_usd=float(spec["cap"]), estimate=estimate):
        tally = hammer(
            spec["workers"],
            lambda: contextlib.nullcontext(lambda: client.chat.completions.create(**kwargs)),
            (LimitExceeded,),
        )
    client.close()
    return tally


def run_peer(python: Path, peer: str, spec: dict[str, Any]) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": "", "PYTHONDONTWRITEBYTECODE": "1"}
    # A scratch folder to run in: LiteLLM's budget manager writes user_cost.json where it runs.
    try:
        with tempfile.TemporaryDirectory(prefix="peer-cap-") as scratch:
            done = subprocess.run(
                [str(python), str(Path(__file__).resolve()), "--child", peer],
                input=json.dumps(spec),
                capture_output=True,
                text=True,
                timeout=CHILD_TIMEOUT_S,
                env=env,
                cwd=scratch,
                check=False,
            )
    except subprocess.TimeoutExpired:
        return {"errors": 1, "first_error": f"timed out after {CHILD_TIMEOUT_S} s"}
    for line in done.stdout.splitlines():
        if line.startswith(RESULT):
            found: dict[str, Any] = json.loads(line[len(RESULT) :])
            return found
    return {"errors": 1, "first_error": f"no result (exit {done.returncode}): {done.stderr[-300:]}"}


def measure(
    tool: str,
    tools: int,
    workers: int,
    python: Path | None,
    redis: str | None,
    provider: Provider = Provider(),
    estimate: str = "learned",
) -> Cell:
    """One tool on one cell, against a fresh provider."""
    import ampmeter
    from ampmeter.testing import BillingProvider
    from cap_bench import MAX_TOKENS, PRICES, one_call_cost

    spec = spec_for(tools, workers)
    server = BillingProvider(
        output_tokens=MAX_TOKENS, prices=PRICES, delay_s=PROVIDER_S, **provider.billing()
    )
    with server:
        body = request(spec)
        cap = (CALLS * one_call_cost(server, body)).quantize(Decimal("0.000001"))
        spec.update(
            base_url=server.openai_base_url, cap=str(cap), redis_url=redis, estimate=estimate
        )
        if tool == "ampmeter":
            found = {"version": ampmeter.__version__, **run_ampmeter(spec).report()}
        elif python is None:
            found = {"errors": 1, "first_error": "the peers' virtualenv could not be made"}
        else:
            found = run_peer(python, tool, spec)
        billed, calls, peak = server.billed_usd, len(server.calls), server.peak_in_flight
    tally = {**Tally().report(), **found}
    version = found.get("version", "?")
    return Cell(tool, version, tools, workers, provider.label, cap, billed, calls, peak, tally)


# --- the run --------------------------------------------------------------------------------------


def measured(
    quick: bool,
    peers: tuple[str, ...] = PEERS,
    providers: tuple[Provider, ...] = (Provider(),),
    estimate: str = "learned",
) -> Iterator[Cell]:
    """Every tool on every cell, ampmeter first in each, yielding each cell as it ends."""
    import ampmeter

    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))  # cap_bench: the same model, prices and call cost
    ampmeter.instrument(http=False)
    if any(p.tokenizer for p in providers):
        from ampmeter.pricing import tokenizer

        tokenizer.use()
    python, why = (None, "no peers asked for") if not peers else peers_python()
    if python is None and peers:
        print(f"the peers could not be installed: {why}", file=sys.stderr, flush=True)
    tools = (0,) if quick else TOOLS
    workers = (8, 128) if quick else WORKERS
    with redis_server() as redis:
        for provider in providers:
            for count in tools:
                for threads in workers:
                    for tool in ("ampmeter", *peers):
                        yield measure(tool, count, threads, python, redis, provider, estimate)


def run(quick: bool) -> list[dict[str, Any]]:
    """The rows for ``bench/run.py``: ampmeter's billed/cap beside each peer's, per cell."""
    found = list(measured(quick))
    ours = {(c.density, c.tools, c.workers): c for c in found if c.tool == "ampmeter"}
    rows = []
    for cell in found:
        if cell.tool == "ampmeter":
            continue
        mine = ours[(cell.density, cell.tools, cell.workers)]
        rows.append(
            {
                "name": f"{cell.tools} tools, {cell.workers} threads, one cap: billed/cap, "
                f"ampmeter beside {cell.tool} ({cell.how})",
                "unit": "billed/cap",
                "ampmeter": round(mine.billed_over_cap, 3),
                "baseline": round(cell.billed_over_cap, 3),
                "baseline_name": cell.tool,
                "ratio": round(cell.billed_over_cap / mine.billed_over_cap, 2),
                "target": "ampmeter billed <= cap",
                "met": mine.billed <= mine.cap and not mine.tally["errors"],
            }
        )
    return rows


def line(cell: Cell) -> str:
    error = f"  first error: {cell.tally['first_error']}" if cell.tally["first_error"] else ""
    error += f"  [{cell.tally['note']}]" if cell.tally["note"] else ""
    return (
        f"{cell.tool:<22} {cell.density:>5} {cell.tools:>2} tools {cell.workers:>3} threads  "
        f"billed/cap {cell.billed_over_cap:6.3f}  billed {cell.billed_calls:>4}  "
        f"refused {cell.refused_before:>4}  stopped after {cell.stopped_after:>4}  "
        f"errors {cell.tally['errors']}  ({cell.how}){error}"
    )


def table(found: list[Cell]) -> str:
    """The cells as a Markdown table."""
    lines = [
        "| tool | text billed | tools | threads | billed/cap | calls billed | "
        "refused before sending | stopped after a billed call | errors | how it stops |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in found:
        lines.append(
            f"| {c.tool} {c.version} | {c.density} | {c.tools} | {c.workers} | "
            f"{c.billed_over_cap:.3f} | "
            f"{c.billed_calls} | {c.refused_before} | {c.stopped_after} | {c.tally['errors']} | "
            f"{c.how} |"
        )
    return "\n".join(lines)


def summary(found: list[Cell]) -> str:
    """One row per tool: billed/cap in every cell, and how it stopped its workers."""
    cells = list(dict.fromkeys((c.density, c.tools, c.workers) for c in found))
    head = " | ".join(f"{d} {tools} tools, {workers} thr." for d, tools, workers in cells)
    lines = [f"| tool | {head} | how it stops |", "|---|" + "---|" * (len(cells) + 1)]
    for tool in dict.fromkeys(c.tool for c in found):
        mine = {(c.density, c.tools, c.workers): c for c in found if c.tool == tool}
        figures = " | ".join(
            f"{mine[key].billed_over_cap:.2f}" if key in mine else "-" for key in cells
        )
        hows = ", ".join(dict.fromkeys(c.how for c in mine.values()))
        version = next(iter(mine.values())).version
        lines.append(f"| {tool} {version} | {figures} | {hows} |")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    if argv[:1] == ["--child"]:
        child(argv[1])
        return
    options = parser(__doc__)
    options.add_argument(
        "--peers",
        default=",".join(PEERS),
        help=f"the peers to measure, comma-separated (default: all of {', '.join(PEERS)}; "
        "'' for ampmeter alone)",
    )
    options.add_argument(
        "--density",
        default="1",
        help="text billed at these multiples of characters/4, comma-separated (e.g. 1,1.6,2.5)",
    )
    options.add_argument(
        "--repeated-ids",
        type=int,
        default=None,
        metavar="N",
        help="the provider draws its response ids from N values (1: the same id every time)",
    )
    options.add_argument(
        "--estimate",
        choices=("learned", "bound"),
        default="learned",
        help="ampmeter's estimate mode",
    )
    options.add_argument(
        "--tokenizer",
        action="store_true",
        help="ampmeter's offline tokenizer on, and the provider counting text with o200k_base",
    )
    args = options.parse_args(argv)
    peers = tuple(name for name in args.peers.split(",") if name)
    unknown = set(peers) - set(PEERS)
    if unknown:
        options.error(f"unknown peers {sorted(unknown)}; known: {', '.join(PEERS)}")
    try:
        densities = tuple(float(d) for d in args.density.split(","))
    except ValueError:
        options.error(f"--density takes numbers, comma-separated; got {args.density!r}")
    if not all(0 < d <= 4 for d in densities):
        options.error("--density: each multiple must be above 0 and at most 4 (a token a byte)")
    if args.repeated_ids is not None and args.repeated_ids < 1:
        options.error("--repeated-ids must be at least 1")
    if args.tokenizer and args.density != "1":
        options.error("--tokenizer bills text by its encoding: it takes no --density")
    providers = tuple(Provider(d, args.repeated_ids, args.tokenizer) for d in densities)
    found = []
    for cell in measured(args.quick, peers, providers, args.estimate):
        found.append(cell)
        print(line(cell), flush=True)
    print()
    print(table(found))
    print()
    print(summary(found))
    errors = {c.tool: c.tally["first_error"] for c in found if c.tally["first_error"]}
    for tool, error in errors.items():
        print(f"\n{tool}: {error}")


if __name__ == "__main__":
    main(sys.argv[1:])
