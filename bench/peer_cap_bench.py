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
stops is cut at 5 × ``CALLS`` attempts (at least 3 a worker) and reported as such.

The peers run in their own virtualenv (``bench/.peers-venv``, made by this script from
``bench/peers-requirements.txt``), one child process per cell that reads its orders on stdin
and reports on stdout; ampmeter runs in this process. Run: ``python bench/peer_cap_bench.py
[--quick] [--peers shekel,litellm]`` (quick: no tools, 8 and 128 threads). Not a timed test:
the figures do not depend on speed.

Options for harder providers (not in the default run), each adding its own cells:
``--density 1,1.6,2.5`` bills text at that many times characters/4 (dense text, code, CJK: the
provider counts 1.6 or 2.5 times more tokens than prose); ``--tokenizer`` adds a provider that
counts text with gpt-4o-mini's own encoding (o200k_base), with ampmeter's offline tokenizer on
in its cells (off in the others); ``--repeated-ids 1,999`` adds a provider (characters/4) per N
that draws its response ids from N values (1: one id for every answer, as some gateways and
mock servers do; 999: like Ollama). ``--estimate learned,bound`` runs ampmeter's cells in each
estimate mode. ``--processes 4`` runs every case a second time as 4 worker processes (the
workers split among them) sharing the cap through a real ``redis-server`` this script starts:
ampmeter on a ``RedisLedger`` scope, shekel on its ``RedisBackend``; the other peers keep their
budget in one process (AgentBudget's session, veronica-core's ``veronica_guard``, pydantic-ai's
``RunUsage``, LiteLLM's module globals and its budget manager's local file), so they have no
process cells. ``--tools``, ``--workers``, ``--calls`` (what the cap is worth) and
``--provider-s`` size the cells; ``--peers ''`` measures ampmeter alone. Every ampmeter cell
starts with nothing learned, as a fresh process would.
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
    "ampmeter": "ampmeter",
    "shekel": "shekel",
    "agentbudget": "agentbudget",
    "veronica-core": "veronica-core",
    "pydantic-ai": "pydantic-ai-slim",
    "litellm": "litellm",
    "litellm-budget-manager": "litellm",
}
TOOLS = (0, 10)
WORKERS = (8, 32, 128)
CALLS = 100  # the cap is worth this many calls (``--calls``)
BOUND_FACTOR = 5  # a tool that never stops is cut after this many times CALLS attempts ...
BOUND_PER_WORKER = 3  # ... or this many per worker, if more (every worker sees its refusal)
PROVIDER_S = 0.5  # the provider's time per call: every worker is in flight at once
CHILD_TIMEOUT_S = 600
RESULT = "peer-cap-result "  # marks the child's one line of results on stdout
READY = "peer-cap-ready"  # a worker process is set up and waits for the word to start
SHARED_STORE = ("ampmeter", "shekel")  # the tools that share one cap across processes

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


def wait_for_go() -> None:
    """In a worker process: say it is ready and wait for the parent's word (a line on stdin),
    so the processes of a cell start calling together."""
    print(READY, flush=True)
    sys.stdin.readline()


def hammer(
    spec: dict[str, Any],
    calls: Callable[[], contextlib.AbstractContextManager[Call]],
    stop: tuple[type[BaseException], ...],
) -> Tally:
    """Run ``spec["workers"]`` threads that call until the tool raises one of ``stop``.

    ``calls()`` is entered once in each thread and yields that thread's call: the same call for
    most tools, a per-thread budget or model for those that need one. In one of several worker
    processes the threads start once every process is ready.
    """
    tally = Tally()
    workers, bound = spec["workers"], spec["attempt_bound"]
    barrier = threading.Barrier(workers, action=wait_for_go if spec.get("processes") else None)

    def worker() -> None:
        try:
            with calls() as call:
                barrier.wait()
                while True:
                    with tally.lock:
                        if tally.attempts >= bound:
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
    name = spec["scope"]  # one name for every worker process of the cell: one shared cap
    client = openai_client(spec)
    kwargs = request(spec)

    @contextlib.contextmanager
    def calls() -> Iterator[Call]:
        with shekel.budget(max_usd=float(spec["cap"]), name=name, backend=backend):
            yield lambda: client.chat.completions.create(**kwargs)

    return hammer(spec, calls, (BudgetExceededError,))


