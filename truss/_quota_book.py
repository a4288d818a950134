"""The edge of quotas: reserve before a run starts, settle when its session ends, read the use.

Every reservation and settlement is a signed entry of the log-level session ``@quota``
(``truss.quota.QUOTA_SESSION``), written by ``truss.ledger.stores.base.append_checked``: the
decision is made on the entries the store holds and written with ``expect_seq`` on that head, so
on any backend two starts can never both take the last of a quota. The pure accounting is
``truss.quota``; this module reads the store and the clock (through the ``Runtime``'s) and
appends.

Why ``@quota`` and not the run's own session: a reservation must be decided against every
other run's, in one place whose head is one compare-and-set; it is written before the run's
session exists (a refused run has no session at all); and it must outlive the run's session
being swept (retention never erases ``@quota``). Each entry names the run's session, so an
auditor can join them.

A reservation whose session ended without its settlement (a crash between ``session_ended``
and the settlement) is settled by the next reservation that sees it, from the session's own
entries; one whose session never started is released, with nothing used, once the run's
deadline has passed.
"""

from __future__ import annotations

import copy
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from truss._errors import QuotaExceededError, VerificationError
from truss.contract import Contract, duration_ms
from truss.ledger.entry import Record, StoredEntry
from truss.ledger.reader import VerifiedStore
from truss.ledger.stores.base import LedgerStore, append_checked
from truss.ledger.verification import check_entry_alone
from truss.quota import (
    QUOTA_SESSION,
    Amounts,
    Charge,
    QuotaBook,
    Refusal,
    Reservation,
    UsageTally,
    charges_for,
    limits_for,
    used_by,
)

__all__ = ["QuotaUse", "quota_book", "quota_use", "reserve", "settle"]

_LOCK = threading.Lock()
_BOOKS: weakref.WeakKeyDictionary[Any, QuotaBook] = weakref.WeakKeyDictionary()


def _raw(store: LedgerStore) -> tuple[LedgerStore, Callable[[StoredEntry, QuotaBook], None] | None]:
    """The store ``@quota`` is read from and appended to, and how each new entry is verified.

    Through the verified reader (the ``Runtime``'s store) a read of a session verifies it from its
    first entry, which would make every reservation cost the whole ``@quota`` history. The fold
    reads only the new entries from the store underneath and verifies each as it comes: a
    well-formed entry of this log signed by a trusted key (V1-V4, V10), at the next seq, linked to
    the last one folded. What does not verify refuses the reservation (``VerificationError``):
    a quota whose record cannot be trusted has no room."""
    if not isinstance(store, VerifiedStore):
        return store, None
    trusted = store.history().trusted
    origin = store.origin

    def check(entry: StoredEntry, book: QuotaBook) -> None:
        finding = check_entry_alone(entry, trusted, origin=origin)
        if finding is None and (entry.seq != book.seq or entry.prev != book.head):
            finding = ("broken_chain", f"entry {entry.seq} does not follow entry {book.seq - 1} of {QUOTA_SESSION}")
        if finding is not None:
            raise VerificationError(
                f"session {QUOTA_SESSION} at seq {entry.seq} does not verify, so no quota can be decided: {finding[1]}",
                remedy="run `truss ledger verify --all`; no run that a quota applies to starts until it verifies",
                session=QUOTA_SESSION,
                seq=entry.seq,
                reason=finding[0],
            )

    return store.raw, check


def _cached(store: LedgerStore) -> QuotaBook:
    with _LOCK:
        try:
            book = _BOOKS.get(store)
            if book is None:
                book = _BOOKS[store] = QuotaBook()
        except TypeError:  # a store that cannot be weakly referenced: fold afresh each time
            book = QuotaBook()
        return book


def _fold(
    book: QuotaBook, entries: Sequence[StoredEntry], check: Callable[[StoredEntry, QuotaBook], None] | None
) -> None:
    with _LOCK:
        applied = False
        for entry in entries:
            if entry.seq >= book.seq:  # other threads fold the same entries into a shared book
                if check is not None:
                    check(entry, book)
                book.apply(entry.kind, entry.body, entry.seq)
                book.head = entry.hash
                applied = True
        if applied:
            book.prune()


