"""The ``with`` protocol, written once for every object that is entered and left.

Sinks, ledgers, servers, calls and contexts are all used in ``with`` blocks; each says only
what entering and leaving mean for it (:meth:`Scoped._enter`, :meth:`Scoped._leave`), or, for
the many that are simply closed, nothing at all (:class:`Closeable`).
"""

from __future__ import annotations

from types import TracebackType
from typing import TypeVar

__all__ = ["Closeable", "Scoped"]

_S = TypeVar("_S", bound="Scoped")


class Scoped:
    """``with obj as x`` runs :meth:`_enter` and gives ``obj`` itself; leaving the block,
    normally or by an exception, runs :meth:`_leave` with that exception (None if none)."""

    __slots__ = ()

    def __enter__(self: _S) -> _S:
        self._enter()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._leave(exc)

    def _enter(self) -> None:
        """What entering does besides giving the object (nothing by default)."""

    def _leave(self, exc: BaseException | None) -> None:
        """What leaving does; ``exc`` is the exception that ends the block, if any."""
        raise NotImplementedError


class Closeable(Scoped):
    """A :class:`Scoped` object that leaving a ``with`` block closes."""

    __slots__ = ()

    def close(self) -> None:
        """Release what the object holds; closing twice is harmless."""
        raise NotImplementedError

    def _leave(self, exc: BaseException | None) -> None:
        self.close()
