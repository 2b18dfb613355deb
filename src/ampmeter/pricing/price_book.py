"""Prices found by name, exactly or by fnmatch pattern: the user's model prices and tool prices.

An exact price wins over a pattern, a longer pattern over a shorter one. A change replaces the
tables, never changes them in place, so that reading them needs no lock.
"""

from __future__ import annotations

import fnmatch
import threading
from collections.abc import Iterable
from typing import Final, Generic, TypeVar

__all__ = ["PriceBook", "is_pattern"]

_PATTERN_CHARS: Final = frozenset("*?[")
_Price = TypeVar("_Price")
_Key = tuple[str, str | None]  # (a name or a pattern, the provider it is for or None)


def is_pattern(name: str) -> bool:
    """Whether ``name`` is an fnmatch pattern (holds ``*``, ``?`` or ``[``)."""
    return not _PATTERN_CHARS.isdisjoint(name)


class PriceBook(Generic[_Price]):
    """Prices by ``(name or pattern, provider)`` (see the module docs)."""

    __slots__ = ("_exact", "_lock", "_patterns", "changes")

    def __init__(self) -> None:
        self._exact: dict[_Key, _Price] = {}
        self._patterns: tuple[tuple[_Key, _Price], ...] = ()  # the longest pattern first
        self._lock = threading.Lock()
        self.changes = 0
        """How many times the book changed: an answer found in it holds while this does."""

    def __bool__(self) -> bool:
        return bool(self._exact or self._patterns)

    def set(self, key: _Key, price: _Price) -> None:
        """Set (or replace) the price of ``key``."""
        with self._lock:
            self.changes += 1
            if is_pattern(key[0]):
                kept = [*(entry for entry in self._patterns if entry[0] != key), (key, price)]
                self._patterns = tuple(sorted(kept, key=lambda entry: -len(entry[0][0])))
            else:
                self._exact = {**self._exact, key: price}

    def remove(self, key: _Key) -> bool:
        """Remove the price of ``key``; False when it has none."""
        with self._lock:
            self.changes += 1
            if is_pattern(key[0]):
                kept = tuple(entry for entry in self._patterns if entry[0] != key)
                found, self._patterns = len(kept) < len(self._patterns), kept
                return found
            if key not in self._exact:
                return False
            self._exact = {k: v for k, v in self._exact.items() if k != key}
            return True

    def clear(self) -> None:
        """Remove every price."""
        with self._lock:
            self.changes += 1
            self._exact, self._patterns = {}, ()

    def find(
        self, names: Iterable[str], providers: tuple[str | None, ...] = (None,)
    ) -> _Price | None:
        """The price of the first of ``names`` at the first of ``providers`` that has an exact
        one, else of the first pattern (the longest) that matches one of them, else None."""
        exact, patterns = self._exact, self._patterns
        for name in names:
            for provider in providers:
                found = exact.get((name, provider))
                if found is not None:
                    return found
        for name in names:
            for (pattern, provider), price in patterns:
                if provider in providers and fnmatch.fnmatchcase(name, pattern):
                    return price
        return None
