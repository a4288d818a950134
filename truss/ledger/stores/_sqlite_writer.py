"""The writer side of the SQLite store: group commit of appends, and the store's other writes.

One ``SqliteWriter`` owns the writer connection of one ``SqliteStore``:

- ``append`` is thread-safe; concurrent callers queue their batches and whichever thread holds
  the writer lock commits every queued batch in one transaction (each batch in its own savepoint,
  so one failing batch does not fail the others), sharing one fsync (leader/follower, the queue
  of ``_group_commit``).
- ``BEGIN IMMEDIATE`` for every write: a second process waits up to the busy timeout and then
  gets ``StoreBusyError``; it never interleaves or corrupts.
- ``synchronous=FULL`` on every commit except batches appended with ``durable=False``.
- Each transaction takes the Merkle frontier from memory (rebuilt from the stored nodes of the
  log's size when another connection committed), appends the new leaves and writes the nodes
  they complete beside the entries; the frontier itself is never stored (schema 2).

What it does not do: reads (``sqlite.SqliteStore``), the session rules (``base.seal_batch``) or the
queue of waiting appends (``_group_commit``).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from truss._clock import Clock
from truss._errors import StoreBusyError, StoreError, TrussError, VerificationError
from truss.ledger.entry import Record, StoredEntry
from truss.ledger.keyhistory import LOG_SESSION
from truss.ledger.keys import IdentityKey
from truss.ledger.merkle import Frontier, NodeKey, leaf_hash, root_nodes
from truss.ledger.stores._group_commit import GroupCommit, Pending, batch_error, fail_all, finish
from truss.ledger.stores._sql import SessionRows
from truss.ledger.stores.base import Lease, SessionHead, check_epoch, key_retired_error, retires, seal_batch

__all__ = [
    "LEASES_TABLE",
    "SqliteWriter",
    "begin",
    "key_retired",
    "read_frontier",
    "read_lease",
    "read_nodes",
    "store_error",
]

_T = TypeVar("_T")
_HEADS_KEPT = 4096  # sessions whose head a writer remembers (a long serve-mcp drives many)
_NODES_PER_QUERY = 400  # two parameters each, below SQLite's bound on parameters
_ROWS_PER_INSERT = 64  # rows per multi-row INSERT: at most 576 parameters, one cached statement per count
_SESSION_ROWS = SessionRows("?", (0, 1))

# Made on first use, so a ledger created before leases existed gets the table without a migration.
LEASES_TABLE = (
    "CREATE TABLE IF NOT EXISTS leases (session TEXT PRIMARY KEY, owner TEXT NOT NULL, host TEXT NOT NULL,"
    " pid INTEGER NOT NULL, epoch INTEGER NOT NULL, acquired_ms INTEGER NOT NULL, expires_ms INTEGER NOT NULL)"
    " WITHOUT ROWID"
)


def read_lease(conn: sqlite3.Connection, session: str) -> Lease | None:
    """The session's lease row, or None (also when the table does not exist yet)."""
    try:
        row = conn.execute(
            "SELECT owner, host, pid, epoch, acquired_ms, expires_ms FROM leases WHERE session = ?", (session,)
        ).fetchone()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return None
        raise
    if row is None:
        return None
    return Lease(session, str(row[0]), str(row[1]), int(row[2]), int(row[3]), int(row[4]), int(row[5]))


def store_error(db: Path, busy_ms: int, what: str, exc: sqlite3.Error) -> StoreError:
    """A sqlite3 error as the store's ``StoreError`` (``StoreBusyError`` for a lock held too long)."""
    text = str(exc)
    if "locked" in text or "busy" in text:
        return StoreBusyError(
            f"{db}: the ledger stayed locked by another writer for {busy_ms} ms",
            remedy="another Truss process is writing; retry when it finishes",
            retryable=True,
            db=str(db),
        )
    return StoreError(
        f"{db}: ledger {what} failed: {type(exc).__name__}: {text}",
        remedy="check the disk and the file's permissions; the last committed state is intact",
        db=str(db),
    )


def key_retired(conn: sqlite3.Connection, key: IdentityKey) -> bool:
    """Whether a key rotation recorded in the ledger retired ``key``, or a removal took it out of the key set
    (as ``_pg_link.key_retired``: a ``key_rotated`` entry signed by it, or a ``key_removed`` naming it)."""
    # Key statements live in the log's own session, so this reads a few rows of one session's index.
    row = conn.execute(
        "SELECT 1 FROM entries WHERE session = ? AND ((kind = 'key_rotated' AND keyid = ?)"
        " OR (kind = 'key_removed' AND instr(raw, ?) > 0)) LIMIT 1",
        (LOG_SESSION, key.key_id, key.verifier.vkey.encode()),
    ).fetchone()
    return row is not None


