"""Test helpers: loopback servers that stand in for LLM providers.

* :class:`ReplayServer` answers with scripted, recorded provider responses
  (``ampmeter.testing.recorded`` holds the recorded bodies);
* :class:`BillingProvider` answers every OpenAI Chat Completions and Anthropic Messages request
  and bills it from everything it sends, like a real provider, keeping what it billed;
  ``ampmeter.testing.agent_requests`` holds agent-shaped prompts and tool schemas to send it.

``ampmeter.local_llm`` starts a real local model for tests that need one.
"""

from ampmeter.testing import agent_requests, recorded
from ampmeter.testing.billing import BilledCall, BillingProvider
from ampmeter.testing.replay import RecordedRequest, ReplayResponse, ReplayServer

__all__ = [
    "BilledCall",
    "BillingProvider",
    "RecordedRequest",
    "ReplayResponse",
    "ReplayServer",
    "agent_requests",
    "recorded",
]
