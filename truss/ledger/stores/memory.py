"""The in-memory ledger store (``memory:``): the rules of every store, without durability.

``MemoryStore`` assigns and signs entries under one lock through the same ``seal_batch`` as the
SQLite store, keeps content-addressed, erasable blobs, and maintains the Merkle tree on every
append. Nothing survives the process: it is for tests of code built on the store, and for a run
whose record is not wanted (``--db memory:``). It does not persist, share between processes or
reopen (each ``open_store("memory:")`` is a new, empty ledger).
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from truss._clock import Clock
from truss._errors import KeyFileError, NotFoundError, StoreConflictError, StoreError, UsageError
from truss.ledger.canonical import canonical
from truss.ledger.cosignature import merge_notes
from truss.ledger.entry import ZERO_HASH, Record, StoredEntry, encode_record, session_status
from truss.ledger.keys import IdentityKey
from truss.ledger.merkle import MemoryTree
from truss.ledger.stores.base import (
    DEFAULT_LEASE_MS,
    Lease,
    LeaseOwner,
    SessionHead,
    SessionInfo,
    StoredCheckpoint,
    check_epoch,
    grant_lease,
    key_retired_error,
    nodes_in_order,
    retires,
    seal_batch,
    session_fields,
)

__all__ = ["MemoryStore", "open_memory"]


class MemoryStore:
    """A ``LedgerStore`` in memory: same rules as the SQLite store, no durability."""

    def __init__(self, *, key: IdentityKey, clock: Clock) -> None:
        self.origin = key.name
        self._key = key
        self._clock = clock
        self._lock = threading.RLock()
        self._entries: list[StoredEntry] = []
        self._by_session: dict[str, list[int]] = {}
        self._sessions: dict[str, SessionInfo] = {}
        self._blobs: dict[str, bytes] = {}
        self._links: dict[str, set[str]] = {}
        self._erased: dict[str, set[str]] = {}
        self._envelopes: dict[str, bytes] = {}
        self._checkpoints: dict[int, StoredCheckpoint] = {}
        self._checkpoint_sizes: list[int] = []  # sorted: the index the lookups bisect
        self._tree = MemoryTree()
        self._leases: dict[str, Lease] = {}
        self._retired = False  # the store's key rotated itself away or was removed: it signs nothing more

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
        bodies = [encode_record(record) for record in records]
        if not records:
            return []
        with self._lock:
            if self._retired:
                raise key_retired_error("memory:", self._key.key_id)
            check_epoch(session, self._leases.get(session), epoch)
            info = self._sessions.get(session)
            head = None if info is None else SessionHead(info.entries, info.head, info.ended)
            out = seal_batch(
                self._key,
                origin=self.origin,
                session=session,
                head=head,
                records=records,
                bodies=bodies,
                index=len(self._entries),
                now_ms=self._clock.now_ms,
                expect_seq=expect_seq,
                expect_index=expect_index,
                copy_bodies=True,
            )
            self._retired = retires(self._key, records)
            for record, entry in zip(records, out, strict=True):
                self._entries.append(entry)
                self._tree.append(entry.raw)
                self._by_session.setdefault(session, []).append(entry.index)
                for ref, data in record.blobs.items():
                    self._blobs.setdefault(ref, bytes(data))
                    self._links.setdefault(ref, set()).add(session)
            if info is None:
                contract, principal = session_fields(records[0])
                info = SessionInfo(
                    id=session,
                    contract=contract,
                    status="running",
                    entries=0,
                    started_ms=out[0].ts,
                    updated_ms=out[0].ts,
                    head=ZERO_HASH,
                    principal=None if principal is None else json.loads(canonical(principal)),
                )
            ended = out[-1].kind == "session_ended"
            self._sessions[session] = dataclasses.replace(
                info,
                status=session_status(session, out[-1].kind, out[-1].body),
                entries=out[-1].seq + 1,
                updated_ms=out[-1].ts,
                head=out[-1].hash,
                ended=ended,
            )
            return out

    def acquire_lease(self, session: str, owner: LeaseOwner, *, ttl_ms: int = DEFAULT_LEASE_MS) -> Lease:
        with self._lock:
            lease = grant_lease(self._leases.get(session), session, owner, self._clock.now_ms(), ttl_ms)
            self._leases[session] = lease
            return lease

    def renew_lease(self, lease: Lease, *, ttl_ms: int = DEFAULT_LEASE_MS) -> Lease:
        with self._lock:
            current = self._leases.get(lease.session)
            check_epoch(lease.session, current, lease.epoch)
            renewed = dataclasses.replace(lease, expires_ms=self._clock.now_ms() + max(1, ttl_ms))
            self._leases[lease.session] = renewed
            return renewed

    def release_lease(self, lease: Lease) -> None:
        with self._lock:
            current = self._leases.get(lease.session)
            if current is not None and current.epoch == lease.epoch:
                self._leases[lease.session] = dataclasses.replace(current, expires_ms=0)

    def lease(self, session: str) -> Lease | None:
        with self._lock:
            return self._leases.get(session)

    def _require(self, session: str) -> SessionInfo:
        info = self._sessions.get(session)
        if info is None:
            raise NotFoundError(f"no session {session!r}", what="session", name=session)
        return info

    def session(self, session: str) -> SessionInfo | None:
        with self._lock:
            return self._sessions.get(session)

    def sessions(
        self, *, status: str | None = None, limit: int | None = None, principal: Any = None
    ) -> list[SessionInfo]:
        with self._lock:
            rows = sorted(self._sessions.values(), key=lambda s: (s.started_ms, s.id), reverse=True)
        if status is not None:
            rows = [r for r in rows if r.status == status]
        if principal is not None:
            want = canonical(principal)
            rows = [r for r in rows if r.principal is not None and canonical(r.principal) == want]
        return rows if limit is None else rows[: max(0, limit)]

    def read_session(self, session: str, *, from_seq: int = 0) -> Iterator[StoredEntry]:
        with self._lock:
            indexes = list(self._by_session.get(session, ()))
        for index in indexes[from_seq:]:
            yield self._entries[index]

    def read_range(self, start: int, stop: int) -> Iterator[StoredEntry]:
        with self._lock:
            chosen = self._entries[max(0, start) : max(0, stop)]
        yield from chosen

    def blob(self, ref: str) -> bytes | None:
        with self._lock:
            return self._blobs.get(ref)

    def blobs_for(self, refs: Iterable[str]) -> dict[str, bytes]:
        with self._lock:
            return {ref: self._blobs[ref] for ref in set(refs) if ref in self._blobs}

    def erased_refs(self, session: str) -> set[str]:
        with self._lock:
            return set(self._erased.get(session, ()))

    def erase_payloads(self, session: str) -> int:
        with self._lock:
            self._require(session)
            erased = self._erased.setdefault(session, set())
            count = 0
            for ref, holders in list(self._links.items()):
                if session in holders:
                    holders.discard(session)
                    if ref not in erased:
                        erased.add(ref)
                        count += 1
                    if not holders:
                        del self._links[ref]
                        self._blobs.pop(ref, None)
            return count

    def tree_size(self) -> int:
        return self._tree.size

    def tree_root(self) -> bytes:
        with self._lock:
            return self._tree.root()

    def tree_head(self) -> tuple[int, bytes]:
        with self._lock:
            return self._tree.size, self._tree.root()

    def node(self, level: int, index: int) -> bytes:
        with self._lock:
            found = self._tree.nodes.get((level, index))
        if found is None:
            raise StoreError(f"Merkle node ({level}, {index}) is not stored", level=level, index=index)
        return found

    def nodes(self, keys: Sequence[tuple[int, int]]) -> dict[tuple[int, int], bytes]:
        with self._lock:
            found = {key: self._tree.nodes.get(key) for key in keys}
        for (level, index), digest in found.items():
            if digest is None:
                raise StoreError(f"Merkle node ({level}, {index}) is not stored", level=level, index=index)
        return {key: digest for key, digest in found.items() if digest is not None}

    def node_hashes(self, keys: Iterable[tuple[int, int]]) -> Iterator[bytes]:
        return nodes_in_order(self.nodes, keys)

    def add_checkpoint(self, size: int, root: bytes, note: str) -> None:
        with self._lock:
            held = self._checkpoints.get(size)
            if held is not None:
                if held.root != root:
                    raise StoreConflictError(f"a checkpoint of size {size} with another root is stored", size=size)
                # Witnesses' cosignatures returned for the checkpoint held are kept with it.
                self._checkpoints[size] = dataclasses.replace(held, note=merge_notes(held.note, note))
                return
            self._checkpoints[size] = StoredCheckpoint(size, root, note, self._clock.now_ms())
            bisect.insort(self._checkpoint_sizes, size)

    def checkpoints(self) -> list[StoredCheckpoint]:
        with self._lock:
            return [self._checkpoints[k] for k in self._checkpoint_sizes]

    def latest_checkpoint(self) -> StoredCheckpoint | None:
        with self._lock:
            return self._checkpoints[self._checkpoint_sizes[-1]] if self._checkpoint_sizes else None

    def checkpoint_covering(self, size: int) -> StoredCheckpoint | None:
        with self._lock:
            at = bisect.bisect_left(self._checkpoint_sizes, size)
            return self._checkpoints[self._checkpoint_sizes[at]] if at < len(self._checkpoint_sizes) else None

    def set_envelope(self, session: str, envelope: bytes) -> None:
        with self._lock:
            self._require(session)
            self._envelopes[session] = bytes(envelope)

    def envelope(self, session: str) -> bytes | None:
        with self._lock:
            return self._envelopes.get(session)

    def close(self) -> None:
        return None


def open_memory(url: str, /, *, key: IdentityKey | None, clock: Clock, create: bool) -> MemoryStore:
    """The ``memory:`` opener: a new, empty ledger each time (so it needs a key and ``create``)."""
    if url.strip().lower() != "memory:":
        raise UsageError(
            "the in-memory store takes no path or options", remedy="give exactly `--db memory:`", what="db"
        )
    if not create:
        raise NotFoundError(
            "no ledger at memory: (an in-memory ledger is new and empty each time it is opened)",
            remedy="use a file (--db PATH) for a ledger that later commands can read",
            what="ledger",
        )
    if key is None:
        raise KeyFileError(
            "cannot create the in-memory ledger without an identity key",
            remedy="run `truss init` to create the key first",
            file="memory:",
        )
    return MemoryStore(key=key, clock=clock)
