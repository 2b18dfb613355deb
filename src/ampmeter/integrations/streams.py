"""Metered SDK streams: the call ends when the stream is read to its end or closed.

A stream abandoned half-way ends ``fail`` with the usage seen so far (see
:func:`~ampmeter.integrations.lifecycle.finish_abandoned`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any, Final

from ampmeter.context import Call
from ampmeter.integrations.adapter import Adapter, Tally
from ampmeter.integrations.lifecycle import finish_abandoned, finish_call

__all__ = ["MeteredAsyncStream", "MeteredStream", "StreamWrapper"]


_OWN_ATTRS: Final = frozenset(
    {"_stream", "_input_tokens", "_call", "adapter", "_hide", "tally", "_done"}
)


class StreamWrapper:
    """Bookkeeping shared by the sync and async stream wrappers."""

    def __init__(
        self, stream: Any, call: Call, adapter: Adapter, hide_usage: bool, input_tokens: int
    ) -> None:
        self._stream = stream
        self._input_tokens = input_tokens
        self._call = call
        self.adapter = adapter
        self._hide = hide_usage
        self.tally = Tally()
        self._done = False

    def end(self, exc: BaseException | None) -> None:
        if self._done:
            return
        self._done = True
        finish_call(self._call, self.tally, exc)

    def abandon(self) -> None:
        if not self._done:
            self._done = True
            finish_abandoned(self._call, self.tally, self._input_tokens)

    def __getattr__(self, name: str) -> Any:
        if name in _OWN_ATTRS:  # not set yet (a failed __init__): no recursion
            raise AttributeError(name)
        return getattr(self._stream, name)

    def __del__(self) -> None:
        # A stream dropped half-way is still counted (with the usage seen so far). Nothing can be
        # reported from a finalizer, and at interpreter exit module globals may be gone already.
        try:  # noqa: SIM105
            self.abandon()
        except Exception:
            pass

    @property
    def response(self) -> Any:
        """The HTTP response, wrapped so that closing it ends the call."""
        return _ResponseProxy(self._stream.response, self)


class _ResponseProxy:
    """An SDK HTTP response whose ``close()``/``aclose()`` also end the metered call.

    The SDKs' stream helpers close the response directly rather than the stream.
    """

    def __init__(self, response: Any, owner: StreamWrapper) -> None:
        self._response = response
        self._owner = owner

    def close(self) -> None:
        try:
            self._response.close()
        finally:
            self._owner.abandon()

    async def aclose(self) -> None:
        try:
            await self._response.aclose()
        finally:
            self._owner.abandon()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._response, name)


class MeteredStream(StreamWrapper):
    """A sync SDK stream that reports its usage to its call when it ends."""

    _iterator: Iterator[Any] | None = None

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        if self._iterator is None:
            self._iterator = iter(self._stream)
        adapter, tally, hide = self.adapter, self.tally, self._hide
        while True:
            try:
                event = next(self._iterator)
            except StopIteration:
                self.end(None)
                raise
            except BaseException as exc:
                self.end(exc)
                raise
            if not adapter.read_event(event, tally, hide):
                return event

    def close(self) -> None:
        """Close the stream; if it was not read to the end the call ends ``fail``."""
        try:
            self._stream.close()
        finally:
            self.abandon()

    def __enter__(self) -> MeteredStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class MeteredAsyncStream(StreamWrapper):
    """An async SDK stream that reports its usage to its call when it ends."""

    _iterator: AsyncIterator[Any] | None = None

    def __aiter__(self) -> AsyncIterator[Any]:
        return self

    async def __anext__(self) -> Any:
        if self._iterator is None:
            self._iterator = self._stream.__aiter__()
        adapter, tally, hide = self.adapter, self.tally, self._hide
        while True:
            try:
                event = await self._iterator.__anext__()
            except StopAsyncIteration:
                self.end(None)
                raise
            except BaseException as exc:
                self.end(exc)
                raise
            if not adapter.read_event(event, tally, hide):
                return event

    async def close(self) -> None:
        """Close the stream; if it was not read to the end the call ends ``fail``."""
        try:
            await self._stream.close()
        finally:
            self.abandon()

    async def __aenter__(self) -> MeteredAsyncStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
