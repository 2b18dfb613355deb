"""Hand-off tokens: a budget that follows work into another process or onto another machine.

``token = ctx.handoff("researcher", max_cost_usd=0.20)`` makes a ``system`` node for a child
that runs elsewhere and returns a token; the other side calls
``ExecutionContext.from_handoff(token)``. The token says where the shared ledger is, which
scope the child spends in, the child's own limits and the limits of every scope above it, the
chain (run) id and the hand-off node's id. It carries no secret: a Redis URL loses its user and
password, and the child must then bring its own ledger (``from_handoff(token, ledger=...)``).

Tokens travel in the ``AMPMETER_HANDOFF`` environment variable (an instrumented process that
finds one and has no context attaches to it by itself, see :func:`attach_from_env`) or in the
``ampmeter-handoff`` HTTP header (:func:`inject` / :func:`extract`, like OpenTelemetry's
propagators).
"""

from __future__ import annotations

import atexit
import base64
import binascii
import os
import threading
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import orjson

from ampmeter.errors import HandoffError
from ampmeter.limits import Limit

if TYPE_CHECKING:
    from ampmeter.context import ExecutionContext
    from ampmeter.ledgers.base import Ledger

__all__ = [
    "HANDOFF_ENV",
    "HANDOFF_HEADER",
    "HANDOFF_LOG_ENV",
    "Handoff",
    "attach_from_env",
    "decode",
    "encode",
    "extract",
    "inject",
    "open_ledger",
]

HANDOFF_ENV: Final = "AMPMETER_HANDOFF"
"""The environment variable a hand-off token travels in to a child process."""
HANDOFF_HEADER: Final = "ampmeter-handoff"
"""The HTTP header a hand-off token travels in (header names are case-insensitive)."""
HANDOFF_LOG_ENV: Final = "AMPMETER_HANDOFF_LOG"
"""Where a process that attaches by itself (:func:`attach_from_env`) writes its JSONL events."""

_VERSION: Final = "amp1."
_MAX_TOKEN: Final = 16_384


@dataclass(frozen=True, slots=True)
class Handoff:
    """What a hand-off token says (see the module docs); ids and depths are as logged."""

    chain_id: str
    node_id: str
    depth: int
    name: str
    scope: str
    ledger: Mapping[str, Any]
    limits: tuple[Limit, ...]
    ancestors: tuple[tuple[str, tuple[Limit, ...]], ...]
    deadline: float | None = None


def encode(handoff: Handoff) -> str:
    """The token of ``handoff``: ``amp1.`` and base64url JSON (safe in headers and env)."""
    payload = {
        "chain": handoff.chain_id,
        "node": handoff.node_id,
        "depth": handoff.depth,
        "name": handoff.name,
        "scope": handoff.scope,
        "ledger": dict(handoff.ledger),
        "limits": _limits_out(handoff.limits),
        "ancestors": [[scope, _limits_out(limits)] for scope, limits in handoff.ancestors],
        "deadline": handoff.deadline,
    }
    body = base64.urlsafe_b64encode(orjson.dumps(payload)).rstrip(b"=").decode("ascii")
    return _VERSION + body


def decode(token: object) -> Handoff:
    """Read a token made by :func:`encode`; :class:`HandoffError` says what is wrong."""
    if not isinstance(token, str):
        raise HandoffError(f"a hand-off token must be a str, got {type(token).__name__}")
    if not token.startswith(_VERSION):
        raise HandoffError(f"not an ampmeter hand-off token (it must start with {_VERSION!r})")
    if len(token) > _MAX_TOKEN:
        raise HandoffError(f"hand-off token is {len(token)} characters, more than {_MAX_TOKEN}")
    body = token[len(_VERSION) :]
    try:
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        data = orjson.loads(raw)
    except (binascii.Error, ValueError) as error:
        raise HandoffError(f"hand-off token is damaged: {error}") from None
    try:
        return _handoff(data)
    except (KeyError, TypeError, ValueError) as error:
        raise HandoffError(f"hand-off token is damaged: {error}") from None


def _handoff(data: Any) -> Handoff:
    if not isinstance(data, dict):
        raise TypeError("its body is not an object")
    texts = {name: data[name] for name in ("chain", "node", "name", "scope")}
    for name, value in texts.items():
        if not isinstance(value, str) or not value:
            raise TypeError(f"{name!r} must be a non-empty str")
    depth, ledger, deadline = data["depth"], data["ledger"], data["deadline"]
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ValueError(f"'depth' must be an int >= 1, got {depth!r}")
    if not isinstance(ledger, dict) or ledger.get("backend") not in ("sqlite", "redis"):
        raise ValueError("'ledger' must name a sqlite or redis backend")
    if deadline is not None and (
        isinstance(deadline, bool) or not isinstance(deadline, (int, float))
    ):
        raise TypeError("'deadline' must be a number of Unix seconds or null")
    from ampmeter.ledgers.base import check_scope  # the ledgers load only when a token is read

    scope = check_scope(texts["scope"])
    ancestors = tuple(
        (check_scope(scope_name), _limits_in(limits)) for scope_name, limits in data["ancestors"]
    )
    for name, _ in ancestors:
        if not scope.startswith(name + "/"):
            raise ValueError(f"ancestor scope {name!r} does not enclose {scope!r}")
    return Handoff(texts["chain"], texts["node"], depth, texts["name"], scope, ledger,
                   _limits_in(data["limits"]), ancestors, deadline)  # fmt: skip


