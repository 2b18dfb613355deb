"""Time ampmeter adds to a real ``openai`` chat call, beside its peers doing the same job.

The provider is a loopback HTTP server in its own process answering at once with recorded
OpenAI bodies (``ampmeter.testing.recorded``), so the client's work is what is measured. One
``openai.OpenAI`` client makes every call; rounds interleave the modes in a rotating order:

* ``raw``: the SDK as installed (the baseline);
* ``ampmeter``: ``instrument()`` and an open ``ExecutionContext`` (node, limits check,
  reservation, usage, price);
* ``shekel``: an open ``shekel.budget()`` (it patches the SDK while a budget is open);
* ``openllmetry``: ``OpenAIInstrumentor`` (``opentelemetry-instrumentation-openai``) with an SDK
  tracer provider and no exporter (the instrumentation's own work).

Two workloads: a plain chat call, and a stream that ends with a usage chunk. The raw and peer
streams ask for that chunk themselves (``stream_options.include_usage``); ampmeter's caller does
not, so ampmeter asks for it and hides it, which is what its users pay. Each figure is the
mean time per call in a round, as wall time and as CPU time of the calling thread (what the
metering itself costs; steadier than wall time on a busy machine); "added" is the median over
rounds of a mode's time minus raw's in the same round, in µs and as a share of the raw call.

Targets (issue 15): ampmeter adds at most 1.5% to a plain call and 3% to the stream.

Run: ``python bench/sdk_bench.py [--quick]``.

``python bench/sdk_bench.py --instructions [--quick]`` (needs valgrind; never part of ``make
test`` or ``make bench``) counts instead the machine instructions a client process executes per
call, raw, metered by ampmeter and, when installed, under shekel: callgrind counts nothing until
the warm-up is done, then the ``N`` calls only (the client switches collection on and off with
``callgrind_control``) after a full garbage collection, so neither start-up, nor a collection
of what start-up made, nor a one-off difference between two processes' start-ups enters the
figure, and it does not move with the machine's load.

``python bench/sdk_bench.py --opcodes`` counts the Python opcodes one call executes after the
warm-up, and the Python function calls it makes (each sets up a frame), each mode in its own
process (``sys.settrace`` events). The count is exact: it
does not move with the seed, the heap or what else the environment installs, while callgrind's
count moves with layout effects of the process (the type-attribute cache, dict probing, the
allocator), larger when a peer imports more (``shekel.budget()`` imports every SDK it patches).
Hold a peer comparison against this count.
"""

from __future__ import annotations

import contextlib
import gc
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import openai

import ampmeter
from _options import parse

# shekel patches LiteLLM too, importing it: keep LiteLLM from fetching its price map.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

MODEL = "gpt-4o-mini"
MESSAGES = [{"role": "user", "content": "What is the answer?"}]
PLAIN_TARGET = 1.5
STREAM_TARGET = 3.0

