"""Ledger storage: the store interface every backend implements, and the SQLite store.

The store is the one place that assigns an entry's ``seq``, ``prev``, ``index`` and ``ts`` and
signs it, inside its writer transaction, so two writers can never record the same step
(``UNIQUE(session, seq)``, ``UNIQUE(idx)``) and every entry is leaf ``index`` of the Merkle log,
whose completed nodes and frontier are written in the same transaction (O(log n) per append).

SQLite specifics (docs/ledger-format.md, section 5):

- WAL journal, ``busy_timeout``, ``synchronous=FULL`` on every commit except batches appended
  with ``durable=False`` ("process" durability: survives a crash of Truss, not of the machine).
- Group commit: ``append`` is thread-safe; concurrent callers queue their batches and whichever
  thread holds the writer lock commits every queued batch in one transaction (each batch in its
  own savepoint, so one failing batch does not fail the others), sharing one fsync.
- ``BEGIN IMMEDIATE`` for every write: a second process waits up to the busy timeout and then
  gets ``StoreBusyError``; it never interleaves or corrupts.
- Blobs are content-addressed (bytes checked against their ref before writing); erasing a
  session's payloads removes its blob links, records which refs were erased, and deletes bytes no
  other session links to. Entries only hold refs, so the chain still verifies.

What it does not do: verify (``verify``), decide checkpoints (``note``) or build bundles.
Reads are paged (``_PAGE`` rows per query) so iterating a large ledger never loads it whole.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

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
from truss.ledger.cosignature import merge_notes
from truss.ledger.entry import ZERO_HASH, Record, StoredEntry, encode_record, seal
from truss.ledger.keyhistory import LOG_SESSION
from truss.ledger.keys import IdentityKey
from truss.ledger.merkle import EMPTY_ROOT, Frontier, leaf_hash

__all__ = [
    "SCHEMA_VERSION",
    "LedgerStore",
    "SessionInfo",
    "SqliteStore",
    "StoredCheckpoint",
    "open_store",
]

SCHEMA_VERSION = 1
_PAGE = 1000
_IN_CHUNK = 500  # refs per IN (...) query, below SQLite's bound on parameters
_STATUS_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz_")


@dataclass(frozen=True)
class SessionInfo:
    """A row of the sessions table: derived from the chain, kept for listing (not signed)."""

    id: str
    contract: str | None
    status: str
    entries: int
    started_ms: int
    updated_ms: int
    head: str
    principal: Any = None
    ended: bool = False

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
        }


@dataclass(frozen=True)
class StoredCheckpoint:
    """A signed checkpoint the store keeps: tree ``size``, ``root`` and the signed note text."""

    size: int
    root: bytes
    note: str
    created_ms: int = 0


@runtime_checkable
class LedgerStore(Protocol):
    """What every ledger store provides (``truss.testing.check_ledger_store`` checks it)."""

    origin: str

    def append(
        self,
        session: str,
        records: Sequence[Record],
        *,
        durable: bool = True,
        expect_seq: int | None = None,
        expect_index: int | None = None,
    ) -> list[StoredEntry]: ...

    def set_status(self, session: str, status: str) -> None: ...

    def session(self, session: str) -> SessionInfo | None: ...

    def sessions(
        self, *, status: str | None = None, limit: int | None = None, principal: Any = None
    ) -> list[SessionInfo]: ...

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

    def add_checkpoint(self, size: int, root: bytes, note: str) -> None: ...

    def checkpoints(self) -> list[StoredCheckpoint]: ...

    def set_envelope(self, session: str, envelope: bytes) -> None: ...

    def envelope(self, session: str) -> bytes | None: ...

    def close(self) -> None: ...


def check_status(status: str) -> None:
    if not status or len(status) > 32 or not set(status) <= _STATUS_CHARS:
        raise StoreError(f"session status {status!r} is not a lower-case word", reason="bad_status")


def session_fields(record: Record) -> tuple[str | None, Any]:
    """The contract name and principal a ``session_started`` body carries."""
    contract = record.body.get("contract")
    return (contract if isinstance(contract, str) else None), record.body.get("principal")


_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v BLOB NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS entries (
    idx INTEGER PRIMARY KEY,
    session TEXT NOT NULL,
    seq INTEGER NOT NULL,
    kind TEXT NOT NULL,
    ts INTEGER NOT NULL,
    hash BLOB NOT NULL,
    raw BLOB NOT NULL,
    sig BLOB NOT NULL,
    keyid TEXT NOT NULL,
    UNIQUE (session, seq)
);
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    contract TEXT,
    principal TEXT,
    status TEXT NOT NULL,
    entries INTEGER NOT NULL,
    started_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL,
    head BLOB NOT NULL,
    ended INTEGER NOT NULL DEFAULT 0,
    envelope BLOB
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS sessions_by_start ON sessions (started_ms, id);
CREATE TABLE IF NOT EXISTS blobs (ref TEXT PRIMARY KEY, data BLOB NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS session_blobs (
    session TEXT NOT NULL, ref TEXT NOT NULL, PRIMARY KEY (session, ref)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS session_blobs_by_ref ON session_blobs (ref);
CREATE TABLE IF NOT EXISTS erased (session TEXT NOT NULL, ref TEXT NOT NULL, PRIMARY KEY (session, ref)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS nodes (
    level INTEGER NOT NULL, idx INTEGER NOT NULL, hash BLOB NOT NULL, PRIMARY KEY (level, idx)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS checkpoints (
    size INTEGER PRIMARY KEY, root BLOB NOT NULL, note TEXT NOT NULL, created_ms INTEGER NOT NULL
);
"""