def run_agentbudget(spec: dict[str, Any]) -> Tally:
    from agentbudget import AgentBudget, wrap_client
    from agentbudget.exceptions import BudgetExhausted

    budget = AgentBudget(max_spend=float(spec["cap"]), max_repeated_calls=10**9)
    kwargs = request(spec)
    with budget.session() as session:
        client = wrap_client(openai_client(spec), session)
        return hammer(
            spec,
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
            spec,
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

    tally = hammer(spec, calls, (UsageLimitExceeded,))
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

    tally = hammer(spec, lambda: contextlib.nullcontext(call), (BudgetExceededError,))
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

    tally = hammer(spec, lambda: contextlib.nullcontext(call), (OverBudget,))
    tally.note = f"the budget manager recorded {manager.get_current_cost(user=user)!r} USD"
    return tally


def run_ampmeter(spec: dict[str, Any]) -> Tally:
    """ampmeter's cell: one context on the cap, on a Redis ledger when in worker processes."""
    import ampmeter
    from ampmeter import ExecutionContext, LimitExceeded
    from ampmeter.ledgers.redis import RedisLedger
    from ampmeter.pricing import request_size, tokenizer

    ampmeter.instrument(http=False)
    tokenizer.use(spec["tokenizer"])
    request_size.forget()  # the first wave is reserved with nothing learned, as in a new process
    ledger = RedisLedger(spec["redis_url"], spec["scope"]) if spec.get("processes") else None
    client = openai_client(spec)
    kwargs = request(spec)
    cap = float(spec["cap"])
    try:
        with ExecutionContext(
            "peer_cap_bench", max_cost_usd=cap, estimate=spec["estimate"], ledger=ledger
        ):
            return hammer(
                spec,
                lambda: contextlib.nullcontext(lambda: client.chat.completions.create(**kwargs)),
                (LimitExceeded,),
            )
    finally:
        client.close()
        if ledger is not None:
            ledger.close()


RUNNERS: dict[str, Callable[[dict[str, Any]], Tally]] = {
    "ampmeter": run_ampmeter,
    "shekel": run_shekel,
    "agentbudget": run_agentbudget,
    "veronica-core": run_veronica,
    "pydantic-ai": run_pydantic_ai,
    "litellm": run_litellm,
    "litellm-budget-manager": run_litellm_budget_manager,
}


def child(tool: str) -> None:
    """A tool's cell (or its share of one, in a worker process): orders on stdin's first line,
    one line of results on stdout."""
    spec = json.loads(sys.stdin.readline())
    report: dict[str, Any] = {"version": importlib.metadata.version(DISTRIBUTIONS[tool])}
    try:
        report.update(RUNNERS[tool](spec).report())
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
        text = "o200k" if self.tokenizer else f"x{self.density:g}"
        return text if self.distinct_ids is None else f"{text} ids{self.distinct_ids}"


@dataclass(frozen=True)
class Case:
    """One workload: the provider, the tool schemas, the workers, how they run, the estimate."""

    provider: Provider
    tools: int
    workers: int
    processes: int = 0  # 0: threads of one process; else that many processes on one Redis
    estimate: str = "learned"  # ampmeter's estimate mode (a peer has none)

    def key(self, tool: str) -> tuple[str, int, int, str, str]:
        """The case's column in the summary; a peer's case names no estimate."""
        estimate = self.estimate if tool == "ampmeter" else "-"
        return (self.provider.label, self.tools, self.workers, self.way, estimate)

    @property
    def way(self) -> str:
        return f"{self.processes} proc." if self.processes else "threads"


@dataclass(frozen=True)
class Settings:
    """The options every case of a run shares."""

    calls: int = CALLS  # the cap is worth this many calls
    provider_s: float = PROVIDER_S
    redis: str | None = None
    python: Path | None = None  # the peers' interpreter


@dataclass(frozen=True)
class Cell:
    """One tool on one case, and what the provider billed."""

    tool: str
    version: str
    case: Case
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
            return "never stopped (cut)"
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


def child_command(python: Path, tool: str) -> tuple[list[str], dict[str, str]]:
    """How to start a tool's child: its command line and environment. ampmeter's runs in this
    interpreter; a peer's in the peers' virtualenv, with nothing of this one on its path."""
    command = [str(python), str(Path(__file__).resolve()), "--child", tool]
    if tool == "ampmeter":
        return command, dict(os.environ)
    return command, {**os.environ, "PYTHONPATH": "", "PYTHONDONTWRITEBYTECODE": "1"}


def run_peer(python: Path, peer: str, spec: dict[str, Any]) -> dict[str, Any]:
    command, env = child_command(python, peer)
    # A scratch folder to run in: LiteLLM's budget manager writes user_cost.json where it runs.
    try:
        with tempfile.TemporaryDirectory(prefix="peer-cap-") as scratch:
            done = subprocess.run(
                command,
                input=json.dumps(spec) + "\n",
                capture_output=True,
                text=True,
                timeout=CHILD_TIMEOUT_S,
                env=env,
                cwd=scratch,
                check=False,
            )
    except subprocess.TimeoutExpired:
        return {"errors": 1, "first_error": f"timed out after {CHILD_TIMEOUT_S} s"}
    return result_of(done.stdout, done.returncode, done.stderr)


def result_of(stdout: str, returncode: int | None, stderr: str) -> dict[str, Any]:
    """The child's line of results, or an error saying why there is none."""
    for text in stdout.splitlines():
        if text.startswith(RESULT):
            found: dict[str, Any] = json.loads(text[len(RESULT) :])
            return found
    return {"errors": 1, "first_error": f"no result (exit {returncode}): {stderr[-300:]}"}


def run_processes(python: Path, tool: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A cell run by ``spec["processes"]`` worker processes sharing the cap through Redis, the
    workers split evenly among them; they start calling together once every one is set up."""
    count = spec["processes"]
    orders = json.dumps({**spec, "workers": spec["workers"] // count}) + "\n"
    command, env = child_command(python, tool)
    with (
        tempfile.TemporaryDirectory(prefix="peer-cap-") as scratch,
        contextlib.ExitStack() as stack,
    ):
        logs = [stack.enter_context(Path(scratch, f"{n}.err").open("w+")) for n in range(count)]
        children = [
            subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env=env,
                cwd=scratch,
            )
            for log in logs
        ]
        for process in children:
            assert process.stdin is not None
            process.stdin.write(orders)
            process.stdin.flush()
        early = [until_ready(process) for process in children]  # all set up before any starts
        reports = []
        for process, output, log in zip(children, early, logs, strict=True):
            try:
                rest, _ = process.communicate("go\n", timeout=CHILD_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                rest, _ = process.communicate()
            log.seek(0)
            reports.append(result_of(output + rest, process.returncode, log.read()))
    return merged(reports)


def until_ready(process: subprocess.Popen[str]) -> str:
    """Read a worker process's output until it says it is ready (then nothing kept) or it ends
    (then what it wrote: its result, if it failed before being ready)."""
    assert process.stdout is not None
    seen = []
    for text in process.stdout:
        if text.startswith(READY):
            return ""
        seen.append(text)
    return "".join(seen)


def merged(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """The worker processes' tallies as one."""
    total = {**Tally().report(), "version": reports[0].get("version", "?")}
    for report in reports:
        for name in ("attempts", "stops", "errors"):
            total[name] += report.get(name, 0)
        total["bounded"] = total["bounded"] or report.get("bounded", False)
        total["first_error"] = total["first_error"] or report.get("first_error", "")
        if report.get("note") and report["note"] not in total["note"]:
            total["note"] = "; ".join(filter(None, (total["note"], report["note"])))
    return total


def measure(tool: str, case: Case, settings: Settings) -> Cell:
    """One tool on one case, against a fresh provider."""
    import ampmeter
    from ampmeter.testing import BillingProvider
    from cap_bench import MAX_TOKENS, PRICES, one_call_cost

    spec = spec_for(case.tools, case.workers)
    server = BillingProvider(
        output_tokens=MAX_TOKENS,
        prices=PRICES,
        delay_s=settings.provider_s,
        **case.provider.billing(),
    )
    python = Path(sys.executable) if tool == "ampmeter" else settings.python
    with server:
        body = request(spec)
        cap = (settings.calls * one_call_cost(server, body)).quantize(Decimal("0.000001"))
        spec.update(
            base_url=server.openai_base_url,
            cap=str(cap),
            redis_url=settings.redis,
            estimate=case.estimate,
            tokenizer=case.provider.tokenizer,
            processes=case.processes,
            scope=f"peer-cap-{os.getpid()}-{time.time_ns()}",
            attempt_bound=max(BOUND_FACTOR * settings.calls, BOUND_PER_WORKER * case.workers),
        )
        if python is None:
            found = {"errors": 1, "first_error": "the peers' virtualenv could not be made"}
        elif case.processes and settings.redis is None:
            found = {"errors": 1, "first_error": "no redis-server to share the cap through"}
        elif case.processes:
            found = run_processes(python, tool, spec)
        elif tool == "ampmeter":
            found = {"version": ampmeter.__version__, **run_ampmeter(spec).report()}
        else:
            found = run_peer(python, tool, spec)
        billed, calls, peak = server.billed_usd, len(server.calls), server.peak_in_flight
    tally = {**Tally().report(), **found}
    return Cell(
        tool=tool,
        version=found.get("version", "?"),
        case=case,
        cap=cap,
        billed=billed,
        billed_calls=calls,
        peak_in_flight=peak,
        tally=tally,
    )


# --- the run --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What one run measures (the command line's options)."""

    peers: tuple[str, ...] = PEERS
    providers: tuple[Provider, ...] = (Provider(),)
    estimates: tuple[str, ...] = ("learned",)
    tools: tuple[int, ...] = TOOLS
    workers: tuple[int, ...] = WORKERS
    processes: int = 0  # also run every case in this many processes on one Redis
    calls: int = CALLS
    provider_s: float = PROVIDER_S

    def cases(self) -> Iterator[tuple[str, Case]]:
        """Each tool and case, ampmeter first in each (in each of its estimate modes); in
        processes, only the tools that can share a cap across them."""
        for provider in self.providers:
            for tools in self.tools:
                for workers in self.workers:
                    for processes in (0, self.processes) if self.processes else (0,):
                        for estimate in self.estimates:
                            yield "ampmeter", Case(provider, tools, workers, processes, estimate)
                        for peer in self.peers:
                            if not processes or peer in SHARED_STORE:
                                yield peer, Case(provider, tools, workers, processes)


def measured(plan: Plan) -> Iterator[Cell]:
    """Every tool on every case of ``plan``, yielding each cell as it ends."""
    import ampmeter

    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))  # cap_bench: the same model, prices and call cost
    ampmeter.instrument(http=False)
    python, why = (None, "no peers asked for") if not plan.peers else peers_python()
    if python is None and plan.peers:
        print(f"the peers could not be installed: {why}", file=sys.stderr, flush=True)
    with redis_server() as redis:
        settings = Settings(plan.calls, plan.provider_s, redis, python)
        for tool, case in plan.cases():
            yield measure(tool, case, settings)


