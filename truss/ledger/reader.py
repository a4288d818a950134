"""The verified reader: the one way every command and API reads the ledger.

``VerifiedStore(store, trusted)`` is a ``LedgerStore`` whose reads return only what verifies
against the chain (docs/ledger-format.md, section 4, "Verified reads", R1-R6); its writes go to
the store it wraps. The ``Runtime`` wraps its store in one, so ``show``, ``export``, ``replay``,
``verdict``, ``list``, ``sessions``, ``resume``, ``approve``, ``resolve``, ``signal``, the memo and
serve-mcp all read through it:

R1 ``read_session`` streams the session from its first entry through the same per-entry steps as
   ``truss ledger verify SESSION`` (``verification.EntryVerifier``: V1-V12 with the Merkle step L6
   and the key history), yielding an entry only once it has passed; at the end, the stored session
   row must end where the chain ends (``head_mismatch``). Reading one session costs its entries.
R2 ``session`` is derived from the verified chain (``verification.SessionFacts``): its status,
   head, counts, start and end times come from signed entries, never from the row alone; a
   ``running`` session whose lease is not held (expired, released, its pid gone on this host) is
   ``interrupted``.
R3 ``sessions`` (a listing) verifies each row it returns at its ends: the first and the last
   entry are well-formed, signed by a trusted key and where the row says; the row's columns must
   be what those entries say. Every row is marked ``verified="ends"``: the chain between was not
   verified (``truss ledger verify --all`` does that).
R4 ``envelope`` returns a verdict envelope only when it opens under the trusted keys for this
   session and its verified head (after a rotation, under a key that signs at that head's log
   index, as bundle step B7), with the status its end records.
R5 ``blob`` and ``blobs_for`` return payload bytes only when they hash to their ref.
R6 ``read_range`` returns entries that are well-formed, signed by a trusted key, at the index
   asked for, and inside the log's size.

What does not verify raises ``VerificationError`` (exit 1) naming the session and position: never
a wrong answer, never an internal error. Sans-IO beyond the store it is given.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from truss._errors import InputError, TrussError, VerificationError
from truss.ledger.audit import SessionInLog, head_index, session_in_log, store_key_history
from truss.ledger.canonical import canonical, sha256_ref
from truss.ledger.entry import Record, StoredEntry, refs_in
from truss.ledger.keyhistory import KeyHistory
from truss.ledger.keys import TrustedKeys
from truss.ledger.stores.base import DEFAULT_LEASE_MS, Lease, LeaseOwner, LedgerStore, SessionInfo, StoredCheckpoint
from truss.ledger.verification import (
    EntryCheck,
    EntryVerifier,
    SessionFacts,
    SignatureChecks,
    check_entry_alone,
    row_mismatch,
)

__all__ = ["SignatureSource", "VerifiedStore", "unverified"]

TrustSource = TrustedKeys | Callable[[], TrustedKeys]
SignatureSource = Callable[[int], SignatureChecks | None]
"""Given the entry count a session's (unverified) row lists, the ``SignatureChecks`` a read of it
uses, or None: the count only chooses how V10 is computed, never what it answers."""
_PROOF_BATCH = 512  # entries proven in the log at once (L6): bounded memory, O(log n) nodes per batch


def unverified(store: LedgerStore) -> LedgerStore:
    """The store a ``VerifiedStore`` wraps (itself for any other store): what verification reads."""
    return store.raw if isinstance(store, VerifiedStore) else store


def _refused(session: str | None, finding: tuple[str, str], *, seq: Any = None, index: Any = None) -> VerificationError:
    where = f"session {session}" if session is not None else "the log"
    at = f" at seq {seq}" if isinstance(seq, int) else ""
    return VerificationError(
        f"{where}{at} does not verify, so it is not read: {finding[1]}",
        remedy="run `truss ledger verify --all`; do not trust this record (compare it with a bundle or checkpoint)",
        session=session,
        seq=seq if isinstance(seq, int) else None,
        index=index if isinstance(index, int) else None,
        reason=finding[0],
    )


class VerifiedStore:
    """A ``LedgerStore`` that reads only what verifies (see the module docstring)."""

    def __init__(
        self,
        store: LedgerStore,
        trusted: TrustSource,
        *,
        now_ms: Callable[[], int] | None = None,
        signatures: SignatureSource | None = None,
    ) -> None:
        if isinstance(store, VerifiedStore):
            signatures = signatures or store._signatures
            store = store.raw
        self.raw: LedgerStore = store
        self.origin = store.origin
        self._trusted_source = trusted
        self._signatures = signatures
        self._now_ms = now_ms
        self._lock = threading.Lock()
        self._history: tuple[int, KeyHistory] | None = None
        # Derived session facts by (session, stored entry count, stored head): a session read
        # again unchanged is not verified again.
        self._facts: dict[tuple[str, int, str], SessionInfo] = {}
        # Payloads the latest read of a session verified (V11), by ref: R5 answers from them without a
        # second read and hash (a resume reads the session, then replays it payload by payload).
        self._kept = _Kept(None)

    # -- the trust the reads are checked against -------------------------------------------------

    def _trusted(self) -> TrustedKeys:
        source = self._trusted_source
        return source if isinstance(source, TrustedKeys) else source()

    def history(self) -> KeyHistory:
        """The key history (``@log`` rotations) followed from the trusted keys; refused when it does not verify."""
        from truss.ledger.keyhistory import LOG_SESSION

        info = self.raw.session(LOG_SESSION)
        count = -1 if info is None else int(info.entries)
        with self._lock:
            held = self._history
        if held is not None and held[0] == count:
            return held[1]
        found = store_key_history(self.raw, self._trusted())
        if not isinstance(found, KeyHistory):
            raise _refused(LOG_SESSION, (str(found.reason), str(found.message)), seq=found.seq, index=found.index)
        with self._lock:
            self._history = (count, found)
        return found

    # -- R1, R2: one session -------------------------------------------------------------------

    def read_session(self, session: str, *, from_seq: int = 0) -> Iterator[StoredEntry]:
        """R1: the session's entries from ``from_seq``, each yielded once it verified."""
        row = self.raw.session(session)
        yield from self._verified(session, row, from_seq=from_seq)

    def _verified(
        self,
        session: str,
        row: SessionInfo | None,
        *,
        from_seq: int = 0,
        on_last: Callable[[StoredEntry, StoredEntry], None] | None = None,
    ) -> Iterator[StoredEntry]:
        # V10 computed ahead (a long session): started first, so that it gets ready while the key
        # history and the proof are read; closed however the read ends.
        source = self._signatures
        checks = source(int(row.entries)) if source is not None and row is not None else None
        try:
            yield from self._checked(session, row, from_seq=from_seq, on_last=on_last, checks=checks)
        finally:
            if checks is not None:
                checks.close()

    def _checked(
        self,
        session: str,
        row: SessionInfo | None,
        *,
        from_seq: int,
        on_last: Callable[[StoredEntry, StoredEntry], None] | None,
        checks: SignatureChecks | None,
    ) -> Iterator[StoredEntry]:
        history = self.history()
        trusted = history.trusted
        sizes = [self.raw.tree_size()]

        def in_log(item: StoredEntry) -> tuple[str, str] | None:
            if item.index >= sizes[0]:
                sizes[0] = self.raw.tree_size()  # appended since the size was read (another writer)?
            if item.index >= sizes[0]:
                return "not_in_log", f"entry {item.seq}: log index {item.index} is past the log's {sizes[0]} entries"
            return None

        # L6 in batches: an entry is yielded once the batch it is in proved against the checkpoint.
        proof = session_in_log(self.raw, trusted, batch=True)[0]
        extra: list[EntryCheck] = [in_log, proof.check]
        if history.rotations:
            extra.append(history.check)
        # V11 looks payloads up in the page fetched for the entries around it (one query per page,
        # not one per payload); each payload V11 hashed is kept for the replay that follows (R5).
        page: dict[str, bytes] = {}
        named: dict[int, list[str]] = {}  # the refs of each entry of the page, by the entry's id()
        kept = self._keeping(session)
        handed: list[tuple[str, bytes]] = []  # what V11 looked up for the entry being checked

        def payload(ref: str) -> bytes | None:
            data = page.get(ref)
            if data is not None:
                handed.append((ref, data))
            return data

        def refs(item: StoredEntry) -> Iterable[str]:
            found = named.get(id(item))
            return found if found is not None else refs_in(item.entry["body"])

        verifier = EntryVerifier(
            trusted, blobs=payload, session=session, origin=self.origin, extra=extra, refs=refs, signatures=checks
        )

        def submit(batch: list[StoredEntry]) -> None:
            if checks is not None:
                checks.submit(batch, trusted)

        ahead = submit if checks is not None else None
        stream = _prefetched(self.raw, self.raw.read_session(session), page, named, ahead)
        first: StoredEntry | None = None
        last: StoredEntry | None = None
        listed_head: str | None = None  # the hash of the entry the row (read before the entries) ends at
        checked: list[StoredEntry] = []  # passed every step but L6, which settles per batch
        try:
            for item in stream:
                finding = verifier.check(item, stream)
                if finding is not None:
                    raise _refused(session, finding, seq=item.entry.get("seq"), index=item.entry.get("index"))
                kept.keep(handed)
                first = first or item
                last = item
                if row is not None and item.seq == row.entries - 1:
                    listed_head = item.hash
                if item.seq >= from_seq:
                    checked.append(item)
                if len(checked) >= _PROOF_BATCH or verifier.count % _PROOF_BATCH == 0:
                    yield from self._settled(session, proof, checked)
                    checked = []
            yield from self._settled(session, proof, checked)
        except VerificationError:
            raise
        except TrussError as exc:
            raise _refused(session, ("unreadable", exc.message)) from exc
        count = verifier.count
        if row is None:
            if count:
                raise _refused(session, ("head_mismatch", "it has entries but no session record"))
            return
        if (count != row.entries or (last is not None and last.hash != row.head)) and not self._grew(
            session, row, count, listed_head
        ):
            raise _refused(
                session,
                (
                    "head_mismatch",
                    f"the store lists {row.entries} entries ending at {row.head[:12]}..., the chain holds {count}",
                ),
            )
        if first is not None and last is not None:
            if count == row.entries and last.hash == row.head:
                # The whole chain just verified: the facts ``session`` derives from it are known,
                # so a read followed by ``session`` (resume, approve) verifies the chain once.
                self._remember((session, count, last.hash), _info(row, SessionFacts.of(first, last), "chain"))
            if on_last is not None:
                on_last(first, last)

    @staticmethod
    def _settled(session: str, proof: SessionInLog, checked: list[StoredEntry]) -> list[StoredEntry]:
        """The batch once its entries are proven in the log (L6); refused when one is not."""
        finding = proof.settle()
        if finding is not None:
            seq, index = proof.failed or (None, None)
            raise _refused(session, finding, seq=seq, index=index)
        return checked

    def _grew(self, session: str, row: SessionInfo, count: int, listed_head: str | None) -> bool:
        """Whether a chain longer than the row read before it is the row's chain with entries another
        writer appended meanwhile: the row, read again, lists at least as many, and the entry the
        first row ended at is the one it named. A row changed by hand stays wrong on a second read."""
        again = self.raw.session(session)
        return again is not None and row.entries <= count <= again.entries and listed_head == row.head

    def _keeping(self, session: str) -> _Kept:
        """Where a read of ``session`` keeps the payloads it verified. Each read starts afresh (what
        was erased since the last one is not answered), so a long-lived process holds one read's."""
        kept = _Kept(session)
        with self._lock:
            self._kept = kept
        return kept

    def session(self, session: str) -> SessionInfo | None:
        """R2: the session as its verified chain says it is (None when the store has no such session)."""
        row = self.raw.session(session)
        if row is None:
            return None
        key = (session, int(row.entries), str(row.head))
        with self._lock:
            held = self._facts.get(key)
        if held is not None:
            return self._owned(held)
        found: list[SessionInfo] = []

        def keep(first: StoredEntry, last: StoredEntry) -> None:
            found.append(_info(row, SessionFacts.of(first, last), "chain"))

        for _ in self._verified(session, row, from_seq=1 << 62, on_last=keep):
            pass
        if not found:
            raise _refused(session, ("head_mismatch", "its session record names no entries"))
        self._remember(key, found[0])
        return self._owned(found[0])

    def _remember(self, key: tuple[str, int, str], info: SessionInfo) -> None:
        with self._lock:
            if len(self._facts) > 4096:
                self._facts.clear()
            self._facts[key] = info

    def _owned(self, info: SessionInfo) -> SessionInfo:
        """R2: a ``running`` session whose owner is gone (lease expired, released, or its pid dead
        on this host) is ``interrupted``: nobody drives it, and it can be resumed."""
        if info.status != "running" or self._now_ms is None:
            return info
        lease = self.raw.lease(info.id)
        if lease is not None and lease.held(self._now_ms()):
            return info
        return replace(info, status="interrupted")

    # -- R3: listings ----------------------------------------------------------------------------

    def sessions(
        self, *, status: str | None = None, limit: int | None = None, principal: Any = None
    ) -> list[SessionInfo]:
        """R3: rows verified at their ends, filtered on what the entries say (never on the row alone)."""
        filtered = status is not None or principal is not None
        rows = self.raw.sessions(limit=None if filtered else limit)
        want = None if principal is None else canonical(principal).decode("utf-8")
        out: list[SessionInfo] = []
        if not rows:
            return out
        # Read once per listing, after the rows: every row's entries are inside this size.
        trusted = self.history().trusted
        size = self.raw.tree_size()
        for row in rows:
            info = self._owned(self._ends(row, trusted, size))
            if status is not None and info.status != status:
                continue
            if want is not None and (info.principal is None or canonical(info.principal).decode("utf-8") != want):
                continue
            out.append(info)
            if limit is not None and len(out) >= max(0, limit):
                break
        return out if limit is None else out[: max(0, limit)]

    def _ends(self, row: SessionInfo, trusted: TrustedKeys, size: int) -> SessionInfo:
        first = next(iter(self.raw.read_session(row.id)), None)
        last = first if row.entries <= 1 else next(iter(self.raw.read_session(row.id, from_seq=row.entries - 1)), None)
        if first is None or last is None:
            raise _refused(
                row.id, ("head_mismatch", f"its session record names {row.entries} entries the store does not hold")
            )
        for item, seq in ((first, 0), (last, row.entries - 1)):
            finding = check_entry_alone(item, trusted, origin=self.origin)
            if finding is None and (item.session != row.id or item.seq != seq or item.index >= size):
                finding = ("head_mismatch", f"the entry stored as its seq {seq} is not")
            if finding is not None:
                raise _refused(row.id, finding, seq=seq)
        if first.kind != "session_started":
            raise _refused(row.id, ("bad_start", "its first entry is not session_started"), seq=0)
        facts = SessionFacts.of(first, last)
        column = row_mismatch(row, facts)
        if column is not None:
            raise _refused(row.id, ("row_mismatch", f"the stored {column} is not what its signed entries say"))
        return _info(row, facts, "ends")

    # -- R4, R5, R6 ------------------------------------------------------------------------------

    def envelope(self, session: str) -> bytes | None:
        """R4: the verdict envelope, only when it verifies for this session's verified head and status."""
        data = self.raw.envelope(session)
        if data is None:
            return None
        info = self.session(session)
        if info is None:
            raise _refused(session, ("bad_envelope", "a verdict envelope for a session the store does not hold"))
        at = functools.partial(head_index, self.raw, session, int(info.entries), info.head)
        try:
            verdict = self.history().open_verdict(data, session=session, head=info.head, head_index=at)
        except (VerificationError, InputError) as exc:
            reason = "retired_key" if exc.fields.get("reason") == "retired_key" else "bad_envelope"
            raise _refused(session, (reason, f"its verdict envelope does not verify ({exc.message})")) from exc
        if verdict.status != info.status:
            raise _refused(
                session, ("bad_envelope", f"its verdict envelope says {verdict.status}, its end {info.status}")
            )
        return data

    def blob(self, ref: str) -> bytes | None:
        """R5: payload bytes that hash to ``ref`` (None when not held)."""
        data = self._kept.payloads.get(ref)
        if data is not None:
            return data
        data = self.raw.blob(ref)
        if data is not None and ref.startswith("sha256:") and sha256_ref(data) != ref:
            raise _refused(None, ("blob_mismatch", f"the payload {ref[:19]}... was changed"))
        return data

    def blobs_for(self, refs: Iterable[str]) -> dict[str, bytes]:
        held = self._kept.payloads
        found: dict[str, bytes] = {}
        wanted: list[str] = []
        for ref in refs:
            data = held.get(ref)
            if data is None:
                wanted.append(ref)
            else:
                found[ref] = data
        fetched = self.raw.blobs_for(wanted) if wanted else {}
        for ref, data in fetched.items():
            if ref.startswith("sha256:") and sha256_ref(data) != ref:
                raise _refused(None, ("blob_mismatch", f"the payload {ref[:19]}... was changed"))
        found.update(fetched)
        return found

    def read_range(self, start: int, stop: int) -> Iterator[StoredEntry]:
        """R6: entries of ``[start, stop)`` in index order, each signed, in place and inside the log."""
        trusted = self.history().trusted
        size = self.raw.tree_size()
        expected = max(0, start)
        for item in self.raw.read_range(start, min(stop, size)):
            finding = check_entry_alone(item, trusted, origin=self.origin)
            if finding is None and item.index != expected:
                finding = ("index_gap", f"log index {item.index} is where entry {expected} belongs")
            if finding is not None:
                raise _refused(item.entry.get("session"), finding, seq=item.entry.get("seq"), index=expected)
            expected += 1
            yield item

    # -- passed through: the rest of the store -------------------------------------------------

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
        return self.raw.append(
            session, records, durable=durable, expect_seq=expect_seq, expect_index=expect_index, epoch=epoch
        )

    def acquire_lease(self, session: str, owner: LeaseOwner, *, ttl_ms: int = DEFAULT_LEASE_MS) -> Lease:
        return self.raw.acquire_lease(session, owner, ttl_ms=ttl_ms)

    def renew_lease(self, lease: Lease, *, ttl_ms: int = DEFAULT_LEASE_MS) -> Lease:
        return self.raw.renew_lease(lease, ttl_ms=ttl_ms)

    def release_lease(self, lease: Lease) -> None:
        self.raw.release_lease(lease)

    def lease(self, session: str) -> Lease | None:
        return self.raw.lease(session)

    def erased_refs(self, session: str) -> set[str]:
        return self.raw.erased_refs(session)

    def erase_payloads(self, session: str) -> int:
        with self._lock:
            self._kept = _Kept(None)  # erased bytes are not answered from memory either
        return self.raw.erase_payloads(session)

    def tree_size(self) -> int:
        return self.raw.tree_size()

    def tree_root(self) -> bytes:
        return self.raw.tree_root()

    def tree_head(self) -> tuple[int, bytes]:
        return self.raw.tree_head()

    def node(self, level: int, index: int) -> bytes:
        return self.raw.node(level, index)

    def nodes(self, keys: Sequence[tuple[int, int]]) -> dict[tuple[int, int], bytes]:
        return self.raw.nodes(keys)

    def node_hashes(self, keys: Iterable[tuple[int, int]]) -> Iterator[bytes]:
        return self.raw.node_hashes(keys)

    def add_checkpoint(self, size: int, root: bytes, note: str) -> None:
        self.raw.add_checkpoint(size, root, note)

    def checkpoints(self) -> list[StoredCheckpoint]:
        return self.raw.checkpoints()

    def latest_checkpoint(self) -> StoredCheckpoint | None:
        return self.raw.latest_checkpoint()

    def checkpoint_covering(self, size: int) -> StoredCheckpoint | None:
        return self.raw.checkpoint_covering(size)

    def set_envelope(self, session: str, envelope: bytes) -> None:
        self.raw.set_envelope(session, envelope)

    def close(self) -> None:
        self.raw.close()

    def __getattr__(self, name: str) -> Any:
        # A backend's own extras (the SQLite store's stats, bulk_append ...) stay reachable.
        if name.startswith("_") or name == "raw":
            raise AttributeError(name)
        return getattr(self.raw, name)


