"""The PostgreSQL ledger store: many Truss processes, on one host or many, share one ledger.

Opened with ``--db postgresql://...`` (or ``postgres://``); the extra ``truss[postgres]``
(psycopg 3 and its pool) must be installed. Nothing else in Truss imports this module, so Truss
without psycopg works as before (docs/postgresql.md).

The guarantees are the SQLite store's, held across processes by the database (Tessera's
PostgreSQL driver is the model):

- **One row lock per batch.** The ``tree`` table has one row (the log's size and Merkle
  frontier). Every append transaction first takes it ``FOR UPDATE``; while it is held nobody else
  appends, so log indexes are assigned without gaps, and the entries, the completed Merkle nodes,
  the session rows and the new frontier commit together or not at all. ``UNIQUE (session, seq)``
  and the primary key on ``idx`` back this up.
- **Group commit.** ``append`` is thread-safe: the concurrent calls of one process queue, and
  whichever thread leads commits every queued batch in one transaction (one savepoint each, so
  one failing batch fails alone), sharing one WAL flush.
- **Durable before dependent** (invariant 5). Every connection turns ``synchronous_commit = off``
  (the server's, the role's or the URL's default) back ``on``, and keeps a stronger level such as
  ``remote_apply``; a batch appended with ``durable=False`` commits
  with ``synchronous_commit = off`` (it survives a crash of Truss, not of the database server). A
  server running with ``fsync = off`` loses commits in a crash: the store refuses to open on it.
- **One checkpoint publisher.** ``publish_checkpoint`` holds the ``publisher`` row ``FOR UPDATE``
  while it signs, so checkpoints form one sequence however many workers end sessions at once; a
  new one is signed at most once per ``checkpoint_interval`` (server time), and a caller whose
  entries a stored checkpoint already covers gets that one without waiting.
- A session's row is locked ``FOR UPDATE`` in the same transaction before its head is read, and
  the writer's lease epoch is checked there against the lease row held ``FOR SHARE`` (fencing):
  a takeover waits for an admitted append; an append after a takeover is refused.

The tables live in one PostgreSQL schema (default ``truss``; ``?schema=NAME`` in the URL picks
another), so one database can hold several ledgers. Truss's own URL parameters (``schema``,
``checkpoint_interval``) are taken out before the rest goes to libpq. A password may come only
from the environment (``PGPASSWORD``), a passfile or a service file, never from the URL.

What it does not do: verify (``truss.ledger.audit``) or decide what a checkpoint says (``note``).
The writer side is in ``_pg_writer``, connection set-up and the tables in ``_pg_link``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from typing import Any, LiteralString, TypeVar

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from truss._clock import Clock
from truss._errors import KeyFileError, NotFoundError, StoreBusyError, StoreError
from truss.ledger.entry import Record, StoredEntry
from truss.ledger.keys import IdentityKey
from truss.ledger.merkle import EMPTY_ROOT, Frontier
from truss.ledger.stores._pg_link import (
    SCHEMA_VERSION,
    Conn,
    PgLink,
    insert_checkpoint,
    key_in_set,
    key_retired,
    missing_node,
    select_nodes,
)
from truss.ledger.stores._pg_url import DEFAULT_CHECKPOINT_INTERVAL_MS, PostgresTarget, parse_postgres_url
from truss.ledger.stores._pg_writer import LedgerImport, PostgresWriter, read_lease
from truss.ledger.stores._sql import SqlReads, checkpoint_of, stored_entry
from truss.ledger.stores.base import (
    DEFAULT_LEASE_MS,
    Lease,
    LeaseOwner,
    StoredCheckpoint,
    check_epoch,
    grant_lease,
    nodes_in_order,
)

__all__ = [
    "DEFAULT_CHECKPOINT_INTERVAL_MS",
    "SCHEMA_VERSION",
    "LedgerImport",
    "PostgresStore",
    "PostgresTarget",
    "open_postgresql",
    "parse_postgres_url",
]

_NOW_MS: LiteralString = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
_T = TypeVar("_T")


def open_postgresql(url: str, /, *, key: IdentityKey | None, clock: Clock, create: bool = True) -> PostgresStore:
    """Open (or create) the ledger a ``postgresql://`` URL names (the store registry's opener)."""
    return PostgresStore(parse_postgres_url(url), key=key, clock=clock, create=create)


