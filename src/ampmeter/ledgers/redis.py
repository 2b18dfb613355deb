"""A ledger kept in Redis, shared by any number of processes on any number of machines.

Each operation is one Lua script (:mod:`._lua`: the keys, the hash tag, exact integer sums) run
with EVALSHA (redis-py loads it on first use), so a reservation is checked and taken atomically
against everything every other process holds. Leases use the Redis server's clock, so the
clocks of the workers do not matter.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit, urlunsplit

import orjson

from ampmeter.ledgers import _lua
from ampmeter.ledgers._amounts import (
    HoldRequest,
    Units,
    check_scope,
    check_seconds,
    root_of,
    scope_path,
)
from ampmeter.ledgers._journal import Settlement, default_journal_dir
from ampmeter.ledgers._rules import SETTLED_ID, Refusal, Reservation, held_reservation
from ampmeter.ledgers.backend import Which
from ampmeter.ledgers.base import SETTLED_KEEP_S, ExpiredHold, Ledger, LedgerUnavailable
from ampmeter.ledgers.reach import Location, Reach, register, settings

# Without the redis package this module still loads, so that its Reach names Redis addresses
# and locations; making a RedisLedger then says what to install.
_MISSING: ImportError | None = None
try:
    import redis
    from redis.backoff import NoBackoff
    from redis.cluster import RedisCluster
    from redis.exceptions import RedisClusterException
    from redis.retry import Retry
except ImportError as missing:  # pragma: no cover - depends on the installed extras
    _MISSING = missing

__all__ = ["RedisLedger"]

_T = TypeVar("_T")
_SUFFIXES = (
    "spent",
    "reserved",
    "holds",
    "leases",
    "committed",
    "released",
    "window",
    "windowed",
    "window_events",
    "unsettled",
    "expired",
    "expired_at",
    "ceilings",
    "idempotency",
    "idempotency_at",
    "notes",
)
# The hashes whose fields name a scope (after its field prefix): spent, reserved, unsettled,
# ceilings, notes.
_SCOPED = (0, 1, 9, 12, 15)
_HASH_OF = {"spent": "1", "reserved": "2", "unsettled": "10"}
_SEP = "\x1f"  # between a scope's path below the root and a key, in hash fields


class RedisLedger(Ledger):
    """A :class:`Ledger` whose state lives in Redis under ``ampmeter:{<root>}:*``.

    ``url`` is a redis-py URL (``redis://host:6379/0``, ``rediss://``, ``unix://``), or a
    ready ``redis.Redis`` or ``redis.cluster.RedisCluster`` client (then its own timeouts and
    retries apply, ``timeout_s`` is not used, and :meth:`close` leaves it open).
    ``ttl_s`` (None = forever) makes the scope tree a window: its keys vanish ``ttl_s`` after
    the first write, and the next write starts a fresh budget (a budget for a day); a ledger
    with a TTL on a tree kept without one is unavailable (it would wipe the tree's spend), and
    one without a TTL on a window's tree writes what ends with the window. ``lease_s`` (None =
    never) is how long an unsettled reservation is held unless renewed, so a crashed worker's
    reservation comes back.
    ``timeout_s`` bounds connecting and every command; a backend that is unreachable or slower
    raises :class:`LedgerUnavailable` (a commit or release is then journaled, see
    :class:`Ledger`; ``journal`` is its directory, by default under the user's cache directory).
    ``on_expired_hold`` and ``handoff_key`` are as for :class:`Ledger`.
    """

    def __init__(
        self,
        url: str | redis.Redis | RedisCluster,
        scope: str,
        *,
        ttl_s: float | None = None,
        lease_s: float | None = 30.0,
        timeout_s: float = 0.25,
        journal: str | os.PathLike[str] | None = None,
        on_expired_hold: ExpiredHold = "charge",
        handoff_key: str | bytes | None = None,
    ) -> None:
        if _MISSING is not None:
            raise ImportError(
                "RedisLedger needs the redis package: pip install 'ampmeter[redis]'"
            ) from _MISSING
        if not isinstance(url, (str, redis.Redis, RedisCluster)):
            raise TypeError(
                "url must be a redis:// URL str, a redis.Redis or a redis.cluster.RedisCluster, "
                f"got {type(url).__name__}"
            )
        root = root_of(check_scope(scope))
        ttl = None if ttl_s is None else check_seconds(ttl_s, "ttl_s")
        lease = None if lease_s is None else check_seconds(lease_s, "lease_s")
        timeout = check_seconds(timeout_s, "timeout_s")
        self._ttl_arg = "" if ttl is None else str(max(1, round(ttl * 1000)))
        self._lease_arg = "" if lease is None else repr(lease)
        self._keys = [f"ampmeter:{{{root}}}:{suffix}" for suffix in _SUFFIXES]
        self._owns_client = isinstance(url, str)
        self._client: redis.Redis | RedisCluster
        if isinstance(url, str):
            self._client = redis.Redis.from_url(
                url,
                socket_timeout=timeout,
                socket_connect_timeout=timeout,
                retry=Retry(NoBackoff(), 0),
                decode_responses=True,
            )
        else:
            self._client = url
        self._where = _where(self._client)
        self._location = _location(url if isinstance(url, str) else self._client, ttl, lease)
        if journal is None:  # one per server and database (what a journal belongs to)
            db = ""
            if not isinstance(self._client, RedisCluster):
                db = f"/{self._client.connection_pool.connection_kwargs.get('db', 0)}"
            journal = default_journal_dir("redis", self._where + db, scope)
        super().__init__(
            scope,
            lease,
            journal,
            on_expired_hold=on_expired_hold,
            handoff_key=handoff_key,
        )
        self._scripts = {
            name: self._client.register_script(getattr(_lua, name)) for name in _lua.__all__
        }

    def _backend_reserve(self, request: HoldRequest) -> Reservation | Refusal:
        reservation_id, amounts, limits, windows, charge = request
        path = scope_path(next(iter(limits)))
        steps = [
            [scope, self._prefix(scope), scope in limits, _texts(limits.get(scope, {}))]
            for scope in path
        ]
        own = self._prefix(path[0])
        spans = [[own + key, repr(span), str(ceiling)] for key, span, ceiling in windows]
        answer = self._script(
            "RESERVE",
            reservation_id,
            self._lease_arg,
            _flat(amounts),
            "1" if charge else "0",
            orjson.dumps(steps).decode(),
            orjson.dumps(spans).decode(),
        )
        status, found, expiry = (_text(part) for part in answer)
        if status == "0":
            return SETTLED_ID
        if status == "5":
            return Refusal(path[int(found) - 1], None, paused=True)
        if status == "3":
            number, key, spent, held, ceiling = orjson.loads(found)
            scope = path[int(number) - 1]
            asked = amounts.get(key, 0)
            return Refusal.of_units(scope, key, int(spent), int(held), asked, int(ceiling))
        if status == "4":
            number, used, held = orjson.loads(found)
            key, span, ceiling = windows[int(number) - 1]
            asked = amounts.get(key, 0)
            return Refusal.of_units(
                path[0], key, int(used), int(held), asked, ceiling, window_s=span
            )
        expires_at = None if expiry in ("", "inf", "+inf") else float(expiry)
        held_amounts, scopes = _hold(found)
        return held_reservation(reservation_id, held_amounts, expires_at, scopes)

    def _backend_settle(self, settlement: Settlement) -> Units | None:
        op, reservation_id, scopes, actual, idempotency_key = settlement
        field = "" if idempotency_key is None else self._prefix(scopes[0]) + idempotency_key
        prefixes = orjson.dumps([self._prefix(scope) for scope in scopes]).decode()
        commit = "1" if op == "commit" else "0"
        answer = self._script("SETTLE", reservation_id, commit, field, _flat(actual), prefixes)
        status, seen = (_text(part) for part in answer)
        return _pairs(orjson.loads(seen)) if status == "2" else None

    def _backend_renew(self, reservation_ids: list[str]) -> set[str]:
        return {_text(item) for item in self._script("RENEW", self._lease_arg, *reservation_ids)}

    def _backend_read(self, which: Which, scope: str) -> Units:
        if which == "ceilings":
            raw = self._call(lambda: self._client.hget(self._keys[12], self._prefix(scope)))
            return {} if raw is None else _units(raw)
        flat: list[Any] = self._script("READ", _HASH_OF[which])
        pairs = zip(flat[::2], flat[1::2], strict=True)
        return {name: int(value) for name, value in self._own(pairs, scope).items()}

    def _backend_unsettled_holds(self) -> list[tuple[str, Units, tuple[str, ...]]]:
        raw: list[Any] = self._script("READ", "11")  # the expired holds (after reaping)
        pairs = zip(raw[::2], raw[1::2], strict=True)
        return [(_text(rid), *_hold(hold)) for rid, hold in pairs]

    def _backend_recent(self, scope: str, key: str, window_s: float) -> int:
        return int(self._script("RECENT", self._prefix(scope) + key, repr(window_s)))

    def _backend_set_ceilings(self, scope: str, ceilings: Units, tighten: bool) -> Units:
        only_lower = "1" if tighten else "0"
        return _units(self._script("CEILINGS", self._prefix(scope), only_lower, *_texts(ceilings)))

    def _backend_notes(self, scope: str) -> dict[str, str]:
        raw: dict[Any, Any] = self._call(lambda: self._client.hgetall(self._keys[15]))
        return self._own(raw.items(), scope)

    def _backend_set_note(
        self, scope: str, name: str, value: str | None, *, first: bool = False
    ) -> bool:
        # A note is never empty (a mark, or JSON): "" is the script's word for "drop it".
        field = self._prefix(scope) + name
        return bool(int(self._script("NOTE", field, value or "", "1" if first else "0")))

    def _backend_known(self, scope: str) -> bool:
        below = scope.partition("/")[2]
        for index in _SCOPED:
            key = self._keys[index]
            fields: list[Any] = self._call(functools.partial(self._client.hkeys, key))
            for field in map(_text, fields):
                # The root holds every field of its tree; another scope its own and those
                # of the scopes below it.
                if not below or field.startswith((below + _SEP, below + "/")):
                    return True
        return False

    def reservation_ids(self) -> set[str]:
        """Ids of the reservations Redis holds now in this scope tree (expired ones included
        until reaped)."""
        ids: list[Any] = self._call(lambda: self._client.hkeys(self._keys[2]))
        return {_text(item) for item in ids}

    def _backend_close(self) -> None:
        if self._owns_client:
            self._client.close()

    def _own(self, pairs: Iterable[tuple[Any, Any]], scope: str) -> dict[str, str]:
        """The fields of a tree's hash (``pairs``) that are ``scope``'s, without its prefix."""
        prefix = self._prefix(scope)
        found: dict[str, str] = {}
        for field, value in pairs:
            name = _text(field)
            if name.startswith(prefix) and _SEP not in name[len(prefix) :]:
                found[name[len(prefix) :]] = _text(value)
        return found

    def _prefix(self, scope: str) -> str:
        """The hash-field prefix of ``scope``: its path below the root, then the separator."""
        below = scope.partition("/")[2]
        return below + _SEP if below else ""

    def _script(self, name: str, *args: str) -> Any:
        """Run the script ``name`` of :mod:`._lua` on the tree's keys; its ARGV 1 and 2 are the
        tree's TTL and how long settled ids are kept, the rest ``args``."""
        script, argv = self._scripts[name], [self._ttl_arg, repr(SETTLED_KEEP_S), *args]
        return self._call(lambda: script(keys=self._keys, args=argv))

    def _call(self, operation: Callable[[], _T]) -> Any:
        try:
            return operation()
        except (redis.RedisError, RedisClusterException) as exc:
            raise LedgerUnavailable(
                f"Redis ledger for scope {self.scope!r} at {self._where} is unavailable: "
                f"{type(exc).__name__}: {exc}"
            ) from exc


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _texts(units: Units) -> list[str]:
    """``units`` as the scripts take amounts: ``[key, "amount", ...]``, never a Lua number."""
    return [text for pair in units.items() for text in map(str, pair)]


def _flat(units: Units) -> str:
    """:func:`_texts` as JSON."""
    return orjson.dumps(_texts(units)).decode()


def _pairs(flat: list[Any]) -> Units:
    """Amounts from the scripts' ``[key, amount, ...]`` (Lua writes an empty list as ``{}``)."""
    items = flat if isinstance(flat, list) else []
    return {items[i]: int(items[i + 1]) for i in range(0, len(items), 2)}


def _hold(raw: Any) -> tuple[Units, tuple[str, ...]]:
    """The amounts and scopes of a hold's JSON as the scripts keep it."""
    hold = orjson.loads(_text(raw))
    return _pairs(hold["a"]), tuple(hold["s"])


def _units(raw: Any) -> Units:
    """Kept ceilings from their JSON (``{key: "units"}``)."""
    return {str(key): int(value) for key, value in orjson.loads(_text(raw)).items()}


def _where(client: redis.Redis | RedisCluster) -> str:
    """Where the client points, for messages and the journal's name."""
    if isinstance(client, RedisCluster):
        nodes = sorted(node.name for node in client.get_nodes())  # type: ignore[no-untyped-call]
        return "cluster " + ",".join(nodes)
    kwargs = client.connection_pool.connection_kwargs
    return str(kwargs.get("path") or f"{kwargs.get('host')}:{kwargs.get('port')}")


def _location(
    where: str | redis.Redis | RedisCluster, ttl: float | None, lease: float | None
) -> dict[str, object]:
    """What a hand-off token may say about this backend: never a user name or a password
    (``credentials`` is True when another process must bring its own client)."""
    found: dict[str, object] = {"ttl_s": ttl, "lease_s": lease}
    if isinstance(where, RedisCluster):
        found.update(url=None, cluster=_where(where), credentials=True)
        return found
    if isinstance(where, str):
        parts = urlsplit(where)
        netloc = parts.netloc.rpartition("@")[2]
        secret = "@" in parts.netloc or "password=" in parts.query
        query = "&".join(q for q in parts.query.split("&") if q and not q.startswith("password="))
        url = urlunsplit((parts.scheme, netloc, parts.path, query, ""))
        found.update(url=url, credentials=secret)
        return found
    kwargs = where.connection_pool.connection_kwargs
    secret = bool(kwargs.get("password") or kwargs.get("username"))
    if kwargs.get("path"):
        url = f"unix://{kwargs['path']}?db={kwargs.get('db', 0)}"
    else:
        tls = issubclass(where.connection_pool.connection_class, redis.SSLConnection)
        scheme = "rediss" if tls else "redis"
        url = f"{scheme}://{kwargs.get('host')}:{kwargs.get('port')}/{kwargs.get('db', 0)}"
    found.update(url=url, credentials=secret)
    return found


def _place(location: Location) -> str:
    """The server and database a location names, written one way (credentials and options
    aside; ``localhost`` is ``127.0.0.1``)."""
    if location.get("cluster"):
        return f"cluster {location['cluster']}"
    parts = urlsplit(str(location["url"]))
    db = parse_qs(parts.query).get("db", ["0"])[0]
    if parts.scheme == "unix":
        return f"unix://{parts.path}?db={db}"
    host = (parts.hostname or "").lower()
    host = "127.0.0.1" if host in ("localhost", "::1") else host
    return f"{parts.scheme}://{host}:{parts.port or 6379}/{parts.path.strip('/') or db}"


def _address(text: str) -> dict[str, object] | None:
    if not text.startswith(("redis://", "rediss://", "unix://")):
        return None
    return {"url": text}


def _reopen(location: Location, scope: str) -> RedisLedger:
    found = settings(location, "ttl_s", "lease_s", "timeout_s")
    return RedisLedger(str(location["url"]), scope, **found)


register(
    Reach(
        name="redis",
        kind=RedisLedger,
        describe=lambda ledger: dict(ledger._location),
        reopen=_reopen,
        place=_place,
        address=_address,
    )
)
