"""Requests this process meters itself, marked for the metering proxy of ``ampmeter run --proxy``
(docs/proxy.md), so that the proxy does not count them again.

The mark (``x-ampmeter-metered``) is an HMAC-SHA256 of the request's body under the run's key
(``AMPMETER_HANDOFF_KEY``), which the proxy checks before it lets the request through
unmetered: a request without a valid mark is metered by the proxy (at worst counted twice,
never not at all). The mark is only ever sent to the run's proxy (``AMPMETER_PROXY_URL``).
"""

from __future__ import annotations

import hashlib
import hmac
import os
from dataclasses import dataclass
from typing import Final

__all__ = ["METERED_HEADER", "PROXY_URL_ENV", "Marker", "metered_mark"]

METERED_HEADER: Final = "x-ampmeter-metered"
PROXY_URL_ENV: Final = "AMPMETER_PROXY_URL"
_KEY_ENV: Final = "AMPMETER_HANDOFF_KEY"


def metered_mark(key: bytes, body: bytes) -> str:
    """The mark of a request with ``body``, under ``key``."""
    return hmac.new(key, body, hashlib.sha256).hexdigest()


@dataclass(frozen=True, slots=True)
class Marker:
    """Marks the requests this process meters that go to the run's proxy (read once from the
    environment when the integrations are switched on; a no-op elsewhere)."""

    proxy_url: str | None = None
    key: bytes | None = None

    @classmethod
    def from_env(cls) -> Marker:
        """The marker of this process: active only under ``ampmeter run --proxy``."""
        url, key = os.environ.get(PROXY_URL_ENV), os.environ.get(_KEY_ENV)
        if not url or not key:
            return cls()
        return cls(url.rstrip("/") + "/", key.encode())

    def mark_for(self, url: str, body: bytes) -> str | None:
        """The mark for a metered request to ``url`` with ``body``, or None (not the proxy)."""
        if self.proxy_url is None or self.key is None or not url.startswith(self.proxy_url):
            return None
        return metered_mark(self.key, body)