def _info(row: SessionInfo, facts: SessionFacts, verified: str) -> SessionInfo:
    import json

    return replace(
        row,
        contract=facts.contract,
        principal=None if facts.principal is None else json.loads(facts.principal),
        status=facts.status,
        entries=facts.entries,
        started_ms=facts.started_ms,
        updated_ms=facts.updated_ms,
        head=facts.head,
        ended=facts.ended,
        verified=verified,
    )


_KEEP_BYTES = 64 << 20  # payload bytes a read keeps for the replay after it; past this, R5 reads again


class _Kept:
    """The payloads one read of a session verified (V11 hashed each), by ref, up to ``_KEEP_BYTES``.

    A payload is addressed by its hash, so bytes that hashed to their ref are the right answer for
    that ref whatever the store holds later; only an erasure through this store drops them."""

    __slots__ = ("payloads", "session", "size")

    def __init__(self, session: str | None) -> None:
        self.session = session
        self.payloads: dict[str, bytes] = {}
        self.size = 0

    def keep(self, handed: list[tuple[str, bytes]]) -> None:
        """The entry V11 was just ``handed`` these payloads for passed (each hashed to its ref): keep them."""
        if self.session is not None and self.size <= _KEEP_BYTES:
            payloads = self.payloads
            for ref, data in handed:
                if ref not in payloads:
                    payloads[ref] = data
                    self.size += len(data)
        handed.clear()


