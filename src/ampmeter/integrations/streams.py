"""Metered SDK streams that stay the SDK's own objects.

The openai and anthropic SDKs' ``Stream`` / ``AsyncStream`` read their events from one iterator
they keep (``_iterator``). Metering swaps that iterator for one that reads each event into the
call's tally on its way out, so the object handed back is the SDK's own: ``isinstance`` checks
and every attribute behave as without ampmeter (frameworks such as Semantic Kernel test the
class). The call ends:

* at the stream's last event (callers often stop reading there), or when it is exhausted;
* with the error the stream raised;
* as abandoned (:func:`~ampmeter.integrations.lifecycle.finish_abandoned`) when the stream's
  response is closed first (by the stream, or by an SDK helper that closes the response
  directly), or when the stream is dropped unread.

Older anthropic stream helpers (0.40) drop the stream their request returned and read the same
response through a stream of their own: :func:`meter_rebuilt_stream` moves the metering there.
"""

from __future__ import annotations

import atexit
import weakref
from collections.abc import Callable
from typing import Any, Final

from ampmeter import redact
from ampmeter.integrations.lifecycle import Admitted

__all__ = ["meter_rebuilt_stream", "meter_stream"]

_METER: Final = "_ampmeter_stream_meter"  # on a metered stream's response: its meter

# Each metered stream's weak reference, whose callback abandons the stream's call when the
# stream is dropped unread (its iterator never runs then), with the stream's meter. A weak
# reference calls back only while it is alive itself, so the references are kept here, by
# identity (a stream need not be hashable); what is still kept at interpreter exit is
# abandoned then, as a stream dropped at exit would be.
_WATCHED: dict[int, tuple[weakref.ref[Any], Admitted]] = {}


def _dropped(stream: weakref.ref[Any]) -> None:
    watched = _WATCHED.pop(id(stream), None)
    if watched is not None:
        watched[1].abandon()


@atexit.register
def _abandon_watched() -> None:
    for _, meter in list(_WATCHED.values()):
        meter.dropped = None  # a reference dropped calls nothing back at the exit's teardown
        meter.abandon()
    _WATCHED.clear()


def _on_close(response: Any, name: str, meter: Admitted, *, is_async: bool) -> None:
    """Have ``response.<name>()`` (its close) also tell ``meter``; the SDK helpers close the
    response directly. The hook holds the response weakly (no cycle keeps it alive)."""
    original: Callable[..., Any] | None = getattr(type(response), name, None)
    if original is None:
        return
    ref = weakref.ref(response)

    if is_async:

        async def aclose() -> None:
            try:
                target = ref()
                if target is not None:
                    await original(target)
            finally:
                meter.response_closed()

        setattr(response, name, aclose)
        return

    def close() -> None:
        try:
            target = ref()
            if target is not None:
                original(target)
        finally:
            meter.response_closed()

    setattr(response, name, close)


def meter_stream(admitted: Admitted, stream: Any, *, is_async: bool) -> None:
    """Meter an SDK's ``stream`` in place (a whole response is read by
    :meth:`Admitted.read_whole`): the object itself is what the caller gets."""
    # A stream's error comes from its events, after its door: the key it may echo is known.
    redact.remember_client(admitted.client)
    _read_through(stream, admitted, is_async=is_async)
    response = getattr(stream, "response", None)
    if response is not None:
        _on_close(response, "aclose" if is_async else "close", admitted, is_async=is_async)
        setattr(response, _METER, admitted)


def meter_rebuilt_stream(stream: Any, *, is_async: bool) -> None:
    """Meter ``stream``, which an SDK helper built over the response of a metered stream it
    then dropped unread: the call is read from ``stream``'s events instead. Nothing happens
    when the response is not metered, or its call has ended."""
    meter: Admitted | None = getattr(getattr(stream, "response", None), _METER, None)
    if meter is None or meter.done:
        return
    if meter.dropped is not None:
        # The dropped stream was never read: dropping it ends nothing.
        _WATCHED.pop(id(meter.dropped), None)
    _read_through(stream, meter, is_async=is_async)


def _read_through(stream: Any, meter: Admitted, *, is_async: bool) -> None:
    """Have ``meter`` read ``stream``'s events on their way out, and abandon its call when the
    stream is dropped before its end. The Stainless SDKs' streams iterate ``_iterator`` (made
    in __init__, or on first use); the object itself stays untouched otherwise."""
    events = meter.async_events if is_async else meter.events
    stream._iterator = events(stream._iterator)
    dropped = meter.dropped = weakref.ref(stream, _dropped)
    _WATCHED[id(dropped)] = (dropped, meter)
