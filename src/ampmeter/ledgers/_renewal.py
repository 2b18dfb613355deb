"""Renewal of this process's live reservations, on a daemon thread, every third of the lease.

A reservation is renewed while it is unsettled and something in this process still holds the
:class:`Reservation` object: one dropped without being settled (a leak) is no longer renewed,
so its hold comes back after the lease like a crashed worker's.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

from ampmeter.errors import BudgetUnavailable

if TYPE_CHECKING:
    from ampmeter.ledgers.base import Reservation

__all__ = ["Renewer"]

_log = logging.getLogger("ampmeter.ledgers")


class Renewer:
    """Keeps the leases of tracked reservations alive until they are forgotten or dropped.

    ``renew`` (held weakly: a ledger dropped without ``close`` ends the thread) takes a list of
    ids and returns those that were still live; the others are forgotten. It is called every
    tick, also with no ids, so it can replay the ledger's journal once the backend is back.
    The thread starts with the first tracked id (or journaled settlement) and stops with
    :meth:`stop`. A forked child starts afresh: the parent's reservations are the parent's.
    """

    __slots__ = ("_ids", "_interval_s", "_lock", "_pid", "_renew", "_stop", "_thread")

    def __init__(self, renew: Callable[[list[str]], set[str]], lease_s: float) -> None:
        self._renew = weakref.WeakMethod(renew)
        self._interval_s = lease_s / 3
        self._lock = threading.Lock()
        self._ids: dict[str, weakref.ref[Reservation]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def track(self, reservation: Reservation) -> None:
        """Renew ``reservation`` from now on (starting the thread if needed)."""
        self.ensure_running()
        with self._lock:
            self._ids.setdefault(reservation.id, weakref.ref(reservation))

    def ensure_running(self) -> None:
        """Start the thread if it is not running (it also replays a journal that waits)."""
        with self._lock:
            if self._pid != os.getpid():  # a forked child: nothing of the parent's is ours
                self._pid, self._ids, self._thread = os.getpid(), {}, None
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(
                    target=self._run, name="ampmeter-lease-renewal", daemon=True
                )
                self._thread.start()

    def forget(self, reservation_id: str) -> None:
        """Stop renewing ``reservation_id`` (it was settled)."""
        with self._lock:
            self._ids.pop(reservation_id, None)

    def tracked(self) -> list[str]:
        """The ids renewed now (forgetting those whose reservation object is gone)."""
        with self._lock:
            gone = [rid for rid, ref in self._ids.items() if ref() is None]
            for rid in gone:
                del self._ids[rid]
            return sorted(self._ids)

    def stop(self) -> None:
        """End the thread (waiting for a renewal under way) and forget every id."""
        self._stop.set()
        with self._lock:
            thread, self._thread = self._thread, None
            self._ids.clear()
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            ids = self.tracked()
            renew = self._renew()
            if renew is None:
                return
            try:
                live = renew(ids)
            except BudgetUnavailable as error:
                _log.warning("lease renewal failed, retrying: %s", error)
                continue
            except Exception:
                _log.exception("lease renewal failed")
                continue
            finally:
                del renew
            with self._lock:
                for rid in ids:
                    if rid not in live:
                        self._ids.pop(rid, None)
