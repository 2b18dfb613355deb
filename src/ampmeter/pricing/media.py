"""What the estimators can learn from media a request carries inline: image sizes, PDF pages,
WAV durations, and the size of any base64 payload.

Only headers are read (an image's size is in its first bytes; a PDF's pages are counted from
its page objects), so measuring a request with a large attachment stays cheap. Anything that
cannot be read returns None and the estimator falls back to its stated bound.
"""

from __future__ import annotations

import base64
import binascii
import re
import struct
from typing import Final

__all__ = [
    "audio_seconds",
    "b64_bytes",
    "data_url",
    "decode_head",
    "image_size",
    "pdf_pages",
]

# The size of a JPEG is in its first frame header, which follows the EXIF block: 256 KiB
# covers a camera's embedded thumbnail.
_HEAD_BYTES: Final = 256 * 1024
_PDF_PAGE: Final = re.compile(rb"/Type\s*/Page(?![a-zA-Z])")
# The least bitrate an audio file of unknown format is assumed to have (8 kbit/s, below any
# speech codec a provider accepts): its duration is at most its bytes over this.
_MIN_AUDIO_BYTES_PER_SECOND: Final = 1_000


def data_url(url: object) -> tuple[str, str] | None:
    """``(media type, base64 data)`` of a ``data:`` URL, or None for any other value."""
    if not isinstance(url, str) or not url.startswith("data:"):
        return None
    head, comma, data = url.partition(",")
    if not comma or ";base64" not in head:
        return None
    return head[5:].split(";", 1)[0], data


def b64_bytes(data: str) -> int:
    """How many bytes the base64 text ``data`` decodes to (without decoding it)."""
    return len(data.rstrip("=")) * 3 // 4


def decode_head(data: str, limit: int = _HEAD_BYTES) -> bytes:
    """The first ``limit`` bytes (or so) of the base64 text ``data``; b"" if it is not base64."""
    chunk = data[: (limit // 3 + 1) * 4]
    return decode_all(chunk[: len(chunk) - len(chunk) % 4])


def decode_all(data: str) -> bytes:
    """The bytes of the base64 text ``data``; b"" if it is not base64."""
    try:
        return base64.b64decode(data, validate=False)
    except (binascii.Error, ValueError):
        return b""


def image_size(head: bytes) -> tuple[int, int] | None:
    """``(width, height)`` of a PNG, GIF, JPEG or WebP image from its first bytes, else None."""
    if head.startswith(b"\x89PNG\r\n\x1a\n") and len(head) >= 24:
        return struct.unpack(">II", head[16:24])
    if head[:6] in (b"GIF87a", b"GIF89a") and len(head) >= 10:
        return struct.unpack("<HH", head[6:10])
    if head.startswith(b"\xff\xd8"):
        return _jpeg_size(head)
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return _webp_size(head)
    return None


def _jpeg_size(head: bytes) -> tuple[int, int] | None:
    at = 2
    while at + 9 < len(head):
        if head[at] != 0xFF:
            return None
        marker = head[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        length = struct.unpack(">H", head[at + 2 : at + 4])[0]
        # Start-of-frame markers C0-CF carry the size, except C4 (tables), C8 and CC.
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            height, width = struct.unpack(">HH", head[at + 5 : at + 9])
            return width, height
        at += 2 + length
    return None


def _webp_size(head: bytes) -> tuple[int, int] | None:
    kind = head[12:16]
    if kind == b"VP8 " and len(head) >= 30:
        width, height = struct.unpack("<HH", head[26:30])
        return width & 0x3FFF, height & 0x3FFF
    if kind == b"VP8L" and len(head) >= 25:
        bits = int.from_bytes(head[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if kind == b"VP8X" and len(head) >= 30:
        return int.from_bytes(head[24:27], "little") + 1, int.from_bytes(head[27:30], "little") + 1
    return None


def pdf_pages(data: bytes) -> int | None:
    """The number of page objects in a PDF's bytes, or None if ``data`` is not a PDF."""
    if not data.startswith(b"%PDF"):
        return None
    return max(len(_PDF_PAGE.findall(data)), 1)


def audio_seconds(head: bytes, total_bytes: int) -> float:
    """The duration of an audio payload of ``total_bytes``: exact for WAV (from its header),
    else a bound from the least bitrate a provider accepts."""
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE" and len(head) >= 36:
        byte_rate = int.from_bytes(head[28:32], "little")
        if byte_rate > 0:
            return total_bytes / byte_rate
    return total_bytes / _MIN_AUDIO_BYTES_PER_SECOND
