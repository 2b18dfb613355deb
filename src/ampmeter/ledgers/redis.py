"""A ledger kept in Redis, shared by any number of processes on any number of machines.

Each operation is one Lua script run with EVALSHA (redis-py loads it on first use), so a
reservation is checked and taken atomically against everything every other process holds. Leases
use the Redis server's clock, so the clocks of the workers do not matter.

Precision: Redis adds with ``HINCRBYFLOAT`` (long double, printed with 17 decimals), so a sum
of many amounts matches the exact float sum to far better than 1e-9 for budgets of ordinary
size; amounts are sent as the shortest exact decimal form of the float and a reservation is
subtracted with the very string it was added with. When the last reservation ends, the
reserved hash is reset to exact zero.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

try:
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("RedisLedger needs the redis package: pip install 'ampmeter[redis]'") from exc

from ampmeter.ledgers import _lua
from ampmeter.ledgers.base import (
    SETTLED_KEEP_S,
    Ledger,
    LedgerUnavailable,
    Reservation,
    check_amounts,
    check_reservation,
    check_scope,
    check_seconds,
    frozen,
)

__all__ = ["RedisLedger"]

_T = TypeVar("_T")
_SUFFIXES = ("spent", "reserved", "holds", "leases", "committed", "released", "window")


class RedisLedger(Ledger):
    """A :class:`Ledger` whose state lives in Redis under ``ampmeter:{scope}:*``.

    ``url`` is a redis-py URL (``redis://host:6379/0``, ``rediss://``, ``unix://``).
    ``ttl_s`` (None = forever) makes the scope a window: its keys vanish ``ttl_s`` after the
    first write, and the next write starts a fresh budget (a budget for a day); every ledger
    of one scope must use the same ``ttl_s``. ``lease_s`` (None = never) is how long a
    reservation is held before it returns to the pool, so a crashed worker's reservation comes
    back. ``timeout_s`` bounds connecting and every command; a backend that is unreachable or
    slower raises :class:`LedgerUnavailable` (no retries, so callers decide quickly).

    The scope sits in a Redis Cluster hash tag (``{scope}``), so all its keys share one slot.
    """

    __slots__ = ("_client", "_commit", "_keys", "_lease_arg", "_release", "_reserve", "_ttl_arg",
                 "_where", "scope")  # fmt: skip

    def __init__(
        self,
        url: str,
        scope: str,
        *,
        ttl_s: float | None = None,
        lease_s: float | None = 30.0,
        timeout_s: float = 0.25,
    ) -> None:
        if not isinstance(url, str):
            raise TypeError(f"url must be a str, got {type(url).__name__}")
        self.scope = check_scope(scope)
        ttl = check_seconds(ttl_s, "ttl_s", optional=True)
        lease = check_seconds(lease_s, "lease_s", optional=True)
        timeout = check_seconds(timeout_s, "timeout_s", optional=False)
        self._ttl_arg = "" if ttl is None else str(max(1, round(ttl * 1000)))
        self._lease_arg = "" if lease is None else repr(lease)
        self._keys = [f"ampmeter:{{{scope}}}:{suffix}" for suffix in _SUFFIXES]
        self._client: redis.Redis = redis.Redis.from_url(
            url,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),
            decode_responses=True,
        )
        kwargs = self._client.connection_pool.connection_kwargs
        self._where = str(kwargs.get("path") or f"{kwargs.get('host')}:{kwargs.get('port')}")
        self._reserve = self._client.register_script(_lua.RESERVE)
        self._commit = self._client.register_script(_lua.COMMIT)
        self._release = self._client.register_script(_lua.RELEASE)

    def reserve(
        self, amounts: Mapping[str, float], ceilings: Mapping[str, float]
    ) -> Reservation | None:
        """See :meth:`Ledger.reserve`."""
        wanted = check_amounts(amounts, "amounts")
        limits = check_amounts(ceilings, "ceilings", allow_negative=True)
        reservation_id = uuid.uuid4().hex
        args: list[str] = [*self._common(), reservation_id, self._lease_arg, str(len(wanted))]
        for key, value in wanted.items():
            args += (key, repr(value))
        args.append(str(len(limits)))
        for key, value in limits.items():
            args += (key, repr(value))
        answer = self._call(lambda: self._reserve(keys=self._keys, args=args))
        taken, seconds, micros = answer
        if not int(taken):
            return None
        expires_at = None
        if self._lease_arg:
            expires_at = int(seconds) + int(micros) / 1e6 + float(self._lease_arg)
        return Reservation(reservation_id, frozen(wanted), expires_at)

    def commit(self, reservation: Reservation, actual: Mapping[str, float]) -> None:
        """See :meth:`Ledger.commit`."""
        held = check_reservation(reservation)
        cost = check_amounts(actual, "actual")
        args: list[str] = [*self._common(), held.id, str(len(cost))]
        for key, value in cost.items():
            args += (key, repr(value))
        self._call(lambda: self._commit(keys=self._keys, args=args))

    def release(self, reservation: Reservation) -> None:
        """See :meth:`Ledger.release`."""
        held = check_reservation(reservation)
        args = [*self._common(), held.id]
        self._call(lambda: self._release(keys=self._keys, args=args))

    def spent(self) -> dict[str, float]:
        """See :meth:`Ledger.spent`."""
        return self._read_hash(self._keys[0])

    def reserved(self) -> dict[str, float]:
        """See :meth:`Ledger.reserved`."""
        return self._read_hash(self._keys[1])

    def reservation_ids(self) -> set[str]:
        """Ids of the reservations Redis holds now (expired ones included until reaped)."""
        ids: set[str] = self._call(lambda: set(self._client.hkeys(self._keys[2])))
        return ids

    def close(self) -> None:
        """Close the connection pool."""
        self._client.close()

    def _common(self) -> tuple[str, str]:
        return self._ttl_arg, repr(SETTLED_KEEP_S)

    def _read_hash(self, key: str) -> dict[str, float]:
        raw: dict[str, str] = self._call(lambda: self._client.hgetall(key))
        return {field: float(value) for field, value in raw.items()}

    def _call(self, operation: Callable[[], _T]) -> Any:
        try:
            return operation()
        except redis.RedisError as exc:
            raise LedgerUnavailable(
                f"Redis ledger for scope {self.scope!r} at {self._where} is unavailable: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
