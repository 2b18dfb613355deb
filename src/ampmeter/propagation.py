"""Hand-off tokens: a budget that follows work into another process or onto another machine
(``docs/shared-budgets.md``: ``ctx.handoff(...)`` here, ``ExecutionContext.from_handoff`` there).

A token carries no secret (a Redis URL loses its user and password; the child brings its own
ledger then) and is signed with HMAC-SHA256. The limits a child obeys are kept in the ledger by
the parent, so even a validly signed token cannot lift them; and a token never makes a process
open a ledger it did not configure (``ledger=``, or ``AMPMETER_LEDGER_ALLOW``). Tokens travel in
``AMPMETER_HANDOFF`` or the ``ampmeter-handoff`` HTTP header (:func:`inject` / :func:`extract`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import orjson

from ampmeter import _validate, money
from ampmeter.errors import HandoffError
from ampmeter.keys import is_money
from ampmeter.limits import Limit

if TYPE_CHECKING:
    from ampmeter.ledgers.base import Ledger

__all__ = [
    "HANDOFF_ENV",
    "HANDOFF_HEADER",
    "HANDOFF_KEY_ENV",
    "HANDOFF_LOG_ENV",
    "LEDGER_ALLOW_ENV",
    "Handoff",
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
"""Where a process that attaches by itself (:mod:`ampmeter.integrations.attach`) writes its
JSONL events."""

HANDOFF_KEY_ENV: Final = "AMPMETER_HANDOFF_KEY"
"""The environment variable of the key that signs hand-off tokens when the ledger has none."""
LEDGER_ALLOW_ENV: Final = "AMPMETER_LEDGER_ALLOW"
"""Ledgers a receiving process may open from a token: their addresses (a SQLite file's path, a
Redis URL: see :func:`ampmeter.ledgers.reach.at_address`), separated by commas."""

_VERSION: Final = "amp2."
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
    on_exhausted: str = "raise"  # what the child's calls do at a hard limit ("raise", "pause")
    pause_timeout_s: float | None = None
    # what the ledger does when the lease of one of the child's holds runs out (the parent's
    # rule: "charge" or "release"; None in tokens of older versions: the ledger's own)
    on_expired_hold: _validate.ExpiredHold | None = None


def encode(handoff: Handoff, *, ledger: Ledger | None = None) -> str:
    """The signed token of ``handoff``: ``amp2.``, base64url JSON, ``.`` and its HMAC-SHA256
    (safe in headers and env). The key is ``ledger``'s ``handoff_key``, else
    ``AMPMETER_HANDOFF_KEY``; with neither, :class:`HandoffError` says how to give one."""
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
        "exhausted": [handoff.on_exhausted, handoff.pause_timeout_s],
        "expired_hold": handoff.on_expired_hold,
    }
    body = _b64(orjson.dumps(payload))
    return f"{_VERSION}{body}.{_b64(_signature(body, ledger))}"


def decode(token: object, *, ledger: Ledger | None = None) -> Handoff:
    """Read a token made by :func:`encode`, checking its signature with ``ledger``'s key (else
    ``AMPMETER_HANDOFF_KEY``); :class:`HandoffError` says what is wrong."""
    body, signature = _parts(token)
    expected = _signature(body, ledger)
    if not hmac.compare_digest(signature, expected):
        raise HandoffError(
            "hand-off token signature does not match: the token was changed after it was "
            f"signed, or signed with another key (the parent's ledger handoff_key or "
            f"{HANDOFF_KEY_ENV} must be the same here)"
        )
    return _read_body(body)


def _parts(token: object) -> tuple[str, bytes]:
    """A token's body and signature, or :class:`HandoffError` for anything else."""
    if not isinstance(token, str):
        raise HandoffError(f"a hand-off token must be a str, got {type(token).__name__}")
    if token.startswith("amp1."):
        raise HandoffError(
            "unsigned hand-off token (amp1.): it was made by an older ampmeter; hand off again"
        )
    if not token.startswith(_VERSION):
        raise HandoffError(f"not an ampmeter hand-off token (it must start with {_VERSION!r})")
    if len(token) > _MAX_TOKEN:
        raise HandoffError(f"hand-off token is {len(token)} characters, more than {_MAX_TOKEN}")
    if not token.isascii():
        raise HandoffError("hand-off token is damaged: it holds characters outside ASCII")
    body, dot, signature = token[len(_VERSION) :].partition(".")
    if not dot or not signature:
        raise HandoffError("hand-off token is damaged: its signature is missing")
    return body, _unb64(signature)