def read_nodes(conn: sqlite3.Connection, keys: Sequence[NodeKey]) -> dict[NodeKey, bytes]:
    """The stored subtrees among ``keys`` (``(level, index)``; absent ones are left out).

    A node is keyed by the leaf that completes it, ``last = ((index + 1) << level) - 1``, then its
    level, so each lookup goes through the primary key (a join from the listed keys: ``IN (VALUES
    ...)`` would scan the table), ``_NODES_PER_QUERY`` keys per query.
    """
    found: dict[NodeKey, bytes] = {}
    for at in range(0, len(keys), _NODES_PER_QUERY):
        chunk = keys[at : at + _NODES_PER_QUERY]
        marks = ", ".join(["(?, ?)"] * len(chunk))
        sql = (
            f"WITH k(last, level) AS (VALUES {marks}) "  # noqa: S608 (placeholders only)
            "SELECT n.last, n.level, n.hash FROM k CROSS JOIN nodes AS n ON n.last = k.last AND n.level = k.level"
        )
        params = tuple(v for level, index in chunk for v in (((index + 1) << level) - 1, level))
        for last, level, digest in conn.execute(sql, params):
            found[(int(level), ((int(last) + 1) >> int(level)) - 1)] = bytes(digest)
    return found


@functools.lru_cache(maxsize=64)
def _ordered_nodes_sql(count: int) -> str:
    # The keys' positions are literals, so a proof's query text depends only on its length.
    marks = ", ".join(f"({pos}, ?, ?)" for pos in range(count))
    return (
        f"WITH k(pos, last, level) AS (VALUES {marks}) "  # noqa: S608 (placeholders and integers only)
        "SELECT k.pos, n.hash FROM k CROSS JOIN nodes AS n ON n.last = k.last AND n.level = k.level ORDER BY k.pos"
    )


