"""The writer side of the PostgreSQL store: group commit of appends, and the store's other writes.

One ``PostgresWriter`` owns the writer connection of one ``PostgresStore``:

- ``append`` is thread-safe; concurrent callers queue their batches and whichever thread holds
  the writer lock commits every queued batch in one transaction (each batch in its own savepoint,
  so one failing batch does not fail the others), sharing one WAL flush (leader/follower, the queue
  of ``_group_commit``, as in the SQLite store).
- Every append transaction first locks the one ``tree`` row ``FOR UPDATE`` (the log's size and
  Merkle frontier): while it is held no other process assigns log indexes, so there is no gap;
  then each batch's session row, ``FOR UPDATE`` (where a lease's epoch check goes). The entries,
  the completed Merkle nodes, the session rows and the new frontier commit together.
- ``durable=False`` batches commit with ``SET LOCAL synchronous_commit = off``.
- ``importing`` fills an empty ledger with another ledger's entries, unchanged (migrate).

What it does not do: reads (``postgresql``) or connection set-up (``_pg_link``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Generator, Iterable, Sequence
from typing import Any, LiteralString, TypeVar

import psycopg
import psycopg.errors
from psycopg import sql

from truss._clock import Clock
from truss._errors import StoreConflictError, StoreError, TrussError
from truss.ledger.canonical import canonical
from truss.ledger.entry import Record, StoredEntry
from truss.ledger.keyhistory import LOG_SESSION
from truss.ledger.keys import IdentityKey
from truss.ledger.merkle import Frontier, leaf_hash
from truss.ledger.stores._group_commit import GroupCommit, Pending, batch_error, fail_all, finish
from truss.ledger.stores._pg_link import KEY_RETIRED, Conn, PgLink, first_line, insert_checkpoint
from truss.ledger.stores._sql import SessionRows
from truss.ledger.stores.base import (
    Lease,
    SessionHead,
    SessionInfo,
    StoredCheckpoint,
    check_epoch,
    key_retired_error,
    seal_batch,
)

_T = TypeVar("_T")


_LEASE_SELECT: LiteralString = "SELECT owner, host, pid, epoch, acquired_ms, expires_ms FROM leases WHERE session = %s"


def read_lease(conn: Conn, session: str, *, hold: bool = False) -> Lease | None:
    """The session's lease row, or None.

    ``hold``: lock the row ``FOR SHARE`` until the transaction ends, as an append does before its
    epoch check: a takeover (which updates the row) then waits for the append to commit, and an
    append that waited for a takeover reads the new epoch and is refused. An epoch is never
    checked against a lease that changes before the entries it admits are committed.
    """
    query: LiteralString = _LEASE_SELECT + " FOR SHARE" if hold else _LEASE_SELECT
    row = conn.execute(query, (session,)).fetchone()
    if row is None:
        return None
    return Lease(session, str(row[0]), str(row[1]), int(row[2]), int(row[3]), int(row[4]), int(row[5]))


__all__ = ["LedgerImport", "PostgresWriter"]

_COPY_FROM = 16  # entries in one batch from which COPY beats INSERT
# The session's row lock, taken after the tree row's: a lease's epoch check (fencing) is one more
# predicate on this row, in this same transaction.
_SESSION_LOCK: LiteralString = "SELECT entries, head, ended FROM sessions WHERE id = %s FOR UPDATE"
_SESSION_ROWS = SessionRows("%s", (False, True))


class PostgresWriter:
    """The append connection of one store, with group commit (see the module docstring)."""

    def __init__(
        self, link: PgLink, conn: Conn, *, key: IdentityKey | None, clock: Clock, origin: str, group_commit: bool
    ) -> None:
        self._link = link
        self.db = link.db
        self._w: Conn | None = conn
        self._key = key
        self._clock = clock
        self.origin = origin
        self._wlock = threading.Lock()
        self._queue = GroupCommit(self._wlock, group=group_commit)
        self._commits = 0
        self._batches = 0
        self._closed = False

    def _conn(self) -> Conn:
        """The append connection (reconnected if the server dropped it); call with ``_wlock`` held."""
        if self._closed:
            raise StoreError(f"{self.db}: the store is closed", db=self.db)
        if self._w is None or self._w.closed or self._w.broken:
            if self._w is not None:
                with contextlib.suppress(psycopg.Error):
                    self._w.close()
            self._w = self._link.connect()
        return self._w

    def close(self) -> None:
        with self._wlock:
            self._closed = True
            if self._w is not None:
                with contextlib.suppress(psycopg.Error):
                    self._w.close()
                self._w = None

    def settings(self) -> dict[str, str]:
        """What the append connection runs with (diagnostics; a test checks invariant 5's settings)."""
        with self._wlock:
            conn = self._conn()
            names = ("fsync", "synchronous_commit", "default_transaction_isolation", "lock_timeout", "search_path")
            return {
                name: str((conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(name))).fetchone() or ("",))[0])
                for name in names
            }

    def stats(self) -> dict[str, int]:
        """Append transactions committed and batches they carried since opening (group commit at work)."""
        return {"commits": self._commits, "batches": self._batches}

    # -- append (group commit) -------------------------------------------------------------------

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
        """Append ``records`` to ``session`` as consecutive entries; returns them signed.

        ``epoch``: refused unless it is the session's current lease epoch (fencing, ``check_epoch``).
        Committed (the WAL flushed, unless ``durable=False``) before it returns. ``expect_seq`` is
        the seq and ``expect_index`` the log index the first record must get (checked under the
        tree row's lock, so it is a compare-and-set across processes); otherwise
        ``StoreConflictError`` and nothing is written. A key that a ``key_rotated`` entry in the
        log's own session retired (whoever appended it) signs nothing more: ``StoreError``
        (``reason="key_retired"``).
        """
        if self._key is None:
            raise StoreError(f"{self.db}: opened without an identity key, so it cannot append", db=self.db)
        if not records:
            return []
        pending = Pending(session, list(records), durable, expect_seq, expect_index=expect_index, epoch=epoch)
        return self._queue.run(pending, self._commit_group)

    def bulk_append(self, batches: Iterable[tuple[str, Sequence[Record]]], *, per_txn: int = 1000) -> int:
        """Append many batches, ``per_txn`` batches per transaction (imports, benchmarks).

        Every transaction but the last commits with ``synchronous_commit = off``; the last one
        flushes them all. A failing batch raises and stops. Returns the number of entries appended.
        """
        return self._queue.bulk(batches, self._commit_group, per_txn=per_txn)

    def _commit_group(self, group: list[Pending]) -> None:
        """Commit every batch of ``group`` in one transaction; sets each one's result or error."""
        if not group:
            return
        try:
            conn = self._conn()
        except TrussError as exc:
            fail_all(group, exc)
            return
        try:
            # A lone short batch (the common case: one run's intent or result) goes in pipeline
            # mode: the locks and reads are one round trip, the writes and the commit another.
            pipelined = len(group) == 1 and len(group[0].records) < _COPY_FROM
            with conn.pipeline() if pipelined else contextlib.nullcontext(), conn.transaction():
                if not any(p.durable for p in group):
                    conn.execute("SET LOCAL synchronous_commit TO off")
                # The one row lock per batch: while it is held, nobody else assigns log indexes.
                # The statements after it run after it got the lock, so they see what the previous
                # holder committed (read committed takes a snapshot per statement).
                tree = conn.execute("SELECT size, frontier FROM tree WHERE id = 0 FOR UPDATE")
                top = conn.execute("SELECT max(idx) FROM entries")
                # Another worker may have rotated this key away (its entries would not verify):
                # checked under the tree lock, so no rotation can commit between this and our entries.
                retired = conn.execute(KEY_RETIRED, (LOG_SESSION, self._key_id(), self._vkey()))
                first = conn.execute(_SESSION_LOCK, (group[0].session,)) if pipelined else None
                frontier = self._frontier(tree.fetchone(), top.fetchone())
                if retired.fetchone() is not None:
                    raise self._retired_error()
                next_index = frontier.size
                if len(group) == 1:
                    [pending] = group
                    row = (
                        first.fetchone()
                        if first is not None
                        else conn.execute(_SESSION_LOCK, (pending.session,)).fetchone()
                    )
                    pending.result = self._apply(conn, pending, next_index, frontier, row)
                else:
                    rotated = False  # a rotation earlier in this group retires the key for the rest
                    for pending in group:
                        if rotated:
                            pending.error = self._retired_error()
                            continue
                        saved = frontier.to_state()
                        try:
                            with conn.transaction():  # a savepoint: one failing batch fails alone
                                row = conn.execute(_SESSION_LOCK, (pending.session,)).fetchone()
                                pending.result = self._apply(conn, pending, next_index, frontier, row)
                            next_index += len(pending.result)
                            rotated = pending.rotates
                        except (TrussError, psycopg.errors.IntegrityError) as exc:
                            frontier = Frontier.from_state(saved)
                            pending.result = []
                            pending.error = batch_error(pending, exc, first_line)
                conn.execute(
                    "UPDATE tree SET size = %s, frontier = %s WHERE id = 0", (frontier.size, frontier.to_state())
                )
            self._commits += 1
            self._batches += len(group)
        except TrussError as exc:
            error = exc if len(group) > 1 else batch_error(group[0], exc, first_line)
            fail_all(group, error, keep_own=True)
            return
        except psycopg.errors.IntegrityError as exc:
            error = batch_error(group[0], exc, first_line) if len(group) == 1 else self._link.error("append", exc)
            fail_all(group, error, keep_own=True)
            return
        except psycopg.Error as exc:
            fail_all(group, self._link.error("append", exc), keep_own=True)
            return
        except BaseException:
            fail_all(group, StoreError(f"{self.db}: append interrupted", db=self.db), keep_own=True)
            raise
        finish(group)

    def _frontier(self, row: tuple[Any, ...] | None, top: tuple[Any, ...] | None) -> Frontier:
        held = 0 if top is None or top[0] is None else int(top[0]) + 1
        try:
            if row is None:
                raise ValueError("the tree row is missing")
            frontier = Frontier.from_state(bytes(row[1]))
            if frontier.size != int(row[0]) or frontier.size != held:
                raise ValueError(f"the Merkle frontier covers {frontier.size} entries but the log holds {held}")
        except ValueError as exc:
            raise StoreError(
                f"{self.db}: {exc}",
                remedy="the ledger's tables were modified outside Truss; run `truss ledger verify --all`",
                db=self.db,
            ) from exc
        return frontier

    def _key_id(self) -> str:
        assert self._key is not None
        return self._key.key_id

    def _vkey(self) -> bytes:
        assert self._key is not None
        return self._key.verifier.vkey.encode()

    def _retired_error(self) -> StoreError:
        return key_retired_error(self.db, self._key_id())

    def _apply(
        self, conn: Conn, pending: Pending, index: int, frontier: Frontier, row: tuple[Any, ...] | None
    ) -> list[StoredEntry]:
        """Seal ``pending`` at ``index`` and write it; ``row`` is its session's row, locked (``_SESSION_LOCK``)."""
        key = self._key
        assert key is not None
        session, records = pending.session, pending.records
        if pending.epoch is not None:
            check_epoch(session, read_lease(conn, session, hold=True), pending.epoch)
        head = None if row is None else SessionHead(int(row[0]), bytes(row[1]).hex(), bool(row[2]))
        out = seal_batch(
            key,
            origin=self.origin,
            session=session,
            head=head,
            records=records,
            bodies=pending.bodies,
            index=index,
            now_ms=self._clock.now_ms,
            expect_seq=pending.expect_seq,
            expect_index=pending.expect_index,
        )
        node_rows: list[tuple[int, int, bytes]] = []
        blob_rows: dict[str, bytes] = {}
        for entry, record in zip(out, records, strict=True):
            node_rows.extend(frontier.append(leaf_hash(entry.raw)))
            blob_rows.update((ref, bytes(data)) for ref, data in record.blobs.items())
        entry_rows = [
            (e.index, session, e.seq, e.kind, e.ts, bytes.fromhex(e.hash), e.raw, e.sig, key.key_id) for e in out
        ]
        with conn.cursor() as cur:
            if len(entry_rows) < _COPY_FROM:
                cur.executemany(
                    "INSERT INTO entries (idx, session, seq, kind, ts, hash, raw, sig, keyid)"
                    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                    entry_rows,
                )
                cur.executemany("INSERT INTO nodes (level, idx, hash) VALUES (%s, %s, %s)", node_rows)
            else:  # a long batch (imports, bulk_append): COPY is several times faster than INSERTs
                with cur.copy("COPY entries (idx, session, seq, kind, ts, hash, raw, sig, keyid) FROM STDIN") as copy:
                    for entry_row in entry_rows:
                        copy.write_row(entry_row)
                with cur.copy("COPY nodes (level, idx, hash) FROM STDIN") as copy:
                    for node_row in node_rows:
                        copy.write_row(node_row)
            if blob_rows:
                cur.executemany(
                    "INSERT INTO blobs (ref, data) VALUES (%s, %s) ON CONFLICT (ref) DO NOTHING",
                    list(blob_rows.items()),
                )
                cur.executemany(
                    "INSERT INTO session_blobs (session, ref) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                    [(session, ref) for ref in blob_rows],
                )
        _, query, params = _SESSION_ROWS.after(session, head, records, out)
        conn.execute(query, params)
        return out

    def transaction(self, body: Callable[[Conn], _T]) -> _T:
        """Run ``body`` in one durable transaction on the append connection (rolled back if it raises)."""
        with self._wlock:
            conn = self._conn()
            try:
                with conn.transaction():
                    return body(conn)
            except psycopg.Error as exc:
                raise self._link.error("write", exc) from exc

    # -- other writes --------------------------------------------------------------------------

    def write(self, steps: Sequence[tuple[LiteralString, tuple[Any, ...]]]) -> list[int]:
        """Run statements in one durable transaction; returns each one's row count."""
        with self._wlock:
            conn = self._conn()
            try:
                with conn.transaction():
                    counts: list[int] = []
                    for query, params in steps:
                        counts.append(conn.execute(query, params).rowcount)
                    return counts
            except psycopg.Error as exc:
                raise self._link.error("write", exc) from exc

    def add_checkpoint(self, size: int, root: bytes, note: str) -> None:
        """Keep a signed checkpoint; a second one at the same size must have the same root.

        Signature lines a second copy brings (witnesses' cosignatures) are merged into the held one.
        """
        with self._wlock:
            conn = self._conn()
            try:
                with conn.transaction():  # the row stays locked from its read to the merge's update
                    insert_checkpoint(conn, self.db, self._clock.now_ms(), size=size, root=root, note=note)
            except psycopg.Error as exc:
                raise self._link.error("write", exc) from exc

    @contextlib.contextmanager
    def importing(self) -> Generator[LedgerImport]:
        """One transaction that fills this empty ledger with another ledger's signed entries.

        The entries keep their bytes and signatures (nothing is re-signed); the Merkle nodes and
        frontier are computed here from the bytes. If the block raises, nothing is written.
        ``StoreConflictError`` when the ledger is not empty.
        """
        with self._wlock:
            conn = self._conn()
            try:
                with conn.transaction():
                    row = conn.execute("SELECT size FROM tree WHERE id = 0 FOR UPDATE").fetchone()
                    held = conn.execute("SELECT count(*) FROM sessions").fetchone()
                    size = 0 if row is None else int(row[0])
                    if size or (held is not None and held[0]):
                        raise StoreConflictError(
                            f"{self.db} already holds a ledger of {size} entries",
                            remedy="migrate into an empty ledger: another schema (?schema=NAME) or database",
                            size=size,
                        )
                    sink = LedgerImport(conn, self._clock.now_ms)
                    yield sink
                    sink.finish()
            except psycopg.Error as exc:
                raise self._link.error("migrate", exc) from exc


