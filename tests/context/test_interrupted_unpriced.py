"""A call of an unpriced model interrupted after it was sent is counted as a sent, unpriced call
(its bill is unknown and it reserved nothing to charge), never as a free stop before sending."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ampmeter import ExecutionContext, JsonlSink
from ampmeter.analysis import summarize
from ampmeter.keys import KEY_UNPRICED_LLM_CALLS


def test_an_interrupted_unpriced_call_is_sent_and_unpriced_not_halted(tmp_path: Path) -> None:
    out = tmp_path / "events.jsonl"
    sink = JsonlSink(str(out))
    with ExecutionContext("interrupts", sinks=[sink]) as ctx:
        sent = ctx.llm_call("sent", model="in-house-model-without-a-price", max_tokens=100)
        with pytest.raises(KeyboardInterrupt), sent:
            raise KeyboardInterrupt
    sink.close()
    node = next(n for n in ctx.graph.nodes() if n.name == "sent")
    assert node.status == "fail" and node.error_class == "KeyboardInterrupt"
    assert node.metadata["cost_status"] == "unpriced"
    assert ctx.stats.get_counter(KEY_UNPRICED_LLM_CALLS) == 1
    assert ctx.stats.reserved() == {}
    events = [json.loads(text) for text in out.read_text().splitlines()]
    (logged,) = (e for e in events if e["operation"] == "sent")
    assert logged["metadata"]["status"] == "fail"
    assert logged["metadata"]["cost_status"] == "unpriced"
    (run,) = summarize([out]).runs  # `summary` and `report` read the same
    assert run.unpriced_calls == 1 and run.halted == 0
