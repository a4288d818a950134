"""What every ledger store is: the ``LedgerStore`` protocol, its row types, and the rules they share.

A store keeps signed entries, the Merkle log over them, payload blobs, checkpoints and verdict
envelopes. Only the entries are signed; everything else a store keeps is derived from them or
checked against them by verification (docs/ledger-format.md). A store is the one place that
assigns an entry's ``seq``, ``prev``, ``index`` and ``ts`` and signs it, inside its write
transaction, so two writers can never record the same step.

``seal_batch`` is that assignment as a pure function: given a session's head as the store holds
it, the records to append and the next log index, it applies the session rules (``session_started``
first and only first, nothing after ``session_ended``, ``expect_seq``, ``expect_index``) and returns the signed
entries, or raises without side effects. Every backend calls it inside its own transaction, so the
rules and their errors are the same whichever store is used.

What this module does not do: I/O (backends live beside it: ``sqlite``, ``memory``), choose a
backend (``truss.ledger.stores.open_store``) or verify (``truss.ledger.verification``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from truss._errors import SessionBusyError, StoreConflictError, StoreError
from truss.ledger.canonical import CanonicalError
from truss.ledger.entry import ZERO_HASH, Record, Signer, StoredEntry, seal
from truss.ledger.merkle import in_order

if TYPE_CHECKING:
    from truss._clock import Clock
    from truss.ledger.keys import IdentityKey

__all__ = [
    "DEFAULT_LEASE_MS",
    "Lease",
    "LeaseOwner",
    "LedgerStore",
    "SessionHead",
    "SessionInfo",
    "StoreOpener",
    "StoredCheckpoint",
    "append_checked",
    "check_epoch",
    "check_status",
    "grant_lease",
    "key_retired_error",
    "nodes_in_order",
    "owner_gone",
    "retires",
    "seal_batch",
    "session_fields",
]

_STATUS_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz_")


@dataclass(frozen=True)
class SessionInfo:
    """A row of the sessions table: derived from the chain, kept for listing (not signed).

    ``verified`` says how much of it a verified reader (``truss.ledger.reader``) checked: ``chain``
    (the whole session verified), ``ends`` (its first and last entry verified, as in a listing),
    or None (read from a store directly, not verified).
    """

    id: str
    contract: str | None
    status: str
    entries: int
    started_ms: int
    updated_ms: int
    head: str
    principal: Any = None
    ended: bool = False
    verified: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "contract": self.contract,
            "status": self.status,
            "entries": self.entries,
            "started_ms": self.started_ms,
            "updated_ms": self.updated_ms,
            "head": self.head,
            "principal": self.principal,
            "ended": self.ended,
            "verified": self.verified,
        }


@dataclass(frozen=True)
class StoredCheckpoint:
    """A signed checkpoint the store keeps: tree ``size``, ``root`` and the signed note text."""

    size: int
    root: bytes
    note: str
    created_ms: int = 0


DEFAULT_LEASE_MS = 30_000
"""How long a session's lease lasts unless renewed; its owner renews it every third of that."""


def _hostname() -> str:
    """This host's name, as ``socket.gethostname()`` gives it, without loading the socket module."""
    uname = getattr(os, "uname", None)
    if uname is not None:  # POSIX: the same nodename gethostname(2) returns
        return uname().nodename
    import socket  # Windows, which has no uname

    return socket.gethostname()


@dataclass(frozen=True)
class LeaseOwner:
    """Who drives a session: an id unique to one process's runtime, its host and pid."""

    id: str
    host: str
    pid: int

    @classmethod
    def this_process(cls, owner_id: str) -> LeaseOwner:
        return cls(owner_id, _hostname(), os.getpid())