class PostgresStore(SqlReads, mark="%s"):
    """A ``LedgerStore`` on PostgreSQL. Thread-safe; see the module docstring for the guarantees."""

    def __init__(
        self,
        target: PostgresTarget,
        *,
        key: IdentityKey | None,
        clock: Clock,
        create: bool = True,
        busy_timeout_ms: int = 30_000,
        group_commit: bool = True,
        pool_size: int = 4,
        origin: str | None = None,
    ) -> None:
        """``origin`` names a new ledger created without a key (migrate); otherwise the key's name does."""
        self.target = target
        self.db = target.shown
        self._key = key
        self._clock = clock
        self._busy_ms = busy_timeout_ms
        self._closed = False
        self._link = PgLink(target, busy_timeout_ms)
        self._pool: ConnectionPool[Conn] | None = None
        self._writer: PostgresWriter | None = None
        conn = self._link.connect()
        try:
            self._link.check_server(conn)
            self.origin: str = self._link.init_schema(
                conn,
                create=create,
                new_origin=key.name if key is not None else origin,
                founder=key.verifier.vkey if key is not None else None,
            )
            if key is not None and key.name != self.origin:
                raise KeyFileError(
                    f"the identity key is named {key.name!r} but the ledger {self.db} is the log {self.origin!r}",
                    remedy="use the key this ledger was created with (rotated keys keep the log's name)",
                    file=self.db,
                )
            if key is not None and key_retired(conn, key):
                raise KeyFileError(
                    f"the identity key {key.key_id} was retired by a key rotation or removed from the key set "
                    f"recorded in {self.db}",
                    remedy="use the current identity key; `truss key rotate` completes a rotation that was interrupted",
                    file=self.db,
                    reason="key_retired",
                )
            if key is not None and not key_in_set(conn, key):
                raise KeyFileError(
                    f"the identity key {key.key_id} is not in the key set of the log {self.origin!r} in {self.db}: "
                    "a worker signs entries only once the log key admitted it",
                    remedy="in the home holding the log key, run the `truss ledger keys add-worker` line "
                    "`truss init --join` printed for this home",
                    file=self.db,
                    reason="key_not_admitted",
                )
            self._writer = PostgresWriter(
                self._link, conn, key=key, clock=clock, origin=self.origin, group_commit=group_commit
            )
            self._pool = ConnectionPool(
                target.conninfo,
                min_size=1,
                max_size=max(1, pool_size),
                open=False,
                kwargs={"autocommit": True},
                configure=self._link.configure,
                timeout=busy_timeout_ms / 1000,
                name="truss-ledger",
            )
            try:
                self._pool.open(wait=True, timeout=busy_timeout_ms / 1000)
            except PoolTimeout as exc:
                raise StoreError(
                    f"{self.db}: could not open reading connections to PostgreSQL in {busy_timeout_ms} ms",
                    remedy="check the server's max_connections and that it accepts this role",
                    retryable=True,
                    db=self.db,
                ) from exc
        except BaseException:
            if self._writer is None:
                conn.close()
            self._close_connections()
            raise

    # -- connections ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def _reader(self) -> Generator[Conn]:
        self._check_open()
        assert self._pool is not None
        try:
            with self._pool.connection() as conn:
                yield conn
        except PoolTimeout as exc:
            raise StoreBusyError(
                f"{self.db}: no database connection became free in {self._busy_ms} ms",
                remedy="retry; if it persists, check the server's max_connections",
                retryable=True,
                db=self.db,
            ) from exc
        except psycopg.Error as exc:
            raise self._link.error("read", exc) from exc

    def _rows(self, query: LiteralString, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._reader() as conn:
            return conn.execute(query, params).fetchall()

    def _check_open(self) -> PostgresWriter:
        if self._closed or self._writer is None:
            raise StoreError(f"{self.db}: the store is closed", db=self.db)
        return self._writer

    def connection_settings(self) -> dict[str, str]:
        """What the append connection runs with (diagnostics; a test checks invariant 5's settings)."""
        return self._check_open().settings()

    def now_ms(self) -> int:
        """The injected clock's time (what entries and checkpoints record)."""
        return self._clock.now_ms()

    def stats(self) -> dict[str, int]:
        """Append transactions committed and batches they carried since opening (group commit at work)."""
        return self._check_open().stats()

    # -- writes --------------------------------------------------------------------------------

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

        ``epoch``: the writer's lease epoch, refused unless current (fencing).
        Committed (the WAL flushed, unless ``durable=False``) before it returns. ``expect_seq`` is
        the seq and ``expect_index`` the log index the first record must get; otherwise
        ``StoreConflictError`` and nothing is written. A key retired by a key rotation in the log
        signs nothing more (``StoreError``, ``reason="key_retired"``).
        """
        writer = self._check_open()
        if self._key is None:
            raise StoreError(f"{self.db}: opened without an identity key, so it cannot append", db=self.db)
        return writer.append(
            session, records, durable=durable, expect_seq=expect_seq, expect_index=expect_index, epoch=epoch
        )

    def bulk_append(self, batches: Iterable[tuple[str, Sequence[Record]]], *, per_txn: int = 1000) -> int:
        """Append many batches, ``per_txn`` batches per transaction (imports, benchmarks).

        Every transaction but the last commits with ``synchronous_commit = off``; the last one
        flushes them all. A failing batch raises and stops. Returns the number of entries appended.
        """
        writer = self._check_open()
        if self._key is None:
            raise StoreError(f"{self.db}: opened without an identity key, so it cannot append", db=self.db)
        return writer.bulk_append(batches, per_txn=per_txn)

    def importing(self) -> contextlib.AbstractContextManager[LedgerImport]:
        """One transaction that fills this empty ledger with another's entries, unchanged (migrate)."""
        return self._check_open().importing()

    # -- leases (one owner per session; docs/ledger-format.md, section 5) ----------------------

    def acquire_lease(self, session: str, owner: LeaseOwner, *, ttl_ms: int = DEFAULT_LEASE_MS) -> Lease:
        def grant(conn: Conn) -> Lease:
            # Serialises acquirers of one session across workers and hosts, even before its row exists.
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (session,))
            lease = grant_lease(read_lease(conn, session), session, owner, self._clock.now_ms(), ttl_ms)
            conn.execute(
                "INSERT INTO leases (session, owner, host, pid, epoch, acquired_ms, expires_ms)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (session) DO UPDATE SET owner = EXCLUDED.owner,"
                " host = EXCLUDED.host, pid = EXCLUDED.pid, epoch = EXCLUDED.epoch,"
                " acquired_ms = EXCLUDED.acquired_ms, expires_ms = EXCLUDED.expires_ms",
                (session, lease.owner, lease.host, lease.pid, lease.epoch, lease.acquired_ms, lease.expires_ms),
            )
            return lease

        return self._check_open().transaction(grant)

    def renew_lease(self, lease: Lease, *, ttl_ms: int = DEFAULT_LEASE_MS) -> Lease:
        def renew(conn: Conn) -> Lease:
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (lease.session,))
            check_epoch(lease.session, read_lease(conn, lease.session), lease.epoch)
            expires = self._clock.now_ms() + max(1, ttl_ms)
            conn.execute("UPDATE leases SET expires_ms = %s WHERE session = %s", (expires, lease.session))
            return Lease(lease.session, lease.owner, lease.host, lease.pid, lease.epoch, lease.acquired_ms, expires)

        return self._check_open().transaction(renew)

    def release_lease(self, lease: Lease) -> None:
        self._check_open().transaction(
            lambda conn: (
                conn.execute(
                    "UPDATE leases SET expires_ms = 0 WHERE session = %s AND epoch = %s", (lease.session, lease.epoch)
                ).rowcount
            )
        )

    def lease(self, session: str) -> Lease | None:
        return self._check_open().transaction(lambda conn: read_lease(conn, session))

    def erase_payloads(self, session: str) -> int:
        """Remove the session's payload bytes; returns how many refs were newly erased."""
        if self.session(session) is None:
            raise NotFoundError(f"no session {session!r} in {self.db}", what="session", name=session)
        counts = self._check_open().write(
            [
                (
                    "INSERT INTO erased (session, ref) SELECT session, ref FROM session_blobs WHERE session = %s"
                    " ON CONFLICT DO NOTHING",
                    (session,),
                ),
                ("DELETE FROM session_blobs WHERE session = %s", (session,)),
                (
                    "DELETE FROM blobs WHERE ref IN (SELECT ref FROM erased WHERE session = %s)"
                    " AND NOT EXISTS (SELECT 1 FROM session_blobs s WHERE s.ref = blobs.ref)",
                    (session,),
                ),
            ]
        )
        return counts[0]

    def add_checkpoint(self, size: int, root: bytes, note: str) -> None:
        """Keep a signed checkpoint; a second one at the same size must have the same root.

        When the one held comes back with more signature lines (witnesses' cosignatures), they
        are merged into it under the row's lock (``cosignature.merge_notes``).
        """
        self._check_open().add_checkpoint(size, root, note)

    def set_envelope(self, session: str, envelope: bytes) -> None:
        """Keep the session's verdict envelope beside its chain (it signs the head, so it cannot be in it)."""
        counts = self._check_open().write([("UPDATE sessions SET envelope = %s WHERE id = %s", (envelope, session))])
        if counts[0] == 0:
            raise NotFoundError(f"no session {session!r} in {self.db}", what="session", name=session)

    # -- the checkpoint publisher --------------------------------------------------------------

    def publish_checkpoint(self, covering: int, sign: Callable[[_CheckpointView], _T]) -> _T | None:
        """Sign a checkpoint as the one publisher, or find one that covers ``covering`` entries.

        Holds the ``publisher`` row ``FOR UPDATE``: publishers across every process take turns.
        When a stored checkpoint already covers ``covering`` entries, returns ``None`` (the caller
        reads it). Otherwise waits until ``checkpoint_interval`` has passed since the last one was
        published (server time, so hosts' clocks do not matter), then calls ``sign`` with a view
        of the store bound to this transaction; what ``sign`` stores commits with the publisher
        row. Waiting callers queue on the row lock and find the new checkpoint covers them.
        """
        interval = self.target.checkpoint_interval_ms
        try:
            with self._reader() as conn, conn.transaction():
                row = conn.execute(f"SELECT published_ms, {_NOW_MS} FROM publisher WHERE id = 0 FOR UPDATE").fetchone()  # noqa: S608
                if row is None:
                    raise StoreError(f"{self.db}: the publisher row is missing", db=self.db)
                latest = conn.execute("SELECT max(size) FROM checkpoints").fetchone()
                if latest is not None and latest[0] is not None and int(latest[0]) >= covering:
                    return None
                wait_ms = int(row[0]) + interval - int(row[1])
                if wait_ms > 0:
                    conn.execute("SELECT pg_sleep(%s)", (min(wait_ms, interval) / 1000,))
                view = _CheckpointView(self, conn)
                result = sign(view)
                conn.execute(
                    f"UPDATE publisher SET published_ms = {_NOW_MS}, size = %s WHERE id = 0",  # noqa: S608
                    (view.signed_size,),
                )
                return result
        except psycopg.Error as exc:
            raise self._link.error("checkpoint", exc) from exc

    def await_checkpoint(self, covering: int, timeout_ms: int) -> bool:
        """Wait (at most ``timeout_ms``, by the server's clock) until a stored checkpoint covers the
        first ``covering`` entries: how a worker, whose key signs no checkpoint, gets one the log
        key's publisher signed. True when one does."""
        try:
            with self._reader() as conn:
                row = conn.execute(f"SELECT {_NOW_MS}").fetchone()
                deadline = int(row[0] if row is not None else 0) + timeout_ms
                while True:
                    row = conn.execute(f"SELECT max(size), {_NOW_MS} FROM checkpoints").fetchone()  # noqa: S608
                    if row is not None and row[0] is not None and int(row[0]) >= covering:
                        return True
                    if row is None or int(row[1]) >= deadline:
                        return False
                    conn.execute("SELECT pg_sleep(0.05)")
        except psycopg.Error as exc:
            raise self._link.error("checkpoint", exc) from exc

    # -- reads ---------------------------------------------------------------------------------

    def _entry(self, row: Sequence[Any]) -> StoredEntry:
        # Rows edited outside Truss may hold anything (a NULL where bytes belong).
        return stored_entry(bytes(row[0] or b""), bytes(row[1] or b""), str(row[2]), bytes(row[3] or b"").hex())

    def blobs_for(self, refs: Iterable[str]) -> dict[str, bytes]:
        """The payloads held for ``refs`` (absent ones are left out), in one query."""
        wanted = sorted(set(refs))
        if not wanted:
            return {}
        rows = self._rows("SELECT ref, data FROM blobs WHERE ref = ANY(%s)", (wanted,))
        return {str(r[0]): bytes(r[1]) for r in rows}

    def _frontier_now(self) -> Frontier:
        rows = self._rows("SELECT frontier FROM tree WHERE id = 0")
        return Frontier.from_state(bytes(rows[0][0])) if rows else Frontier()

    def node(self, level: int, index: int) -> bytes:
        """The hash of the complete subtree ``(level, index)``; ``StoreError`` if it is not stored."""
        rows = self._rows("SELECT hash FROM nodes WHERE level = %s AND idx = %s", (level, index))
        if not rows:
            raise missing_node(self.db, level, index)
        return bytes(rows[0][0])

    def nodes(self, keys: Sequence[tuple[int, int]]) -> dict[tuple[int, int], bytes]:
        return select_nodes(self._rows, self.db, keys) if keys else {}

    def node_hashes(self, keys: Iterable[tuple[int, int]]) -> Iterator[bytes]:
        return nodes_in_order(self.nodes, keys)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._close_connections()

    def _close_connections(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self._writer is not None:
            self._writer.close()


class _CheckpointView:
    """The store as the checkpoint publisher's transaction sees it (``note.CheckpointStore``)."""

    def __init__(self, store: PostgresStore, conn: Conn) -> None:
        self.origin = store.origin
        self._store = store
        self._conn = conn
        self._now_ms = store.now_ms
        self.signed_size = 0

    def tree_head(self) -> tuple[int, bytes]:
        row = self._conn.execute("SELECT frontier FROM tree WHERE id = 0").fetchone()
        frontier = Frontier.from_state(bytes(row[0])) if row else Frontier()
        return frontier.size, frontier.root() if frontier.size else EMPTY_ROOT

    def node(self, level: int, index: int) -> bytes:
        row = self._conn.execute("SELECT hash FROM nodes WHERE level = %s AND idx = %s", (level, index)).fetchone()
        if row is None:
            raise missing_node(self._store.db, level, index)
        return bytes(row[0])

    def nodes(self, keys: Sequence[tuple[int, int]]) -> dict[tuple[int, int], bytes]:
        return select_nodes(lambda q, p: self._conn.execute(q, p).fetchall(), self._store.db, keys) if keys else {}

    def checkpoints(self) -> list[StoredCheckpoint]:
        return [checkpoint_of(r) for r in self._conn.execute(self._store.read_sql.checkpoints)]

    def latest_checkpoint(self) -> StoredCheckpoint | None:
        r = self._conn.execute(self._store.read_sql.latest).fetchone()
        return None if r is None else checkpoint_of(r)

    def checkpoint_covering(self, size: int) -> StoredCheckpoint | None:
        r = self._conn.execute(self._store.read_sql.covering, (size,)).fetchone()
        return None if r is None else checkpoint_of(r)

    def add_checkpoint(self, size: int, root: bytes, note: str) -> None:
        insert_checkpoint(self._conn, self._store.db, self._now_ms(), size=size, root=root, note=note)
        self.signed_size = size