def _prefetched(
    raw: LedgerStore,
    entries: Iterator[StoredEntry],
    page: dict[str, bytes],
    named: dict[int, list[str]],
    submit: Callable[[list[StoredEntry]], None] | None = None,
) -> Iterator[StoredEntry]:
    """``entries`` a page at a time, with ``page`` holding the payloads that page's entries name
    (fetched in one ``blobs_for``) while its entries are yielded; absent payloads stay absent.
    ``named`` holds each entry's refs (by ``id()``, the entries held in the page meanwhile), so
    V11 does not walk the body a second time. With ``submit`` (V10 computed ahead, elsewhere), the
    entries are read a page ahead: each page is handed to it while the page before is checked."""
    batch: list[StoredEntry] = []
    held: list[StoredEntry] | None = None  # read and submitted, checked after the page before it
    for item in entries:
        batch.append(item)
        if len(batch) == _PROOF_BATCH:
            if submit is None:
                _fetch(raw, batch, page, named)
                yield from batch
            else:
                submit(batch)
                if held is not None:
                    _fetch(raw, held, page, named)
                    yield from held
                held = batch
            batch = []
    if submit is not None:
        if batch:
            submit(batch)
        if held is not None:
            _fetch(raw, held, page, named)
            yield from held
    _fetch(raw, batch, page, named)
    yield from batch


def _fetch(raw: LedgerStore, batch: list[StoredEntry], page: dict[str, bytes], named: dict[int, list[str]]) -> None:
    page.clear()
    named.clear()
    refs: list[str] = []
    for item in batch:
        body = item.entry.get("body")
        if type(body) is dict:
            own = refs_in(body)
            named[id(item)] = own
            refs.extend(own)
    if refs:
        page.update(raw.blobs_for(refs))
