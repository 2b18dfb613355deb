"""How many ampmeter files and function calls one instrumented ``openai`` call goes through.

One plain chat call (``client.chat.completions.create``) inside an open context with a cost
limit, against the loopback replay server, after two warm-up calls: ``sys.setprofile`` sees every
Python function called during the measured call, and this counts those whose code lives in the
``ampmeter`` package (the replay server's own thread is not profiled; ``ampmeter.testing`` is
left out). Prints the number of files entered, of calls made, and of moves from one file to
another, then the calls per file.

``python bench/call_path.py [--stream]`` (``--stream``: a stream that ends with a usage chunk).
Issue 38's targets: at most 16 files and 45 calls for the plain call.
"""

from __future__ import annotations

import argparse
import collections
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import openai

import ampmeter
from ampmeter.testing import recorded
from ampmeter.testing.replay import ReplayServer

PACKAGE = Path(ampmeter.__file__).resolve().parent
LEFT_OUT = PACKAGE / "testing"


def measure(stream: bool) -> tuple[collections.Counter[str], int]:
    """The ampmeter calls of one instrumented call, per file, and the moves between files."""
    calls: collections.Counter[str] = collections.Counter()
    moves = 0
    last: str | None = None
    me = threading.get_ident()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal moves, last
        if event != "call" or threading.get_ident() != me:
            return
        path = Path(frame.f_code.co_filename)
        if not path.is_relative_to(PACKAGE) or path.is_relative_to(LEFT_OUT):
            return
        name = str(path.relative_to(PACKAGE.parent))
        calls[name] += 1
        if last is not None and name != last:
            moves += 1
        last = name

    ampmeter.instrument()
    with ReplayServer() as replay:
        client = openai.OpenAI(base_url=replay.openai_base_url, api_key="k", max_retries=0)
        with ampmeter.ExecutionContext("bench", max_cost_usd=10):
            for measured in (False, False, True):  # two warm-ups, then the measured call
                replay.script("/v1/chat/completions", _answer(stream))
                if measured:
                    sys.setprofile(profile)
                try:
                    _call(client, stream)
                finally:
                    sys.setprofile(None)
    return calls, moves


def _answer(stream: bool) -> Any:
    return recorded.openai_chat_stream_usage() if stream else recorded.openai_chat_tool_calls()


def _call(client: openai.OpenAI, stream: bool) -> None:
    messages: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
    if stream:
        chunks = client.chat.completions.create(
            model="gpt-4o-mini", messages=messages, max_tokens=64, stream=True
        )
        for _ in chunks:
            pass
    else:
        client.chat.completions.create(model="gpt-4o-mini", messages=messages, max_tokens=64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stream", action="store_true", help="measure a stream with usage")
    options = parser.parse_args()
    calls, moves = measure(options.stream)
    print(f"files entered: {len(calls)}")
    print(f"function calls: {sum(calls.values())}")
    print(f"moves between files: {moves}")
    for name, count in calls.most_common():
        print(f"  {count:4d}  {name}")


if __name__ == "__main__":
    main()
