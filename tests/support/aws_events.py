"""Bedrock's binary event stream (``application/vnd.amazon.eventstream``), written as AWS
writes it, for the replay server to send: each frame a prelude (total and header lengths, their
CRC-32), string headers, a JSON payload and the CRC-32 of the whole frame."""

from __future__ import annotations

import base64
import json
import struct
import zlib
from typing import Any

from ampmeter.testing.replay import ReplayResponse

__all__ = ["event_stream", "frame", "invoke_chunk"]

_STRING = 7  # the header value type of a string


def frame(event_type: str, payload: Any) -> bytes:
    """One event frame of ``event_type`` carrying ``payload`` as JSON."""
    headers = b""
    values = {":event-type": event_type, ":content-type": "application/json"}
    for name, value in {**values, ":message-type": "event"}.items():
        encoded = value.encode()
        headers += bytes([len(name)]) + name.encode() + bytes([_STRING])
        headers += struct.pack(">H", len(encoded)) + encoded
    body = json.dumps(payload).encode()
    total = 12 + len(headers) + len(body) + 4
    prelude = struct.pack(">II", total, len(headers))
    prelude += struct.pack(">I", zlib.crc32(prelude))
    message = prelude + headers + body
    return message + struct.pack(">I", zlib.crc32(message))


def invoke_chunk(event: dict[str, Any]) -> bytes:
    """An InvokeModel stream's frame: an Anthropic event inside a ``chunk``, base64 encoded."""
    return frame("chunk", {"bytes": base64.b64encode(json.dumps(event).encode()).decode()})


def event_stream(frames: list[bytes], *, cut_after: int | None = None) -> ReplayResponse:
    """A streamed answer of ``frames``, one frame per chunk (``cut_after``: dropped there)."""
    return ReplayResponse(
        chunks=tuple(frames),
        headers=(("content-type", "application/vnd.amazon.eventstream"),),
        streamed=True,
        cut_after=cut_after,
    )
