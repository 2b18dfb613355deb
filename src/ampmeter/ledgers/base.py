"""The ledger interface: reservations and spend of hierarchical budget scopes, for every backend.

:class:`Ledger` holds what every backend shares: argument checks and units (dollars at the
API, integers in the backend, see :mod:`ampmeter.ledgers._amounts`), the idempotence rules,
lease renewal of this process's reservations and the journal of settlements the backend could
not take. A backend implements the few ``_backend_*`` methods, each one atomic step.
"""

from __future__ import annotations

import copy
import hashlib
import hmac
import logging
import os
import uuid
from collections.abc import Mapping, Sequence

from ampmeter import _validate
from ampmeter._core.idempotency import KEEP_S
from ampmeter._scoped import Closeable
from ampmeter.errors import BudgetUnavailable
from ampmeter.ledgers import _notes
from ampmeter.ledgers._amounts import (
    Amount,
    AmountIn,
    HoldRequest,
    Limits,
    Units,
    amounts_out,
    check_amounts,
    check_ancestors,
    check_key,
    check_reservation_id,
    check_scope,
    check_seconds,
    check_segment,
    check_windows,
    root_of,
    scope_path,
    to_amount,
)
from ampmeter.ledgers._journal import Journal, Settlement
from ampmeter.ledgers._renewal import Renewer
from ampmeter.ledgers._rules import (
    BudgetView,
    PausedCall,
    Refusal,
    Reservation,
    UnsettledHold,
    check_reservation,
    held_scopes,
)
from ampmeter.ledgers.backend import Which
from ampmeter.ledgers.reach import reach_of

__all__ = [
    "Amount",
    "BudgetView",
    "Committed",
    "Ledger",
    "LedgerUnavailable",
    "PausedCall",
    "Refusal",
    "Reservation",
    "UnsettledHold",
    "check_scope",
]

# The claim name (at the root scope) of the first reader that reports an unsettled hold.
UNSETTLED_CLAIM = "amp:unsettled:"

# How long settled reservation ids, expired holds kept for their commit and idempotency keys
# are remembered (a repeat within it is ignored); the core's figure, as a context keeps its own.
SETTLED_KEEP_S = KEEP_S

# How often a ledger without leases replays a journal that waits (it has nothing to renew).
JOURNAL_REPLAY_S = 1.0

ExpiredHold = _validate.ExpiredHold

_log = logging.getLogger("ampmeter.ledgers")

LedgerUnavailable = BudgetUnavailable
"""The name ledger backends have always raised: the same class as :class:`BudgetUnavailable`."""


class Committed(dict[str, Amount]):
    """What a commit counts, ``{key: amount}`` (see :meth:`Ledger.commit`). ``duplicate`` is
    True when its ``idempotency_key`` had been seen at the scope: this commit added nothing,
    and the amounts are the first settlement's."""

    __slots__ = ("duplicate",)

    def __init__(self, amounts: Mapping[str, Amount], *, duplicate: bool) -> None:
        super().__init__(amounts)
        self.duplicate = duplicate


