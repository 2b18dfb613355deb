"""Instructions and time ampmeter adds to a real ``openai`` chat call, beside its peers.

The provider is a loopback HTTP server in its own process answering at once with recorded
OpenAI bodies (``ampmeter.testing.recorded``), each response with an id of its own, so the
client's work is what is measured. Every tool runs in **its own clean virtualenv** holding the
same ``openai`` release and nothing but that tool (made under ``bench/.sdk-venvs`` on first use,
ignored by git): a package the development environment happens to hold cannot enter a figure
(its ``huggingface_hub`` imports ``filelock``, whose audit hook adds about 50k instructions to
every SDK call in the process). The client process is ``bench/_sdk_client.py``; the modes:

* ``raw``: the SDK as installed (the baseline), in a virtualenv with ``openai`` only;
* ``ampmeter``: ``instrument()`` and an open ``ExecutionContext`` (node, limits check,
  reservation, usage, price), with this checkout installed;
* ``shekel``: an open ``shekel.budget()`` (the release pinned in ``peers-requirements.txt``);
* ``openllmetry``: ``OpenAIInstrumentor`` with an SDK tracer provider and no exporter.

Two workloads: a plain chat call, and a stream that ends with a usage chunk. The raw and peer
streams ask for that chunk themselves (``stream_options.include_usage``); ampmeter's caller does
not, so ampmeter asks for it and hides it, which is what its users pay.

``python bench/sdk_bench.py [--quick]``: rounds interleave the modes' client processes in a
rotating order; each gives the mean wall time and calling-thread CPU time per call after its
warm-up; "added" is the median over rounds of a mode's time minus raw's in the same round.

``python bench/sdk_bench.py --instructions [--quick]`` (needs valgrind; never part of ``make
test`` or ``make bench``) counts the machine instructions a client process executes per call,
raw and each tool, in one run: callgrind counts nothing until the warm-up is done and a full
collection has run, then the ``N`` calls only, so neither start-up nor a collection of what
start-up made enters the figure, and it does not move with the machine's load.

``python bench/sdk_bench.py --opcodes`` counts the Python opcodes one call executes after the
warm-up, and the Python function calls it makes (``sys.settrace`` events), exactly.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _options import parse
from _venvs import clean_python

HERE = Path(__file__).resolve().parent
CLIENT = HERE / "_sdk_client.py"
VENVS = HERE / ".sdk-venvs"
PLAIN_TARGET = 1.5
STREAM_TARGET = 3.0
WORKLOADS = ("plain", "stream")

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


def _pinned(name: str) -> str:
    """``name==version``: the release the development environment holds (its lock), or else
    the one ``peers-requirements.txt`` pins."""
    try:
        return f"{name}=={importlib.metadata.version(name)}"
    except importlib.metadata.PackageNotFoundError:
        for line in (HERE / "peers-requirements.txt").read_text().splitlines():
            if line.split("==")[0].strip() == name:
                return line.strip()
        raise


def _requirements() -> dict[str, list[str]]:
    openai = _pinned("openai")
    return {
        "raw": [openai],
        "ampmeter": [openai, f"-e {HERE.parent}"],
        "shekel": [openai, _pinned("shekel")],
        "openllmetry": [
            openai,
            _pinned("opentelemetry-instrumentation-openai"),
            _pinned("opentelemetry-sdk"),
        ],
    }


def pythons(modes: tuple[str, ...]) -> dict[str, Path]:
    """Each mode's clean interpreter (raw first); a peer that cannot be installed is left out
    with a line saying why, and so is everything when raw or ampmeter cannot."""
    wanted = _requirements()
    found: dict[str, Path] = {}
    for mode in ("raw", *modes):
        python, why = clean_python(VENVS / mode, wanted[mode])
        if python is None:
            if mode in ("raw", "ampmeter"):
                sys.exit(f"[sdk] cannot make the {mode} virtualenv: {why}")
            print(f"[sdk] {mode} left out: {why}", file=sys.stderr)
            continue
        found[mode] = python
    return found


def _client(
    python: Path,
    what: str,
    base_url: str,
    mode: str,
    workload: str,
    calls: int,
    prefix: list[str] | None = None,
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [*(prefix or []), str(python), str(CLIENT), what, base_url, mode, workload, str(calls)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONHASHSEED": "0"},  # string hashes move dict probing
    )
    if done.returncode != 0:
        raise RuntimeError(f"the {mode} {workload} client failed:\n{done.stderr[-2000:]}")
    return done


# -- wall and CPU time per call ------------------------------------------------------------


def _measure(
    found: dict[str, Path], base_url: str, workload: str, rounds: int, calls: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Wall time and calling-thread CPU time per call (µs) of each mode, one value per round."""
    names = list(found)
    wall: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    for round_no in range(rounds):
        for name in names[round_no % len(names) :] + names[: round_no % len(names)]:
            out = _client(found[name], "wall", base_url, name, workload, calls).stdout.split()
            wall[name].append(float(out[-2]))
            cpu[name].append(float(out[-1]))
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
    found = pythons(("ampmeter", "shekel", "openllmetry"))
    with _provider() as base_url:
        plain_wall, plain_cpu = _measure(found, base_url, "plain", rounds, calls)
        stream_wall, stream_cpu = _measure(found, base_url, "stream", rounds, calls)
    return [
        *_rows("plain chat call, wall", plain_wall, PLAIN_TARGET),
        *_rows("plain chat call, caller's CPU", plain_cpu, None),
        *_rows("stream with usage, wall", stream_wall, STREAM_TARGET),
        *_rows("stream with usage, caller's CPU", stream_cpu, None),
    ]


# -- instructions per call (callgrind) -------------------------------------------------------


def _instructions(python: Path, base_url: str, mode: str, workload: str, calls: int) -> float:
    """Instructions the client process executes per call, over ``calls`` calls after a warm-up."""
    with tempfile.TemporaryDirectory(prefix="sdk_bench.") as tmp:
        valgrind = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={os.path.join(tmp, 'callgrind.out')}",
        ]
        done = _client(python, "instructions", base_url, mode, workload, calls, valgrind)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise RuntimeError(f"callgrind counted nothing for {mode} {workload}:\n{done.stderr}")
    return int(found.group(1)) / calls


def instructions(quick: bool) -> list[tuple[str, str, float, float]]:
    """(workload, mode, raw, mode's) instructions per call for the plain call and the stream:
    ampmeter, and shekel beside it, each in its clean virtualenv, in one run."""
    calls = 100 if quick else 300
    found = pythons(("ampmeter", "shekel"))
    rows = []
    with _provider() as base_url:
        for workload in WORKLOADS:
            raw = _instructions(found["raw"], base_url, "raw", workload, calls)
            for mode in found:
                if mode != "raw":
                    metered = _instructions(found[mode], base_url, mode, workload, calls)
                    rows.append((workload, mode, raw, metered))
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


def opcodes() -> list[tuple[str, str, int, int]]:
    """(workload, mode, opcodes, Python calls) of one call for every mode, each in a fresh
    process in its clean virtualenv."""
    found = pythons(("ampmeter", "shekel", "openllmetry"))
    rows = []
    with _provider() as base_url:
        for workload in WORKLOADS:
            for mode, python in found.items():
                out = _client(python, "opcodes", base_url, mode, workload, 1).stdout.split()
                rows.append((workload, mode, int(out[-2]), int(out[-1])))
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


if __name__ == "__main__":
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
