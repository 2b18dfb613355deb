"""Request bodies shaped as the SDKs send them, for the input estimators' tests."""

from __future__ import annotations

import base64
import io
import struct
import zlib
from typing import Any

from ampmeter.pricing.request_size import json_text

_TOOL_TOPICS = [
    ("search_web", "Search the public web and return the most relevant pages"),
    ("read_file", "Read a text file from the workspace and return its content"),
    ("write_file", "Write text to a file in the workspace, replacing what it held"),
    ("list_directory", "List the entries of a directory in the workspace"),
    ("run_shell", "Run a shell command in the sandbox and return its output"),
    ("get_weather", "Get the current weather and a three-day forecast for a city"),
    ("send_email", "Send an email from the user's account to one or more people"),
    ("create_ticket", "Open a ticket in the issue tracker with a title and body"),
    ("query_database", "Run a read-only SQL query against the analytics warehouse"),
    ("fetch_url", "Fetch a URL over HTTP and return the body as text"),
    ("translate_text", "Translate text between two languages"),
    ("summarize_document", "Summarize a long document into a short abstract"),
    ("schedule_meeting", "Schedule a meeting on the user's calendar"),
    ("lookup_customer", "Look up a customer record by email or account id"),
    ("refund_order", "Refund an order in full or in part"),
    ("geocode_address", "Turn a postal address into latitude and longitude"),
    ("convert_currency", "Convert an amount between two currencies at today's rate"),
    ("search_code", "Search the code base for a symbol or a regular expression"),
    ("open_pull_request", "Open a pull request from a branch with a description"),
    ("post_message", "Post a message to a chat channel"),
]


def chat_tools(n: int) -> list[dict[str, Any]]:
    """``n`` Chat Completions tool definitions of about 700 characters each."""
    tools = []
    for name, description in _TOOL_TOPICS[:n]:
        parameters = {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": f"What to {name.replace('_', ' ')}."},
                "limit": {
                    "type": "integer",
                    "description": "The most results to return; the default is ten.",
                    "minimum": 1,
                    "maximum": 100,
                },
                "mode": {
                    "type": "string",
                    "enum": ["fast", "thorough", "exhaustive"],
                    "description": "How hard to try before answering.",
                },
                "filters": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "Optional filters, each written as key=value.",
                },
            },
            "required": ["query"],
            "additionalProperties": False,
        }
        tools.append(
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": f"{description}. Use it only when the user asks for it, "
                    "and say what you found in plain words afterwards.",
                    "parameters": parameters,
                    "strict": True,
                },
            }
        )
    return tools


def json_chars(values: list[Any]) -> int:
    return sum(len(json_text(value)) for value in values)


def png(width: int, height: int) -> bytes:
    """A valid PNG image of ``width`` x ``height`` (one grey channel)."""
    raw = b"".join(b"\x00" + b"\x80" * width for _ in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


def pdf(pages: int) -> bytes:
    """A minimal PDF with ``pages`` pages."""
    kids = " ".join(f"{3 + i} 0 R" for i in range(pages))
    objects = [
        "1 0 obj << /Type /Catalog /Pages 2 0 R >> endobj",
        f"2 0 obj << /Type /Pages /Kids [{kids}] /Count {pages} >> endobj",
        *(
            f"{3 + i} 0 obj << /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] >> endobj"
            for i in range(pages)
        ),
    ]
    return ("%PDF-1.4\n" + "\n".join(objects) + "\n%%EOF\n").encode()


def wav(seconds: float, rate: int = 16_000) -> bytes:
    """A mono 16-bit WAV file of ``seconds`` of silence."""
    frames = int(seconds * rate)
    data = b"\x00\x00" * frames
    header = b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVE"
    fmt = b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)
    return header + fmt + b"data" + struct.pack("<I", len(data)) + data


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{b64(data)}"


def pillow_image(fmt: str, width: int, height: int) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (width, height), (10, 20, 30)).save(out, format=fmt)
    return out.getvalue()
