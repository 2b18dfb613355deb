"""Request parts shaped like an agent's: a long system prompt, a user task and tool schemas.

Cap tests and benchmarks send these to a :class:`~ampmeter.testing.BillingProvider`, so that
what is estimated and billed includes what real agents send besides message text::

    client.chat.completions.create(
        model="gpt-4o-mini",
        messages=[{"role": "system", "content": SYSTEM_PROMPT},
                  {"role": "user", "content": USER_PROMPT}],
        tools=tool_schemas(20),  # about 13,300 characters of JSON
        max_tokens=100,
    )
"""

from __future__ import annotations

from typing import Any, Final, Literal

__all__ = ["SYSTEM_PROMPT", "USER_PROMPT", "tool_schemas"]

SYSTEM_PROMPT: Final = (
    "You are a careful operations assistant for a logistics company. Answer in short, "
    "precise sentences. When a question needs data you do not have, call one of the tools "
    "instead of guessing, and never invent order numbers, prices or dates. "
) * 5
"""A system prompt of 1,180 characters."""

USER_PROMPT: Final = (
    "Order 48213 left the Rotterdam warehouse on Monday and should have reached the Lyon "
    "depot by Thursday, but the customer says nothing arrived. Find where it is now, whether "
    "it was split into several parcels, and what the customer should be told today. "
) * 2
"""A user task of 502 characters."""

_FIELDS: Final = ("order_id", "warehouse", "carrier_reference", "customer_email")


def tool_schemas(count: int, wire: Literal["chat", "anthropic"] = "chat") -> list[dict[str, Any]]:
    """``count`` distinct tool definitions of about 660 characters each as compact JSON, in
    the OpenAI Chat Completions shape (``wire="chat"``) or the Anthropic Messages one."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(f"count must be an int >= 0, got {count!r}")
    if wire not in ("chat", "anthropic"):
        raise ValueError(f"wire must be 'chat' or 'anthropic', got {wire!r}")
    tools = []
    for index in range(count):
        properties: dict[str, Any] = {
            field: {"type": "string", "description": f"The {field.replace('_', ' ')} to look up."}
            for field in _FIELDS
        }
        properties["include_history"] = {
            "type": "boolean",
            "description": "Whether to return every past status, not only the latest one.",
        }
        name = f"lookup_{index:02d}"
        description = (
            f"Look up shipment records in system {index}: the status, the parcels and where "
            "each one was last scanned."
        )
        schema = {"type": "object", "properties": properties, "required": ["order_id"]}
        if wire == "anthropic":
            tools.append({"name": name, "description": description, "input_schema": schema})
        else:
            function = {"name": name, "description": description, "parameters": schema}
            tools.append({"type": "function", "function": function})
    return tools
