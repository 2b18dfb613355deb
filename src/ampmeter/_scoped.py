"""The ``with`` protocol, written once for the sinks, ledgers, servers, calls and contexts: each
says only what entering and leaving mean for it (:meth:`Scoped._enter`, :meth:`Scoped._leave`),
or, for the many that are simply closed, nothing at all (:class:`Closeable`)."""

from __future__ import annotations

from types import TracebackType
from typing import TypeVar

__all__ = ["Closeable", "Scoped"]

_S = TypeVar("_S", bound="Scoped")


class Scoped:
    """``with obj as x`` runs :meth:`_enter` and gives ``obj`` itself; leaving the block,
    normally or by an exception, runs :meth:`_leave` with that exception (None if none).
    ``async with`` runs :meth:`_aenter` and :meth:`_aleave`, the same by default."""

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

    async def __aenter__(self: _S) -> _S:
        await self._aenter()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._aleave(exc)

    def _enter(self) -> None:
        """What entering does besides giving the object (nothing by default)."""

    def _leave(self, exc: BaseException | None) -> None:
        """What leaving does; ``exc`` is the exception that ends the block, if any."""
        raise NotImplementedError

    async def _aenter(self) -> None:
        """What ``async with`` does on entering (as :meth:`_enter` by default)."""
        self._enter()

    async def _aleave(self, exc: BaseException | None) -> None:
        """What ``async with`` does on leaving (as :meth:`_leave` by default)."""
        self._leave(exc)


class Closeable(Scoped):
    """A :class:`Scoped` object that leaving a ``with`` block closes."""

    __slots__ = ()

    def close(self) -> None:
        """Release what the object holds; closing twice is harmless."""
        raise NotImplementedError

    def _leave(self, exc: BaseException | None) -> None:
        self.close()