# The provider: a stdlib HTTP/1.1 server (keep-alive) that answers every chat request with the
# recorded completion, or the recorded chunks when streaming (the usage chunk only if asked),
# each with an id of its own as from a provider (a repeated id would count as a replay).
_SERVER = r"""
import itertools, json, socket, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from ampmeter.testing import recorded

plain = json.dumps(recorded.load("openai_chat_tool_calls")).encode()
chunks = recorded.load("openai_chat_stream_usage")
ids = [json.dumps(c["id"]).encode() for c in (recorded.load("openai_chat_tool_calls"), chunks[0])]
numbers = itertools.count()

def sse(with_usage):
    events = [c for c in chunks if c["choices"] or with_usage]
    body = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in events)
    return body + b"data: [DONE]\n\n"

streams = {True: sse(True), False: sse(False)}

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()  # headers and body go in two writes: do not let Nagle delay the second
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["content-length"])))
        if request.get("stream"):
            options = request.get("stream_options") or {}
            body, kind = streams[bool(options.get("include_usage"))], "text/event-stream"
        else:
            body, kind = plain, "application/json"
        number = str(next(numbers)).encode()
        for old in ids:
            body = body.replace(old, old[:-1] + b"-" + number + b'"')
        self.send_response(200)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


@contextlib.contextmanager
def _provider() -> Iterator[str]:
    proc = subprocess.Popen([sys.executable, "-c", _SERVER], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        proc.wait()


def _plain(client: openai.OpenAI, asks_usage: bool) -> None:
    client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=50)


def _stream(client: openai.OpenAI, asks_usage: bool) -> None:
    options = {"stream_options": {"include_usage": True}} if asks_usage else {}
    for _chunk in client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=50, stream=True, **options
    ):
        pass


@contextlib.contextmanager
def _raw() -> Iterator[bool]:
    yield True


@contextlib.contextmanager
def _ampmeter() -> Iterator[bool]:
    ampmeter.instrument()
    try:
        with ampmeter.ExecutionContext("bench", max_cost_usd=1e9):
            yield False  # the caller does not ask for usage: ampmeter does
    finally:
        ampmeter.uninstrument()


@contextlib.contextmanager
def _shekel() -> Iterator[bool]:
    import shekel

    with shekel.budget(max_usd=1e9):
        yield True


_otel: Any = None


@contextlib.contextmanager
def _openllmetry() -> Iterator[bool]:
    global _otel
    from opentelemetry.instrumentation.openai import OpenAIInstrumentor
    from opentelemetry.sdk.trace import TracerProvider

    if _otel is None:
        _otel = (OpenAIInstrumentor(), TracerProvider())
    instrumentor, provider = _otel
    instrumentor.instrument(tracer_provider=provider)
    try:
        yield True
    finally:
        instrumentor.uninstrument()


def _peers() -> dict[str, Callable[[], contextlib.AbstractContextManager[bool]]]:
    modes: dict[str, Callable[[], contextlib.AbstractContextManager[bool]]] = {
        "raw": _raw,
        "ampmeter": _ampmeter,
    }
    for name, factory, module in (
        ("shekel", _shekel, "shekel"),
        ("openllmetry", _openllmetry, "opentelemetry.instrumentation.openai"),
    ):
        try:
            __import__(module)
        except ImportError:
            print(f"[sdk] {name} is not installed: left out", file=sys.stderr)
            continue
        modes[name] = factory
    return modes


@contextlib.contextmanager
def _isolated(name: str) -> Iterator[None]:
    """Put back ``Completions.create`` as it was before a mode, if the mode's teardown did not.

    OpenLLMetry's ``uninstrument()`` can leave its wrapper in place once another library has
    patched the same method, so its wrappers piled up round after round (every later mode,
    ampmeter's included, then paid for all of them, and a full run never ended).
    """
    from openai.resources.chat.completions import Completions

    before = Completions.__dict__["create"]
    try:
        yield
    finally:
        if Completions.__dict__["create"] is not before:
            print(f"[sdk] {name} left Completions.create patched: put back", file=sys.stderr)
            Completions.create = before  # type: ignore[method-assign]


def _measure(
    client: openai.OpenAI, call: Callable[[openai.OpenAI, bool], None], rounds: int, calls: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Wall time and calling-thread CPU time per call (µs) of each mode, one value per round."""
    modes = _peers()
    names = list(modes)
    wall: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    for round_no in range(rounds):
        order = names[round_no % len(names) :] + names[: round_no % len(names)]
        for name in order:
            with _isolated(name), modes[name]() as asks_usage:
                call(client, asks_usage)  # warm this mode's path
                start, start_cpu = time.perf_counter(), time.thread_time()
                for _ in range(calls):
                    call(client, asks_usage)
                cpu[name].append((time.thread_time() - start_cpu) / calls * 1e6)
                wall[name].append((time.perf_counter() - start) / calls * 1e6)
    return wall, cpu


def _added(per_round: dict[str, list[float]], name: str) -> float:
    """Median over rounds of the mode's time minus raw's in the same round (drift cancels)."""
    return statistics.median(m - r for m, r in zip(per_round[name], per_round["raw"], strict=True))


def _rows(
    workload: str, per_round: dict[str, list[float]], target: float | None
) -> list[dict[str, Any]]:
    raw = statistics.median(per_round["raw"])
    added = {name: _added(per_round, name) for name in per_round if name != "raw"}
    share = added["ampmeter"] / raw * 100
    rows: list[dict[str, Any]] = [
        {
            "name": f"{workload}: added to the raw call ({share:.2f}%)",
            "unit": "µs/call",
            "ampmeter": round(added["ampmeter"], 1),
            "baseline": round(raw, 1),
            "baseline_name": "raw call",
            "ratio": None,
            "target": None if target is None else f"<= {target:g}% of the raw call",
            "met": None if target is None else share <= target,
        }
    ]
    for peer in ("shekel", "openllmetry"):
        if peer in added:
            rows.append(
                {
                    "name": f"{workload}: added, beside {peer} ({added[peer] / raw * 100:.2f}%)",
                    "unit": "µs/call",
                    "ampmeter": round(added["ampmeter"], 1),
                    "baseline": round(added[peer], 1),
                    "baseline_name": peer,
                    "ratio": round(added[peer] / added["ampmeter"], 2)
                    if added["ampmeter"] > 0
                    else None,
                    "target": None,
                    "met": None,
                }
            )
    return rows


def run(quick: bool) -> list[dict[str, Any]]:
    rounds, calls = (6, 100) if quick else (15, 300)
    with (
        _provider() as base_url,
        openai.OpenAI(base_url=base_url, api_key="bench", max_retries=0) as client,
    ):
        plain_wall, plain_cpu = _measure(client, _plain, rounds, calls)
        stream_wall, stream_cpu = _measure(client, _stream, rounds, calls)
    return [
        *_rows("plain chat call, wall", plain_wall, PLAIN_TARGET),
        *_rows("plain chat call, caller's CPU", plain_cpu, None),
        *_rows("stream with usage, wall", stream_wall, STREAM_TARGET),
        *_rows("stream with usage, caller's CPU", stream_cpu, None),
    ]


# -- instructions per call (callgrind) -------------------------------------------------------

_WORKLOADS: dict[str, Callable[[openai.OpenAI, bool], None]] = {"plain": _plain, "stream": _stream}
_WARM_UP = 20


def _collect(on: bool) -> None:
    """Switch callgrind's collection for this process on or off (it returns once done)."""
    switch = "on" if on else "off"
    subprocess.run(
        ["callgrind_control", "-i", switch, str(os.getpid())], check=True, capture_output=True
    )


def _client(base_url: str, mode: str, workload: str, calls: int) -> None:
    """The process callgrind runs: a warm-up, then ``calls`` calls in one mode, counted."""
    call = _WORKLOADS[workload]
    with (
        openai.OpenAI(base_url=base_url, api_key="bench", max_retries=0) as client,
        _peers()[mode]() as asks_usage,
    ):
        for _ in range(_WARM_UP):
            call(client, asks_usage)
        # What start-up made (modules, a price table loaded by the first call) is collected
        # now: otherwise a full collection of it falls inside the counted calls of one mode and
        # not the other, depending only on when the collector's thresholds are crossed.
        gc.collect()
        _collect(True)
        for _ in range(calls):
            call(client, asks_usage)
        _collect(False)


def _instructions(base_url: str, mode: str, workload: str, calls: int) -> float:
    """Instructions the client process executes per call, over ``calls`` calls after a warm-up."""
    with tempfile.TemporaryDirectory(prefix="sdk_bench.") as tmp:
        done = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--instr-atstart=no",
                f"--callgrind-out-file={os.path.join(tmp, 'callgrind.out')}",
                sys.executable,
                __file__,
                "--client",
                base_url,
                mode,
                workload,
                str(calls),
            ],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "PYTHONHASHSEED": "0"},  # string hashes move dict probing
        )
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"the {mode} {workload} client failed:\n{done.stderr[-2000:]}")
    return int(found.group(1)) / calls


