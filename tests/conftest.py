"""Shared fixtures: one real llama.cpp server per test session, and SDK clients pointed at it."""

from __future__ import annotations

import os
import tempfile
from collections.abc import AsyncIterator, Iterator

import anthropic
import openai
import pytest

from ampmeter.local_llm import LocalLLMServer
from ampmeter.testing.replay import ReplayServer

TEST_API_KEY = "test-key"

# Ledger journals of the tests go to a throwaway directory, never to the user's cache.
_JOURNALS = tempfile.TemporaryDirectory(prefix="ampmeter-test-journals-")
os.environ["AMPMETER_JOURNAL_DIR"] = _JOURNALS.name
# The price index too (ampmeter/pricing/_cache.py).
os.environ["AMPMETER_CACHE_DIR"] = _JOURNALS.name


@pytest.fixture(scope="session")
def llm_server() -> Iterator[LocalLLMServer]:
    """The SmolLM2-135M model served by llama.cpp on loopback, started once per session."""
    # One thread: on a busy 2-core machine llama.cpp's two spinning threads starve each other
    # (measured: a 16-token call took 3-10 s with threads=2 under load, 0.6-1 s with one).
    server = LocalLLMServer(host="127.0.0.1", port=0, n_ctx=2048, threads=1)
    with server:
        yield server


@pytest.fixture
def openai_client(llm_server: LocalLLMServer) -> Iterator[openai.OpenAI]:
    """A real OpenAI SDK client talking to the local server, no retries."""
    with openai.OpenAI(base_url=llm_server.base_url, api_key=TEST_API_KEY, max_retries=0) as client:
        yield client


@pytest.fixture
async def async_openai_client(llm_server: LocalLLMServer) -> AsyncIterator[openai.AsyncOpenAI]:
    """A real async OpenAI SDK client talking to the local server, no retries."""
    async with openai.AsyncOpenAI(
        base_url=llm_server.base_url, api_key=TEST_API_KEY, max_retries=0
    ) as client:
        yield client


@pytest.fixture
def anthropic_client(llm_server: LocalLLMServer) -> Iterator[anthropic.Anthropic]:
    """A real Anthropic SDK client talking to the local server's Messages API, no retries."""
    with anthropic.Anthropic(
        base_url=llm_server.url, api_key=TEST_API_KEY, max_retries=0
    ) as client:
        yield client


@pytest.fixture
async def async_anthropic_client(
    llm_server: LocalLLMServer,
) -> AsyncIterator[anthropic.AsyncAnthropic]:
    """A real async Anthropic SDK client talking to the local server, no retries."""
    async with anthropic.AsyncAnthropic(
        base_url=llm_server.url, api_key=TEST_API_KEY, max_retries=0
    ) as client:
        yield client


@pytest.fixture
def instrumented() -> Iterator[None]:
    """SDKs and HTTP clients metered for the test (priced by the real table, every context's
    default), unpatched after; a test module asks for it with
    ``pytestmark = pytest.mark.usefixtures("instrumented")``."""
    from ampmeter.integrations import instrument, uninstrument

    instrument()
    yield
    uninstrument()


@pytest.fixture
def replay() -> Iterator[ReplayServer]:
    """A replay server (recorded provider wire bodies) on loopback for the test."""
    with ReplayServer() as server:
        yield server