def quota_book(store: LedgerStore) -> QuotaBook:
    """The ``@quota`` entries as the store holds them now, verified and folded (a copy the caller may keep)."""
    raw, check = _raw(store)
    book = _cached(raw)
    _fold(book, list(raw.read_session(QUOTA_SESSION, from_seq=book.seq)), check)
    with _LOCK:
        return copy.deepcopy(book)


def _limit_json(limit: Any) -> dict[str, int | None]:
    """The limits in force when a reservation was decided (recorded for ``truss status``)."""
    return {d: (limit.get(d) if limit is not None else None) for d in ("runs", "tool_calls", "tokens")}


def _start(seq: int) -> list[Record]:
    return [Record("session_started", {"scope": "quota"})] if seq == 0 else []


def _overdue(store: LedgerStore, pending: Sequence[Reservation], now: int) -> list[Record]:
    """Settlements owed: reservations whose session ended unsettled, or never started by their deadline."""
    out: list[Record] = []
    for reservation in pending:
        info = store.session(reservation.session)
        if info is None:
            if reservation.release_ms <= now:
                used = {key: Amounts() for key in reservation.charges}
                out.append(_settlement(reservation.session, now, used, "released"))
        elif info.ended:
            used = used_by(store.read_session(reservation.session), reservation.charges)
            out.append(_settlement(reservation.session, now, used, "ended"))
    return out


def _settlement(session: str, at_ms: int, used: dict[str, Amounts], how: str) -> Record:
    return Record(
        "quota_settled",
        {"session": session, "at_ms": at_ms, "how": how, "used": {k: v.to_json() for k, v in sorted(used.items())}},
    )


def reserve(store: LedgerStore, contract: Contract, *, session: str, principal: Any, now_ms: int) -> list[Charge]:
    """Reserve a run's worst case on every quota that applies to it, or raise ``QuotaExceededError``.

    Returns the charges reserved (none: no quota applies and nothing was written).
    """
    charges = charges_for(contract, principal)
    if not charges:
        return []
    limits = limits_for(contract, principal)
    raw, check = _raw(store)
    book = _cached(raw)
    refused: list[Refusal] = []

    def decide(fresh: list[StoredEntry], seq: int) -> list[Record]:
        refused.clear()
        _fold(book, fresh, check)
        with _LOCK:
            now = book.stamp(now_ms)
            if session in book.reservations:
                return []  # already reserved (a retried start)
            pending = [r for r in book.unsettled() if r.session != session]
        owed = _overdue(store, pending, now)  # reads other sessions: outside the lock
        with _LOCK:
            view = book
            if (
                owed
            ):  # rare: decided on a private copy with what is owed applied (other threads fold into the shared one)
                view = copy.deepcopy(book)
                for record in owed:
                    view.apply(record.kind, record.body, view.seq)
            refusal = view.decide(charges, limits, now)
        if refusal is not None:
            refused.append(refusal)
            return _start(seq) + owed  # what was owed is written even when this run is refused
        release = now + duration_ms(contract.budget.deadline)
        body: dict[str, Any] = {
            "session": session,
            "at_ms": now,
            "release_ms": release,
            "contract": contract.contract.name,
            "contract_hash": contract.hash,
            "charges": [{**c.to_json(), "limit": _limit_json(limits.get(c.key))} for c in charges],
        }
        if principal is not None:
            body["principal"] = principal
        return [*_start(seq), *owed, Record("quota_reserved", body)]

    append_checked(raw, QUOTA_SESSION, decide, from_seq=book.seq)
    if refused:
        raise _refused(refused[0], session)
    return charges


