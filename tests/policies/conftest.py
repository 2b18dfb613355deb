"""Fixtures of the policy tests on SDK calls: real clients on the local model, metering, replay."""

from support.metering import instrumented, replay
from support.sdk_clients import (
    anthropic_client,
    async_anthropic_client,
    async_openai_client,
    openai_client,
)

__all__ = [
    "anthropic_client",
    "async_anthropic_client",
    "async_openai_client",
    "instrumented",
    "openai_client",
    "replay",
]