def iter_node_hashes(
    conn: sqlite3.Connection, lock: threading.Lock, keys: Iterable[NodeKey], missing: Callable[[int, int], Exception]
) -> Iterator[bytes]:
    """The hashes of the stored subtrees ``keys``, in their order, one row at a time (``read_nodes``'s
    lookup, ``_NODES_PER_QUERY`` keys per query); ``missing(level, index)`` is raised at the first
    key not stored. The keys are held only as the query's parameters and the hashes not at all:
    a caller folds them as they arrive (``merkle.inclusion_root``), so a proof's memory barely
    grows with the log. The lock is taken per row, never across a ``yield``."""
    stream = iter(keys)
    while True:
        params: list[int] = []
        for level, index in itertools.islice(stream, _NODES_PER_QUERY):
            params.append(((index + 1) << level) - 1)
            params.append(level)
        if not params:
            return
        with lock:
            cursor = conn.execute(_ordered_nodes_sql(len(params) // 2), params)
        try:
            expected = 0
            while True:
                with lock:
                    row = cursor.fetchone()
                if row is None or row[0] != expected:
                    if 2 * expected == len(params):
                        break
                    last, level = params[2 * expected], params[2 * expected + 1]
                    raise missing(level, ((last + 1) >> level) - 1)
                yield bytes(row[1])
                expected += 1
        finally:  # a fold that stops early (a malformed hash) ends the read at once
            with lock:
                cursor.close()


def read_frontier(conn: sqlite3.Connection, db: Path, *, writing: bool = False) -> Frontier:
    """The Merkle frontier as ``conn`` sees it, rebuilt from the stored complete subtrees of the
    tree's size (the leaves stored, O(log n) rows); run it inside one transaction so an append
    cannot split it.

    When a subtree of the frontier is missing, or (``writing``) the log's entries and its nodes
    disagree on its size, the file was changed outside Truss: a writer gets ``StoreError`` (nothing
    may be appended to it), a reader ``VerificationError`` (``tree_mismatch``), as an unreadable
    stored frontier was reported. A reader takes the size its nodes say, so verification finds a
    truncated log.
    """
    if writing:
        row = conn.execute("SELECT (SELECT MAX(idx) FROM entries), (SELECT MAX(last) FROM nodes)").fetchone()
        logged = 0 if row is None or row[0] is None else int(row[0]) + 1
        size = 0 if row is None or row[1] is None else int(row[1]) + 1
        if logged != size:
            raise StoreError(
                f"{db}: the Merkle nodes cover {size} entries but the log holds {logged}",
                remedy="the ledger file was modified outside Truss; run `truss ledger verify --all`",
                db=str(db),
                reason="tree_mismatch",
            )
    else:
        row = conn.execute("SELECT MAX(last) FROM nodes").fetchone()
        size = 0 if row is None or row[0] is None else int(row[0]) + 1
    keys = root_nodes(size)
    found = read_nodes(conn, keys)
    for level, index in keys:
        if (level, index) not in found:
            message = f"{db}: Merkle node ({level}, {index}) of the tree of {size} leaves is not stored"
            remedy = "the ledger file was modified outside Truss; run `truss ledger verify --all`"
            if writing:
                raise StoreError(message, remedy=remedy, db=str(db), reason="tree_mismatch", level=level, index=index)
            raise VerificationError(
                message,
                remedy="the ledger file was modified outside Truss; do not trust it beyond a checkpoint you hold",
                reason="tree_mismatch",
            )
    return Frontier.at(size, lambda level, index: found[(level, index)])


_SQL: dict[tuple[str, int, int], str] = {}  # (head, width, rows) -> its INSERT: at most 4 heads x _ROWS_PER_INSERT


def _insert_sql(head: str, width: int, rows: int) -> str:
    sql = _SQL.get((head, width, rows))
    if sql is None:
        row = "(" + ",".join("?" * width) + ")"
        sql = _SQL[(head, width, rows)] = f"{head} VALUES {','.join([row] * rows)}"
    return sql


def _insert(conn: sqlite3.Connection, head: str, width: int, flat: Sequence[Any]) -> None:
    """``head VALUES (...), (...)``: the rows of ``flat`` (``width`` values each) in one statement
    per ``_ROWS_PER_INSERT`` rows, instead of one ``executemany`` step per row. Each statement's
    text is built once per row count (an append's statements are the same every time)."""
    step = width * _ROWS_PER_INSERT
    if len(flat) <= step:  # the common case: one statement, no slice
        conn.execute(_insert_sql(head, width, len(flat) // width), flat)
        return
    for at in range(0, len(flat), step):
        chunk = flat[at : at + step]
        conn.execute(_insert_sql(head, width, len(chunk) // width), chunk)


def begin(conn: sqlite3.Connection, db: Path, busy_ms: int) -> None:
    try:
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError as exc:
        raise store_error(db, busy_ms, "lock", exc) from exc


class SqliteWriter:
    """The writer connection of one SQLite ledger; see the module docstring."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        *,
        db: Path,
        key: IdentityKey | None,
        clock: Clock,
        origin: str,
        busy_timeout_ms: int,
        group_commit: bool,
    ) -> None:
        self._w = conn
        self._db = db
        self._key = key
        self._clock = clock
        self._origin = origin
        self._busy_ms = busy_timeout_ms
        self.lock = threading.Lock()  # the writer: whoever holds it commits the queue
        self._queue = GroupCommit(self.lock, group=group_commit)
        self._commits = 0
        self._batches = 0
        self._flushes = 0  # commits with synchronous=FULL: the ones that wait for the disk
        self._sync_full: bool | None = None
        self._frontier: Frontier | None = None
        self._rotated_here = False
        # What this connection knows of the ledger as of its last commit, valid while no other
        # connection commits (``PRAGMA data_version`` unchanged): the sessions' heads and leases
        # this writer read or wrote. An owner's append then reads nothing back (docs/ledger-format.md).
        self._version: int | None = None
        self._heads: dict[str, SessionHead] = {}
        self._leases: dict[str, Lease | None] = {}
        self.closed = False

    @property
    def connection(self) -> sqlite3.Connection:
        return self._w

    def _check_open(self) -> None:
        if self.closed:
            raise StoreError(f"{self._db}: the store is closed", db=str(self._db))

    def _set_sync(self, full: bool) -> None:
        if self._sync_full is not full:
            self._w.execute(f"PRAGMA synchronous = {'FULL' if full else 'NORMAL'}")
            self._sync_full = full

    def stats(self) -> dict[str, int]:
        return {"commits": self._commits, "batches": self._batches, "flushes": self._flushes}

    def close(self) -> None:
        self.closed = True
        self._w.close()

    # -- other writes ----------------------------------------------------------------------------

    def write(self, sql_steps: Sequence[tuple[str, tuple[Any, ...]]]) -> list[int]:
        """Run statements in one durable transaction; returns each one's rowcount."""
        return self._durably(lambda conn: [conn.execute(sql, params).rowcount for sql, params in sql_steps])

    def merge_checkpoint(self, size: int, note: str) -> None:
        """Merge ``note``'s signature lines into the checkpoint held at ``size`` (one transaction)."""
        from truss.ledger.cosignature import merge_notes  # only here: a store that only reads never loads it

        def merge(conn: sqlite3.Connection) -> None:
            row = conn.execute("SELECT note FROM checkpoints WHERE size = ?", (size,)).fetchone()
            if row is not None:
                merged = merge_notes(str(row[0]), note)
                if merged != str(row[0]):
                    conn.execute("UPDATE checkpoints SET note = ? WHERE size = ?", (merged, size))

        self._durably(merge)

    def transaction(self, body: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run ``body`` in one durable write transaction (``BEGIN IMMEDIATE``; rolled back if it raises)."""

        def with_leases(conn: sqlite3.Connection) -> _T:
            conn.execute(LEASES_TABLE)
            self._leases.clear()  # a lease written here: read it again at the next append
            return body(conn)

        return self._durably(with_leases)

    def _durably(self, body: Callable[[sqlite3.Connection], _T]) -> _T:
        """``body`` in one durable ``BEGIN IMMEDIATE`` transaction, committed, or rolled back if it raises."""
        self._check_open()
        with self.lock:
            conn = self._w
            try:
                self._set_sync(True)
                begin(conn, self._db, self._busy_ms)
                result = body(conn)
                conn.execute("COMMIT")
                return result
            except BaseException as exc:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise store_error(self._db, self._busy_ms, "write", exc) from exc
                raise

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
        self._check_open()
        if self._key is None:
            raise StoreError(f"{self._db}: opened without an identity key, so it cannot append", db=str(self._db))
        if not records:
            return []
        pending = Pending(session, list(records), durable, expect_seq, expect_index=expect_index, epoch=epoch)
        return self._queue.run(pending, self._commit_group)

    def bulk_append(self, batches: Iterable[tuple[str, Sequence[Record]]], *, per_txn: int = 1000) -> int:
        """Append many batches, ``per_txn`` batches per transaction (imports, benchmarks).

        Each transaction commits with ``synchronous=NORMAL`` and the last with ``FULL``; a failing
        batch raises and stops. Returns the number of entries appended.
        """
        self._check_open()
        return self._queue.bulk(batches, self._commit_group, per_txn=per_txn)

    def _commit_group(self, group: list[Pending]) -> None:
        """Commit every batch of ``group`` in one transaction; sets each one's result or error."""
        if not group:
            return
        conn = self._w
        try:
            self._set_sync(group[0].durable if len(group) == 1 else any(p.durable for p in group))
            begin(conn, self._db, self._busy_ms)
        except TrussError as exc:
            fail_all(group, exc)
            return
        except sqlite3.Error as exc:
            fail_all(group, store_error(self._db, self._busy_ms, "append", exc))
            return
        try:
            version = int(conn.execute("PRAGMA data_version").fetchone()[0])
            frontier = self._frontier
            if frontier is not None and version == self._version:
                # Nobody else committed since this writer did: its frontier, heads and leases are current.
                next_index = frontier.size
                if self._rotated_here:
                    self._refuse_retired(conn)
            else:
                self._forget()
                next_index = self._reload(conn)
                frontier = self._frontier
            assert frontier is not None
            if len(group) == 1:
                # A lone batch needs no savepoint: if it fails, the whole transaction is rolled
                # back (two statements and a frontier copy fewer on the common, sequential path).
                [pending] = group
                try:
                    pending.result = self._apply(conn, pending, next_index, frontier)
                except (TrussError, sqlite3.IntegrityError) as exc:
                    self._forget()  # the frontier took the failed batch's leaves: reload it
                    conn.execute("ROLLBACK")
                    fail_all(group, batch_error(pending, exc))
                    return
            rotated = False  # a rotation earlier in this group retires the key for the rest (as in PostgreSQL)
            for pending in group if len(group) > 1 else ():
                if rotated:
                    pending.result, pending.error = [], self._retired_error()
                    continue
                saved = frontier.to_state()
                conn.execute("SAVEPOINT batch")
                try:
                    pending.result = self._apply(conn, pending, next_index, frontier)
                    conn.execute("RELEASE batch")
                    next_index += len(pending.result)
                    rotated = pending.rotates
                except (TrussError, sqlite3.IntegrityError) as exc:
                    conn.execute("ROLLBACK TO batch")
                    conn.execute("RELEASE batch")
                    frontier = Frontier.from_state(saved)
                    pending.result = []
                    pending.error = batch_error(pending, exc)
            conn.execute("COMMIT")
            self._frontier, self._version = frontier, version
            key = self._key
            if key is not None and not self._rotated_here and any(retires(key, p.records) for p in group if p.result):
                self._rotated_here = True  # its own rotation, or a removal naming its key: check from now on
            self._commits += 1
            self._flushes += int(bool(self._sync_full))
            self._batches += len(group)
        except BaseException as exc:
            self._forget()
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            if isinstance(exc, TrussError):
                fail_all(group, exc)
            elif isinstance(exc, sqlite3.Error):
                fail_all(group, store_error(self._db, self._busy_ms, "append", exc))
            else:
                fail_all(group, StoreError(f"{self._db}: append interrupted", db=str(self._db)))
                raise
            return
        finish(group)

    def _forget(self) -> None:
        self._frontier, self._version = None, None
        self._heads.clear()
        self._leases.clear()

    def _reload(self, conn: sqlite3.Connection) -> int:
        """Rebuild the log's frontier as another writer (or none) left it; the next index."""
        frontier = read_frontier(conn, self._db, writing=True)
        # Another writer may have rotated this key away: its entries would not verify.
        self._refuse_retired(conn)
        self._frontier = frontier
        return frontier.size

    def _refuse_retired(self, conn: sqlite3.Connection) -> None:
        assert self._key is not None
        if key_retired(conn, self._key):
            raise self._retired_error()

    def _retired_error(self) -> StoreError:
        assert self._key is not None
        return key_retired_error(str(self._db), self._key.key_id)

    def _apply(self, conn: sqlite3.Connection, pending: Pending, index: int, frontier: Frontier) -> list[StoredEntry]:
        key = self._key
        assert key is not None
        session, records = pending.session, pending.records
        if pending.epoch is not None:
            if session not in self._leases:
                self._leases[session] = read_lease(conn, session)
            check_epoch(session, self._leases[session], pending.epoch)
        head = self._heads.get(session)
        if head is None:
            row = conn.execute("SELECT entries, head, ended FROM sessions WHERE id = ?", (session,)).fetchone()
            head = None if row is None else SessionHead(int(row[0]), bytes(row[1]).hex(), bool(row[2]))
        out = seal_batch(
            key,
            origin=self._origin,
            session=session,
            head=head,
            records=records,
            bodies=pending.bodies,
            index=index,
            now_ms=self._clock.now_ms,
            expect_seq=pending.expect_seq,
            expect_index=pending.expect_index,
        )
        entry_rows: list[Any] = []
        node_rows: list[Any] = []  # last, level, hash: one append's nodes are one key range
        blob_rows: list[Any] = []
        link_rows: list[str] = []
        key_id = key.key_id
        for record, entry in zip(records, out, strict=True):
            at = entry.index
            entry_rows += (at, session, entry.seq, record.kind, entry.ts, bytes.fromhex(entry.hash), entry.raw)
            entry_rows += (entry.sig, key_id)
            for level, _, digest in frontier.append(leaf_hash(entry.raw)):
                node_rows += (at, level, digest)
            for ref, data in record.blobs.items():
                blob_rows += (ref, data)
                link_rows += (session, ref)
        _insert(conn, "INSERT INTO entries (idx, session, seq, kind, ts, hash, raw, sig, keyid)", 9, entry_rows)
        _insert(conn, "INSERT INTO nodes (last, level, hash)", 3, node_rows)
        if blob_rows:
            _insert(conn, "INSERT OR IGNORE INTO blobs (ref, data)", 2, blob_rows)
            _insert(conn, "INSERT OR IGNORE INTO session_blobs (session, ref)", 2, link_rows)
        now, query, params = _SESSION_ROWS.after(session, head, records, out)
        conn.execute(query, params)
        if len(self._heads) >= _HEADS_KEPT:
            self._heads.clear()
            self._leases.clear()
        self._heads[session] = now
        return out