class LedgerImport:
    """Rows of a ledger being copied in, written with COPY in one transaction (``importing``)."""

    _FLUSH = 2000

    def __init__(self, conn: Conn, now_ms: Callable[[], int]) -> None:
        self._conn = conn
        self._now_ms = now_ms
        self.frontier = Frontier()
        self.entries = self.sessions = self.checkpoints = self.blobs = 0
        self._entry_rows: list[tuple[Any, ...]] = []
        self._node_rows: list[tuple[int, int, bytes]] = []
        self._blob_rows: dict[str, bytes] = {}
        self._link_rows: set[tuple[str, str]] = set()
        self._last_size = 0

    def entry(self, item: StoredEntry, payloads: dict[str, bytes]) -> None:
        """The next entry of the log (in index order) and the payloads its session links to."""
        if item.index != self.frontier.size:
            raise StoreError(f"entry {item.index} arrives where leaf {self.frontier.size} belongs", reason="index_gap")
        self._entry_rows.append(
            (item.index, item.session, item.seq, item.kind, item.ts, bytes.fromhex(item.hash), item.raw, item.sig,
             item.keyid)
        )  # fmt: skip
        self._node_rows.extend(self.frontier.append(leaf_hash(item.raw)))
        for ref, data in payloads.items():
            self._blob_rows[ref] = data
            self._link_rows.add((item.session, ref))
        self.entries += 1
        if len(self._entry_rows) >= self._FLUSH:
            self._flush()

    def session(self, info: SessionInfo, *, envelope: bytes | None, erased: Iterable[str]) -> None:
        principal = None if info.principal is None else canonical(info.principal).decode("utf-8")
        self._flush()
        self._conn.execute(
            "INSERT INTO sessions (id, contract, principal, status, entries, started_ms, updated_ms, head, ended,"
            " envelope) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (info.id, info.contract, principal, info.status, info.entries, info.started_ms, info.updated_ms,
             bytes.fromhex(info.head), info.ended, envelope),
        )  # fmt: skip
        with self._conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO erased (session, ref) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                [(info.id, ref) for ref in sorted(erased)],
            )
        self.sessions += 1

    def checkpoint(self, checkpoint: StoredCheckpoint) -> None:
        self._conn.execute(
            "INSERT INTO checkpoints (size, root, note, created_ms) VALUES (%s, %s, %s, %s)",
            (checkpoint.size, checkpoint.root, checkpoint.note, checkpoint.created_ms or self._now_ms()),
        )
        self._last_size = max(self._last_size, checkpoint.size)
        self.checkpoints += 1

    def _flush(self) -> None:
        with self._conn.cursor() as cur:
            if self._entry_rows:
                with cur.copy("COPY entries (idx, session, seq, kind, ts, hash, raw, sig, keyid) FROM STDIN") as copy:
                    for row in self._entry_rows:
                        copy.write_row(row)
            if self._node_rows:
                with cur.copy("COPY nodes (level, idx, hash) FROM STDIN") as copy:
                    for node in self._node_rows:
                        copy.write_row(node)
            if self._blob_rows:
                cur.executemany(
                    "INSERT INTO blobs (ref, data) VALUES (%s, %s) ON CONFLICT (ref) DO NOTHING",
                    list(self._blob_rows.items()),
                )
            if self._link_rows:
                cur.executemany(
                    "INSERT INTO session_blobs (session, ref) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                    sorted(self._link_rows),
                )
        self._entry_rows.clear()
        self._node_rows.clear()
        self._blob_rows.clear()
        self._link_rows.clear()

    def finish(self) -> None:
        self._flush()
        self._conn.execute(
            "UPDATE tree SET size = %s, frontier = %s WHERE id = 0", (self.frontier.size, self.frontier.to_state())
        )
        self._conn.execute("UPDATE publisher SET size = %s WHERE id = 0", (self._last_size,))
        row = self._conn.execute("SELECT count(*) FROM blobs").fetchone()
        self.blobs = 0 if row is None else int(row[0])
