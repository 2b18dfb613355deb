"""A ReAct agent in plain text: Thought / Action / Observation, then a Final Answer.

The agent talks to any OpenAI-compatible server through the real ``openai`` SDK; ampmeter sees
those calls through its instrumentation, so the agent itself only reports what the SDK cannot
know: its tool calls and the replies it could not parse.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Final

from ampmeter.context import ExecutionContext
from ampmeter.demo.tools import TOOLS, ToolError
from ampmeter.errors import LimitExceeded
from ampmeter.limits import ExceededLimit
from ampmeter.trace import ParseErrorTrace

__all__ = ["SYSTEM_PROMPT", "AgentResult", "parse_reply", "run_agent"]

SYSTEM_PROMPT: Final = (
    "Answer the question. You can use tools.\n"
    "Tools: calculator[expression] computes arithmetic; lookup[term] finds a fact.\n"
    "Reply in this format:\n"
    "Thought: what to do\n"
    "Action: calculator[2+2]\n"
    "Then you get an Observation. When you know the answer reply:\n"
    "Final Answer: the answer"
)
# One worked example: small models follow a shown format far better than a described one.
EXAMPLE: Final = (
    {"role": "user", "content": "Question: What is 3 + 5?"},
    {"role": "assistant", "content": "Thought: I add the numbers.\nAction: calculator[3 + 5]"},
    {"role": "user", "content": "Observation: 8"},
    {"role": "assistant", "content": "Final Answer: 8"},
)
_FORMAT_REMINDER: Final = {
    "role": "user",
    "content": "Use the format: 'Action: tool[input]' or 'Final Answer: ...'",
}
_FINAL: Final = re.compile(r"final answer\s*:\s*(.+)", re.IGNORECASE | re.DOTALL)
_ACTION: Final = re.compile(
    r"action\s*:\s*(calculator|lookup)\s*[\[(]\s*(.+?)\s*[\])]", re.IGNORECASE | re.DOTALL
)


@dataclass(frozen=True, slots=True)
class Parsed:
    """One reply, understood: a tool to call or a final answer."""

    final: str | None = None
    tool: str | None = None
    argument: str = ""


def parse_reply(text: str) -> Parsed | None:
    """The action or final answer in ``text``, or None when it follows neither format."""
    action = _ACTION.search(text)
    final = _FINAL.search(text)
    if action is not None and (final is None or action.start() < final.start()):
        return Parsed(tool=action.group(1).lower(), argument=action.group(2))
    if final is not None:
        answer = final.group(1).strip().splitlines()
        return Parsed(final=answer[0].strip() if answer else "")
    return None


@dataclass(slots=True)
class AgentResult:
    """How one question went; when a limit stopped it, which call and why (``stop_*``)."""

    question: str
    answer: str | None = None
    stopped: str | None = None
    stop_before: str | None = None  # the call that was not made, e.g. "LLM call 2"
    stop_exceeded: ExceededLimit | None = None
    stop_node: str | None = None  # the halted call's node (None when an iteration was stopped)
    steps: int = 0
    parse_errors: int = 0
    transcript: list[str] = field(default_factory=list)


def run_agent(
    ctx: ExecutionContext, client: Any, model: str, question: str, *, max_tokens: int = 48
) -> AgentResult:
    """Run the ReAct loop for one question inside ``ctx`` until an answer or a limit."""
    result = AgentResult(question)
    messages: list[dict[str, str]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        *EXAMPLE,
        {"role": "user", "content": f"Question: {question}"},
    ]
    pending = ""
    try:
        while True:
            pending = f"LLM call {result.steps + 1}"
            ctx.start_iteration()
            reply = client.chat.completions.create(
                model=model,
                messages=messages,
                max_tokens=max_tokens,
                temperature=0,
                stop=["Observation:"],
            )
            result.steps += 1
            text = reply.choices[0].message.content or ""
            result.transcript.append(text)
            parsed = parse_reply(text)
            if parsed is None:
                result.parse_errors += 1
                ctx.trace(ParseErrorTrace(error_type="format", raw_content=text[:200]))
                messages += [{"role": "assistant", "content": text}, _FORMAT_REMINDER]
                continue
            ctx.parse_ok("format")
            if parsed.final is not None:
                result.answer = parsed.final
                return result
            pending = f"tool call {parsed.tool}[{parsed.argument}]"
            observation = _use_tool(ctx, parsed)
            messages += [
                {"role": "assistant", "content": text},
                {"role": "user", "content": f"Observation: {observation}"},
            ]
    except LimitExceeded as exc:
        result.stopped = str(exc.exceeded) if exc.exceeded is not None else str(exc)
        result.stop_before, result.stop_node = pending, exc.node_id
        result.stop_exceeded = exc.exceeded
        return result


def _use_tool(ctx: ExecutionContext, parsed: Parsed) -> str:
    name = parsed.tool or ""
    with ctx.tool_call(name):
        try:
            return TOOLS[name](parsed.argument)
        except ToolError as exc:
            return f"error: {exc}"
