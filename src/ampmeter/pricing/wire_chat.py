"""The input of an OpenAI Chat Completions request (``"chat"``) and of a legacy Completions
request (``"completions"``), measured from its body.

Billed text: every message's content in every role (text parts, refusals), names, the
assistant's tool and function calls (names and argument JSON), tool results, tool and
legacy function definitions and ``response_format`` (as the JSON sent), and a predicted
output's content (sent, so counted). Framing follows OpenAI's cookbook on counting chat tokens
("How to count tokens with tiktoken"): 3 tokens per message, 1 more for a name, 3 that prime
the reply; for tools, 7 per function and 12 for the tool block (the cookbook's figures for
its rendering of function definitions, which is shorter than their JSON). Images, audio and
files follow :mod:`ampmeter.pricing.openai_media`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from ampmeter.pricing import openai_media
from ampmeter.pricing.request_size import RequestSize, Tally

__all__ = ["measure_chat", "measure_completions"]

TOKENS_PER_MESSAGE: Final = 3
TOKENS_PER_NAME: Final = 1
REPLY_PRIMING: Final = 3
TOKENS_PER_FUNCTION: Final = 7
TOOLS_BLOCK: Final = 12


def measure_chat(
    body: Mapping[str, Any], counter: Callable[[str], int] | None = None
) -> RequestSize:
    """The measure of a Chat Completions ``body`` (``counter``: a tokenizer's count)."""
    tally = Tally()
    model = body.get("model")
    for key, value in body.items():  # only the fields a body has are read
        add = _BODY_PARTS.get(key)
        if add is not None:
            add(value, model, tally)
    tally.framing += REPLY_PRIMING
    return tally.size(counter)


def _messages(messages: object, model: object, tally: Tally) -> None:
    """Every message in one pass: its framing, its text as sent (content as a string, the
    common case, and a refusal), and what each other field adds (content as a list of parts, a
    name, tool and function calls)."""
    if not isinstance(messages, list):
        return
    for message in messages:
        if not isinstance(message, dict):
            continue
        tally.framing += TOKENS_PER_MESSAGE
        for key, value in message.items():  # only the fields a message has are read
            if key in _TEXT_FIELDS and isinstance(value, str):
                tally.append(value)
                continue
            add = _MESSAGE_PARTS.get(key)
            if add is not None:
                add(value, model, tally)


def _functions(functions: object, model: object, tally: Tally) -> None:
    """Tool (or legacy function) definitions: their JSON, and the framing of their block (a
    body that sends both tools and legacy functions counts a block for each: over, not under)."""
    definitions = _list(functions)
    if definitions:
        tally.framing += TOOLS_BLOCK + TOKENS_PER_FUNCTION * len(definitions)
        for definition in definitions:
            tally.json(definition)


def _response_format(response_format: object, model: object, tally: Tally) -> None:
    tally.json(response_format)


def _prediction(prediction: object, model: object, tally: Tally) -> None:
    if isinstance(prediction, dict):  # its content: a string, or a list of text parts
        openai_media.add_content(prediction.get("content"), model, tally)


def measure_completions(
    body: Mapping[str, Any], counter: Callable[[str], int] | None = None
) -> RequestSize:
    """The measure of a legacy Completions ``body`` (``counter``: a tokenizer's count): the
    prompt as text or token ids, and the suffix. Token ids are counted exactly (as framing: no
    text to read)."""
    tally = Tally()
    prompt = body.get("prompt")
    prompts = prompt if isinstance(prompt, list) and not _is_ids(prompt) else [prompt]
    for one in prompts:
        if isinstance(one, str):
            tally.text(one)
        elif isinstance(one, list) and _is_ids(one):
            tally.framing += len(one)
    tally.text(body.get("suffix"))
    return tally.size(counter)


def _is_ids(value: list[Any]) -> bool:
    return bool(value) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)


def _list(value: object) -> list[Any] | tuple[()]:
    return value if isinstance(value, list) else ()


def _name(name: object, model: object, tally: Tally) -> None:
    if isinstance(name, str) and name:
        tally.text(name)
        tally.framing += TOKENS_PER_NAME


def _tool_calls(calls: object, model: object, tally: Tally) -> None:
    for call in _list(calls):
        if isinstance(call, dict):
            _function_call(call.get("function") or call.get("custom"), model, tally)


def _function_call(call: object, model: object, tally: Tally) -> None:
    if isinstance(call, dict):
        tally.text(call.get("name"))
        tally.json(call.get("arguments"))
        tally.json(call.get("input"))


# The fields of a message whose string value is its text as sent.
_TEXT_FIELDS: Final = frozenset({"content", "refusal"})

# What each other field of a message adds (its role is in the framing).
_MESSAGE_PARTS: Final[dict[str, Callable[[Any, object, Tally], None]]] = {
    "name": _name,
    "content": openai_media.add_content,
    "tool_calls": _tool_calls,
    "function_call": _function_call,
}


# What each field of a body adds (fields not here send nothing billed, e.g. max_tokens).
_BODY_PARTS: Final[dict[str, Callable[[Any, object, Tally], None]]] = {
    "messages": _messages,
    "tools": _functions,
    "functions": _functions,
    "response_format": _response_format,
    "prediction": _prediction,
}
