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
- A session's row is locked ``FOR UPDATE`` in the same transaction before its head is read: that
  is where a lease epoch check (fencing) goes, as one more predicate on the same row lock.

The tables live in one PostgreSQL schema (default ``truss``; ``?schema=NAME`` in the URL picks
another), so one database can hold several ledgers. Truss's own URL parameters (``schema``,
``checkpoint_interval``) are taken out before the rest goes to libpq. A password may come only
from the environment (``PGPASSWORD``), a passfile or a service file, never from the URL.

What it does not do: verify (``truss.ledger.verify``) or decide what a checkpoint says (``note``).
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, LiteralString, TypeVar

import psycopg
import psycopg.errors
from psycopg import sql
from psycopg_pool import ConnectionPool, PoolTimeout

from truss._clock import Clock
from truss._errors import (
    InputError,
    KeyFileError,
    NotFoundError,
    StoreBusyError,
    StoreConflictError,
    StoreError,
    TrussError,
)
from truss.ledger.canonical import CanonicalError, canonical
from truss.ledger.entry import ZERO_HASH, Record, StoredEntry, encode_record, seal
from truss.ledger.keys import IdentityKey
from truss.ledger.merkle import EMPTY_ROOT, Frontier, leaf_hash
from truss.ledger.store import SessionInfo, StoredCheckpoint, check_status, session_fields
from truss.ledger.stores._pg_url import DEFAULT_CHECKPOINT_INTERVAL_MS, PostgresTarget, parse_postgres_url

__all__ = [
    "DEFAULT_CHECKPOINT_INTERVAL_MS",
    "SCHEMA_VERSION",
    "LedgerImport",
    "PostgresStore",
    "PostgresTarget",
    "open_postgresql",
    "parse_postgres_url",
]

SCHEMA_VERSION = 1
_PAGE = 1000
_COPY_FROM = 16  # entries in one batch from which COPY beats INSERT
_NOW_MS: LiteralString = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
_T = TypeVar("_T")


def open_postgresql(url: str, /, *, key: IdentityKey | None, clock: Clock, create: bool = True) -> PostgresStore:
    """Open (or create) the ledger a ``postgresql://`` URL names (the store registry's opener)."""
    return PostgresStore(parse_postgres_url(url), key=key, clock=clock, create=create)


@dataclass(frozen=True)
class _SessionHead:
    seq: int
    head: str
    ended: bool


