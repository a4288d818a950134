"""An in-memory ledger store, and the conformance check every ledger store must pass.

``MemoryStore`` keeps the same contract as the SQLite store (seq, prev, index and ts assigned
and signed under one lock; ``session_started`` first; ``expect_seq``; content-addressed,
erasable blobs; the Merkle tree maintained on every append) without durability. It is for
tests of code built on the store.

``check_ledger_store(factory)`` runs the behaviours any store (SQLite now, PostgreSQL later) must
show, through the ``LedgerStore`` interface only, and raises ``AssertionError`` naming the first
one that fails. ``factory(key, clock)`` returns a fresh, empty store each time it is called.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from truss._clock import Clock
from truss._errors import NotFoundError, StoreConflictError, StoreError, TrussError
from truss.ledger.canonical import CanonicalError, canonical, sha256_ref
from truss.ledger.cosignature import cosign, merge_notes, with_signature_lines
from truss.ledger.entry import ZERO_HASH, Record, StoredEntry, check_record, seal
from truss.ledger.keys import CosignerKey, IdentityKey, TrustedKeys
from truss.ledger.merkle import MemoryTree, leaf_hash, root_at
from truss.ledger.note import sign_checkpoint_note
from truss.ledger.store import LedgerStore, SessionInfo, StoredCheckpoint, check_status, session_fields
from truss.ledger.verify import verify_ledger
from truss.testing._clock import ManualClock

__all__ = ["MemoryStore", "check_ledger_store"]


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
        self._tree = MemoryTree()

    def append(
        self,
        session: str,
        records: Sequence[Record],
        *,
        durable: bool = True,
        expect_seq: int | None = None,
        expect_index: int | None = None,
    ) -> list[StoredEntry]:
        for record in records:
            check_record(record)
        if not records:
            return []
        with self._lock:
            info = self._sessions.get(session)
            first = records[0]
            if info is None:
                if first.kind != "session_started":
                    raise StoreError(
                        f"session {session} does not exist: its first entry must be session_started",
                        reason="no_session",
                        session=session,
                    )
                seq, prev, ended = 0, ZERO_HASH, False
            else:
                if first.kind == "session_started":
                    raise StoreConflictError(f"session {session} already exists", session=session, seq=info.entries)
                seq, prev, ended = info.entries, info.head, info.ended
            if expect_seq is not None and expect_seq != seq:
                raise StoreConflictError(
                    f"session {session}: expected to append at seq {expect_seq} but its head is at seq {seq}",
                    session=session,
                    seq=expect_seq,
                    actual=seq,
                )
            out: list[StoredEntry] = []
            index = len(self._entries)
            if expect_index is not None and expect_index != index:
                raise StoreConflictError(
                    f"session {session}: expected to append at log index {expect_index} but the log is at {index}",
                    session=session,
                    index=expect_index,
                    actual=index,
                )
            for i, record in enumerate(records):
                if ended:
                    raise StoreConflictError(f"session {session} has ended", session=session, seq=seq + i)
                if i and record.kind == "session_started":
                    raise StoreError(f"session {session}: session_started may only be its first entry")
                entry = _seal_or_refuse(
                    self._key,
                    log=self.origin,
                    session=session,
                    seq=seq + i,
                    index=index + i,
                    ts=self._clock.now_ms(),
                    kind=record.kind,
                    body=_private_copy(record.body),
                    prev=prev,
                )
                out.append(entry)
                prev = entry.hash
                ended = record.kind == "session_ended"
            for record, entry in zip(records, out, strict=True):
                self._entries.append(entry)
                self._tree.append(entry.raw)
                self._by_session.setdefault(session, []).append(entry.index)
                for ref, data in record.blobs.items():
                    self._blobs.setdefault(ref, bytes(data))
                    self._links.setdefault(ref, set()).add(session)
            if info is None:
                contract, principal = session_fields(first)
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
            status = "ended" if ended and info.status == "running" else info.status
            self._sessions[session] = SessionInfo(
                id=session,
                contract=info.contract,
                status=status,
                entries=seq + len(out),
                started_ms=info.started_ms,
                updated_ms=out[-1].ts,
                head=prev,
                principal=info.principal,
                ended=ended,
            )
            return out

    def set_status(self, session: str, status: str) -> None:
        check_status(status)
        with self._lock:
            info = self._require(session)
            self._sessions[session] = dataclasses.replace(info, status=status)

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

    def add_checkpoint(self, size: int, root: bytes, note: str) -> None:
        with self._lock:
            held = self._checkpoints.get(size)
            if held is not None:
                if held.root != root:
                    raise StoreConflictError(f"a checkpoint of size {size} with another root is stored", size=size)
                self._checkpoints[size] = dataclasses.replace(held, note=merge_notes(held.note, note))
                return
            self._checkpoints[size] = StoredCheckpoint(size, root, note, self._clock.now_ms())

    def checkpoints(self) -> list[StoredCheckpoint]:
        with self._lock:
            return [self._checkpoints[k] for k in sorted(self._checkpoints)]

    def set_envelope(self, session: str, envelope: bytes) -> None:
        with self._lock:
            self._require(session)
            self._envelopes[session] = bytes(envelope)

    def envelope(self, session: str) -> bytes | None:
        with self._lock:
            return self._envelopes.get(session)

    def close(self) -> None:
        return None


def _seal_or_refuse(key: IdentityKey, **fields: Any) -> StoredEntry:
    try:
        return seal(key, **fields)
    except CanonicalError as exc:
        raise StoreError(f"the body is not canonical JSON: {exc}", reason="bad_body") from exc


def _private_copy(body: dict[str, Any]) -> dict[str, Any]:
    # Callers may mutate their dict after appending; the stored entry must not change with it.
    try:
        return json.loads(canonical(body))
    except CanonicalError as exc:
        raise StoreError(f"the body is not canonical JSON: {exc}", reason="bad_body") from exc


# -- conformance ------------------------------------------------------------------------------

StoreFactory = Callable[[IdentityKey, ManualClock], LedgerStore]

_CONFORMANCE_SEED = bytes(range(32))


def check_ledger_store(factory: StoreFactory) -> None:
    """Run every conformance check against fresh stores from ``factory``; ``AssertionError`` on failure."""
    for check in _CHECKS:
        key = IdentityKey.from_seed(_CONFORMANCE_SEED, "conformance.truss.test")
        clock = ManualClock()
        store = factory(key, clock)
        try:
            check(store, key, clock)
        except AssertionError as exc:
            raise AssertionError(f"store conformance: {check.__name__}: {exc}") from exc
        finally:
            store.close()


def _start(contract: str = "demo", principal: Any = None) -> Record:
    body: dict[str, Any] = {"contract": contract}
    if principal is not None:
        body["principal"] = principal
    return Record("session_started", body)


def _expect(error: type[TrussError], fn: Callable[[], object], what: str) -> TrussError:
    try:
        fn()
    except error as exc:
        return exc
    raise AssertionError(f"{what}: expected {error.__name__}")


def _appends_assign_seq_prev_index_ts_and_sign(store: LedgerStore, key: IdentityKey, clock: ManualClock) -> None:
    first = store.append("s_a", [_start(), Record("model_turn", {"n": 1})])
    clock.advance(1)
    second = store.append("s_b", [_start("other")])
    third = store.append("s_a", [Record("model_turn", {"n": 2})])
    assert [e.seq for e in first] == [0, 1] and third[0].seq == 2, "seq counts per session from 0"
    assert [e.index for e in first + second + third] == [0, 1, 2, 3], "index counts over the whole log"
    assert first[0].prev == ZERO_HASH and first[1].prev == first[0].hash and third[0].prev == first[1].hash
    assert second[0].ts == first[0].ts + 1000, "ts comes from the injected clock"
    assert all(e.log == store.origin == key.name for e in first), "entries carry the log origin"
    assert all(key.verifier.verify(_payload(e), e.sig) and e.keyid == key.key_id for e in first + second + third)
    read = list(store.read_session("s_a"))
    assert [e.hash for e in read] == [e.hash for e in first + third], "read_session returns what append returned"
    assert [e.raw for e in read] == [e.raw for e in first + third], "stored bytes are the signed bytes"
    assert [e.seq for e in store.read_session("s_a", from_seq=1)] == [1, 2]
    assert [e.index for e in store.read_range(1, 3)] == [1, 2]
    assert list(store.read_session("s_missing")) == []


def _payload(entry: StoredEntry) -> bytes:
    from truss.ledger.entry import entry_signing_payload

    return entry_signing_payload(entry.raw)


def _sessions_are_listed(store: LedgerStore, key: IdentityKey, clock: ManualClock) -> None:
    store.append("s_1", [_start("one", principal={"tenant": "t", "user": "u"})])
    clock.advance(1)
    store.append("s_2", [_start("two")])
    store.append("s_2", [Record("session_ended", {})])
    info = store.session("s_1")
    assert info is not None and info.contract == "one" and info.status == "running" and info.entries == 1
    assert info.principal == {"tenant": "t", "user": "u"}
    two = store.session("s_2")
    assert two is not None and two.ended and two.entries == 2 and two.status == "ended"
    assert two.head == list(store.read_session("s_2"))[-1].hash
    assert [s.id for s in store.sessions()] == ["s_2", "s_1"], "newest first"
    assert [s.id for s in store.sessions(limit=1)] == ["s_2"]
    assert [s.id for s in store.sessions(principal={"user": "u", "tenant": "t"})] == ["s_1"]
    store.set_status("s_1", "suspended")
    assert [s.id for s in store.sessions(status="suspended")] == ["s_1"]
    assert store.session("s_nope") is None
    _expect(NotFoundError, lambda: store.set_status("s_nope", "running"), "status of an unknown session")


def _session_rules_are_enforced(store: LedgerStore, key: IdentityKey, clock: ManualClock) -> None:
    _expect(StoreError, lambda: store.append("s_x", [Record("model_turn", {})]), "a session not started")
    store.append("s_x", [_start()])
    _expect(StoreConflictError, lambda: store.append("s_x", [_start()]), "starting a session twice")
    conflict = _expect(
        StoreConflictError,
        lambda: store.append("s_x", [Record("model_turn", {})], expect_seq=5),
        "a stale expect_seq",
    )
    assert conflict.fields.get("session") == "s_x"
    store.append("s_x", [Record("model_turn", {})], expect_seq=1)
    surrogate = _expect(StoreError, lambda: store.append("s_x", [Record("model_turn", {"t": "\ud800"})]), "a surrogate")
    assert surrogate.fields.get("reason") == "bad_body", "a body that cannot be encoded is refused as such"
    store.append("s_x", [Record("session_ended", {})])
    _expect(StoreConflictError, lambda: store.append("s_x", [Record("model_turn", {})]), "appending after the end")
    _expect(StoreError, lambda: store.append("s_x", [Record("no_such_kind", {})]), "an unknown kind")
    info = store.session("s_x")
    assert info is not None and info.entries == 3, "failed appends write nothing"
    assert store.tree_size() == 3


def _blobs_are_content_addressed_and_erasable(store: LedgerStore, key: IdentityKey, clock: ManualClock) -> None:
    data, shared = b'{"path":"/srv/a"}', b"shared bytes"
    ref, shared_ref = sha256_ref(data), sha256_ref(shared)
    bad = Record("mcp_tool_intent", {"args": ref}, {ref: b"other bytes"})
    store.append("s_p", [_start()])
    _expect(StoreError, lambda: store.append("s_p", [bad]), "a blob that does not match its ref")
    store.append("s_p", [Record("mcp_tool_intent", {"args": ref, "x": shared_ref}, {ref: data, shared_ref: shared})])
    store.append("s_q", [_start(), Record("mcp_tool_call", {"result": shared_ref}, {shared_ref: shared})])
    assert store.blob(ref) == data and store.blob(shared_ref) == shared
    assert store.blobs_for([ref, shared_ref, sha256_ref(b"absent"), ref]) == {ref: data, shared_ref: shared}
    assert store.erase_payloads("s_p") == 2
    assert store.blob(ref) is None, "erased bytes are gone"
    assert store.blob(shared_ref) == shared, "bytes another session links to stay"
    assert store.erased_refs("s_p") == {ref, shared_ref}
    assert store.erased_refs("s_q") == set()
    trusted = TrustedKeys([key.verifier])
    report = verify_ledger(store, trusted, session="s_p")
    assert report.ok and report.blobs_absent == 1 and report.blobs_checked == 1, f"verifies after erasure: {report}"


def _the_merkle_tree_is_maintained(store: LedgerStore, key: IdentityKey, clock: ManualClock) -> None:
    tree = MemoryTree()
    assert store.tree_size() == 0 and store.tree_root() == tree.root()
    for i in range(7):
        entries = store.append(f"s_{i}", [_start(), Record("model_turn", {"i": i})])
        for entry in entries:
            tree.append(entry.raw)
        assert store.tree_head() == (tree.size, tree.root())
    assert store.node(0, 5) == leaf_hash(next(store.read_range(5, 6)).raw)
    assert store.node(3, 0) == tree.nodes[(3, 0)] and store.node(2, 2) == tree.nodes[(2, 2)]
    assert root_at(9, store.node) == tree.root(9), "stored nodes give the root at any earlier size"
    _expect(StoreError, lambda: store.node(4, 0), "a node of a subtree not yet complete")


def _checkpoints_and_envelopes_are_kept(store: LedgerStore, key: IdentityKey, clock: ManualClock) -> None:
    store.append("s_c", [_start()])
    size, root = store.tree_head()
    store.add_checkpoint(size, root, "note text\n")
    store.add_checkpoint(size, root, "note text\n")
    _expect(StoreConflictError, lambda: store.add_checkpoint(size, b"\x00" * 32, "x"), "a second root at one size")
    assert [(c.size, c.root, c.note) for c in store.checkpoints()] == [(1, root, "note text\n")]
    assert store.envelope("s_c") is None
    store.set_envelope("s_c", b'{"payloadType":"x"}')
    assert store.envelope("s_c") == b'{"payloadType":"x"}'
    _expect(NotFoundError, lambda: store.set_envelope("s_none", b"{}"), "an envelope for an unknown session")


def _cosignatures_are_kept_with_their_checkpoint(store: LedgerStore, key: IdentityKey, clock: ManualClock) -> None:
    store.append("s_w", [_start()])
    size, root = store.tree_head()
    signed = sign_checkpoint_note(store.origin, size, root, key)
    assert signed.note is not None
    store.add_checkpoint(size, root, signed.note.decode())
    witness = CosignerKey.from_seed(b"\x07" * 32, "witness.test/w1")
    line = cosign(signed.text(), witness, 1_700_000_000)
    cosigned = with_signature_lines(signed.note, [line]).decode()
    store.add_checkpoint(size, root, cosigned)
    [held] = [c for c in store.checkpoints() if c.size == size]
    assert held.note == cosigned, "a cosignature returned for a checkpoint is kept with it"
    store.add_checkpoint(size, root, signed.note.decode())
    [held] = [c for c in store.checkpoints() if c.size == size]
    assert held.note == cosigned, "adding the bare checkpoint again loses no cosignature"


def _expect_index_refuses_an_append_elsewhere_in_the_log(
    store: LedgerStore, key: IdentityKey, clock: ManualClock
) -> None:
    store.append("s_i", [_start()])
    size = store.tree_size()
    _expect(
        StoreConflictError,
        lambda: store.append("s_i", [Record("model_turn", {})], expect_index=size + 1),
        "an append whose first entry would not land at the expected log index",
    )
    assert store.tree_size() == size, "nothing is written when the index does not match"
    [entry] = store.append("s_i", [Record("model_turn", {})], expect_index=size)
    assert entry.index == size


def _concurrent_appends_leave_valid_chains(store: LedgerStore, key: IdentityKey, clock: ManualClock) -> None:
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            store.append(f"s_t{n}", [_start()])
            for i in range(20):
                store.append(f"s_t{n}", [Record("model_turn", {"i": i})], durable=i % 2 == 0)
        except BaseException as exc:  # surfaced below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, f"a writer failed: {errors[0]!r}"
    assert store.tree_size() == 8 * 21
    report = verify_ledger(store, TrustedKeys([key.verifier]))
    assert report.ok and report.entries == 168 and report.sessions == 8, f"{report}"


_CHECKS: list[Callable[[LedgerStore, IdentityKey, ManualClock], None]] = [
    _appends_assign_seq_prev_index_ts_and_sign,
    _sessions_are_listed,
    _session_rules_are_enforced,
    _blobs_are_content_addressed_and_erasable,
    _the_merkle_tree_is_maintained,
    _checkpoints_and_envelopes_are_kept,
    _cosignatures_are_kept_with_their_checkpoint,
    _expect_index_refuses_an_append_elsewhere_in_the_log,
    _concurrent_appends_leave_valid_chains,
]
