"""A stop raised into a framework that wraps it is still found: smolagents, for real."""

from __future__ import annotations

import pytest

from ampmeter import ExecutionContext, LimitExceeded, find_limit_exceeded
from ampmeter.local_llm import LocalLLMServer
from ampmeter.sinks.memory import MemorySink

pytestmark = pytest.mark.usefixtures("instrumented")  # conftest.py


def test_smolagents_wraps_the_stop_in_agent_generation_error(llm_server: LocalLLMServer) -> None:
    from smolagents import OpenAIServerModel, ToolCallingAgent
    from smolagents.utils import AgentGenerationError

    model = OpenAIServerModel(model_id=llm_server.model, api_base=llm_server.base_url,
                              api_key="k")  # fmt: skip
    agent = ToolCallingAgent(tools=[], model=model, max_steps=3, verbosity_level=0)
    sink = MemorySink()
    with ExecutionContext(max_steps=0, sinks=[sink]), pytest.raises(AgentGenerationError) as err:
        agent.run("Name one colour.")
    stop = find_limit_exceeded(err.value)
    assert isinstance(stop, LimitExceeded)
    assert err.value.__cause__ is stop  # smolagents keeps it as the cause
    (node,) = [n for n in sink.nodes if n.kind == "llm"]
    assert node.status == "halt" and stop.node_id == node.node_id
