"""The input estimators read the bodies the real SDKs send (recorded by the replay server)."""

from __future__ import annotations

from typing import Any

import anthropic
import openai
import pydantic

from ampmeter.pricing.request_size import json_text, measure
from ampmeter.testing import recorded
from ampmeter.testing.replay import ReplayServer
from support.request_bodies import b64, chat_tools, json_chars, png

IMAGE = png(640, 480)


class Forecast(pydantic.BaseModel):
    """What the model answers: whether to take an umbrella, and why."""

    umbrella: bool
    reason: str
    hours_of_rain: list[int]


def without(body: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in keys}


def test_openai_chat_body_as_sent(replay: ReplayServer) -> None:
    replay.script("/v1/chat/completions", recorded.openai_chat_tool_calls())
    client = openai.OpenAI(api_key="sk-test", base_url=replay.openai_base_url, max_retries=0)
    tools = [*chat_tools(5), openai.pydantic_function_tool(Forecast)]
    client.chat.completions.create(
        model="gpt-4o",
        messages=[
            {"role": "system", "content": "Be brief."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Umbrella?"},
                    {
                        "type": "image_url",
                        "image_url": {"url": f"data:image/png;base64,{b64(IMAGE)}"},
                    },
                ],
            },
        ],
        tools=tools,  # type: ignore[arg-type]
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "forecast", "schema": Forecast.model_json_schema()},
        },
        max_tokens=50,
    )
    sent = replay.requests[-1].json()
    size = measure("chat", sent)
    bare = measure("chat", without(sent, "tools", "response_format"))
    assert size.chars - bare.chars == json_chars(sent["tools"]) + len(
        json_text(sent["response_format"])
    )
    assert bare.chars == len("Be brief.") + len("Umbrella?")
    assert size.media == 85 + 170 * 2  # 640x480 at high detail: 2 x 1 tiles of 512
    assert size.framing == 2 * 3 + 3 + 12 + 7 * 6


def test_openai_responses_body_as_sent(replay: ReplayServer) -> None:
    replay.script("/v1/responses", recorded.openai_responses_usage())
    client = openai.OpenAI(api_key="sk-test", base_url=replay.openai_base_url, max_retries=0)
    client.responses.create(
        model="gpt-4.1",
        instructions="Be brief.",
        input=[
            {"role": "user", "content": [{"type": "input_text", "text": "Umbrella?"}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "rain"},
        ],
        tools=[{"type": "function", **t["function"]} for t in chat_tools(3)],  # type: ignore[misc]
        text={
            "format": {
                "type": "json_schema",
                "name": "forecast",
                "schema": Forecast.model_json_schema(),
            }
        },
    )
    sent = replay.requests[-1].json()
    size = measure("responses", sent)
    bare = measure("responses", without(sent, "tools", "text"))
    assert size.chars - bare.chars == json_chars(sent["tools"]) + len(
        json_text(sent["text"]["format"])
    )
    assert bare.chars == len("Be brief.Umbrella?get_weather{}rain")


def test_anthropic_body_as_sent(replay: ReplayServer) -> None:
    replay.script("/v1/messages", recorded.anthropic_message_tool_use())
    client = anthropic.Anthropic(
        api_key="sk-test", base_url=replay.anthropic_base_url, max_retries=0
    )
    tools = [
        {
            "name": t["function"]["name"],
            "description": t["function"]["description"],
            "input_schema": t["function"]["parameters"],
        }
        for t in chat_tools(6)
    ]
    client.messages.create(
        model="claude-haiku-4-5",
        max_tokens=100,
        system="Be brief.",
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Umbrella?"},
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": b64(IMAGE)},
                    },
                ],
            },
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}}],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "rain"}],
            },
        ],
        tools=tools,  # type: ignore[arg-type]
    )
    sent = replay.requests[-1].json()
    size = measure("anthropic", sent)
    bare = measure("anthropic", without(sent, "tools"))
    assert size.chars - bare.chars == json_chars(sent["tools"])
    assert size.framing - bare.framing == 346  # the tool-use system prompt
    assert bare.chars == len("Be brief.Umbrella?get_weather{}rain")
    assert size.media == 410  # 640 * 480 / 750 = 409.6, rounded up