_SESSION_SELECT = "SELECT id, contract, principal, status, entries, started_ms, updated_ms, head, ended FROM sessions"


def _as_bytes(value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    if isinstance(value, bytearray):
        return bytes(value)
    return b""


def _encode_body(record: Record) -> bytes:
    return encode_record(record)


class _Pending:
    """One caller's batch waiting for a group commit."""

    __slots__ = (
        "bodies",
        "done",
        "durable",
        "error",
        "expect_index",
        "expect_seq",
        "records",
        "result",
        "session",
        "wake",
    )

    def __init__(
        self,
        session: str,
        records: Sequence[Record],
        durable: bool,
        expect_seq: int | None,
        expect_index: int | None = None,
    ) -> None:
        # Checked and encoded here, in the caller's thread, so the writer only splices and signs.
        self.bodies = [_encode_body(record) for record in records]
        self.session = session
        self.records = records
        self.durable = durable
        self.expect_seq = expect_seq
        self.expect_index = expect_index
        self.result: list[StoredEntry] = []
        self.error: TrussError | None = None
        self.done = False
        # Only a follower waits (its event is made when it queues); a lone writer never needs one.
        self.wake: threading.Event | None = None


def open_store(
    db: Path,
    *,
    key: IdentityKey | None,
    clock: Clock,
    create: bool = True,
    busy_timeout_ms: int = 5000,
    group_commit: bool = True,
) -> SqliteStore:
    """Open (or create) the SQLite ledger at ``db``.

    ``key`` signs appended entries; without one the store is read-only (verification, listing).
    A new ledger takes the key's name as its origin; an existing one refuses a key with another
    name (``KeyFileError``). ``create=False`` refuses a missing file (``NotFoundError``).
    ``group_commit=False`` commits each batch alone (the naive baseline the benchmark compares).
    """
    return SqliteStore(
        db, key=key, clock=clock, create=create, busy_timeout_ms=busy_timeout_ms, group_commit=group_commit
    )


class SqliteStore:
    """The embedded store. Thread-safe; see the module docstring for the durability contract."""

    def __init__(
        self,
        db: Path,
        *,
        key: IdentityKey | None,
        clock: Clock,
        create: bool = True,
        busy_timeout_ms: int = 5000,
        group_commit: bool = True,
    ) -> None:
        self.db = db
        self._key = key
        self._clock = clock
        self._busy_ms = busy_timeout_ms
        self._group = group_commit
        if not db.exists():
            if not create:
                raise NotFoundError(
                    f"no ledger at {db}", remedy="run `truss init` and a contract first, or pass --db", what="ledger"
                )
            if key is None:
                raise KeyFileError(
                    f"cannot create the ledger {db} without an identity key",
                    remedy="run `truss init` to create the key first",
                    file=str(db),
                )
            db.parent.mkdir(parents=True, exist_ok=True)
        self._wlock = threading.Lock()  # the writer: whoever holds it commits the queue
        self._qlock = threading.Lock()
        self._rlock = threading.Lock()
        self._queue: list[_Pending] = []
        self._leading = False
        self._commits = 0
        self._batches = 0
        self._sync_full: bool | None = None
        self._frontier: Frontier | None = None
        self._rotated_here = False
        self._closed = False
        self._create = create
        try:
            self._w = self._connect()
            self._init_schema()
            self._r = self._connect()
        except sqlite3.DatabaseError as exc:
            if "not a database" in str(exc) or "malformed" in str(exc):
                raise InputError(
                    f"{db} is not a Truss ledger ({exc})",
                    remedy="point --db at the ledger.db of a Truss home",
                    db=str(db),
                ) from exc
            raise self._store_error("open", exc) from exc
        row = self._r.execute("SELECT v FROM meta WHERE k = 'origin'").fetchone()
        self.origin: str = bytes(row[0]).decode("utf-8")
        if key is not None and key.name != self.origin:
            raise KeyFileError(
                f"the identity key is named {key.name!r} but the ledger {db} is the log {self.origin!r}",
                remedy="use the key this ledger was created with (rotated keys keep the log's name)",
                file=str(db),
            )
        if key is not None and self._retired(self._r, key.key_id):
            raise KeyFileError(
                f"the identity key {key.key_id} was retired by a key rotation recorded in {db}",
                remedy="use the current identity key; `truss key rotate` completes a rotation that was interrupted",
                file=str(db),
                reason="key_retired",
            )

    # -- connections ---------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            str(self.db), isolation_level=None, check_same_thread=False, timeout=self._busy_ms / 1000
        )
        conn.execute(f"PRAGMA busy_timeout = {int(self._busy_ms)}")
        self._refuse_foreign(conn)
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()
        if mode is None or str(mode[0]).lower() != "wal":
            raise StoreError(f"{self.db}: cannot switch the ledger to WAL mode", db=str(self.db))
        conn.execute("PRAGMA synchronous = FULL")
        return conn

    def _refuse_foreign(self, conn: sqlite3.Connection) -> None:
        """Before changing anything in the file: it is empty (a new ledger) or a Truss ledger."""
        tables = {str(r[0]) for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if (tables and not {"meta", "entries"} <= tables) or (not tables and not self._create):
            conn.close()
            raise InputError(
                f"{self.db} is not a Truss ledger",
                remedy="point --db at the ledger.db of a Truss home",
                db=str(self.db),
            )

    def _init_schema(self) -> None:
        conn = self._w
        try:
            row = conn.execute("SELECT v FROM meta WHERE k = 'schema'").fetchone()
        except sqlite3.OperationalError:
            row = None  # no meta table yet: a new file
        if row is not None and int(bytes(row[0]).decode()) == SCHEMA_VERSION:
            return  # an existing ledger: readers need no write lock to open it
        self._begin(conn)
        try:
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            row = conn.execute("SELECT v FROM meta WHERE k = 'schema'").fetchone()
            if row is None:
                if self._key is None:
                    raise KeyFileError(
                        f"cannot create the ledger {self.db} without an identity key",
                        remedy="run `truss init` to create the key first",
                        file=str(self.db),
                    )
                conn.execute("INSERT INTO meta (k, v) VALUES ('schema', ?)", (str(SCHEMA_VERSION).encode(),))
                conn.execute("INSERT INTO meta (k, v) VALUES ('origin', ?)", (self._key.name.encode("utf-8"),))
                conn.execute("INSERT INTO meta (k, v) VALUES ('frontier', ?)", (Frontier().to_state(),))
            elif int(bytes(row[0]).decode()) > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.db} was written by a newer Truss (schema {bytes(row[0]).decode()})",
                    remedy="upgrade Truss to read this ledger",
                    db=str(self.db),
                )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def _begin(self, conn: sqlite3.Connection) -> None:
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise self._store_error("lock", exc) from exc

    def _store_error(self, what: str, exc: sqlite3.Error) -> StoreError:
        text = str(exc)
        if "locked" in text or "busy" in text:
            return StoreBusyError(
                f"{self.db}: the ledger stayed locked by another writer for {self._busy_ms} ms",
                remedy="another Truss process is writing; retry when it finishes",
                retryable=True,
                db=str(self.db),
            )
        return StoreError(
            f"{self.db}: ledger {what} failed: {type(exc).__name__}: {text}",
            remedy="check the disk and the file's permissions; the last committed state is intact",
            db=str(self.db),
        )

    def _set_sync(self, full: bool) -> None:
        if self._sync_full is not full:
            self._w.execute(f"PRAGMA synchronous = {'FULL' if full else 'NORMAL'}")
            self._sync_full = full

    def connection_settings(self) -> dict[str, dict[str, Any]]:
        """The journal mode, sync level and busy timeout each connection runs with (diagnostics)."""
        out: dict[str, dict[str, Any]] = {}
        for name, conn, lock in (("writer", self._w, self._wlock), ("reader", self._r, self._rlock)):
            with lock:
                out[name] = {
                    pragma: conn.execute(f"PRAGMA {pragma}").fetchone()[0]
                    for pragma in ("journal_mode", "synchronous", "busy_timeout")
                }
        return out

    def stats(self) -> dict[str, int]:
        """Append transactions committed and batches they carried since opening (group commit at work)."""
        return {"commits": self._commits, "batches": self._batches}

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"{self.db}: the store is closed", db=str(self.db))

    # -- append (group commit) -------------------------------------------------------------------

    def append(
        self,
        session: str,
        records: Sequence[Record],
        *,
        durable: bool = True,
        expect_seq: int | None = None,
        expect_index: int | None = None,
    ) -> list[StoredEntry]:
        """Append ``records`` to ``session`` as consecutive entries; returns them signed.

        Committed (fsync'd unless ``durable=False``) before it returns. ``expect_seq`` is the seq
        and ``expect_index`` the log index the first record must get; otherwise
        ``StoreConflictError`` and nothing is written (``expect_index`` lets a record name its
        own position, as a key rotation does).
        """
        self._check_open()
        if self._key is None:
            raise StoreError(f"{self.db}: opened without an identity key, so it cannot append", db=str(self.db))
        if not records:
            return []
        pending = _Pending(session, list(records), durable, expect_seq, expect_index)
        if not self._group:
            with self._wlock:
                self._commit_group([pending])
        else:
            # Leader/follower: the first caller to find no leader commits everything queued, then
            # hands leadership to the oldest waiter, if any. Followers wait on their own event, so a
            # finished follower returns at once instead of queueing behind the next commit.
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
                    wake = self._queue[0].wake  # a follower's: it queued while this leader held the lead
                    assert wake is not None
                    wake.set()  # not done: it wakes as the next leader
                else:
                    self._leading = False

    def bulk_append(self, batches: Iterable[tuple[str, Sequence[Record]]], *, per_txn: int = 1000) -> int:
        """Append many batches, ``per_txn`` batches per transaction (imports, benchmarks).

        Each transaction commits with ``synchronous=NORMAL`` and the last with ``FULL``; a failing
        batch raises and stops. Returns the number of entries appended.
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
        conn = self._w
        try:
            self._set_sync(any(p.durable for p in group))
            self._begin(conn)
        except TrussError as exc:
            self._fail_all(group, exc)
            return
        except sqlite3.Error as exc:
            self._fail_all(group, self._store_error("append", exc))
            return
        try:
            row = conn.execute("SELECT MAX(idx) FROM entries").fetchone()
            next_index = 0 if row is None or row[0] is None else int(row[0]) + 1
            frontier = self._frontier
            if frontier is None or frontier.size != next_index:
                # Another process appended (or this is the first append): reload what it committed.
                state = conn.execute("SELECT v FROM meta WHERE k = 'frontier'").fetchone()
                frontier = Frontier.from_state(bytes(state[0]))
                if frontier.size != next_index:
                    raise StoreError(
                        f"{self.db}: the Merkle frontier covers {frontier.size} entries but the log holds {next_index}",
                        remedy="the ledger file was modified outside Truss; run `truss ledger verify --all`",
                        db=str(self.db),
                    )
                # Another writer may have rotated this key away: its entries would not verify.
                self._refuse_retired(conn)
            elif self._rotated_here:
                self._refuse_retired(conn)
            if len(group) == 1:
                # A lone batch needs no savepoint: if it fails, the whole transaction is rolled
                # back (two statements and a frontier copy fewer on the common, sequential path).
                [pending] = group
                try:
                    pending.result = self._apply(conn, pending, next_index, frontier)
                except (TrussError, sqlite3.IntegrityError) as exc:
                    self._frontier = None  # the frontier took the failed batch's leaves: reload it
                    conn.execute("ROLLBACK")
                    self._fail_all(group, self._batch_error(pending, exc))
                    return
            for pending in group if len(group) > 1 else ():
                saved = frontier.to_state()
                conn.execute("SAVEPOINT batch")
                try:
                    pending.result = self._apply(conn, pending, next_index, frontier)
                    conn.execute("RELEASE batch")
                    next_index += len(pending.result)
                except (TrussError, sqlite3.IntegrityError) as exc:
                    conn.execute("ROLLBACK TO batch")
                    conn.execute("RELEASE batch")
                    frontier = Frontier.from_state(saved)
                    pending.result = []
                    pending.error = self._batch_error(pending, exc)
            conn.execute("INSERT OR REPLACE INTO meta (k, v) VALUES ('frontier', ?)", (frontier.to_state(),))
            conn.execute("COMMIT")
            self._frontier = frontier
            if any(r.kind == "key_rotated" for p in group if p.result for r in p.records):
                self._rotated_here = True
            self._commits += 1
            self._batches += len(group)
        except BaseException as exc:
            self._frontier = None
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            if isinstance(exc, TrussError):
                self._fail_all(group, exc)
            elif isinstance(exc, sqlite3.Error):
                self._fail_all(group, self._store_error("append", exc))
            else:
                self._fail_all(group, StoreError(f"{self.db}: append interrupted", db=str(self.db)))
                raise
            return
        for pending in group:
            pending.done = True
            if pending.wake is not None:
                pending.wake.set()

    @staticmethod
    def _retired(conn: sqlite3.Connection, key_id: str) -> bool:
        # Rotations live in the log's own session, so this reads a few rows of one session's index.
        row = conn.execute(
            "SELECT 1 FROM entries WHERE session = ? AND kind = 'key_rotated' AND keyid = ? LIMIT 1",
            (LOG_SESSION, key_id),
        ).fetchone()
        return row is not None

    def _refuse_retired(self, conn: sqlite3.Connection) -> None:
        assert self._key is not None
        if self._retired(conn, self._key.key_id):
            raise StoreError(
                f"{self.db}: the identity key {self._key.key_id} was retired by a key rotation; "
                "nothing more can be signed with it",
                remedy="restart with the current identity key; an interrupted run resumes with `truss resume SESSION`",
                db=str(self.db),
                reason="key_retired",
            )

    @staticmethod
    def _batch_error(pending: _Pending, exc: TrussError | sqlite3.IntegrityError) -> TrussError:
        if isinstance(exc, TrussError):
            return exc
        return StoreConflictError(
            f"session {pending.session}: another writer recorded this step ({exc})",
            remedy="re-read the session and retry from its head",
            session=pending.session,
        )

    @staticmethod
    def _fail_all(group: list[_Pending], exc: TrussError) -> None:
        for pending in group:
            pending.result = []
            pending.error = exc
            pending.done = True
            if pending.wake is not None:
                pending.wake.set()

    def _apply(self, conn: sqlite3.Connection, pending: _Pending, index: int, frontier: Frontier) -> list[StoredEntry]:
        key = self._key
        assert key is not None
        session, records = pending.session, pending.records
        row = conn.execute("SELECT entries, head, ended FROM sessions WHERE id = ?", (session,)).fetchone()
        first = records[0]
        if row is None:
            if first.kind != "session_started":
                raise StoreError(
                    f"session {session} does not exist: its first entry must be session_started, not {first.kind}",
                    reason="no_session",
                    session=session,
                )
            seq, prev, ended = 0, ZERO_HASH, False
        else:
            seq, prev, ended = int(row[0]), bytes(row[1]).hex(), bool(row[2])
            if first.kind == "session_started":
                raise StoreConflictError(
                    f"session {session} already exists", remedy="use a new session id", session=session, seq=seq
                )
        if pending.expect_index is not None and pending.expect_index != index:
            raise StoreConflictError(
                f"session {session}: expected to append at log index {pending.expect_index} but the log is at {index}",
                remedy="another writer appended first; re-read the log and retry",
                session=session,
                index=pending.expect_index,
                actual=index,
            )
        if pending.expect_seq is not None and pending.expect_seq != seq:
            raise StoreConflictError(
                f"session {session}: expected to append at seq {pending.expect_seq} but its head is at seq {seq}",
                remedy="another writer is recording this session; stop, re-read it and resume from its head",
                session=session,
                seq=pending.expect_seq,
                actual=seq,
            )
        entry_rows: list[tuple[Any, ...]] = []
        node_rows: list[tuple[int, int, bytes]] = []
        blob_rows: list[tuple[str, bytes]] = []
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
                    log=self.origin,
                    session=session,
                    seq=seq,
                    index=index,
                    ts=self._clock.now_ms(),
                    kind=record.kind,
                    body=record.body,
                    prev=prev,
                    body_bytes=pending.bodies[i],
                )
            except CanonicalError as exc:
                raise StoreError(
                    f"the body of a {record.kind} entry is not canonical JSON: {exc}", reason="bad_body"
                ) from exc
            out.append(entry)
            entry_rows.append(
                (
                    index,
                    session,
                    seq,
                    record.kind,
                    entry.ts,
                    bytes.fromhex(entry.hash),
                    entry.raw,
                    entry.sig,
                    key.key_id,
                )
            )
            node_rows.extend(frontier.append(leaf_hash(entry.raw)))
            blob_rows.extend((ref, bytes(data)) for ref, data in record.blobs.items())
            ended = record.kind == "session_ended"
            prev, seq, index = entry.hash, seq + 1, index + 1
        conn.executemany(
            "INSERT INTO entries (idx, session, seq, kind, ts, hash, raw, sig, keyid) VALUES (?,?,?,?,?,?,?,?,?)",
            entry_rows,
        )
        conn.executemany("INSERT INTO nodes (level, idx, hash) VALUES (?,?,?)", node_rows)
        if blob_rows:
            conn.executemany("INSERT OR IGNORE INTO blobs (ref, data) VALUES (?,?)", blob_rows)
            conn.executemany(
                "INSERT OR IGNORE INTO session_blobs (session, ref) VALUES (?,?)", [(session, r) for r, _ in blob_rows]
            )
        now = out[-1].ts
        if row is None:
            contract, principal = session_fields(first)
            conn.execute(
                "INSERT INTO sessions (id, contract, principal, status, entries, started_ms, updated_ms, head, ended)"
                " VALUES (?,?,?,?,?,?,?,?,?)",
                (
                    session,
                    contract,
                    None if principal is None else canonical(principal).decode("utf-8"),
                    "ended" if ended else "running",
                    seq,
                    out[0].ts,
                    now,
                    bytes.fromhex(prev),
                    int(ended),
                ),
            )
        else:
            conn.execute(
                "UPDATE sessions SET entries = ?, head = ?, updated_ms = ?, ended = ?,"
                " status = CASE WHEN ? AND status = 'running' THEN 'ended' ELSE status END WHERE id = ?",
                (seq, bytes.fromhex(prev), now, int(ended), int(ended), session),
            )
        return out

    # -- other writes --------------------------------------------------------------------------

    def _write(self, sql_steps: Sequence[tuple[str, tuple[Any, ...]]]) -> list[int]:
        """Run statements in one durable transaction; returns each one's rowcount."""
        self._check_open()
        with self._wlock:
            conn = self._w
            try:
                self._set_sync(True)
                self._begin(conn)
                counts = [conn.execute(sql, params).rowcount for sql, params in sql_steps]
                conn.execute("COMMIT")
                return counts
            except sqlite3.Error as exc:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise self._store_error("write", exc) from exc

    def _require_session(self, session: str) -> None:
        if self.session(session) is None:
            raise NotFoundError(f"no session {session!r} in {self.db}", what="session", name=session)

    def set_status(self, session: str, status: str) -> None:
        """Set the listing status (``running``, ``suspended``, ``passed`` ...); not part of the chain."""
        check_status(status)
        counts = self._write(
            [("UPDATE sessions SET status = ?, updated_ms = ? WHERE id = ?", (status, self._clock.now_ms(), session))]
        )
        if counts[0] == 0:
            raise NotFoundError(f"no session {session!r} in {self.db}", what="session", name=session)

    def erase_payloads(self, session: str) -> int:
        """Remove the session's payload bytes; returns how many refs were newly erased."""
        self._require_session(session)
        counts = self._write(
            [
                (
                    "INSERT OR IGNORE INTO erased (session, ref)"
                    " SELECT session, ref FROM session_blobs WHERE session = ?",
                    (session,),
                ),
                ("DELETE FROM session_blobs WHERE session = ?", (session,)),
                (
                    "DELETE FROM blobs WHERE ref IN (SELECT ref FROM erased WHERE session = ?)"
                    " AND NOT EXISTS (SELECT 1 FROM session_blobs s WHERE s.ref = blobs.ref)",
                    (session,),
                ),
            ]
        )
        return counts[0]

    def add_checkpoint(self, size: int, root: bytes, note: str) -> None:
        """Keep a signed checkpoint; a second one at the same size must have the same root.

        When the one held comes back with more signature lines (witnesses' cosignatures), they
        are kept with it (``cosignature.merge_notes``, read and written in one transaction).
        """
        with self._rlock:
            row = self._r.execute("SELECT root, note FROM checkpoints WHERE size = ?", (size,)).fetchone()
        if row is not None:
            if bytes(row[0]) != root:
                raise StoreConflictError(
                    f"{self.db}: a checkpoint of size {size} with another root is already stored",
                    remedy="the log was forked: run `truss ledger verify --all`",
                    size=size,
                )
            if merge_notes(str(row[1]), note) != str(row[1]):
                self._merge_checkpoint(size, note)
            return
        self._write(
            [
                (
                    "INSERT OR IGNORE INTO checkpoints (size, root, note, created_ms) VALUES (?,?,?,?)",
                    (size, root, note, self._clock.now_ms()),
                )
            ]
        )

    def _merge_checkpoint(self, size: int, note: str) -> None:
        self._check_open()
        with self._wlock:
            conn = self._w
            try:
                self._set_sync(True)
                self._begin(conn)
                row = conn.execute("SELECT note FROM checkpoints WHERE size = ?", (size,)).fetchone()
                if row is not None:
                    merged = merge_notes(str(row[0]), note)
                    if merged != str(row[0]):
                        conn.execute("UPDATE checkpoints SET note = ? WHERE size = ?", (merged, size))
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise self._store_error("write", exc) from exc

    def set_envelope(self, session: str, envelope: bytes) -> None:
        """Keep the session's verdict envelope beside its chain (it signs the head, so it cannot be in it)."""
        counts = self._write([("UPDATE sessions SET envelope = ? WHERE id = ?", (envelope, session))])
        if counts[0] == 0:
            raise NotFoundError(f"no session {session!r} in {self.db}", what="session", name=session)

    # -- reads ---------------------------------------------------------------------------------

    def _rows(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        self._check_open()
        with self._rlock:
            try:
                return self._r.execute(sql, params).fetchall()
            except sqlite3.Error as exc:
                raise self._store_error("read", exc) from exc

    @staticmethod
    def _session_info(row: Any) -> SessionInfo:
        return SessionInfo(
            id=row[0],
            contract=row[1],
            principal=None if row[2] is None else json.loads(row[2]),
            status=row[3],
            entries=int(row[4]),
            started_ms=int(row[5]),
            updated_ms=int(row[6]),
            head=bytes(row[7]).hex(),
            ended=bool(row[8]),
        )

    def session(self, session: str) -> SessionInfo | None:
        rows = self._rows(_SESSION_SELECT + " WHERE id = ?", (session,))
        return self._session_info(rows[0]) if rows else None

    def sessions(
        self, *, status: str | None = None, limit: int | None = None, principal: Any = None
    ) -> list[SessionInfo]:
        """Sessions, most recently started first; filtered by status and principal (JSON equality)."""
        where: list[str] = []
        params: list[Any] = []
        if status is not None:
            where.append("status = ?")
            params.append(status)
        if principal is not None:
            where.append("principal = ?")
            params.append(canonical(principal).decode("utf-8"))
        sql = _SESSION_SELECT
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY started_ms DESC, id DESC"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(max(0, limit))
        return [self._session_info(r) for r in self._rows(sql, tuple(params))]

    @staticmethod
    def _entry(row: Any) -> StoredEntry:
        # A file edited outside Truss may hold anything in any column: hand verification an entry
        # it will report as malformed rather than failing here.
        raw, sig, keyid, digest = (_as_bytes(row[0]), _as_bytes(row[1]), str(row[2]), _as_bytes(row[3]).hex())
        try:
            return StoredEntry.from_raw(raw, sig, keyid, digest)
        except (ValueError, UnicodeDecodeError):
            return StoredEntry(entry={"unreadable": True}, hash=digest, sig=sig, keyid=keyid, raw=raw or b"-")

    def read_session(self, session: str, *, from_seq: int = 0) -> Iterator[StoredEntry]:
        """The session's entries in seq order from ``from_seq``, read a page at a time."""
        seq = from_seq
        while True:
            rows = self._rows(
                "SELECT raw, sig, keyid, hash, seq FROM entries WHERE session = ? AND seq >= ? ORDER BY seq LIMIT ?",
                (session, seq, _PAGE),
            )
            for row in rows:
                yield self._entry(row)
            if len(rows) < _PAGE:
                return
            seq = int(rows[-1][4]) + 1

    def read_range(self, start: int, stop: int) -> Iterator[StoredEntry]:
        """Entries with ``start <= index < stop`` in index order, read a page at a time."""
        index = start
        while index < stop:
            rows = self._rows(
                "SELECT raw, sig, keyid, hash, idx FROM entries WHERE idx >= ? AND idx < ? ORDER BY idx LIMIT ?",
                (index, stop, _PAGE),
            )
            for row in rows:
                yield self._entry(row)
            if len(rows) < _PAGE:
                return
            index = int(rows[-1][4]) + 1

    def blob(self, ref: str) -> bytes | None:
        rows = self._rows("SELECT data FROM blobs WHERE ref = ?", (ref,))
        return bytes(rows[0][0]) if rows else None

    def blobs_for(self, refs: Iterable[str]) -> dict[str, bytes]:
        """The payloads held for ``refs`` (absent ones are left out), a few queries for many refs."""
        wanted = sorted(set(refs))
        out: dict[str, bytes] = {}
        for start in range(0, len(wanted), _IN_CHUNK):
            chunk = wanted[start : start + _IN_CHUNK]
            marks = ",".join("?" * len(chunk))
            rows = self._rows(f"SELECT ref, data FROM blobs WHERE ref IN ({marks})", tuple(chunk))  # noqa: S608
            out.update((str(r[0]), bytes(r[1])) for r in rows)
        return out

    def erased_refs(self, session: str) -> set[str]:
        return {r[0] for r in self._rows("SELECT ref FROM erased WHERE session = ?", (session,))}

    def session_refs(self, session: str) -> set[str]:
        """Refs whose bytes this session still links to."""
        return {r[0] for r in self._rows("SELECT ref FROM session_blobs WHERE session = ?", (session,))}

    def _frontier_now(self) -> Frontier:
        rows = self._rows("SELECT v FROM meta WHERE k = 'frontier'", ())
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
        rows = self._rows("SELECT hash FROM nodes WHERE level = ? AND idx = ?", (level, index))
        if not rows:
            raise StoreError(
                f"{self.db}: Merkle node ({level}, {index}) is not stored",
                remedy="run `truss ledger verify --all`; the tree may have been modified",
                db=str(self.db),
                level=level,
                index=index,
            )
        return bytes(rows[0][0])

    def checkpoints(self) -> list[StoredCheckpoint]:
        rows = self._rows("SELECT size, root, note, created_ms FROM checkpoints ORDER BY size", ())
        return [StoredCheckpoint(int(r[0]), bytes(r[1]), r[2], int(r[3])) for r in rows]

    def envelope(self, session: str) -> bytes | None:
        rows = self._rows("SELECT envelope FROM sessions WHERE id = ?", (session,))
        return bytes(rows[0][0]) if rows and rows[0][0] is not None else None

    def close(self) -> None:
        if self._closed:
            return
        with self._wlock, self._rlock:
            self._closed = True
            self._w.close()
            self._r.close()

    def __enter__(self) -> SqliteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