class Ledger(_notes.Controls, Closeable):
    """Reservations and spend for a tree of budget scopes (``tenant-42/run-7/researcher``).

    A ledger is bound to one scope; :meth:`child` gives a ledger on the same backend for a
    scope below it. Money keys (``amp:cost``, ``amp:cost:<model>``) take dollars (Decimal,
    float read as written, int or str) and come back as Decimal; other keys count whole things
    as ints. Backends store integers (nano-dollars), so every sum is exact. Every backend has
    the same semantics (each method states its part; ``docs/shared-budgets.md`` the whole):

    * A reserve holds only if, at every scope it names and every scope above whose ceilings
      the ledger keeps, ``spent + reserved + amount`` stays within each ceiling; a paused
      scope, or one below it, admits nothing. Commit and release are idempotent per id.
    * Reservations carry a lease, so a crashed worker cannot hold budget forever; a daemon
      thread renews, every third of the lease, each hold whose :class:`Reservation` this
      process still holds. A hold whose lease ends is charged as *unsettled* spend
      (``on_expired_hold="charge"``, the default: its request may have been billed) until its
      commit or release comes, or returned to the pool (``"release"``).
    * A reserve that raises (a timeout, a lost connection, an interrupt) leaves no hold: the
      ledger releases its id, or journals that release.
    * A commit or release the backend cannot take is retried briefly, then kept in a local
      journal and replayed (idempotent by id) at the next operation, :meth:`flush` or
      :meth:`close`: spend is never dropped, while new reservations fail closed.

    ``handoff_key`` signs and checks hand-off tokens (:mod:`ampmeter.propagation`); without
    it the key comes from ``AMPMETER_HANDOFF_KEY``.
    """

    scope: str
    hold_prefix: str = ""
    """What the id of every hold this ledger object takes begins with: ``ampmeter run`` gives
    each run its own, so a run records (and waits for) only the holds its own processes left,
    never another run's on the same scope (see :meth:`claim_unsettled`)."""
    _root_ledger: Ledger | None = None  # the ledger that owns the backend (None: this one)

    def __init__(
        self,
        scope: str,
        lease_s: float | None,
        journal: str | os.PathLike[str] | None,
        *,
        on_expired_hold: ExpiredHold = "charge",
        handoff_key: str | bytes | None = None,
    ) -> None:
        self.scope = check_scope(scope)
        _validate.expired_hold(on_expired_hold)
        if handoff_key is not None and not isinstance(handoff_key, (str, bytes)):
            raise TypeError(f"handoff_key must be a str or bytes, got {type(handoff_key).__name__}")
        if handoff_key is not None and not handoff_key:
            raise ValueError("handoff_key must not be empty")
        self._charge_expired = on_expired_hold == "charge"
        self._handoff_key = handoff_key.encode() if isinstance(handoff_key, str) else handoff_key
        self._lease_s = lease_s
        # Settlements the backend could not take, sealed with the handoff key (None: an
        # in-process backend is never unreachable).
        tree = root_of(self.scope)
        self._journal = (
            None if journal is None else Journal(journal, tree=tree, key=self._handoff_key)
        )
        self._renewer = Renewer(self._renew_ids, lease_s or 3 * JOURNAL_REPLAY_S)

    # -- the public operations --------------------------------------------------------------

    @property
    def on_expired_hold(self) -> ExpiredHold:
        """What a hold's lease running out does unless its reserve says otherwise:
        ``"charge"`` it as unsettled spend or ``"release"`` it."""
        return "charge" if self._charge_expired else "release"

    def child(self, name: str) -> Ledger:
        """A ledger on the same backend (connection, journal, renewal) for ``scope/name``."""
        child = copy.copy(self)  # shares the backend, journal and renewer by reference
        child.scope = self.scope + "/" + check_segment(name)
        child._root_ledger = self._root_ledger or self
        return child

    @property
    def lease_s(self) -> float | None:
        """How long a reservation holds unless renewed (None: until it is settled)."""
        return self._lease_s

    def location(self) -> dict[str, object]:
        """Where another process finds this ledger, without any secret (a hand-off token
        carries it), as its :class:`~ampmeter.ledgers.reach.Reach` describes it. A ledger no
        other process can reach (one kept in this process) has no such place: ``TypeError``."""
        reach = reach_of(self)
        return {"backend": reach.name, **reach.describe(self)}

    def sign_handoff(self, body: bytes) -> bytes | None:
        """The HMAC-SHA256 of ``body`` under this ledger's ``handoff_key``, or None without
        one (the key itself never leaves the ledger)."""
        if self._handoff_key is None:
            return None
        return hmac.new(self._handoff_key, body, hashlib.sha256).digest()

    def try_reserve(
        self,
        amounts: Mapping[str, AmountIn],
        ceilings: Mapping[str, AmountIn],
        *,
        ancestors: Mapping[str, Mapping[str, AmountIn]] | None = None,
        reservation_id: str | None = None,
        windows: Sequence[tuple[str, float, AmountIn]] = (),
        on_expired_hold: ExpiredHold | None = None,
    ) -> Reservation | Refusal:
        """Reserve ``amounts`` at this scope and every scope in ``ancestors``, or return the
        :class:`Refusal` that names the ceiling that refused (or the paused scope) and whether
        what is spent alone would have left room (``busy``).

        ``ceilings`` are this scope's (``{key: max}``), ``ancestors`` the ceilings of enclosing
        scopes (``{scope: {key: max}}``; an empty mapping holds and counts there unchecked).
        The ceilings the ledger keeps for this scope and those above it apply as well. A
        refusal means a ceiling would be exceeded, a scope is paused, or ``reservation_id`` was
        already settled (committed, or released - also before it was ever reserved); nothing
        changed then. Reserving a live ``reservation_id`` again returns that reservation,
        holding once. ``windows`` (``(key, window_s, max)`` triples) are sliding-window ceilings
        at this scope: what was committed of ``key`` in the last ``window_s`` seconds, plus
        ``reserved``, plus the amount, stays within ``max``; from then on each commit of
        ``key`` here is remembered (for the longest window asked), so :meth:`recent` and later
        windows see it. A window's key is held (0 if not in ``amounts``) so its commit counts.
        ``on_expired_hold`` is what this hold's lease running out does (``"charge"`` or
        ``"release"``, see :class:`Ledger`); None: the ledger's own :attr:`on_expired_hold`.
        Raises :class:`LedgerUnavailable` when the backend cannot be reached (fail closed);
        whatever the request may still do on the way, its id is released (or journaled).
        """
        wanted = check_amounts(amounts, "amounts")
        limits: Limits = {self.scope: check_amounts(ceilings, "ceilings", ceiling=True)}
        if ancestors is not None:
            limits.update(check_ancestors(self.scope, ancestors))
        if reservation_id is None:
            reservation_id = self.hold_prefix + uuid.uuid4().hex
        rid = check_reservation_id(reservation_id)
        spans = check_windows(windows)
        charge = self._charge_expired
        if on_expired_hold is not None:
            charge = _validate.expired_hold(on_expired_hold) == "charge"
        for key, _, _ in spans:
            wanted.setdefault(key, 0)
        self._replay_journal(strict=True)
        try:
            held = self._backend_reserve(HoldRequest(rid, wanted, limits, spans, charge))
        except BaseException:
            # The backend may have taken the hold before the answer was lost (a timeout, a
            # dropped connection, an interrupt): nobody would ever settle it, so release it.
            self._abandon(rid)
            raise
        if isinstance(held, Reservation) and held.expires_at is not None:
            self._renewer.track(held)
        return held

    def commit(
        self,
        reservation: Reservation,
        actual: Mapping[str, AmountIn],
        *,
        idempotency_key: str | None = None,
    ) -> Committed:
        """Replace ``reservation`` by the ``actual`` spend, added at each of its scopes, and
        return what this settlement counts (a dict; ``.duplicate`` says whether its key had
        been seen).

        An expired or unknown reservation still adds ``actual`` (the money was spent) but is not
        subtracted from ``reserved`` a second time; one charged as unsettled when its lease
        ended has that charge replaced. A second commit of the same id does nothing. With an
        ``idempotency_key`` (one step of a replayed workflow) the settlement counts once per
        key at the reservation's scope: a key already seen (within a day) adds nothing, ends
        the reservation, and returns the first settlement's amounts.
        When the backend cannot be reached the commit is kept in the journal, replayed later,
        and :class:`LedgerUnavailable` says so.
        """
        held = check_reservation(reservation)
        cost = check_amounts(actual, "actual")
        key = None if idempotency_key is None else check_key(idempotency_key, "idempotency_key")
        scopes = held_scopes(self.scope, held)
        first = self._settle(Settlement("commit", held.id, scopes, cost, key))
        return Committed(amounts_out(cost if first is None else first), duplicate=first is not None)

    def release(self, reservation: Reservation | str) -> None:
        """Return a reservation (or the id one was, or might have been, reserved with) unused.

        Repeated calls do nothing. Releasing an id never reserved leaves a tombstone: a reserve
        with that id that arrives later (one that timed out on the way) does nothing. Releasing
        a hold charged as unsettled takes the charge back. When the backend cannot be reached
        the release is journaled like a commit.
        """
        self._settle(Settlement("release", _id_of(reservation), (), {}))

    def renew(self, reservation: Reservation | str) -> bool:
        """Extend a live reservation's lease by the lease length from now; False if not live.

        A reservation without a lease is just checked for being live. This process's own
        reservations are renewed by a daemon thread; call this for one reserved elsewhere.
        """
        rid = _id_of(reservation)
        self._replay_journal(strict=False)
        return rid in self._backend_renew([rid])

    def spent(self, scope: str | None = None) -> dict[str, Amount]:
        """The spend per key at ``scope`` (default: this ledger's), unsettled charges included."""
        return self._amounts("spent", scope)

    def unsettled(self, scope: str | None = None) -> dict[str, Amount]:
        """The part of :meth:`spent` charged for holds whose lease ran out unsettled."""
        return self._amounts("unsettled", scope)

    def unsettled_holds(self, scope: str | None = None) -> list[UnsettledHold]:
        """The holds charged as unsettled that held ``scope`` (default: this ledger's) or a
        scope below it: what :meth:`unsettled` sums, hold by hold."""
        name = self._readable(scope)
        self._replay_journal(strict=False)
        return [
            UnsettledHold(rid, amounts_out(units), scopes)
            for rid, units, scopes in self._backend_unsettled_holds()
            if name in scopes
        ]

    def claim_unsettled(self, hold: UnsettledHold | str) -> bool:
        """True for the first caller, in any process, that claims to report the unsettled
        ``hold`` (or its id); False for every later one, and for a hold this process still
        renews (its own call will settle it). A surviving context records what it claims, of
        the holds whose ids begin with its ledger's :attr:`hold_prefix`."""
        rid = check_reservation_id(hold if isinstance(hold, str) else hold.id)
        if rid in self._renewer.tracked():
            return False
        return self._claim(root_of(self.scope), UNSETTLED_CLAIM + rid)

    def reserved(self, scope: str | None = None) -> dict[str, Amount]:
        """The amounts live reservations hold at ``scope`` (default: this ledger's), per key."""
        return self._amounts("reserved", scope)

    def recent(self, key: str, window_s: float, scope: str | None = None) -> Amount:
        """What was committed of ``key`` at ``scope`` (default: this ledger's) in the last
        ``window_s`` seconds; only commits made after a reserve asked for a window on ``key``
        there are remembered (0 before that)."""
        name = self._readable(scope)
        span = check_seconds(window_s, "window_s")
        field = check_key(key, "key")
        self._replay_journal(strict=False)
        return to_amount(field, self._backend_recent(name, field, span))

    def claim(self, name: str) -> bool:
        """True for the first caller, in any process, that claims ``name`` at this scope; False
        for every later one (claims are kept as long as the scope's spend)."""
        return self._claim(self.scope, check_key(name, "claim name"))

    def show(self, scope: str | None = None) -> BudgetView:
        """What the ledger holds for ``scope`` (default: this ledger's): see :class:`BudgetView`."""
        name = self._readable(scope)
        return BudgetView(
            name,
            self._amounts("spent", name),
            self._amounts("reserved", name),
            self._amounts("unsettled", name),
            self.ceilings(name),
            next((at for at in scope_path(name) if _notes.PAUSE in self._backend_notes(at)), None),
            self.paused_calls(name),
        )

    def flush(self) -> None:
        """Replay the journal now; raises :class:`LedgerUnavailable` if the backend is down."""
        if self._journal is not None:
            self._journal.replay(self._backend_settle)

    def close(self) -> None:
        """Replay what the journal holds if possible, stop renewing, release the backend (a
        child ledger leaves its parent's open); what cannot be replayed stays on disk."""
        if self._journal is not None:
            try:
                self.flush()
            except LedgerUnavailable as error:
                _log.warning("ledger %r closed with journaled settlements: %s", self.scope, error)
        if self._root_ledger is None:
            self._renewer.stop()
            self._backend_close()

    # -- shared machinery -------------------------------------------------------------------

    def _amounts(self, which: Which, scope: str | None) -> dict[str, Amount]:
        """The ``which`` amounts of ``scope``, journaled spend replayed first (when the backend
        is back)."""
        name = self._readable(scope)
        self._replay_journal(strict=False)
        return amounts_out(self._backend_read(which, name))

    def _abandon(self, reservation_id: str) -> None:
        """Release ``reservation_id`` after a reserve that raised, or journal that release."""
        release = Settlement("release", reservation_id, (), {})
        try:
            self._backend_settle(release)
            return
        except Exception as error:
            _log.warning("releasing abandoned reservation %r failed: %s", reservation_id, error)
        if self._journal is None:
            return
        try:
            self._journal.append(release)
        except OSError as error:
            _log.warning("cannot journal the release of %r: %s", reservation_id, error)
            return
        self._renewer.ensure_running()  # replays it once the backend is back

    def _settle(self, settlement: Settlement) -> Units | None:
        """Apply a commit or release, or journal it (see :meth:`Journal.settle`)."""
        self._renewer.forget(settlement.reservation_id)
        if self._journal is None:
            return self._backend_settle(settlement)
        # A journaled settlement is replayed soon after the backend is back.
        return self._journal.settle(settlement, self._backend_settle, self._renewer.ensure_running)

    def _replay_journal(self, *, strict: bool) -> None:
        journal = self._journal
        if journal is None or not journal.pending:
            return
        try:
            journal.replay(self._backend_settle)
        except LedgerUnavailable:
            if strict:
                raise

    def _claim(self, scope: str, name: str) -> bool:
        """True for the first claim of ``name`` at ``scope``: a note that is never rewritten."""
        return self._backend_set_note(scope, _notes.CLAIM + name, "1", first=True)

    def _renew_ids(self, reservation_ids: list[str]) -> set[str]:
        """The renewal thread's tick: replay a waiting journal, then renew (if any to renew)."""
        self._replay_journal(strict=False)
        return self._backend_renew(reservation_ids) if reservation_ids else set()


def _id_of(reservation: Reservation | str) -> str:
    """The checked id of ``reservation`` (a :class:`Reservation` or its id)."""
    if isinstance(reservation, str):
        return check_reservation_id(reservation)
    return check_reservation(reservation).id