def _seal_batch(
    key: IdentityKey,
    *,
    origin: str,
    session: str,
    head: _SessionHead | None,
    records: Sequence[Record],
    bodies: Sequence[bytes],
    index: int,
    now_ms: Callable[[], int],
    expect_seq: int | None,
) -> list[StoredEntry]:
    """The signed entries ``records`` become at log ``index`` (the session rules every store applies)."""
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
        try:
            entry = seal(
                key,
                log=origin,
                session=session,
                seq=seq,
                index=index,
                ts=now_ms(),
                kind=record.kind,
                body=record.body,
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


class _Pending:
    """One caller's batch waiting for a group commit."""

    __slots__ = ("bodies", "done", "durable", "error", "expect_seq", "records", "result", "session", "wake")

    def __init__(self, session: str, records: Sequence[Record], durable: bool, expect_seq: int | None) -> None:
        self.bodies = [encode_record(record) for record in records]  # in the caller's thread
        self.session = session
        self.records = records
        self.durable = durable
        self.expect_seq = expect_seq
        self.result: list[StoredEntry] = []
        self.error: TrussError | None = None
        self.done = False
        self.wake: threading.Event | None = None


_TABLES: LiteralString = """
CREATE TABLE IF NOT EXISTS meta (k text PRIMARY KEY, v bytea NOT NULL);
CREATE TABLE IF NOT EXISTS tree (
    id smallint PRIMARY KEY CHECK (id = 0),
    size bigint NOT NULL,
    frontier bytea NOT NULL
);
CREATE TABLE IF NOT EXISTS entries (
    idx bigint PRIMARY KEY,
    session text NOT NULL,
    seq bigint NOT NULL,
    kind text NOT NULL,
    ts bigint NOT NULL,
    hash bytea NOT NULL,
    raw bytea NOT NULL,
    sig bytea NOT NULL,
    keyid text NOT NULL,
    UNIQUE (session, seq)
);
CREATE TABLE IF NOT EXISTS sessions (
    id text PRIMARY KEY,
    contract text,
    principal text,
    status text NOT NULL,
    entries bigint NOT NULL,
    started_ms bigint NOT NULL,
    updated_ms bigint NOT NULL,
    head bytea NOT NULL,
    ended boolean NOT NULL DEFAULT false,
    envelope bytea
);
CREATE INDEX IF NOT EXISTS sessions_by_start ON sessions (started_ms DESC, id DESC);
CREATE TABLE IF NOT EXISTS blobs (ref text PRIMARY KEY, data bytea NOT NULL);
CREATE TABLE IF NOT EXISTS session_blobs (session text NOT NULL, ref text NOT NULL, PRIMARY KEY (session, ref));
CREATE INDEX IF NOT EXISTS session_blobs_by_ref ON session_blobs (ref);
CREATE TABLE IF NOT EXISTS erased (session text NOT NULL, ref text NOT NULL, PRIMARY KEY (session, ref));
CREATE TABLE IF NOT EXISTS nodes (
    level smallint NOT NULL, idx bigint NOT NULL, hash bytea NOT NULL, PRIMARY KEY (level, idx)
);
CREATE TABLE IF NOT EXISTS checkpoints (
    size bigint PRIMARY KEY, root bytea NOT NULL, note text NOT NULL, created_ms bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS publisher (
    id smallint PRIMARY KEY CHECK (id = 0),
    published_ms bigint NOT NULL,
    size bigint NOT NULL
)
"""

# The session's row lock, taken after the tree row's: a lease's epoch check (fencing) is one more
# predicate on this row, in this same transaction.
_SESSION_LOCK: LiteralString = "SELECT entries, head, ended FROM sessions WHERE id = %s FOR UPDATE"
_SESSION_SELECT: LiteralString = (
    "SELECT id, contract, principal, status, entries, started_ms, updated_ms, head, ended FROM sessions"
)

Conn = psycopg.Connection[tuple[Any, ...]]


class PostgresStore:
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
        self.target = target
        # The log a new ledger is named after: the key's name, or ``origin`` for a copy (migrate).
        self._new_origin = key.name if key is not None else origin
        self.db = target.shown
        self._key = key
        self._clock = clock
        self._busy_ms = busy_timeout_ms
        self._group = group_commit
        self._wlock = threading.Lock()
        self._qlock = threading.Lock()
        self._queue: list[_Pending] = []
        self._leading = False
        self._commits = 0
        self._batches = 0
        self._closed = False
        self._w: Conn | None = None
        self._pool: ConnectionPool[Conn] | None = None
        try:
            self._w = self._connect()
            self._check_durability(self._w)
            self.origin: str = self._init_schema(self._w, create=create)
            self._pool = ConnectionPool(
                target.conninfo,
                min_size=1,
                max_size=max(1, pool_size),
                open=False,
                kwargs={"autocommit": True},
                configure=self._configure,
                timeout=busy_timeout_ms / 1000,
                name="truss-ledger",
            )
            self._pool.open(wait=True, timeout=busy_timeout_ms / 1000)
        except BaseException:
            self._close_connections()
            raise
        if key is not None and key.name != self.origin:
            self._close_connections()
            raise KeyFileError(
                f"the identity key is named {key.name!r} but the ledger {self.db} is the log {self.origin!r}",
                remedy="use the key this ledger was created with (rotated keys keep the log's name)",
                file=self.db,
            )

    # -- connections ---------------------------------------------------------------------------

    def _connect(self) -> Conn:
        try:
            conn: Conn = psycopg.connect(
                self.target.conninfo, autocommit=True, connect_timeout=max(1, self._busy_ms // 1000)
            )
        except psycopg.Error as exc:
            raise StoreError(
                f"cannot connect to the PostgreSQL ledger {self.db}: {_first_line(exc)}",
                remedy="check that the server runs and the URL names it; a password comes from PGPASSWORD, "
                "a passfile or a service file",
                db=self.db,
            ) from exc
        try:
            self._configure(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _configure(self, conn: Conn) -> None:
        """Every connection: durable commits, read committed, bounded lock waits, our schema only."""
        # Invariant 5: a commit is flushed before it is reported. Only "off" skips the local WAL
        # flush; a stronger setting the operator chose (remote_apply ...) is kept.
        level = conn.execute("SELECT current_setting('synchronous_commit')").fetchone()
        if level is None or level[0] == "off":
            conn.execute("SET synchronous_commit TO on")
            level = conn.execute("SELECT current_setting('synchronous_commit')").fetchone()
            if level is None or level[0] == "off":
                raise StoreError(
                    f"{self.db}: synchronous_commit stays off on this connection",
                    remedy="allow sessions to set synchronous_commit (a pooler may be resetting it)",
                    reason="unsafe_server",
                    db=self.db,
                )
        conn.execute("SET default_transaction_isolation TO 'read committed'")
        conn.execute(sql.SQL("SET lock_timeout TO {}").format(sql.Literal(f"{int(self._busy_ms)}ms")))
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(self.target.schema)))

    def _check_durability(self, conn: Conn) -> None:
        # Invariant 5: a commit must be on disk before anything that depends on it happens.
        row = conn.execute("SELECT current_setting('fsync')").fetchone()
        fsync = "" if row is None else str(row[0])
        if fsync != "on":
            raise StoreError(
                f"the PostgreSQL server of {self.db} runs with fsync = {fsync}: it loses committed "
                "entries in a crash, which breaks 'durable before dependent'",
                remedy="set fsync = on in postgresql.conf and reload the server",
                reason="unsafe_server",
                db=self.db,
            )

    def _init_schema(self, conn: Conn, *, create: bool) -> str:
        schema = sql.Identifier(self.target.schema)
        try:
            present = conn.execute("SELECT to_regclass('meta') IS NOT NULL, to_regclass('entries') IS NOT NULL")
            meta, entries = present.fetchone() or (False, False)
            if not meta:
                if entries or self._has_tables(conn):
                    raise InputError(
                        f"{self.db}: the schema {self.target.schema!r} holds tables but is not a Truss ledger",
                        remedy="name another schema with ?schema=NAME, or another database",
                        db=self.db,
                    )
                if not create:
                    raise NotFoundError(
                        f"no ledger at {self.db} (schema {self.target.schema!r})",
                        remedy="run a contract with this --db first, or `truss ledger migrate` into it",
                        what="ledger",
                    )
                if self._new_origin is None:
                    raise KeyFileError(
                        f"cannot create the ledger {self.db} without an identity key",
                        remedy="run `truss init` to create the key first",
                        file=self.db,
                    )
                with conn.transaction():
                    # Two processes creating one ledger at once: the second waits, then finds it.
                    conn.execute("SELECT pg_advisory_xact_lock(hashtext('truss.ledger.schema'))")
                    conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(schema))
                    conn.execute(_TABLES)
                    conn.execute(
                        "INSERT INTO meta (k, v) VALUES ('schema', %s), ('origin', %s) ON CONFLICT (k) DO NOTHING",
                        (str(SCHEMA_VERSION).encode(), self._new_origin.encode("utf-8")),
                    )
                    conn.execute(
                        "INSERT INTO tree (id, size, frontier) VALUES (0, 0, %s) ON CONFLICT (id) DO NOTHING",
                        (Frontier().to_state(),),
                    )
                    conn.execute(
                        "INSERT INTO publisher (id, published_ms, size) VALUES (0, 0, 0) ON CONFLICT (id) DO NOTHING"
                    )
            rows = dict(conn.execute("SELECT k, v FROM meta WHERE k IN ('schema', 'origin')").fetchall())
        except psycopg.Error as exc:
            raise self._store_error("open", exc) from exc
        version = bytes(rows.get("schema", b"0")).decode("utf-8", "replace")
        if not version.isdigit() or int(version) != SCHEMA_VERSION:
            raise StoreError(
                f"{self.db} holds a ledger of schema {version!r}; this Truss reads schema {SCHEMA_VERSION}",
                remedy="use the Truss version that wrote it (a newer one reads older schemas)",
                db=self.db,
            )
        return bytes(rows["origin"]).decode("utf-8")

    def _has_tables(self, conn: Conn) -> bool:
        row = conn.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = %s", (self.target.schema,)
        ).fetchone()
        return bool(row and row[0])

    def _store_error(self, what: str, exc: psycopg.Error) -> StoreError:
        if isinstance(exc, psycopg.errors.LockNotAvailable | psycopg.errors.QueryCanceled):
            return StoreBusyError(
                f"{self.db}: the ledger stayed locked by another writer for {self._busy_ms} ms",
                remedy="another Truss process is writing; retry when it finishes",
                retryable=True,
                db=self.db,
            )
        if isinstance(exc, psycopg.errors.UniqueViolation):
            return StoreConflictError(
                f"{self.db}: another writer recorded this step ({_first_line(exc)})",
                remedy="re-read the session and retry from its head",
                db=self.db,
            )
        if isinstance(exc, psycopg.OperationalError):
            return StoreError(
                f"{self.db}: ledger {what} failed: the connection to PostgreSQL failed: {_first_line(exc)}",
                remedy="check that the server runs; the last committed state is intact",
                retryable=True,
                db=self.db,
            )
        return StoreError(
            f"{self.db}: ledger {what} failed: {type(exc).__name__}: {_first_line(exc)}",
            remedy="check the server's log and the role's privileges; the last committed state is intact",
            db=self.db,
        )

    def _writer(self) -> Conn:
        """The append connection (reconnected if the server dropped it); call with ``_wlock`` held."""
        self._check_open()
        if self._w is None or self._w.closed or self._w.broken:
            if self._w is not None:
                with contextlib.suppress(psycopg.Error):
                    self._w.close()
            self._w = self._connect()
        return self._w

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
            raise self._store_error("read", exc) from exc

    def _rows(self, query: LiteralString, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._reader() as conn:
            return conn.execute(query, params).fetchall()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"{self.db}: the store is closed", db=self.db)

    def connection_settings(self) -> dict[str, str]:
        """What the append connection runs with (diagnostics; a test checks invariant 5's settings)."""
        with self._wlock:
            conn = self._writer()
            names = ("fsync", "synchronous_commit", "default_transaction_isolation", "lock_timeout", "search_path")
            return {
                name: str((conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(name))).fetchone() or ("",))[0])
                for name in names
            }

    def now_ms(self) -> int:
        """The injected clock's time (what entries and checkpoints record)."""
        return self._clock.now_ms()

    def stats(self) -> dict[str, int]:
        """Append transactions committed and batches they carried since opening (group commit at work)."""
        return {"commits": self._commits, "batches": self._batches}

    # -- append (group commit) -------------------------------------------------------------------

    def append(
        self, session: str, records: Sequence[Record], *, durable: bool = True, expect_seq: int | None = None
    ) -> list[StoredEntry]:
        """Append ``records`` to ``session`` as consecutive entries; returns them signed.

        Committed (the WAL flushed, unless ``durable=False``) before it returns. ``expect_seq`` is
        the seq the first record must get; otherwise ``StoreConflictError`` and nothing is written.
        """
        self._check_open()
        if self._key is None:
            raise StoreError(f"{self.db}: opened without an identity key, so it cannot append", db=self.db)
        if not records:
            return []
        pending = _Pending(session, list(records), durable, expect_seq)
        if not self._group:
            with self._wlock:
                self._commit_group([pending])
        else:
            # Leader/follower, as in the SQLite store: the first caller to find no leader commits
            # everything queued, then wakes the oldest waiter to lead the next group.
            with self._qlock:
                self._queue.append(pending)
                lead = not self._leading
                self._leading = True
                if not lead:
                    pending.wake = threading.Event()
            if pending.wake is not None:
                pending.wake.wait()
            if not pending.done:
                self._lead()
        if pending.error is not None:
            raise pending.error
        return pending.result

    def _lead(self) -> None:
        try:
            with self._qlock:
                group, self._queue = self._queue, []
            with self._wlock:
                self._commit_group(group)
        finally:
            with self._qlock:
                if self._queue:
                    wake = self._queue[0].wake
                    assert wake is not None
                    wake.set()
                else:
                    self._leading = False

    def bulk_append(self, batches: Iterable[tuple[str, Sequence[Record]]], *, per_txn: int = 1000) -> int:
        """Append many batches, ``per_txn`` batches per transaction (imports, benchmarks).

        Every transaction but the last commits with ``synchronous_commit = off``; the last one
        flushes them all. A failing batch raises and stops. Returns the number of entries appended.
        """
        self._check_open()
        count = 0
        chunk: list[_Pending] = []

        def flush(last: bool) -> None:
            nonlocal count
            for p in chunk:
                p.durable = False
            if last and chunk:
                chunk[-1].durable = True
            with self._wlock:
                self._commit_group(chunk)
            for p in chunk:
                if p.error is not None:
                    raise p.error
                count += len(p.result)
            chunk.clear()

        for session, records in batches:
            chunk.append(_Pending(session, list(records), False, None))
            if len(chunk) >= per_txn:
                flush(False)
        flush(True)
        return count

    def _commit_group(self, group: list[_Pending]) -> None:
        """Commit every batch of ``group`` in one transaction; sets each one's result or error."""
        if not group:
            return
        try:
            conn = self._writer()
        except TrussError as exc:
            self._fail_all(group, exc)
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
                first = conn.execute(_SESSION_LOCK, (group[0].session,)) if pipelined else None
                frontier = self._frontier(tree.fetchone(), top.fetchone())
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
                    for pending in group:
                        saved = frontier.to_state()
                        try:
                            with conn.transaction():  # a savepoint: one failing batch fails alone
                                row = conn.execute(_SESSION_LOCK, (pending.session,)).fetchone()
                                pending.result = self._apply(conn, pending, next_index, frontier, row)
                            next_index += len(pending.result)
                        except (TrussError, psycopg.errors.IntegrityError) as exc:
                            frontier = Frontier.from_state(saved)
                            pending.result = []
                            pending.error = self._batch_error(pending, exc)
                conn.execute(
                    "UPDATE tree SET size = %s, frontier = %s WHERE id = 0", (frontier.size, frontier.to_state())
                )
            self._commits += 1
            self._batches += len(group)
        except TrussError as exc:
            self._fail_all(group, exc if len(group) > 1 else self._batch_error(group[0], exc))
            return
        except psycopg.errors.IntegrityError as exc:
            self._fail_all(
                group, self._batch_error(group[0], exc) if len(group) == 1 else self._store_error("append", exc)
            )
            return
        except psycopg.Error as exc:
            self._fail_all(group, self._store_error("append", exc))
            return
        except BaseException:
            self._fail_all(group, StoreError(f"{self.db}: append interrupted", db=self.db))
            raise
        for pending in group:
            pending.done = True
            if pending.wake is not None:
                pending.wake.set()

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

    @staticmethod
    def _batch_error(pending: _Pending, exc: TrussError | psycopg.errors.IntegrityError) -> TrussError:
        if isinstance(exc, TrussError):
            return exc
        return StoreConflictError(
            f"session {pending.session}: another writer recorded this step ({_first_line(exc)})",
            remedy="re-read the session and retry from its head",
            session=pending.session,
        )

    @staticmethod
    def _fail_all(group: list[_Pending], exc: TrussError) -> None:
        for pending in group:
            if pending.error is None:
                pending.error = exc
            pending.result = []
            pending.done = True
            if pending.wake is not None:
                pending.wake.set()

    def _apply(
        self, conn: Conn, pending: _Pending, index: int, frontier: Frontier, row: tuple[Any, ...] | None
    ) -> list[StoredEntry]:
        """Seal ``pending`` at ``index`` and write it; ``row`` is its session's row, locked (``_SESSION_LOCK``)."""
        key = self._key
        assert key is not None
        session, records = pending.session, pending.records
        head = None if row is None else _SessionHead(int(row[0]), bytes(row[1]).hex(), bool(row[2]))
        out = _seal_batch(
            key,
            origin=self.origin,
            session=session,
            head=head,
            records=records,
            bodies=pending.bodies,
            index=index,
            now_ms=self._clock.now_ms,
            expect_seq=pending.expect_seq,
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
        last = out[-1]
        ended = last.kind == "session_ended"
        if head is None:
            contract, principal = session_fields(records[0])
            conn.execute(
                "INSERT INTO sessions (id, contract, principal, status, entries, started_ms, updated_ms, head, ended)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                (
                    session,
                    contract,
                    None if principal is None else canonical(principal).decode("utf-8"),
                    "ended" if ended else "running",
                    last.seq + 1,
                    out[0].ts,
                    last.ts,
                    bytes.fromhex(last.hash),
                    ended,
                ),
            )
        else:
            conn.execute(
                "UPDATE sessions SET entries = %s, head = %s, updated_ms = %s, ended = %s,"
                " status = CASE WHEN %s AND status = 'running' THEN 'ended' ELSE status END WHERE id = %s",
                (last.seq + 1, bytes.fromhex(last.hash), last.ts, ended, ended, session),
            )
        return out

    # -- other writes --------------------------------------------------------------------------

    def _write(self, steps: Sequence[tuple[LiteralString, tuple[Any, ...]]]) -> list[int]:
        """Run statements in one durable transaction; returns each one's row count."""
        with self._wlock:
            conn = self._writer()
            try:
                with conn.transaction():
                    counts: list[int] = []
                    for query, params in steps:
                        counts.append(conn.execute(query, params).rowcount)
                    return counts
            except psycopg.Error as exc:
                raise self._store_error("write", exc) from exc

    def set_status(self, session: str, status: str) -> None:
        """Set the listing status (``running``, ``suspended``, ``pass`` ...); not part of the chain."""
        check_status(status)
        counts = self._write(
            [
                (
                    "UPDATE sessions SET status = %s, updated_ms = %s WHERE id = %s",
                    (status, self._clock.now_ms(), session),
                )
            ]
        )
        if counts[0] == 0:
            raise NotFoundError(f"no session {session!r} in {self.db}", what="session", name=session)

    def erase_payloads(self, session: str) -> int:
        """Remove the session's payload bytes; returns how many refs were newly erased."""
        if self.session(session) is None:
            raise NotFoundError(f"no session {session!r} in {self.db}", what="session", name=session)
        counts = self._write(
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
        """Keep a signed checkpoint; a second one at the same size must have the same root."""
        with self._wlock:
            conn = self._writer()
            try:
                _insert_checkpoint(conn, self.db, self._clock.now_ms(), size=size, root=root, note=note)
            except psycopg.Error as exc:
                raise self._store_error("write", exc) from exc

    def set_envelope(self, session: str, envelope: bytes) -> None:
        """Keep the session's verdict envelope beside its chain (it signs the head, so it cannot be in it)."""
        counts = self._write([("UPDATE sessions SET envelope = %s WHERE id = %s", (envelope, session))])
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
            raise self._store_error("checkpoint", exc) from exc

    # -- copying a whole ledger in (migrate) ----------------------------------------------------

    @contextlib.contextmanager
    def importing(self) -> Generator[LedgerImport]:
        """One transaction that fills this empty ledger with another ledger's signed entries.

        The entries keep their bytes and signatures (nothing is re-signed); the Merkle nodes and
        frontier are computed here from the bytes. If the block raises, nothing is written.
        ``StoreConflictError`` when the ledger is not empty.
        """
        with self._wlock:
            conn = self._writer()
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
                raise self._store_error("migrate", exc) from exc

    # -- reads ---------------------------------------------------------------------------------

    @staticmethod
    def _session_info(row: tuple[Any, ...]) -> SessionInfo:
        return SessionInfo(
            id=str(row[0]),
            contract=row[1],
            principal=None if row[2] is None else json.loads(row[2]),
            status=str(row[3]),
            entries=int(row[4]),
            started_ms=int(row[5]),
            updated_ms=int(row[6]),
            head=bytes(row[7]).hex(),
            ended=bool(row[8]),
        )

    def session(self, session: str) -> SessionInfo | None:
        rows = self._rows(_SESSION_SELECT + " WHERE id = %s", (session,))
        return self._session_info(rows[0]) if rows else None

    def sessions(
        self, *, status: str | None = None, limit: int | None = None, principal: Any = None
    ) -> list[SessionInfo]:
        """Sessions, most recently started first; filtered by status and principal (JSON equality)."""
        where: list[LiteralString] = []
        params: list[Any] = []
        if status is not None:
            where.append("status = %s")
            params.append(status)
        if principal is not None:
            where.append("principal = %s")
            params.append(canonical(principal).decode("utf-8"))
        query = _SESSION_SELECT
        if where:
            query += " WHERE " + " AND ".join(where)
        query += " ORDER BY started_ms DESC, id DESC"
        if limit is not None:
            query += " LIMIT %s"
            params.append(max(0, limit))
        return [self._session_info(r) for r in self._rows(query, tuple(params))]

    @staticmethod
    def _entry(row: tuple[Any, ...]) -> StoredEntry:
        # Rows edited outside Truss may hold anything: hand verification an entry it reports as
        # malformed rather than failing here.
        raw, sig, keyid, digest = bytes(row[0] or b""), bytes(row[1] or b""), str(row[2]), bytes(row[3] or b"").hex()
        try:
            return StoredEntry.from_raw(raw, sig, keyid, digest)
        except (ValueError, UnicodeDecodeError):
            return StoredEntry(entry={"unreadable": True}, hash=digest, sig=sig, keyid=keyid, raw=raw or b"-")

    def read_session(self, session: str, *, from_seq: int = 0) -> Iterator[StoredEntry]:
        """The session's entries in seq order from ``from_seq``, read a page at a time."""
        seq = from_seq
        while True:
            rows = self._rows(
                "SELECT raw, sig, keyid, hash, seq FROM entries WHERE session = %s AND seq >= %s ORDER BY seq LIMIT %s",
                (session, seq, _PAGE),
            )
            for row in rows:
                yield self._entry(row)
            if len(rows) < _PAGE:
                return
            seq = int(rows[-1][4]) + 1

    def read_range(self, start: int, stop: int) -> Iterator[StoredEntry]:
        """Entries with ``start <= index < stop`` in index order, read a page at a time."""
        index = max(0, start)
        while index < stop:
            rows = self._rows(
                "SELECT raw, sig, keyid, hash, idx FROM entries WHERE idx >= %s AND idx < %s ORDER BY idx LIMIT %s",
                (index, stop, _PAGE),
            )
            for row in rows:
                yield self._entry(row)
            if len(rows) < _PAGE:
                return
            index = int(rows[-1][4]) + 1

    def blob(self, ref: str) -> bytes | None:
        rows = self._rows("SELECT data FROM blobs WHERE ref = %s", (ref,))
        return bytes(rows[0][0]) if rows else None

    def blobs_for(self, refs: Iterable[str]) -> dict[str, bytes]:
        """The payloads held for ``refs`` (absent ones are left out), in one query."""
        wanted = sorted(set(refs))
        if not wanted:
            return {}
        rows = self._rows("SELECT ref, data FROM blobs WHERE ref = ANY(%s)", (wanted,))
        return {str(r[0]): bytes(r[1]) for r in rows}

    def erased_refs(self, session: str) -> set[str]:
        return {str(r[0]) for r in self._rows("SELECT ref FROM erased WHERE session = %s", (session,))}

    def session_refs(self, session: str) -> set[str]:
        """Refs whose bytes this session still links to."""
        return {str(r[0]) for r in self._rows("SELECT ref FROM session_blobs WHERE session = %s", (session,))}

    def _frontier_now(self) -> Frontier:
        rows = self._rows("SELECT frontier FROM tree WHERE id = 0")
        return Frontier.from_state(bytes(rows[0][0])) if rows else Frontier()

    def tree_size(self) -> int:
        return self._frontier_now().size

    def tree_root(self) -> bytes:
        return self._frontier_now().root()

    def tree_head(self) -> tuple[int, bytes]:
        """``(size, root)`` read together, so an append in between cannot split them."""
        frontier = self._frontier_now()
        return frontier.size, frontier.root() if frontier.size else EMPTY_ROOT

    def node(self, level: int, index: int) -> bytes:
        """The hash of the complete subtree ``(level, index)``; ``StoreError`` if it is not stored."""
        rows = self._rows("SELECT hash FROM nodes WHERE level = %s AND idx = %s", (level, index))
        if not rows:
            raise _missing_node(self.db, level, index)
        return bytes(rows[0][0])

    def checkpoints(self) -> list[StoredCheckpoint]:
        rows = self._rows("SELECT size, root, note, created_ms FROM checkpoints ORDER BY size")
        return [StoredCheckpoint(int(r[0]), bytes(r[1]), str(r[2]), int(r[3])) for r in rows]

    def envelope(self, session: str) -> bytes | None:
        rows = self._rows("SELECT envelope FROM sessions WHERE id = %s", (session,))
        return bytes(rows[0][0]) if rows and rows[0][0] is not None else None

    def close(self) -> None:
        if self._closed:
            return
        with self._wlock:
            self._closed = True
            self._close_connections()

    def _close_connections(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self._w is not None:
            with contextlib.suppress(psycopg.Error):
                self._w.close()
            self._w = None

    def __enter__(self) -> PostgresStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
            raise _missing_node(self._store.db, level, index)
        return bytes(row[0])

    def checkpoints(self) -> list[StoredCheckpoint]:
        rows = self._conn.execute("SELECT size, root, note, created_ms FROM checkpoints ORDER BY size").fetchall()
        return [StoredCheckpoint(int(r[0]), bytes(r[1]), str(r[2]), int(r[3])) for r in rows]

    def add_checkpoint(self, size: int, root: bytes, note: str) -> None:
        _insert_checkpoint(self._conn, self._store.db, self._now_ms(), size=size, root=root, note=note)
        self.signed_size = size


def _insert_checkpoint(conn: Conn, db: str, now_ms: int, *, size: int, root: bytes, note: str) -> None:
    conn.execute(
        "INSERT INTO checkpoints (size, root, note, created_ms) VALUES (%s, %s, %s, %s) ON CONFLICT (size) DO NOTHING",
        (size, root, note, now_ms),
    )
    held = conn.execute("SELECT root FROM checkpoints WHERE size = %s", (size,)).fetchone()
    if held is not None and bytes(held[0]) != root:
        raise StoreConflictError(
            f"{db}: a checkpoint of size {size} with another root is already stored",
            remedy="the log was forked: run `truss ledger verify --all`",
            size=size,
        )


def _missing_node(db: str, level: int, index: int) -> StoreError:
    return StoreError(
        f"{db}: Merkle node ({level}, {index}) is not stored",
        remedy="run `truss ledger verify --all`; the tree may have been modified",
        db=db,
        level=level,
        index=index,
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
