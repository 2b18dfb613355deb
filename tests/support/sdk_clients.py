"""Real openai and anthropic SDK clients pointed at the session's local model server.

A folder whose tests use them imports these fixtures into its conftest.py; they need the
``openai`` and ``anthropic`` extras.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import anthropic
import openai
import pytest

from ampmeter.local_llm import LocalLLMServer

TEST_API_KEY = "test-key"
# A fresh connection per request: the local server may close a kept-alive connection right
# after a streamed answer, and a client without retries that sends the next request on it
# fails with "Server disconnected without sending a response".
FRESH_CONNECTIONS = {"Connection": "close"}


@pytest.fixture
def openai_client(llm_server: LocalLLMServer) -> Iterator[openai.OpenAI]:
    """A real OpenAI SDK client talking to the local server, no retries."""
    with openai.OpenAI(
        base_url=llm_server.base_url,
        api_key=TEST_API_KEY,
        max_retries=0,
        default_headers=FRESH_CONNECTIONS,
    ) as client:
        yield client


@pytest.fixture
async def async_openai_client(llm_server: LocalLLMServer) -> AsyncIterator[openai.AsyncOpenAI]:
    """A real async OpenAI SDK client talking to the local server, no retries."""
    async with openai.AsyncOpenAI(
        base_url=llm_server.base_url,
        api_key=TEST_API_KEY,
        max_retries=0,
        default_headers=FRESH_CONNECTIONS,
    ) as client:
        yield client


@pytest.fixture
def anthropic_client(llm_server: LocalLLMServer) -> Iterator[anthropic.Anthropic]:
    """A real Anthropic SDK client talking to the local server's Messages API, no retries."""
    with anthropic.Anthropic(
        base_url=llm_server.url,
        api_key=TEST_API_KEY,
        max_retries=0,
        default_headers=FRESH_CONNECTIONS,
    ) as client:
        yield client


@pytest.fixture
async def async_anthropic_client(
    llm_server: LocalLLMServer,
) -> AsyncIterator[anthropic.AsyncAnthropic]:
    """A real async Anthropic SDK client talking to the local server, no retries."""
    async with anthropic.AsyncAnthropic(
        base_url=llm_server.url,
        api_key=TEST_API_KEY,
        max_retries=0,
        default_headers=FRESH_CONNECTIONS,
    ) as client:
        yield client