def settle(store: LedgerStore, session: str, *, now_ms: int, usage: UsageTally | None = None) -> bool:
    """Settle ``session``'s reservation to what its entries record; False when it holds none.

    ``usage`` is what the session used when the caller tallied it already (the run that just
    ended: its journal, written or verified by this process); without it the session is read, and
    so verified in full, through ``store``."""
    raw, check = _raw(store)
    book = _cached(raw)
    done: list[bool] = []

    def decide(fresh: list[StoredEntry], seq: int) -> list[Record]:
        done.clear()
        _fold(book, fresh, check)
        with _LOCK:
            reservation = book.reservations.get(session)
            if reservation is None or reservation.settled is not None:
                return []
            keys = list(reservation.charges)
            now = book.stamp(now_ms)
        used = used_by(store.read_session(session), keys) if usage is None else usage.used(keys)
        done.append(True)
        return [_settlement(session, now, used, "ended")]

    if raw.session(QUOTA_SESSION) is None:
        return False
    append_checked(raw, QUOTA_SESSION, decide, from_seq=book.seq)
    return bool(done)


@dataclass(frozen=True)
class QuotaUse:
    """One counter's use now (``truss status``): what counts, by whom, and when it next frees up."""

    key: str
    quota: str
    window_ms: int
    used: Amounts
    held_by: tuple[str, ...]  # sessions whose unsettled reservations count in full
    next_frees_ms: int | None  # when the oldest settled use in the window leaves it
    limit: dict[str, int | None]  # the limits in force at the latest reservation on this counter

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "quota": self.quota,
            "window_ms": self.window_ms,
            "used": self.used.to_json(),
            "held_by": list(self.held_by),
            "next_frees_ms": self.next_frees_ms,
            "limit": dict(self.limit),
        }


def quota_use(book: QuotaBook, now_ms: int) -> list[QuotaUse]:
    """Every counter with use in its window at ``now_ms``, sorted by key."""
    now = book.stamp(now_ms)
    keys: dict[str, tuple[str, int]] = {}
    for reservation in book.reservations.values():
        for key in reservation.charges:
            keys.setdefault(key, (reservation.labels.get(key, key), reservation.windows.get(key, 0)))
    out: list[QuotaUse] = []
    for key, (label, window) in sorted(keys.items()):
        used = book.use(key, now)
        if used == Amounts():
            continue
        held = tuple(r.session for r in book.unsettled() if key in r.charges)
        leaving = [e for r in book.reservations.values() if key in r.charges
                   and (e := r.expires_ms(key)) is not None and e > now]  # fmt: skip
        limit = dict(book.limits.get(key) or {d: None for d in ("runs", "tool_calls", "tokens")})
        out.append(QuotaUse(key, label, window, used, held, min(leaving, default=None), limit))
    return out


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _refused(refusal: Refusal, session: str) -> QuotaExceededError:
    what = refusal.dimension.replace("_", " ")
    if refusal.unbounded:
        return QuotaExceededError(
            f"quota {refusal.quota!r} limits {what}, but this run's budget does not bound them, so its "
            f"worst case cannot be reserved",
            remedy="Set budget.max_tokens in the contract so the run's worst case is known",
            quota=refusal.quota, dimension=refusal.dimension, limit=refusal.limit, used=refusal.used,
            requested=None, frees_at_ms=None, held_by=[], retryable=False, session=session,
        )  # fmt: skip
    head = (
        f"quota {refusal.quota!r} has no room for this run: {refusal.used} of {refusal.limit} {what} are "
        f"used or reserved and this run may use {refusal.requested}"
    )
    if refusal.requested > refusal.limit:
        remedy = f"The run's budget alone exceeds the quota; lower it to at most {refusal.limit} {what}"
        retryable = False
    elif refusal.frees_at_ms is not None:
        remedy = f"Enough frees up at {_when(refusal.frees_at_ms)}; retry then"
        retryable = True
    else:
        held = ", ".join(refusal.held_by[:5]) or "unsettled runs"
        remedy = (
            f"Unfinished runs hold it ({held}): it frees up as they end (see 'truss status'; "
            "settle a run in doubt with 'truss resolve')"
        )
        retryable = True
    return QuotaExceededError(
        head, remedy=remedy, quota=refusal.quota, dimension=refusal.dimension, limit=refusal.limit,
        used=refusal.used, requested=refusal.requested, frees_at_ms=refusal.frees_at_ms,
        held_by=list(refusal.held_by), retryable=retryable, session=session,
    )  # fmt: skip
