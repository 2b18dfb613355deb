"""A small on-disk index of model rates already resolved from genai-prices.

Loading genai-prices' table costs about half a second, paid by the first priced call of every
process. Rates once resolved are kept here, one JSON file per genai-prices version, so later
processes price known models without loading the table at all. The file holds only what the
table says (nothing user-set), is replaced atomically, and a cache that cannot be read or written
is simply not used.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import threading
from pathlib import Path
from typing import Any, Final

from ampmeter._files import replaced_when_complete

__all__ = ["MISS", "lookup", "store"]

MISS: Final = object()
""":func:`lookup`'s answer for a model the cache does not know."""

# How names are resolved against the table: a change to the rules starts a new index, so no
# answer the old rules gave (a model once unpriced) outlives them.
_RULES: Final = 3
_lock = threading.Lock()
_entries: dict[str, Any] | None = None  # key -> rates as JSON (None: the table has no price)
_path: Path | None = None


def _cache_path() -> Path | None:
    # The installed table is identified by its module file (found without importing it): a
    # different version or install gets a different index.
    spec = importlib.util.find_spec("genai_prices")
    if spec is None or spec.origin is None:
        return None
    try:
        stat = os.stat(spec.origin)
    except OSError:
        return None
    identity = f"{spec.origin}|{stat.st_mtime_ns}|{stat.st_size}|{_RULES}"
    tag = hashlib.sha256(identity.encode()).hexdigest()
    base = os.environ.get("AMPMETER_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "ampmeter",
    )
    return Path(base) / f"prices-{tag[:16]}.json"


def _key(model: str, provider: str | None) -> str:
    return f"{model}\x00{provider or ''}"


def _load() -> dict[str, Any]:
    global _entries, _path
    if _entries is None:
        _path = _cache_path()
        entries: dict[str, Any] = {}
        if _path is not None:
            with contextlib.suppress(OSError, ValueError):
                loaded = json.loads(_path.read_text(encoding="utf-8"))
                if isinstance(loaded, dict):
                    entries = loaded
        _entries = entries
    return _entries


def lookup(model: str, provider: str | None) -> Any:
    """The cached rates of ``model`` (JSON form, or None when unpriced), or :data:`MISS`."""
    with _lock:
        return _load().get(_key(model, provider), MISS)


def store(model: str, provider: str | None, rates: Any) -> None:
    """Remember ``rates`` (JSON form, None for unpriced) and rewrite the file atomically."""
    with _lock:
        entries = _load()
        key = _key(model, provider)
        if entries.get(key, MISS) == rates:
            return
        entries[key] = rates
        if _path is None:
            return
        with contextlib.suppress(OSError):
            _path.parent.mkdir(parents=True, exist_ok=True)
            with replaced_when_complete(_path) as tmp:
                Path(tmp).write_text(json.dumps(entries, separators=(",", ":")), encoding="utf-8")


def forget() -> None:
    """Drop what was read (tests point ``AMPMETER_CACHE_DIR`` elsewhere, then call this)."""
    global _entries, _path
    with _lock:
        _entries = None
        _path = None
