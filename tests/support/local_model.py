"""The ``llm_server`` fixture: one real llama.cpp server on loopback for the whole session.

Registered once by the root conftest, so the folders that use it share one server; importing
this module loads nothing (the model and llama.cpp load when a test first asks for the server).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ampmeter.local_llm import LocalLLMServer


@pytest.fixture(scope="session")
def llm_server() -> Iterator[LocalLLMServer]:
    """The SmolLM2-135M model served by llama.cpp on loopback, started once per session."""
    # One thread: on a busy 2-core machine llama.cpp's two spinning threads starve each other
    # (measured: a 16-token call took 3-10 s with threads=2 under load, 0.6-1 s with one).
    server = LocalLLMServer(host="127.0.0.1", port=0, n_ctx=2048, threads=1)
    with server:
        yield server