def instructions(quick: bool) -> list[tuple[str, str, float, float]]:
    """(workload, mode, raw, mode's) instructions per call for the plain call and the stream:
    ampmeter, and shekel beside it when installed."""
    calls = 100 if quick else 300
    modes = [mode for mode in ("ampmeter", "shekel") if mode in _peers()]
    rows = []
    with _provider() as base_url:
        for workload in _WORKLOADS:
            raw = _instructions(base_url, "raw", workload, calls)
            for mode in modes:
                rows.append((workload, mode, raw, _instructions(base_url, mode, workload, calls)))
    return rows


def _print_instructions(quick: bool) -> None:
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        sys.exit(
            "--instructions needs valgrind and its callgrind_control (apt-get install valgrind)"
        )
    for workload, mode, raw, metered in instructions(quick):
        added = metered - raw
        print(
            f"{workload:7s} raw {raw:11,.0f}  {mode:9s} {metered:11,.0f}  instructions/call   "
            f"added {added:9,.0f} ({added / raw * 100:.2f}% of the raw call)"
        )


# -- Python opcodes per call (exact) -------------------------------------------------------


def _opcodes_of_one_call(base_url: str, mode: str, workload: str) -> tuple[int, int]:
    """Opcodes the calling thread executes in one call, after the warm-up, in one mode, and
    the Python function calls it makes."""
    call = _WORKLOADS[workload]
    count = calls = 0

    def trace(frame: Any, event: str, arg: Any) -> Any:
        nonlocal count, calls
        frame.f_trace_opcodes = True
        if event == "opcode":
            count += 1
        elif event == "call":
            calls += 1
        return trace

    with (
        openai.OpenAI(base_url=base_url, api_key="bench", max_retries=0) as client,
        _peers()[mode]() as asks_usage,
    ):
        for _ in range(_WARM_UP):
            call(client, asks_usage)
        sys.settrace(trace)
        try:
            call(client, asks_usage)
        finally:
            sys.settrace(None)
    return count, calls


