"""Test helpers: a loopback server that replays recorded provider responses.

``ampmeter.testing.recorded`` holds the recorded bodies; ``ampmeter.local_llm`` starts a real
local model for tests that need one.
"""

from ampmeter.testing import recorded
from ampmeter.testing.replay import RecordedRequest, ReplayResponse, ReplayServer

__all__ = ["RecordedRequest", "ReplayResponse", "ReplayServer", "recorded"]
