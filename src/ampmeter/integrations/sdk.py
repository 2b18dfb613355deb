"""The Stainless SDKs (``openai``, ``anthropic``): each request metered at the SDK's one door.

Every request of these SDKs (every method docs/integrations.md lists) goes through its
client's generic ``request`` once per call, above the SDK's retry loop: the one place a call is
metered. A request in a known wire format, made where a context applies (:mod:`.attach`), is
begun and admitted from the JSON body the SDK built (``LimitExceeded`` is raised there, before
a request exists and outside the retry loop, so it reaches the caller as itself), sent by the
SDK, and ended with the usage of the SDK's own result (a stream when it ends: :mod:`.streams`;
a raw response: :mod:`.raw`); any other request runs untouched. The HTTP layer below never
meters it again (:func:`_patch_clients`). Retries are counted from the client's
``_sleep_for_retry``. The node is named after the SDK method: the helper the SDK names in its
``X-Stainless-Helper-Method`` header (``chat.completions.parse``, ``messages.stream``), else
``<resource>.create`` (``responses.compact`` for a compaction).
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any, Final

from ampmeter.context import configured_policies
from ampmeter.integrations.adapter import Adapter
from ampmeter.integrations.attach import metered_context
from ampmeter.integrations.http import ROUTES, adapter_for_path, unwrapped_send
from ampmeter.integrations.lifecycle import (
    ACTIVE_REQUEST,
    HELPER,
    Admitted,
    begin_call,
    relieve_pressure,
    sent_unanswered,
    settings,
)
from ampmeter.integrations.patching import Patch, undo_all
from ampmeter.integrations.raw import RAW_RESPONSE_HEADER, after_raw, after_raw_async
from ampmeter.integrations.streams import meter_stream
from ampmeter.integrations.unmetered import unmetered_adapter
from ampmeter.pricing import stored_state

__all__ = ["admit", "instrument_sdk", "is_instrumented", "uninstrument_sdk"]

# The header naming the SDK helper a request comes from (openai: the method's whole name;
# anthropic: the verb, e.g. "stream", under the name in lower case).
_HELPER_HEADER: Final = "X-Stainless-Helper-Method"
_HELPER_HEADER_LOWER: Final = _HELPER_HEADER.lower()


def _operation(options: Any, headers: Mapping[str, Any], adapter: Adapter) -> str:
    """The SDK method a request comes from (see the module's documentation)."""
    base = adapter.operation
    # Among the options' own fields (openai's have no ``qualifiers``): a getattr that misses
    # on a pydantic model raises inside its ``__getattr__``, about 4 µs, more than the door.
    qualifiers = vars(options).get("qualifiers")
    if (qualifiers and qualifiers.get("beta")) or "beta=true" in options.url:  # client.beta
        base = f"beta.{base}"
    helper = (headers.get(_HELPER_HEADER) or headers.get(_HELPER_HEADER_LOWER)) if headers else None
    if not isinstance(helper, str) or not helper:
        helper = HELPER.get() or adapter.sdk_method
    return helper if "." in helper else f"{base}.{helper}"


def admit(client: Any, options: Any) -> Admitted | None:
    """Begin and admit the call of an SDK request (None: not one to meter here)."""
    if ACTIVE_REQUEST.get() is not None:
        return None
    body = options.json_data
    if not isinstance(body, dict) or options.method.lower() != "post":
        return None
    path = options.url.partition("?")[0]
    adapter = ROUTES.get(path) or adapter_for_path(path)  # the SDK's own paths are the keys
    if adapter is None:
        return _admit_unmetered(client, options, body, path)
    ctx = metered_context()
    if ctx is None:
        return None
    extra = options.extra_json  # the caller's extra_body: a mapping, as the SDK merges it, or None
    sent = {**body, **extra} if extra else body  # what is sent: extra_body merged in
    model = sent.get("model")
    if not isinstance(model, str):
        model = adapter.model_for(path, sent)
        if model is None:
            return None  # no model: not an LLM request (e.g. POST /v1/threads/{id}/messages)
    refused = notes = None
    policies = configured_policies(ctx)
    if policies.shapes_requests:  # the hook may change the body (measured after)
        refused, notes = relieve_pressure(ctx, policies.reliefs, adapter, body)
        sent = {**body, **extra} if extra else body
        model = sent.get("model")  # a downgrade's (anything but a string: no model)
        model = model if isinstance(model, str) else None
    # The SDK's helpers name themselves in a dict they make (a Mapping check is a Python call).
    headers = options.headers if isinstance(options.headers, dict) else {}
    operation = _operation(options, headers, adapter)
    admitted = begin_call(
        ctx, adapter, sent, model, notes, operation=operation, refused=refused, ask_usage=body
    )
    admitted.client = client
    if headers and headers.get(RAW_RESPONSE_HEADER):
        admitted.raw = True
    return admitted


def _admit_unmetered(client: Any, options: Any, body: dict[str, Any], path: str) -> Admitted | None:
    """Begin and admit the node of a billed request ampmeter does not meter (see
    :mod:`.unmetered`); None for any other request."""
    adapter = unmetered_adapter(path)
    ctx = None if adapter is None else metered_context()
    if adapter is None or ctx is None:
        return None
    admitted = adapter.begin(ctx, body, operation=_operation(options, {}, adapter))
    admitted.client = client
    return admitted


def _stored_state_changed(options: Any) -> bool:
    """Note what a request that is no LLM call does to OpenAI's stored conversations
    (:mod:`ampmeter.pricing.stored_state`); True when it makes an empty one.

    A response in a conversation is billed for all it holds, and ampmeter learns that size
    from the responses it reads. Items put in one otherwise (``conversations.create(items=)``,
    ``conversations.items.create``) are billed as input by every later response, uncounted:
    the conversation's size becomes unknown (forgotten before the request is sent: one that
    fails may still have added them). One made empty is known to hold nothing."""
    path = options.url.partition("?")[0]
    if not path.startswith("/conversations") or options.method.lower() != "post":
        return False
    parts = path.strip("/").split("/")
    if len(parts) == 3 and parts[2] == "items":
        stored_state.forget_conversation(parts[1])
        return False
    body = options.json_data
    return len(parts) == 1 and not (isinstance(body, Mapping) and body.get("items"))


def _door(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def request(client: Any, cast_to: Any, options: Any, *args: Any, **kwargs: Any) -> Any:
        admitted = admit(client, options)
        if admitted is None:
            made_empty = _stored_state_changed(options)
            result = original(client, cast_to, options, *args, **kwargs)
            if made_empty:
                stored_state.remember(None, result, 0)
            return result
        with admitted:
            result = original(client, cast_to, options, *args, **kwargs)
        if admitted.raw:
            return after_raw(result, admitted)
        if admitted.stream:
            meter_stream(admitted, result, is_async=False)
        else:
            admitted.read_whole(result)
        return result

    return request


def _async_door(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def request(client: Any, cast_to: Any, options: Any, *args: Any, **kwargs: Any) -> Any:
        admitted = admit(client, options)
        if admitted is None:
            made_empty = _stored_state_changed(options)
            result = await original(client, cast_to, options, *args, **kwargs)
            if made_empty:
                stored_state.remember(None, result, 0)
            return result
        with admitted:
            result = await original(client, cast_to, options, *args, **kwargs)
        if admitted.raw:
            return await after_raw_async(result, admitted)
        if admitted.stream:
            meter_stream(admitted, result, is_async=True)
        else:
            admitted.read_whole(result)
        return result

    return request


def _retry_counter(original: Callable[..., Any]) -> Callable[..., Any]:
    """The client's ``_sleep_for_retry``, counting a retry on the call being sent (an async
    client's gets its sleep to await: the count is made in the request's own context)."""

    @functools.wraps(original)
    def sleep(client: Any, *args: Any, **kwargs: Any) -> Any:
        admitted = ACTIVE_REQUEST.get()
        if admitted is not None:
            admitted.call.retry()
            # (Called where the SDK handles the attempt's error: a read timeout is one sent.)
            failed = sys.exc_info()[1]
            if failed is not None and sent_unanswered(failed):
                admitted.tally.unanswered += 1
        return original(client, *args, **kwargs)

    return sleep


def _patch_clients(base_client: Any) -> list[Patch]:
    """Meter the requests of an SDK's sync and async clients (its ``_base_client`` module).

    The door meters every request the SDK's own httpx clients send, so those send past the
    HTTP layer (one wrapper per call), unless under ``ampmeter run --proxy`` the HTTP layer
    must mark them (:mod:`.proxy_mark`). A client the caller gives the SDK (``http_client=``)
    keeps the HTTP layer, which leaves a request the door meters alone after one check."""
    patches = []
    for client, http_client, is_async in (
        (base_client.SyncAPIClient, "SyncHttpxClientWrapper", False),
        (base_client.AsyncAPIClient, "AsyncHttpxClientWrapper", True),
    ):
        sleep = client.__dict__.get("_sleep_for_retry")
        if sleep is not None:
            patches.append(Patch.apply(client, "_sleep_for_retry", _retry_counter(sleep)))
        door = _async_door if is_async else _door
        patches.append(Patch.apply(client, "request", door(client.__dict__["request"])))
        own = getattr(base_client, http_client, None)
        if own is not None and settings.marker.proxy_url is None:
            patches.append(Patch.apply(own, "send", unwrapped_send(own)))
    return patches


_patched: dict[str, list[Patch]] = {}  # by SDK package


def instrument_sdk(package: str, *more: Callable[[], list[Patch]]) -> bool:
    """Meter the installed SDK ``package`` (``openai``, ``anthropic``; idempotent): its clients'
    door, and the ``more`` patches it needs. False if it is not installed."""
    if _patched.get(package):
        return True
    try:
        base_client = importlib.import_module(f"{package}._base_client")
    except ImportError:
        return False
    patches = _patched[package] = _patch_clients(base_client)
    for patch in more:
        patches.extend(patch())
    return True


def uninstrument_sdk(package: str) -> None:
    """Restore every attribute of ``package`` patched, exactly (idempotent)."""
    undo_all(_patched.pop(package, []))


def is_instrumented(package: str) -> bool:
    """Whether the SDK ``package`` is currently patched."""
    return bool(_patched.get(package))