def opcodes() -> list[tuple[str, str, int, int]]:
    """(workload, mode, opcodes, Python calls per call) for every installed mode, each in a
    fresh process."""
    rows = []
    with _provider() as base_url:
        for workload in _WORKLOADS:
            for mode in _peers():
                done = subprocess.run(
                    [sys.executable, __file__, "--opcodes-client", base_url, mode, workload],
                    capture_output=True,
                    text=True,
                    check=False,
                )
                if done.returncode != 0:
                    raise RuntimeError(f"the {mode} {workload} client failed:\n{done.stderr}")
                count, calls = done.stdout.split()[-2:]
                rows.append((workload, mode, int(count), int(calls)))
    return rows


def _print_opcodes() -> None:
    rows = opcodes()
    raw = {workload: (count, calls) for workload, mode, count, calls in rows if mode == "raw"}
    for workload, mode, count, calls in rows:
        if mode != "raw":
            raw_count, raw_calls = raw[workload]
            print(
                f"{workload:7s} raw {raw_count:8,d}  {mode:12s} {count:8,d} opcodes/call",
                f"+{count - raw_count:,d}   Python calls +{calls - raw_calls:,d}",
            )


if __name__ == "__main__" and sys.argv[1:2] == ["--opcodes-client"]:
    print(*_opcodes_of_one_call(sys.argv[2], sys.argv[3], sys.argv[4]))
elif __name__ == "__main__" and sys.argv[1:2] == ["--client"]:
    _client(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
elif __name__ == "__main__":
    options = parse(
        __doc__,
        instructions="count machine instructions per call under callgrind (needs valgrind)",
        opcodes="count the Python opcodes and function calls of one call, exactly",
    )
    if options.opcodes and options.instructions:
        sys.exit("--opcodes and --instructions are two different counts: choose one")
    if options.opcodes:
        _print_opcodes()
    elif options.instructions:
        _print_instructions(options.quick)
    else:
        for row in run(options.quick):
            print(
                f"{row['name']:60s} ampmeter {row['ampmeter']:7.1f} µs   "
                f"{row['baseline_name']} {row['baseline']:7.1f} µs"
            )
