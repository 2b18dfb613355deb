"""The client process of ``sdk_bench.py``: real ``openai`` calls in one mode, measured.

It runs inside the clean virtualenv of the tool it measures (``sdk_bench.py`` makes them), so it
imports nothing but the standard library, ``openai`` and, in its mode, that one tool: a peer's
import-time side effects (an audit hook, a patched method) cannot reach another tool's figure.

``python _sdk_client.py MEASURE BASE_URL MODE WORKLOAD CALLS`` where ``MEASURE`` is

* ``wall``: after a warm-up, ``CALLS`` calls; prints the wall and calling-thread CPU µs per call;
* ``instructions``: after a warm-up and a full collection, switches callgrind's collection on
  for the ``CALLS`` calls only (the process runs under ``valgrind --instr-atstart=no``);
* ``opcodes``: one call after the warm-up under ``sys.settrace``; prints its opcodes and the
  Python function calls it made.
"""

from __future__ import annotations

import contextlib
import gc
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import openai

MODEL = "gpt-4o-mini"
MESSAGES = [{"role": "user", "content": "What is the answer?"}]
WARM_UP = 20


def plain(client: openai.OpenAI, asks_usage: bool) -> None:
    client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=50)


def stream(client: openai.OpenAI, asks_usage: bool) -> None:
    # The raw call and the peers ask for the usage chunk themselves; ampmeter's caller does
    # not, so ampmeter asks for it, which is what its users pay.
    options = {"stream_options": {"include_usage": True}} if asks_usage else {}
    for _chunk in client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=50, stream=True, **options
    ):
        pass


WORKLOADS: dict[str, Callable[[openai.OpenAI, bool], None]] = {"plain": plain, "stream": stream}


@contextlib.contextmanager
def raw() -> Iterator[bool]:
    yield True


@contextlib.contextmanager
def ampmeter() -> Iterator[bool]:
    import ampmeter as meter

    meter.instrument()
    try:
        with meter.ExecutionContext("bench", max_cost_usd=1e9):
            yield False
    finally:
        meter.uninstrument()


@contextlib.contextmanager
def shekel() -> Iterator[bool]:
    import shekel as tool

    with tool.budget(max_usd=1e9):
        yield True


@contextlib.contextmanager
def openllmetry() -> Iterator[bool]:
    from opentelemetry.instrumentation.openai import OpenAIInstrumentor
    from opentelemetry.sdk.trace import TracerProvider

    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument(tracer_provider=TracerProvider())
    try:
        yield True
    finally:
        instrumentor.uninstrument()


MODES: dict[str, Callable[[], contextlib.AbstractContextManager[bool]]] = {
    "raw": raw,
    "ampmeter": ampmeter,
    "shekel": shekel,
    "openllmetry": openllmetry,
}


def _collect(on: bool) -> None:
    """Switch callgrind's collection for this process on or off (it returns once done)."""
    switch = "on" if on else "off"
    subprocess.run(
        ["callgrind_control", "-i", switch, str(os.getpid())], check=True, capture_output=True
    )


def measure(what: str, base_url: str, mode: str, workload: str, calls: int) -> str:
    """What ``what`` measures of ``calls`` calls (one for opcodes), as one line of numbers."""
    call = WORKLOADS[workload]
    with (
        openai.OpenAI(base_url=base_url, api_key="bench", max_retries=0) as client,
        MODES[mode]() as asks_usage,
    ):
        for _ in range(WARM_UP):
            call(client, asks_usage)
        # What start-up made (modules, a price table loaded by the first call) is collected
        # now: otherwise a full collection of it falls inside the measured calls of one mode
        # and not the other, depending only on when the collector's thresholds are crossed.
        gc.collect()
        if what == "instructions":
            _collect(True)
            for _ in range(calls):
                call(client, asks_usage)
            _collect(False)
            return ""
        if what == "opcodes":
            return " ".join(map(str, _opcodes(lambda: call(client, asks_usage))))
        start, start_cpu = time.perf_counter(), time.thread_time()
        for _ in range(calls):
            call(client, asks_usage)
        cpu = (time.thread_time() - start_cpu) / calls * 1e6
        return f"{(time.perf_counter() - start) / calls * 1e6} {cpu}"


def _opcodes(job: Callable[[], None]) -> tuple[int, int]:
    count = functions = 0

    def trace(frame: Any, event: str, arg: Any) -> Any:
        nonlocal count, functions
        frame.f_trace_opcodes = True
        if event == "opcode":
            count += 1
        elif event == "call":
            functions += 1
        return trace

    sys.settrace(trace)
    try:
        job()
    finally:
        sys.settrace(None)
    return count, functions


if __name__ == "__main__":
    what, base_url, mode, workload, calls = sys.argv[1:6]
    print(measure(what, base_url, mode, workload, int(calls)), flush=True)