def _limits_out(limits: tuple[Limit, ...]) -> list[list[Any]]:
    return [[limit.key, limit.max_value, limit.type.value] for limit in limits]


def _limits_in(raw: Any) -> tuple[Limit, ...]:
    if not isinstance(raw, list):
        raise TypeError("limits must be a list")
    return tuple(Limit(key, value, kind) for key, value, kind in raw)


# -- HTTP ---------------------------------------------------------------------------------------


def inject(headers: MutableMapping[str, str], token: str) -> None:
    """Put ``token`` in ``headers`` (a dict, ``httpx.Headers``...) as ``ampmeter-handoff``."""
    decode(token)  # a damaged token fails here, not in the service that receives it
    headers[HANDOFF_HEADER] = token


def extract(headers: Mapping[str, str]) -> str | None:
    """The hand-off token in ``headers`` (any case of the name), or None if there is none.

    A header that is there but damaged raises :class:`HandoffError`.
    """
    found = headers.get(HANDOFF_HEADER)
    if found is None:
        found = next((v for k, v in headers.items() if k.lower() == HANDOFF_HEADER), None)
    if found is None:
        return None
    decode(found)
    return found


# -- the ledger ---------------------------------------------------------------------------------


def open_ledger(handoff: Handoff, ledger: Ledger | None = None) -> Ledger:
    """The ledger the child of ``handoff`` spends in, at its scope.

    ``ledger`` (on the same backend, at the hand-off's scope or one above it) is needed when
    the backend wants credentials, which a token never carries; otherwise one is opened from
    the token's location.
    """
    from ampmeter.ledgers.base import Ledger

    if ledger is not None:
        if not isinstance(ledger, Ledger):
            raise TypeError(f"ledger must be a Ledger, got {type(ledger).__name__}")
        if ledger.scope == handoff.scope:
            return ledger
        if not handoff.scope.startswith(ledger.scope + "/"):
            raise HandoffError(
                f"ledger scope {ledger.scope!r} does not enclose the hand-off's scope "
                f"{handoff.scope!r}: give a ledger on the same backend at {handoff.scope!r} or "
                "a scope above it"
            )
        for segment in handoff.scope[len(ledger.scope) + 1 :].split("/"):
            ledger = ledger.child(segment)
        return ledger
    where = handoff.ledger
    lease = where.get("lease_s")
    if where["backend"] == "sqlite":
        from ampmeter.ledgers.sqlite import SqliteLedger

        return SqliteLedger(str(where["path"]), handoff.scope, lease_s=lease)
    if where.get("credentials") or not where.get("url"):
        raise HandoffError(
            "the hand-off's Redis ledger needs credentials, which a token never carries: "
            f"pass ledger=RedisLedger(<url with password>, {handoff.scope.split('/')[0]!r}) "
            "to from_handoff()"
        )
    from ampmeter.ledgers.redis import RedisLedger

    return RedisLedger(str(where["url"]), handoff.scope, ttl_s=where.get("ttl_s"), lease_s=lease)


# -- attaching by itself ------------------------------------------------------------------------

_attached: dict[int, ExecutionContext | None] = {}  # pid -> the context attached from the env
_attach_lock = threading.Lock()


def attach_from_env() -> ExecutionContext | None:
    """The context made from ``AMPMETER_HANDOFF`` in this process (made on first use), or None.

    Its events go to the JSONL file ``AMPMETER_HANDOFF_LOG`` names (if any); it closes when the
    interpreter exits. A damaged token or unreachable ledger raises :class:`HandoffError` once
    and is not retried.
    """
    pid = os.getpid()
    if pid in _attached:
        return _attached[pid]
    with _attach_lock:
        if pid in _attached:
            return _attached[pid]
        _attached[pid] = None
        token = os.environ.get(HANDOFF_ENV)
        if not token:
            return None
        from ampmeter.context import ExecutionContext
        from ampmeter.sinks.jsonl import JsonlSink

        log = os.environ.get(HANDOFF_LOG_ENV)
        sink = JsonlSink(log, flush="line") if log else None
        try:
            ctx = ExecutionContext.from_handoff(token, sinks=[sink] if sink else [])
        except Exception as error:
            if sink is not None:
                sink.close()
            raise HandoffError(f"cannot attach to {HANDOFF_ENV}: {error}") from error
        _attached[pid] = ctx

        def close() -> None:
            if os.getpid() == pid:
                ctx.close()
                if sink is not None:
                    sink.close()

        atexit.register(close)
        return ctx
