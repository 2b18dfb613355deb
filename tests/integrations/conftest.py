"""Fixtures of the integration tests: real SDK clients on the local model, metering, replay."""

import os

from support.metering import instrumented, replay
from support.sdk_clients import (
    anthropic_client,
    async_anthropic_client,
    async_openai_client,
    openai_client,
)

# LiteLLM reads its bundled price map instead of downloading one (set before any test imports it).
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

__all__ = [
    "anthropic_client",
    "async_anthropic_client",
    "async_openai_client",
    "instrumented",
    "openai_client",
    "replay",
]