@dataclass(frozen=True)
class Lease:
    """A session's lease as a store holds it: owner, host, pid, epoch, when taken and until when.

    ``epoch`` grows by one on every grant (a takeover, or the same owner again): an append that
    carries an older epoch is refused (fencing). A released lease keeps its epoch with
    ``expires_ms`` 0. Coordination, not evidence: it is not signed, and verification does not read it.
    """

    session: str
    owner: str
    host: str
    pid: int
    epoch: int
    acquired_ms: int
    expires_ms: int

    def held(self, now_ms: int) -> bool:
        """Whether it still binds others at ``now_ms``: not expired and its process not known gone."""
        return self.expires_ms > now_ms and not owner_gone(self)

    def to_json(self) -> dict[str, Any]:
        return {
            "owner": self.owner,
            "host": self.host,
            "pid": self.pid,
            "epoch": self.epoch,
            "acquired_ms": self.acquired_ms,
            "expires_ms": self.expires_ms,
        }


def owner_gone(lease: Lease) -> bool:
    """A lease held by a pid on this host that no longer runs (the process died without releasing it).

    Only this host's pids are probed; an owner on another host counts as alive until its lease
    expires, so nothing here assumes one host.
    """
    if lease.host != _hostname() or lease.pid <= 0:
        return False
    try:
        os.kill(lease.pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # it exists under another user
    return False


def grant_lease(current: Lease | None, session: str, owner: LeaseOwner, now_ms: int, ttl_ms: int) -> Lease:
    """The lease ``owner`` gets on ``session``, given the one held (read in the store's transaction).

    ``SessionBusyError`` (exit 3) when another owner holds it and it has neither expired nor lost
    its process; else the next epoch.
    """
    if current is not None and current.owner != owner.id and current.held(now_ms):
        from datetime import UTC, datetime

        since = datetime.fromtimestamp(current.acquired_ms / 1000, tz=UTC).strftime("%H:%M:%S")
        raise SessionBusyError(
            f"session {session} is being driven by pid {current.pid} on host {current.host} since {since} UTC",
            remedy="wait for that run to end or suspend; if it died on another host, its lease expires "
            f"{max(0, current.expires_ms - now_ms) // 1000 + 1} s from now and the session becomes interrupted",
            session=session,
            owner=current.owner,
            host=current.host,
            pid=current.pid,
            since_ms=current.acquired_ms,
            expires_ms=current.expires_ms,
        )
    epoch = 1 if current is None else current.epoch + 1
    return Lease(session, owner.id, owner.host, owner.pid, epoch, now_ms, now_ms + max(1, ttl_ms))


def check_epoch(session: str, current: Lease | None, epoch: int | None) -> None:
    """Fencing: an append that carries ``epoch`` is refused unless it is the session's current epoch."""
    if epoch is None:
        return
    if current is None or current.epoch != epoch:
        now = "no lease" if current is None else f"epoch {current.epoch}, held by pid {current.pid} on {current.host}"
        raise StoreConflictError(
            f"session {session}: this writer's lease (epoch {epoch}) was taken over ({now}); its append is refused",
            remedy="another process drives this session now; stop this one",
            session=session,
            reason="stale_epoch",
            epoch=epoch,
        )


@runtime_checkable
class LedgerStore(Protocol):
    """What every ledger store provides (``truss.testing.check_ledger_store`` checks it).

    Thread-safe: a run appends from worker threads while serve-mcp reads from others. Every
    method that writes is durable when it returns (``append(durable=False)`` excepted).
    """

    origin: str

    def append(
        self,
        session: str,
        records: Sequence[Record],
        *,
        durable: bool = True,
        expect_seq: int | None = None,
        expect_index: int | None = None,
        epoch: int | None = None,
    ) -> list[StoredEntry]:
        """Append ``records`` to ``session`` as consecutive signed entries (see ``seal_batch``).

        ``epoch``: the lease epoch of the writer; refused (``StoreConflictError``, reason
        ``stale_epoch``) unless it is the session's current one, in the same transaction (``check_epoch``).
        """
        ...

    def acquire_lease(self, session: str, owner: LeaseOwner, *, ttl_ms: int = DEFAULT_LEASE_MS) -> Lease:
        """Take the session's lease (``grant_lease`` inside one transaction); ``SessionBusyError`` if held."""
        ...

    def renew_lease(self, lease: Lease, *, ttl_ms: int = DEFAULT_LEASE_MS) -> Lease:
        """Extend a lease still current; ``StoreConflictError`` (``stale_epoch``) when it was taken over."""
        ...

    def release_lease(self, lease: Lease) -> None:
        """Give a current lease up (it keeps its epoch); nothing when it was taken over."""
        ...

    def lease(self, session: str) -> Lease | None:
        """The session's lease as held (expired or released ones included), None if never taken."""
        ...

    def session(self, session: str) -> SessionInfo | None: ...

    def sessions(
        self, *, status: str | None = None, limit: int | None = None, principal: Any = None
    ) -> list[SessionInfo]:
        """Sessions, most recently started first; filtered by status and principal (JSON equality)."""
        ...

    def read_session(self, session: str, *, from_seq: int = 0) -> Iterator[StoredEntry]: ...

    def read_range(self, start: int, stop: int) -> Iterator[StoredEntry]: ...

    def blob(self, ref: str) -> bytes | None: ...

    def blobs_for(self, refs: Iterable[str]) -> dict[str, bytes]: ...

    def erased_refs(self, session: str) -> set[str]: ...

    def erase_payloads(self, session: str) -> int: ...

    def tree_size(self) -> int: ...

    def tree_root(self) -> bytes: ...

    def tree_head(self) -> tuple[int, bytes]: ...

    def node(self, level: int, index: int) -> bytes: ...

    def nodes(self, keys: Sequence[tuple[int, int]]) -> dict[tuple[int, int], bytes]:
        """The complete subtrees ``keys`` (``merkle.inclusion_nodes`` ...) in one lookup, whatever
        the log's size; ``StoreError`` as ``node`` raises it, naming one that is not stored."""
        ...

    def node_hashes(self, keys: Iterable[tuple[int, int]]) -> Iterator[bytes]:
        """The hashes of the complete subtrees ``keys`` in the order asked, for a fold that holds
        none of them (``merkle.inclusion_root`` over ``merkle.path_nodes``, as ``verify SESSION``
        proves each entry); ``StoreError`` as ``nodes`` raises it, at the latest when the one not
        stored is reached. A store that can stream them from one query does (SQLite), so a proof's
        memory does not grow with the log; one that can only answer ``nodes`` returns
        ``nodes_in_order(self.nodes, keys)``."""
        ...

    def add_checkpoint(self, size: int, root: bytes, note: str) -> None: ...

    def checkpoints(self) -> list[StoredCheckpoint]: ...

    def latest_checkpoint(self) -> StoredCheckpoint | None:
        """The stored checkpoint of the largest size, or None: one index lookup, never a read of all."""
        ...

    def checkpoint_covering(self, size: int) -> StoredCheckpoint | None:
        """The smallest stored checkpoint whose size is at least ``size`` (the first that covers the
        log's first ``size`` entries), or None: one index lookup, never a read of all."""
        ...

    def set_envelope(self, session: str, envelope: bytes) -> None: ...

    def envelope(self, session: str) -> bytes | None: ...

    def close(self) -> None: ...


def nodes_in_order(
    nodes: Callable[[Sequence[tuple[int, int]]], Mapping[tuple[int, int], bytes]], keys: Iterable[tuple[int, int]]
) -> Iterator[bytes]:
    """``LedgerStore.node_hashes`` for a store that can only answer ``nodes``: one ``nodes`` lookup
    of all ``keys``, then their hashes in the order asked (``merkle.in_order``). It holds the
    O(log n) hashes of a proof where a streaming store holds none."""
    return iter(in_order(nodes)(keys))


class StoreOpener(Protocol):
    """What a backend registers under its URL scheme (``truss.ledger.stores.register_store``).

    ``url`` is what the operator gave (``--db``), a bare path for the SQLite default. ``key``
    signs appended entries; without one the store opens read-only. ``create=False`` refuses a
    ledger that does not exist yet (``NotFoundError``).
    """

    def __call__(self, url: str, /, *, key: IdentityKey | None, clock: Clock, create: bool) -> LedgerStore: ...


def check_status(status: str) -> None:
    """Refuse a listing status that is not a short lower-case word (``running``, ``pass`` ...)."""
    if not status or len(status) > 32 or not set(status) <= _STATUS_CHARS:
        raise StoreError(f"session status {status!r} is not a lower-case word", reason="bad_status")


def session_fields(record: Record) -> tuple[str | None, Any]:
    """The contract name and principal a ``session_started`` body carries."""
    contract = record.body.get("contract")
    return (contract if isinstance(contract, str) else None), record.body.get("principal")


@dataclass(frozen=True)
class SessionHead:
    """Where a session stands in a store: its next ``seq``, last entry hash, and whether it ended."""

    seq: int
    head: str
    ended: bool


def retires(key: IdentityKey, records: Iterable[Record]) -> bool:
    """Whether appending ``records`` with ``key`` retires it: a ``key_rotated`` record (the store signs
    it with the key it retires) or a ``key_removed`` naming it. Nothing more may be signed with the
    key (it would not verify), so a store that appended such records refuses its next append
    (``key_retired``), as SQLite and PostgreSQL do by reading the statements in the log."""
    vkey = key.verifier.vkey
    return any(r.kind == "key_rotated" or (r.kind == "key_removed" and r.body.get("key") == vkey) for r in records)


def key_retired_error(db: str, key_id: str) -> StoreError:
    """The append refused because the store's key ``key_id`` is retired (``retires``): every backend raises this."""
    return StoreError(
        f"{db}: the identity key {key_id} was retired by a key rotation or removed from the log's key set; "
        "nothing more can be signed with it",
        remedy="restart with the current identity key; an interrupted run resumes with `truss resume SESSION`",
        db=db,
        reason="key_retired",
    )


def seal_batch(
    signer: Signer,
    *,
    origin: str,
    session: str,
    head: SessionHead | None,
    records: Sequence[Record],
    bodies: Sequence[bytes],
    index: int,
    now_ms: Callable[[], int],
    expect_seq: int | None = None,
    expect_index: int | None = None,
    copy_bodies: bool = False,
) -> list[StoredEntry]:
    """The signed entries ``records`` become when appended to ``session`` at log ``index``.

    ``head`` is the session as the store holds it inside its transaction (None: no such
    session); ``bodies`` are ``encode_record(record)`` of each record (encoded by the caller,
    outside the store's lock). Raises ``StoreError`` (``reason="no_session"``: a session must
    start with ``session_started``; ``bad_body``; ``key_retired``: a record after a key rotation,
    which the key it retires would sign) or ``StoreConflictError`` (starting a session
    twice, a stale ``expect_seq`` or ``expect_index``, appending after ``session_ended``); nothing
    is returned half-done. ``expect_index`` is the log index the first record must get (a record
    that names its own position, as a key rotation does). ``copy_bodies`` gives each entry a
    private copy of its body, for stores that keep the entry objects themselves (the caller may
    change its dict afterwards).
    """
    first = records[0]
    if head is None:
        if first.kind != "session_started":
            raise StoreError(
                f"session {session} does not exist: its first entry must be session_started, not {first.kind}",
                reason="no_session",
                session=session,
            )
        seq, prev, ended = 0, ZERO_HASH, False
    else:
        seq, prev, ended = head.seq, head.head, head.ended
        if first.kind == "session_started":
            raise StoreConflictError(
                f"session {session} already exists", remedy="use a new session id", session=session, seq=seq
            )
    if expect_index is not None and expect_index != index:
        raise StoreConflictError(
            f"session {session}: expected to append at log index {expect_index} but the log is at {index}",
            remedy="another writer appended first; re-read the log and retry",
            session=session,
            index=expect_index,
            actual=index,
        )
    if expect_seq is not None and expect_seq != seq:
        raise StoreConflictError(
            f"session {session}: expected to append at seq {expect_seq} but its head is at seq {seq}",
            remedy="another writer is recording this session; stop, re-read it and resume from its head",
            session=session,
            seq=expect_seq,
            actual=seq,
        )
    out: list[StoredEntry] = []
    for i, record in enumerate(records):
        if ended:
            raise StoreConflictError(
                f"session {session} has ended; nothing more can be appended", session=session, seq=seq
            )
        if i and record.kind == "session_started":
            raise StoreError(f"session {session}: session_started may only be its first entry", session=session)
        if i and records[i - 1].kind == "key_rotated":  # the rotation retires the key that would sign this
            raise StoreError(
                f"session {session}: a {record.kind} record follows a key rotation in one append; the key the"
                " rotation retires cannot sign it",
                remedy="append the rotation statement alone, then reopen the store with the new key",
                session=session,
                reason="key_retired",
            )
        body: dict[str, Any] = json.loads(bodies[i]) if copy_bodies else record.body
        try:
            entry = seal(
                signer,
                log=origin,
                session=session,
                seq=seq,
                index=index,
                ts=now_ms(),
                kind=record.kind,
                body=body,
                prev=prev,
                body_bytes=bodies[i],
            )
        except CanonicalError as exc:
            raise StoreError(
                f"the body of a {record.kind} entry is not canonical JSON: {exc}", reason="bad_body"
            ) from exc
        out.append(entry)
        ended = record.kind == "session_ended"
        prev, seq, index = entry.hash, seq + 1, index + 1
    return out


MAX_CHECKED_ATTEMPTS = 200
"""How often ``append_checked`` re-reads and re-decides before it gives up (each lost race is
another writer's success, so this bounds the writers that may win ahead of one caller)."""


def append_checked(
    store: LedgerStore,
    session: str,
    decide: Callable[[list[StoredEntry], int], Sequence[Record]],
    *,
    from_seq: int = 0,
    durable: bool = True,
) -> list[StoredEntry]:
    """Append what ``decide`` makes of a session's current entries, as one check-and-write.

    ``decide(new_entries, next_seq)`` sees the entries appended since the last attempt (from
    ``from_seq``, where the caller's fold stands) and returns the records to append (none: nothing
    is written), or raises to refuse. The append carries ``expect_seq=next_seq``: inside the
    backend's write transaction a stale head is refused (``StoreConflictError``), so a decision is
    only ever written over exactly the entries it was made on, and two writers can never both
    write decisions that only fit one at a time. On a lost race the new entries are read and
    ``decide`` runs again. This is the reservation transaction of quotas (``truss._quota_book``);
    every backend that passes ``check_ledger_store`` supports it, because the conformance check
    holds every backend to ``expect_seq`` inside its transaction and to this function under
    concurrent writers.
    """
    seq = from_seq
    for _ in range(MAX_CHECKED_ATTEMPTS):
        fresh = list(store.read_session(session, from_seq=seq))
        if fresh:
            seq = fresh[-1].seq + 1
        records = decide(fresh, seq)
        if not records:
            return []
        try:
            return store.append(session, list(records), durable=durable, expect_seq=seq)
        except StoreConflictError as exc:
            if exc.fields.get("actual") is None and records[0].kind != "session_started":
                raise  # not a lost race on the head (an ended session, a stale lease)
            continue
    raise StoreConflictError(
        f"session {session}: {MAX_CHECKED_ATTEMPTS} attempts to append lost the race to other writers",
        remedy="the store is under heavy contention; retry",
        session=session,
    )