def run(quick: bool) -> list[dict[str, Any]]:
    """The rows for ``bench/run.py``: ampmeter's billed/cap beside each peer's, per cell."""
    plan = Plan(tools=(0,), workers=(8, 128)) if quick else Plan()
    found = list(measured(plan))
    ours = {c.case: c for c in found if c.tool == "ampmeter"}
    rows = []
    for cell in found:
        if cell.tool == "ampmeter":
            continue
        mine = ours[cell.case]
        rows.append(
            {
                "name": f"{cell.case.tools} tools, {cell.case.workers} threads, one cap: "
                f"billed/cap, ampmeter beside {cell.tool} ({cell.how})",
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
    label, tools, workers, way, estimate = cell.case.key(cell.tool)
    return (
        f"{cell.tool:<22} {estimate:<7} {label:>10} {tools:>2} tools {workers:>3} {way:<8} "
        f"billed/cap {cell.billed_over_cap:6.3f}  billed {cell.billed_calls:>4}  "
        f"refused {cell.refused_before:>4}  stopped after {cell.stopped_after:>4}  "
        f"errors {cell.tally['errors']}  ({cell.how}){error}"
    )


def table(found: list[Cell]) -> str:
    """The cells as a Markdown table."""
    lines = [
        "| tool | estimate | text billed | tools | workers | billed/cap | calls billed | "
        "refused before sending | stopped after a billed call | errors | how it stops |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in found:
        label, tools, workers, way, estimate = c.case.key(c.tool)
        lines.append(
            f"| {c.tool} {c.version} | {estimate} | {label} | {tools} | {workers} {way} | "
            f"{c.billed_over_cap:.3f} | {c.billed_calls} | {c.refused_before} | "
            f"{c.stopped_after} | {c.tally['errors']} | {c.how} |"
        )
    return "\n".join(lines)


def summary(found: list[Cell]) -> str:
    """One row per tool and estimate, one column per workload: billed/cap."""
    columns = list(dict.fromkeys(c.case.key(c.tool)[:4] for c in found))
    head = " | ".join(
        f"{label} {tools} tools, {workers} {way}" for label, tools, workers, way in columns
    )
    lines = [f"| tool | {head} |", "|---|" + "---|" * len(columns)]
    rows = dict.fromkeys((c.tool, c.case.key(c.tool)[4]) for c in found)
    for tool, estimate in rows:
        mine = {
            c.case.key(c.tool)[:4]: c
            for c in found
            if c.tool == tool and c.case.key(c.tool)[4] == estimate
        }
        figures = " | ".join(
            f"{mine[key].billed_over_cap:.2f}" if key in mine else "-" for key in columns
        )
        name = tool if estimate == "-" else f"{tool} ({estimate})"
        lines.append(f"| {name} | {figures} |")
    return "\n".join(lines)


def numbers(text: str, kind: type[float] | type[int], option: str) -> tuple[Any, ...]:
    """A comma-separated option's values (none when empty)."""
    try:
        return tuple(kind(value) for value in text.split(",") if value)
    except ValueError:
        raise SystemExit(f"{option} takes numbers, comma-separated; got {text!r}") from None


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
        default="",
        metavar="N[,N...]",
        help="also a provider (characters/4) drawing its response ids from N values, for each N "
        "(1: the same id every time)",
    )
    options.add_argument(
        "--estimate",
        default="learned",
        help="ampmeter's estimate modes, comma-separated: learned, bound (default: learned)",
    )
    options.add_argument(
        "--tokenizer",
        action="store_true",
        help="also a provider counting text with o200k_base, with ampmeter's tokenizer on",
    )
    options.add_argument(
        "--processes",
        type=int,
        default=0,
        metavar="N",
        help="also run each case as N worker processes sharing the cap through one Redis "
        "(ampmeter and shekel; the other peers have no shared store)",
    )
    options.add_argument("--tools", default=None, help="tool schemas per request (default 0,10)")
    options.add_argument("--workers", default=None, help="worker counts (default 8,32,128)")
    options.add_argument("--calls", type=int, default=CALLS, help="the cap is worth N calls")
    options.add_argument(
        "--provider-s", type=float, default=PROVIDER_S, help="the provider's seconds per call"
    )
    args = options.parse_args(argv)
    peers = tuple(name for name in args.peers.split(",") if name)
    unknown = set(peers) - set(PEERS)
    if unknown:
        options.error(f"unknown peers {sorted(unknown)}; known: {', '.join(PEERS)}")
    estimates = tuple(mode for mode in args.estimate.split(",") if mode)
    if not estimates or not set(estimates) <= {"learned", "bound"}:
        options.error(f"--estimate takes learned and/or bound; got {args.estimate!r}")
    densities = numbers(args.density, float, "--density")
    if not all(0 < d <= 4 for d in densities):
        options.error("--density: each multiple must be above 0 and at most 4 (a token a byte)")
    pools = numbers(args.repeated_ids, int, "--repeated-ids")
    if not all(pool >= 1 for pool in pools):
        options.error("--repeated-ids: each N must be at least 1")
    workers = numbers(args.workers, int, "--workers") if args.workers else WORKERS
    if args.processes < 0 or any(w % max(args.processes, 1) or w < 1 for w in workers):
        options.error("--processes must divide every worker count")
    if args.calls < 1 or args.provider_s < 0:
        options.error("--calls must be at least 1 and --provider-s not negative")
    providers = (
        *(Provider(d) for d in densities),
        *((Provider(tokenizer=True),) if args.tokenizer else ()),
        *(Provider(distinct_ids=pool) for pool in pools),
    )
    tools = numbers(args.tools, int, "--tools") if args.tools else TOOLS
    plan = Plan(
        peers=peers,
        providers=providers,
        estimates=estimates,
        tools=(0,) if args.quick else tools,
        workers=(8, 128) if args.quick else workers,
        processes=args.processes,
        calls=args.calls,
        provider_s=args.provider_s,
    )
    found = []
    for cell in measured(plan):
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
