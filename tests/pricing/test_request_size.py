"""The input estimators, one per wire format, against request bodies as the SDKs send them."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ampmeter.pricing import media, request_size
from ampmeter.pricing.request_size import RequestSize, input_tokens, json_text, measure
from support.request_bodies import (
    b64,
    chat_tools,
    data_url,
    json_chars,
    pdf,
    pillow_image,
    png,
    wav,
)

SYSTEM = "You are a careful assistant. Answer in English, in at most three sentences."
QUESTION = "What is the weather in Lyon, and should I take an umbrella tomorrow?"
ARGUMENTS = '{"query":"Lyon","limit":3,"mode":"fast"}'
TOOL_RESULT = '{"city":"Lyon","today":"rain, 12 C","tomorrow":"showers, 10 C"}'
ANSWER = "Yes: showers are expected tomorrow in Lyon, so take an umbrella."
SCHEMA = {
    "type": "json_schema",
    "json_schema": {
        "name": "answer",
        "strict": True,
        "schema": {
            "type": "object",
            "properties": {"umbrella": {"type": "boolean"}, "reason": {"type": "string"}},
            "required": ["umbrella", "reason"],
            "additionalProperties": False,
        },
    },
}


def chars(*texts: str) -> int:
    return sum(len(t) for t in texts)


# --------------------------------------------------------------------------- Chat Completions


def chat_body(tools: int = 3) -> dict[str, Any]:
    return {
        "model": "gpt-4o",
        "max_tokens": 400,
        "messages": [
            {"role": "system", "content": SYSTEM},
            {
                "role": "user",
                "name": "ana",
                "content": [
                    {"type": "text", "text": QUESTION},
                    {
                        "type": "image_url",
                        "image_url": {"url": data_url("image/png", png(1024, 1024))},
                    },
                ],
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": ARGUMENTS},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": TOOL_RESULT},
            {"role": "assistant", "content": ANSWER},
            {"role": "user", "content": [{"type": "text", "text": "And in Paris?"}]},
        ],
        "tools": chat_tools(tools),
        "tool_choice": "auto",
        "response_format": SCHEMA,
    }


def test_chat_counts_every_billed_part() -> None:
    body = chat_body(tools=3)
    size = measure("chat", body)
    texts = chars(SYSTEM, "ana", QUESTION, "get_weather", ARGUMENTS, TOOL_RESULT, ANSWER)
    texts += chars("And in Paris?")
    assert size.chars == texts + json_chars(body["tools"]) + len(json_text(SCHEMA))
    # 6 messages at 3, a name, the reply's 3, the tool block's 12 and 7 per function.
    assert size.framing == 6 * 3 + 1 + 3 + 12 + 7 * 3
    # A 1024x1024 image at high detail: scaled to 768x768, 4 tiles of 170 plus 85.
    assert size.media == 85 + 4 * 170
    assert size.utf8_bytes == size.chars  # all ASCII


def test_chat_refusals_legacy_calls_and_predicted_output_are_billed_text() -> None:
    refusal = "I can't help with that."
    prediction = "def area(r):\n    return 3.14159 * r * r\n"
    body = {
        "model": "gpt-4o",
        "messages": [
            {"role": "user", "content": QUESTION},
            {"role": "assistant", "content": None, "refusal": refusal},
            {"role": "assistant", "content": [{"type": "refusal", "refusal": refusal}]},
            {"role": "assistant", "function_call": {"name": "f", "arguments": ARGUMENTS}},
            {"role": "user", "content": "", "refusal": None},
        ],
        "prediction": {"type": "content", "content": prediction},
    }
    size = measure("chat", body)
    assert size.chars == chars(QUESTION, refusal, refusal, "f", ARGUMENTS, prediction)
    assert size.framing == 5 * 3 + 3
    parts = {"type": "content", "content": [{"type": "text", "text": prediction}]}
    as_parts = measure("chat", {**body, "prediction": parts})
    assert as_parts == size


def test_chat_tool_schemas_raise_the_measure_by_their_json() -> None:
    without = measure("chat", chat_body(tools=0))
    with_ten = measure("chat", chat_body(tools=10))
    assert with_ten.chars - without.chars == json_chars(chat_tools(10))
    assert with_ten.framing - without.framing == 12 + 7 * 10
    assert json_chars(chat_tools(20)) > 12_000  # the 20 tools: about 14k characters


def test_chat_image_rules_follow_model_and_detail() -> None:
    def image_body(model: str, url: str, detail: str | None = None) -> dict[str, Any]:
        image: dict[str, Any] = {"url": url}
        if detail:
            image["detail"] = detail
        part = {"type": "image_url", "image_url": image}
        return {"model": model, "messages": [{"role": "user", "content": [part]}]}

    small = data_url("image/png", png(512, 512))
    wide = data_url("image/png", png(4096, 1024))  # to 2048x512: 4 tiles
    assert measure("chat", image_body("gpt-4o", small)).media == 85 + 170
    assert measure("chat", image_body("gpt-4o", wide)).media == 85 + 4 * 170
    assert measure("chat", image_body("gpt-4o", wide, "low")).media == 85
    assert measure("chat", image_body("gpt-4o-mini", small)).media == 2833 + 5667
    # A URL the estimator cannot see is billed at the most: 768x2048, 8 tiles.
    assert measure("chat", image_body("gpt-4o", "https://example.com/a.png")).media == 85 + 8 * 170
    # Patch models: one 32-pixel patch a token, times the model's multiplier.
    assert measure("chat", image_body("gpt-4.1-mini", small)).media == 415  # 16 x 16 patches * 1.62
    assert measure("chat", image_body("o4-mini", "https://x/y.png")).media == 2642  # 1536 * 1.72


@pytest.mark.parametrize(
    ("fmt", "width", "height"),
    [("JPEG", 640, 480), ("GIF", 33, 77), ("WEBP", 300, 200), ("PNG", 5, 9)],
)
def test_image_sizes_are_read_from_their_headers(fmt: str, width: int, height: int) -> None:
    image = pillow_image(fmt, width, height)
    assert media.image_size(media.decode_head(b64(image))) == (width, height)
    assert media.image_size(b"not an image") is None


def test_chat_audio_and_files() -> None:
    audio = {"type": "input_audio", "input_audio": {"data": b64(wav(4.0)), "format": "wav"}}
    file = {
        "type": "file",
        "file": {"filename": "r.pdf", "file_data": data_url("application/pdf", pdf(3))},
    }
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": [audio, file]}]}
    size = measure("chat", body)
    page = 1500 + 85 + 8 * 170  # the page's text bound and its image at high detail
    assert size.media == 101 + 3 * page  # 4 s at 25 a second; the header adds a hair
    assert size.chars == len("r.pdf")


def test_legacy_completions_prompts() -> None:
    assert measure("completions", {"prompt": "Say hi", "suffix": "!"}).chars == 7
    assert measure("completions", {"prompt": ["ab", "cde"]}).chars == 5
    ids = measure("completions", {"prompt": [1, 2, 3, 4]})
    assert (ids.chars, ids.framing) == (0, 4)  # token ids are counted exactly
    assert measure("completions", {"prompt": [[1, 2], [3]]}).framing == 3


# --------------------------------------------------------------------------- Responses


def responses_body() -> dict[str, Any]:
    return {
        "model": "gpt-4.1",
        "instructions": SYSTEM,
        "input": [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": QUESTION},
                    {"type": "input_image", "image_url": "https://x/y.png", "detail": "low"},
                ],
            },
            {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [{"type": "summary_text", "text": "Look it up."}],
                "encrypted_content": "gAAAAB" + "x" * 60,
            },
            {
                "type": "function_call",
                "call_id": "c1",
                "name": "get_weather",
                "arguments": ARGUMENTS,
            },
            {"type": "function_call_output", "call_id": "c1", "output": TOOL_RESULT},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": ANSWER}],
            },
            {"role": "user", "content": "And in Paris?"},
        ],
        "tools": [{"type": "function", **t["function"]} for t in chat_tools(2)],
        "text": {
            "format": {
                "type": "json_schema",
                "name": "answer",
                "schema": SCHEMA["json_schema"]["schema"],
            }
        },
    }


def test_responses_counts_every_billed_part() -> None:
    body = responses_body()
    size = measure("responses", body)
    texts = chars(SYSTEM, QUESTION, "Look it up.", "gAAAAB" + "x" * 60, "get_weather", ARGUMENTS)
    texts += chars(TOOL_RESULT, ANSWER, "And in Paris?")
    expected = texts + json_chars(body["tools"]) + len(json_text(body["text"]["format"]))
    assert size.chars == expected
    assert size.framing == 7 * 3 + 3 + 12 + 7 * 2  # instructions + 6 items, reply, tools
    assert size.media == 85  # a low-detail image
    plain = measure("responses", {"model": "gpt-4.1", "input": "hello there"})
    assert (plain.chars, plain.framing) == (11, 6)


# --------------------------------------------------------------------------- Anthropic


def anthropic_body(tool_choice: dict[str, str] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 512,
        "system": [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": QUESTION},
                    {
                        "type": "image",
                        "source": {
                            "type": "base64",
                            "media_type": "image/png",
                            "data": b64(png(800, 600)),
                        },
                    },
                    {
                        "type": "document",
                        "title": "Forecast",
                        "source": {
                            "type": "base64",
                            "media_type": "application/pdf",
                            "data": b64(pdf(2)),
                        },
                    },
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "I should call the tool.", "signature": "sig"},
                    {
                        "type": "tool_use",
                        "id": "tu1",
                        "name": "get_weather",
                        "input": {"query": "Lyon"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "tu1", "content": TOOL_RESULT}],
            },
        ],
        "tools": [
            {
                "name": t["function"]["name"],
                "description": t["function"]["description"],
                "input_schema": t["function"]["parameters"],
            }
            for t in chat_tools(4)
        ],
    }
    if tool_choice is not None:
        body["tool_choice"] = tool_choice
    return body


def test_anthropic_counts_every_billed_part() -> None:
    body = anthropic_body()
    size = measure("anthropic", body)
    texts = chars(SYSTEM, QUESTION, "Forecast", "I should call the tool.", "get_weather")
    texts += len(json_text({"query": "Lyon"})) + len(TOOL_RESULT)
    assert size.chars == texts + json_chars(body["tools"])
    assert size.framing == 8 + 3 * 5 + 346  # the request, 3 turns, the tool-use system prompt
    assert size.media == 800 * 600 // 750 + 2 * (3000 + 1600)
    forced = measure("anthropic", anthropic_body({"type": "any"}))
    assert size.framing - forced.framing == 346 - 313
    old = measure("anthropic", {**body, "model": "claude-3-opus-20240229"})
    assert old.framing - size.framing == 530 - 346


def test_anthropic_images_are_scaled_to_their_long_edge() -> None:
    def one(data: str) -> int:
        block = {
            "type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": data},
        }
        return measure("anthropic", {"messages": [{"role": "user", "content": [block]}]}).media

    assert one(b64(png(200, 150))) == 40
    assert one(b64(png(3136, 1000))) == 1046  # scaled to 1568x500: 1045.3, rounded up
    assert one("not base64 at all!") == 1600


# --------------------------------------------------------------------------- Gemini


def test_gemini_counts_every_billed_part() -> None:
    schema = {"type": "OBJECT", "properties": {"umbrella": {"type": "BOOLEAN"}}}
    declarations = [
        {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {"type": "OBJECT", "properties": {"city": {"type": "STRING"}}},
        }
    ]
    body = {
        "systemInstruction": {"parts": [{"text": SYSTEM}]},
        "contents": [
            {
                "role": "user",
                "parts": [
                    {"text": QUESTION},
                    {"inlineData": {"mimeType": "image/png", "data": b64(png(300, 300))}},
                    {"inline_data": {"mime_type": "image/png", "data": b64(png(1000, 800))}},
                    {"inlineData": {"mimeType": "audio/wav", "data": b64(wav(2.0))}},
                ],
            },
            {
                "role": "model",
                "parts": [{"functionCall": {"name": "get_weather", "args": {"city": "Lyon"}}}],
            },
            {
                "role": "user",
                "parts": [
                    {"functionResponse": {"name": "get_weather", "response": {"rain": True}}}
                ],
            },
        ],
        "tools": [{"functionDeclarations": declarations}],
        "generationConfig": {"responseMimeType": "application/json", "responseSchema": schema},
    }
    size = measure("gemini", body)
    texts = chars(SYSTEM, QUESTION, "get_weather", json_text({"city": "Lyon"}), "get_weather")
    texts += len(json_text({"rain": True}))
    texts += len(json_text({"functionDeclarations": declarations})) + len(json_text(schema))
    assert size.chars == texts
    assert size.framing == 4 * 4 + 2  # the system instruction, three contents, two text parts
    assert size.media == 258 + 258 * 2 * 2 + 65  # two seconds (and a header) at 32 a second
    gemini_3 = measure("gemini", {**body, "model": "gemini-3-pro-preview"})
    assert gemini_3.media == 2 * 1120 + 65


# --------------------------------------------------------------------------- every format


@pytest.mark.parametrize(
    ("wire", "body"),
    [("chat", chat_body()), ("responses", responses_body()), ("anthropic", anthropic_body())],
)
def test_non_ascii_text_counts_its_bytes(wire: str, body: dict[str, Any]) -> None:
    before = measure(wire, body)  # type: ignore[arg-type]
    body = json.loads(json.dumps(body).replace("Lyon", "Lyön 里昂"))
    after = measure(wire, body)  # type: ignore[arg-type]
    assert after.utf8_bytes - before.utf8_bytes > after.chars - before.chars > 0


def test_bad_wire_and_body() -> None:
    with pytest.raises(ValueError, match="unknown wire format 'grpc'"):
        measure("grpc", {})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be a mapping"):
        measure("chat", [])  # type: ignore[arg-type]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "type",
                    "text",
                    "content",
                    "messages",
                    "input",
                    "parts",
                    "contents",
                    "tools",
                    "image_url",
                    "source",
                    "data",
                    "role",
                    "system",
                    "prompt",
                ]
            ),
            inner,
            max_size=5,
        )
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(
    wire=st.sampled_from(["chat", "completions", "responses", "anthropic", "gemini"]),
    body=st.dictionaries(
        st.sampled_from(
            [
                "messages",
                "input",
                "contents",
                "system",
                "tools",
                "prompt",
                "instructions",
                "systemInstruction",
            ]
        ),
        json_values,
        max_size=4,
    ),
)
def test_any_json_body_measures_without_error(wire: str, body: dict[str, Any]) -> None:
    size = measure(wire, body)  # type: ignore[arg-type]
    assert size.chars >= 0 and size.framing >= 0 and size.media >= 0
    assert input_tokens(size, "gpt-4o") <= input_tokens(size, "gpt-4o", "bound")


def test_measure_does_not_change_the_body() -> None:
    body = chat_body()
    kept = copy.deepcopy(body)
    measure("chat", body)
    assert body == kept


def test_bound_is_bytes_plus_framing_and_media() -> None:
    size = RequestSize(chars=10, utf8_bytes=30, framing=7, media=85)
    assert input_tokens(size, "m", "bound") == 30 + 7 + 85
    assert input_tokens(size, "m") == 10 + 7 + 85  # ten characters at the prior, one a token
    counted = RequestSize(chars=10, utf8_bytes=30, framing=7, media=85, text_tokens=4)
    assert input_tokens(counted, "m", "bound") == 4 + 7 + 85  # the model's own encoding
    with pytest.raises(ValueError, match="estimate mode"):
        input_tokens(size, "m", "guess")  # type: ignore[arg-type]
    assert request_size.measure_text("héllo") == RequestSize(5, 6)


def test_hostile_nesting_and_cycles_still_measure() -> None:
    deep: Any = "leaf"
    for _ in range(50_000):
        deep = [deep]
    body = {
        "model": "gpt-4o",
        "messages": [
            {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": deep}}]},
            {"role": "user", "content": [{"type": "mystery", "payload": deep}]},
        ],
    }
    size = measure("chat", body)
    assert size.chars >= len("f") + 2 * len("leaf")
    loop: dict[str, Any] = {"text": "again"}
    loop["self"] = loop
    size = measure(
        "anthropic", {"messages": [{"role": "user", "content": [{"type": "x", "d": loop}]}]}
    )
    assert size.chars == len("again")