def _read_body(body: str) -> Handoff:
    data = _unb64(body)
    try:
        return _handoff(orjson.loads(data))
    except (KeyError, TypeError, ValueError) as error:  # orjson's JSONDecodeError too
        raise HandoffError(f"hand-off token is damaged: {error}") from None


def _unb64(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as error:
        raise HandoffError(f"hand-off token is damaged: {error}") from None


def _signature(body: str, ledger: Ledger | None) -> bytes:
    signed = None if ledger is None else ledger.sign_handoff(body.encode("ascii"))
    if signed is not None:
        return signed
    key = os.environ.get(HANDOFF_KEY_ENV)
    if not key:
        raise HandoffError(
            "no key to sign or check hand-off tokens: give the ledger handoff_key=... or set "
            f"{HANDOFF_KEY_ENV} to the same secret in both processes (ampmeter run sets one)"
        )
    return hmac.new(key.encode(), body.encode("ascii"), hashlib.sha256).digest()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _handoff(data: Any) -> Handoff:
    if not isinstance(data, dict):
        raise TypeError("its body is not an object")
    texts = {name: data[name] for name in ("chain", "node", "name", "scope")}
    for name, value in texts.items():
        if not isinstance(value, str) or not value:
            raise TypeError(f"{name!r} must be a non-empty str")
    depth, ledger = data["depth"], data["ledger"]
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ValueError(f"'depth' must be an int >= 1, got {depth!r}")
    if not isinstance(ledger, dict) or not isinstance(ledger.get("backend"), str):
        raise ValueError("'ledger' must be an object naming its backend")
    from ampmeter.ledgers.base import check_scope  # the ledgers load only when a token is read

    scope = check_scope(texts["scope"])
    ancestors = tuple(
        (check_scope(scope_name), _limits_in(limits)) for scope_name, limits in data["ancestors"]
    )
    for name, _ in ancestors:
        if not scope.startswith(name + "/"):
            raise ValueError(f"ancestor scope {name!r} does not enclose {scope!r}")
    mode, pause_s = data.get("exhausted") or ("raise", None)
    if mode not in ("raise", "pause"):
        raise ValueError(f"'exhausted' must name 'raise' or 'pause', got {mode!r}")
    return Handoff(
        chain_id=texts["chain"],
        node_id=texts["node"],
        depth=depth,
        name=texts["name"],
        scope=scope,
        ledger=ledger,
        limits=_limits_in(data["limits"]),
        ancestors=ancestors,
        deadline=_seconds(data["deadline"], "'deadline' must be a number of Unix seconds"),
        on_exhausted=mode,
        pause_timeout_s=_seconds(
            pause_s, "the pause time of 'exhausted' must be a number of seconds"
        ),
        on_expired_hold=_validate.expired_hold(data.get("expired_hold"), "'expired_hold'"),
    )


def _seconds(value: object, wanted: str) -> float | None:
    """A time in a token: a number, or null."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{wanted} or null")
    return float(value)


def _limits_out(limits: tuple[Limit, ...]) -> list[list[Any]]:
    # Money goes as a decimal string: a JSON number would be read back as a binary float.
    return [
        [lim.key, str(lim.max_value) if is_money(lim.key) else lim.max_value, lim.type.value]
        for lim in limits
    ]


def _limits_in(raw: Any) -> tuple[Limit, ...]:
    if not isinstance(raw, list):
        raise TypeError("limits must be a list")
    return tuple(Limit(key, _max_in(key, value), kind) for key, value, kind in raw)


def _max_in(key: object, value: object) -> object:
    """A limit's maximum as written in a token: money as a decimal string, read exactly."""
    if isinstance(key, str) and is_money(key):
        if not isinstance(value, str):
            raise TypeError(f"the maximum of {key!r} must be a decimal string, got {value!r}")
        return money.usd(value, f"the maximum of {key!r}", allow_negative=True)
    return value


# -- HTTP ---------------------------------------------------------------------------------------


def inject(headers: MutableMapping[str, str], token: str) -> None:
    """Put ``token`` in ``headers`` (a dict, ``httpx.Headers``...) as ``ampmeter-handoff``."""
    _read_body(_parts(token)[0])  # a damaged token fails here, not in the service
    headers[HANDOFF_HEADER] = token


def extract(headers: Mapping[str, str], *, ledger: Ledger | None = None) -> str | None:
    """The hand-off token in ``headers`` (any case of the name), or None if there is none.

    A header that is there but damaged, or whose signature fails (checked with ``ledger``'s
    key, else ``AMPMETER_HANDOFF_KEY``), raises :class:`HandoffError`.
    """
    found = headers.get(HANDOFF_HEADER)
    if found is None:
        found = next((v for k, v in headers.items() if k.lower() == HANDOFF_HEADER), None)
    if found is None:
        return None
    decode(found, ledger=ledger)
    return found


# -- the ledger ---------------------------------------------------------------------------------


def open_ledger(handoff: Handoff, ledger: Ledger | None = None) -> Ledger:
    """The ledger the child of ``handoff`` spends in, at its scope.

    ``ledger`` must be the token's ledger (same SQLite file, or same Redis server and
    database), at the hand-off's scope or one above it; it is needed when the backend wants
    credentials, which a token never carries. Without it, the token's ledger is opened only if
    ``AMPMETER_LEDGER_ALLOW`` lists it: a token never makes this process create a file or
    connect anywhere it did not configure.
    """
    from ampmeter.ledgers import reach

    try:
        found, place = reach.location_of(handoff.ledger)
    except ValueError as error:
        raise HandoffError(f"cannot open the hand-off's ledger: {error}") from None
    wanted = f"the {found.name} ledger {place}"
    if ledger is not None:
        return _child_of(ledger, handoff, wanted)
    if handoff.ledger.get("credentials"):
        raise HandoffError(
            f"{wanted} needs credentials, which a token never carries: pass "
            f"ledger={found.kind.__name__}(..., {handoff.scope.split('/')[0]!r}) to from_handoff()"
        )
    allowed = set()
    for entry in os.environ.get(LEDGER_ALLOW_ENV, "").split(","):
        try:
            allowed.add(reach.location_of(reach.at_address(entry.strip())[1])[1])
        except ValueError:
            continue  # an entry this process cannot open allows nothing
    if place not in allowed:
        raise HandoffError(
            f"the hand-off names {wanted}, which this process did not configure: "
            f"pass ledger=... to from_handoff(), or list it in {LEDGER_ALLOW_ENV}"
        )
    return found.reopen(handoff.ledger, handoff.scope)


def _child_of(ledger: Ledger, handoff: Handoff, wanted: str) -> Ledger:
    """``ledger`` (the receiving process's own) at the hand-off's scope, if it is the token's."""
    from ampmeter.ledgers import reach
    from ampmeter.ledgers.base import Ledger

    if not isinstance(ledger, Ledger):
        raise TypeError(f"ledger must be a Ledger, got {type(ledger).__name__}")
    try:
        mine, place = reach.location_of(ledger.location())
    except TypeError as error:
        raise HandoffError(f"ledger= cannot receive a hand-off: {error}") from None
    if f"the {mine.name} ledger {place}" != wanted:
        raise HandoffError(
            f"ledger= is the {mine.name} ledger {place}, not the hand-off's ledger ({wanted}): "
            "the child's spend would never reach its parent"
        )
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
