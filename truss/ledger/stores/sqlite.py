"""The SQLite ledger store: the embedded default (a bare ``--db`` path, or ``sqlite:///PATH``).

Tables (docs/ledger-format.md, section 5): ``entries`` (``UNIQUE(session, seq)``, ``idx`` the
primary key, so two writers can never record the same step), ``sessions`` (derived, for listing),
``blobs`` and ``session_blobs`` (content-addressed payloads and who links to them), ``erased``,
``nodes`` (the Merkle log's complete subtrees, keyed by the leaf that completes them and written in
the same transaction as the entries: O(log n) per append, on one page) and ``checkpoints``. The
tree's frontier is not stored: it is rebuilt from the nodes of the log's size (``read_frontier``).
A ledger of an older schema is brought to the current one when it is opened (``_migrate``).

- WAL journal, ``busy_timeout``, ``synchronous=FULL`` on every commit except batches appended
  with ``durable=False`` ("process" durability: survives a crash of Truss, not of the machine).
- Writes go through one ``SqliteWriter`` (group commit, ``BEGIN IMMEDIATE``; see
  ``_sqlite_writer``); reads use a second connection, so a reader never waits for a commit.
- Blobs are content-addressed (bytes checked against their ref before writing); erasing a
  session's payloads removes its blob links, records which refs were erased, and deletes bytes no
  other session links to. Entries only hold refs, so the chain still verifies.
- A file that is not a Truss ledger is refused before anything in it is changed.

What it does not do: verify (``truss.ledger.verification``), decide checkpoints (``note``) or build
bundles. Reads are paged (``_sql.SqlReads``, the reads both SQL stores share) so iterating a large
ledger never loads it whole.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from truss._clock import Clock
from truss._errors import (
    InputError,
    KeyFileError,
    NotFoundError,
    StoreConflictError,
    StoreError,
    UsageError,
    VerificationError,
)
from truss.ledger.entry import Record, StoredEntry
from truss.ledger.keys import IdentityKey
from truss.ledger.merkle import Frontier
from truss.ledger.stores._sql import SqlReads, stored_entry
from truss.ledger.stores._sqlite_writer import (
    SqliteWriter,
    begin,
    iter_node_hashes,
    key_retired,
    read_frontier,
    read_lease,
    read_nodes,
    store_error,
)
from truss.ledger.stores.base import (
    DEFAULT_LEASE_MS,
    Lease,
    LeaseOwner,
    check_epoch,
    grant_lease,
)

__all__ = ["SCHEMA_VERSION", "SqliteStore", "open_sqlite", "sqlite_path"]

SCHEMA_VERSION = 2
"""1: nodes keyed ``(level, idx)`` and the frontier in ``meta``, rewritten by every append.
2: nodes keyed by the leaf that completes them, ``(last, level)``, so one append's nodes share a
page; no stored frontier (derived from the nodes of the log's size). ``_migrate`` takes 1 to 2."""
_IN_CHUNK = 500  # refs per IN (...) query, below SQLite's bound on parameters


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
    last INTEGER NOT NULL,
    level INTEGER NOT NULL,
    hash BLOB NOT NULL,
    PRIMARY KEY (last, level)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS checkpoints (
    size INTEGER PRIMARY KEY, root BLOB NOT NULL, note TEXT NOT NULL, created_ms INTEGER NOT NULL
);
"""


def _as_bytes(value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    if isinstance(value, bytearray):
        return bytes(value)
    return b""


def _schema_number(value: object) -> int:
    """The schema version a ledger's meta row states (-1 when it is not a number)."""
    text = _as_bytes(value).decode("ascii", "replace")
    return int(text) if text.isdigit() else -1


def sqlite_path(url: str) -> Path:
    """The file a SQLite ``--db`` names: a bare path, ``sqlite:///ABS/PATH`` or ``sqlite:REL/PATH``.

    The URL form follows RFC 3986 (and RFC 8089 for files): ``sqlite:///srv/l.db`` is the absolute
    path ``/srv/l.db``, ``sqlite:l.db`` a relative one; percent-escapes are decoded. A host
    (``sqlite://host/...``), a query or a fragment is refused rather than ignored.
    """
    scheme, colon, rest = url.partition(":")
    if not colon or scheme.lower() != "sqlite":
        return Path(url)
    if "?" in rest or "#" in rest:
        raise UsageError(
            f"--db {url!r}: the SQLite store takes no query or fragment",
            remedy="give sqlite:///ABSOLUTE/PATH, sqlite:RELATIVE/PATH or a plain path",
            what="db",
        )
    if rest.startswith("//"):
        authority, slash, path = rest[2:].partition("/")
        if authority:
            raise UsageError(
                f"--db {url!r}: a SQLite ledger is a local file; the URL names a host ({authority!r})",
                remedy="give sqlite:///ABSOLUTE/PATH (three slashes) or a plain path",
                what="db",
            )
        rest = slash + path
    path = unquote(rest)
    if not path:
        raise UsageError(
            f"--db {url!r} names no file", remedy="give sqlite:///ABSOLUTE/PATH or a plain path", what="db"
        )
    return Path(path)


def open_sqlite(
    url: str | Path,
    /,
    *,
    key: IdentityKey | None,
    clock: Clock,
    create: bool = True,
    busy_timeout_ms: int = 5000,
    group_commit: bool = True,
) -> SqliteStore:
    """Open (or create) the SQLite ledger at ``url`` (a path, or a URL ``sqlite_path`` reads).

    ``key`` signs appended entries; without one the store is read-only (verification, listing).
    A new ledger takes the key's name as its origin; an existing one refuses a key with another
    name (``KeyFileError``). ``create=False`` refuses a missing file (``NotFoundError``).
    ``group_commit=False`` commits each batch alone (the naive baseline the benchmark compares).
    """
    db = url if isinstance(url, Path) else sqlite_path(url)
    return SqliteStore(
        db, key=key, clock=clock, create=create, busy_timeout_ms=busy_timeout_ms, group_commit=group_commit
    )


class SqliteStore(SqlReads, mark="?"):
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
        self._rlock = threading.Lock()
        self._create = create
        self._closed = False
        conns: list[sqlite3.Connection] = []
        try:
            conns.append(self._connect())
            self._init_schema(conns[0])
            conns.append(self._connect())
            row = conns[1].execute("SELECT v FROM meta WHERE k = 'origin'").fetchone()
            if row is None or not isinstance(row[0], bytes | str):
                raise InputError(
                    f"{db} is not a usable Truss ledger: it names no log origin",
                    remedy="the file was modified outside Truss; restore it from a copy you trust",
                    db=str(db),
                )
            self.origin: str = _as_bytes(row[0]).decode("utf-8", "replace")
            if key is not None and key.name != self.origin:
                raise KeyFileError(
                    f"the identity key is named {key.name!r} but the ledger {db} is the log {self.origin!r}",
                    remedy="use the key this ledger was created with (rotated keys keep the log's name)",
                    file=str(db),
                )
            if key is not None and key_retired(conns[1], key):
                raise KeyFileError(
                    f"the identity key {key.key_id} was retired by a key rotation or removed from the key set "
                    f"recorded in {db}",
                    remedy="use the current identity key; `truss key rotate` completes a rotation that was interrupted",
                    file=str(db),
                    reason="key_retired",
                )
        except BaseException as exc:
            for conn in conns:
                conn.close()
            if isinstance(exc, sqlite3.DatabaseError):
                if "not a database" in str(exc) or "malformed" in str(exc):
                    raise InputError(
                        f"{db} is not a Truss ledger ({exc})",
                        remedy="point --db at the ledger.db of a Truss home",
                        db=str(db),
                    ) from exc
                raise store_error(db, busy_timeout_ms, "open", exc) from exc
            raise
        self._r = conns[1]
        self._writer = SqliteWriter(
            conns[0],
            db=db,
            key=key,
            clock=clock,
            origin=self.origin,
            busy_timeout_ms=busy_timeout_ms,
            group_commit=group_commit,
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
            conn.close()
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

    def _init_schema(self, conn: sqlite3.Connection) -> None:
        try:
            row = conn.execute("SELECT v FROM meta WHERE k = 'schema'").fetchone()
        except sqlite3.OperationalError:
            row = None  # no meta table yet: a new file
        if row is not None and _schema_number(row[0]) == SCHEMA_VERSION:
            return  # an existing ledger: readers need no write lock to open it
        begin(conn, self.db, self._busy_ms)
        try:
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            row = conn.execute("SELECT v FROM meta WHERE k = 'schema'").fetchone()
            held = (
                conn.execute("SELECT 1 FROM entries LIMIT 1").fetchone()
                or conn.execute("SELECT 1 FROM meta WHERE k = 'origin'").fetchone()
            )
            if row is None and held is not None:
                raise InputError(
                    f"{self.db} is not a usable Truss ledger: it holds a log but states no schema version",
                    remedy="the file was modified outside Truss; restore it from a copy you trust",
                    db=str(self.db),
                )
            if row is None:
                if self._key is None:
                    raise KeyFileError(
                        f"cannot create the ledger {self.db} without an identity key",
                        remedy="run `truss init` to create the key first",
                        file=str(self.db),
                    )
                conn.execute("INSERT INTO meta (k, v) VALUES ('schema', ?)", (str(SCHEMA_VERSION).encode(),))
                conn.execute("INSERT INTO meta (k, v) VALUES ('origin', ?)", (self._key.name.encode("utf-8"),))
            elif _schema_number(row[0]) == 1:
                self._migrate(conn)
            elif _schema_number(row[0]) != SCHEMA_VERSION:
                raise InputError(  # a schema this Truss does not know: unusable input, nothing changed
                    f"{self.db} was written by another Truss (schema {_as_bytes(row[0]).decode('utf-8', 'replace')})",
                    remedy="use the Truss version that wrote this ledger",
                    db=str(self.db),
                )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def _migrate(self, conn: sqlite3.Connection) -> None:
        """Schema 1 to 2, inside the opening transaction (all or nothing; no key needed).

        The nodes are re-keyed by the leaf that completes them, and the stored frontier is
        dropped once it is shown to be the one the nodes give: a ledger whose frontier and nodes
        disagree (changed outside Truss) is refused as it is, so the migration never hides it.
        Entries, signatures, payloads and checkpoints are not touched: the log verifies as before.
        """
        state = conn.execute("SELECT v FROM meta WHERE k = 'frontier'").fetchone()
        conn.execute("ALTER TABLE nodes RENAME TO nodes_v1")
        nodes = next(part for part in _SCHEMA.split(";") if "TABLE IF NOT EXISTS nodes" in part)
        conn.execute(nodes)
        conn.execute(
            "INSERT INTO nodes (last, level, hash)"
            " SELECT ((idx + 1) << level) - 1, level, hash FROM nodes_v1 ORDER BY 1, 2"
        )
        conn.execute("DROP TABLE nodes_v1")
        try:
            derived = read_frontier(conn, self.db, writing=True)
            stored = Frontier.from_state(_as_bytes(state[0])) if state is not None else Frontier()
        except (StoreError, ValueError) as exc:
            message = exc.message if isinstance(exc, StoreError) else str(exc)
            raise VerificationError(
                f"{self.db}: cannot migrate the ledger to schema {SCHEMA_VERSION}: its Merkle tree is unreadable"
                f" ({message})",
                remedy="the ledger file was modified outside Truss; do not trust it beyond a checkpoint you hold",
                reason="tree_mismatch",
            ) from exc
        if stored.to_state() != derived.to_state():
            raise VerificationError(
                f"{self.db}: cannot migrate the ledger to schema {SCHEMA_VERSION}: its stored Merkle frontier"
                f" (size {stored.size}) is not the one its nodes give (size {derived.size})",
                remedy="the ledger file was modified outside Truss; do not trust it beyond a checkpoint you hold",
                reason="tree_mismatch",
            )
        conn.execute("DELETE FROM meta WHERE k = 'frontier'")
        conn.execute("UPDATE meta SET v = ? WHERE k = 'schema'", (str(SCHEMA_VERSION).encode(),))

    def connection_settings(self) -> dict[str, dict[str, Any]]:
        """The journal mode, sync level and busy timeout each connection runs with (diagnostics)."""
        out: dict[str, dict[str, Any]] = {}
        pairs = (("writer", self._writer.connection, self._writer.lock), ("reader", self._r, self._rlock))
        for name, conn, lock in pairs:
            with lock:
                out[name] = {
                    pragma: conn.execute(f"PRAGMA {pragma}").fetchone()[0]
                    for pragma in ("journal_mode", "synchronous", "busy_timeout")
                }
        return out

    def stats(self) -> dict[str, int]:
        """Append transactions committed, how many of them flushed to disk (``synchronous=FULL``), and
        the batches they carried, since opening (group commit at work)."""
        return self._writer.stats()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"{self.db}: the store is closed", db=str(self.db))

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

        Committed (fsync'd unless ``durable=False``) before it returns. ``expect_seq`` is the seq
        and ``expect_index`` the log index the first record must get; otherwise
        ``StoreConflictError`` and nothing is written (``expect_index`` lets a record name its
        own position, as a key rotation does).
        """
        return self._writer.append(
            session, records, durable=durable, expect_seq=expect_seq, expect_index=expect_index, epoch=epoch
        )

    # -- leases (one owner per session; docs/durability.md) -------------------------------------

    def acquire_lease(self, session: str, owner: LeaseOwner, *, ttl_ms: int = DEFAULT_LEASE_MS) -> Lease:
        def grant(conn: sqlite3.Connection) -> Lease:
            lease = grant_lease(read_lease(conn, session), session, owner, self._clock.now_ms(), ttl_ms)
            conn.execute(
                "INSERT OR REPLACE INTO leases (session, owner, host, pid, epoch, acquired_ms, expires_ms)"
                " VALUES (?,?,?,?,?,?,?)",
                (session, lease.owner, lease.host, lease.pid, lease.epoch, lease.acquired_ms, lease.expires_ms),
            )
            return lease

        return self._writer.transaction(grant)

    def renew_lease(self, lease: Lease, *, ttl_ms: int = DEFAULT_LEASE_MS) -> Lease:
        def renew(conn: sqlite3.Connection) -> Lease:
            check_epoch(lease.session, read_lease(conn, lease.session), lease.epoch)
            expires = self._clock.now_ms() + max(1, ttl_ms)
            conn.execute("UPDATE leases SET expires_ms = ? WHERE session = ?", (expires, lease.session))
            return Lease(lease.session, lease.owner, lease.host, lease.pid, lease.epoch, lease.acquired_ms, expires)

        return self._writer.transaction(renew)

    def release_lease(self, lease: Lease) -> None:
        self._writer.transaction(
            lambda conn: (
                conn.execute(
                    "UPDATE leases SET expires_ms = 0 WHERE session = ? AND epoch = ?", (lease.session, lease.epoch)
                ).rowcount
            )
        )

    def lease(self, session: str) -> Lease | None:
        self._check_open()
        with self._rlock:
            try:
                return read_lease(self._r, session)
            except sqlite3.Error as exc:
                raise store_error(self.db, self._busy_ms, "read", exc) from exc

    def bulk_append(self, batches: Iterable[tuple[str, Sequence[Record]]], *, per_txn: int = 1000) -> int:
        """Append many batches, ``per_txn`` batches per transaction (imports, benchmarks).

        Each transaction commits with ``synchronous=NORMAL`` and the last with ``FULL``; a failing
        batch raises and stops. Returns the number of entries appended.
        """
        return self._writer.bulk_append(batches, per_txn=per_txn)

    def _require_session(self, session: str) -> None:
        if self.session(session) is None:
            raise NotFoundError(f"no session {session!r} in {self.db}", what="session", name=session)

    def erase_payloads(self, session: str) -> int:
        """Remove the session's payload bytes; returns how many refs were newly erased."""
        self._require_session(session)
        counts = self._writer.write(
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
        rows = self._rows("SELECT root, note FROM checkpoints WHERE size = ?", (size,))
        if rows:
            if bytes(rows[0][0]) != root:
                raise StoreConflictError(
                    f"{self.db}: a checkpoint of size {size} with another root is already stored",
                    remedy="the log was forked: run `truss ledger verify --all`",
                    size=size,
                )
            from truss.ledger.cosignature import merge_notes  # a checkpoint stored twice only: reads never need it

            if merge_notes(str(rows[0][1]), note) != str(rows[0][1]):
                self._writer.merge_checkpoint(size, note)
            return
        self._writer.write(
            [
                (
                    "INSERT OR IGNORE INTO checkpoints (size, root, note, created_ms) VALUES (?,?,?,?)",
                    (size, root, note, self._clock.now_ms()),
                )
            ]
        )

    def set_envelope(self, session: str, envelope: bytes) -> None:
        """Keep the session's verdict envelope beside its chain (it signs the head, so it cannot be in it)."""
        counts = self._writer.write([("UPDATE sessions SET envelope = ? WHERE id = ?", (envelope, session))])
        if counts[0] == 0:
            raise NotFoundError(f"no session {session!r} in {self.db}", what="session", name=session)

    # -- reads ---------------------------------------------------------------------------------

    def _rows(self, query: str, params: tuple[Any, ...]) -> list[Any]:
        self._check_open()
        with self._rlock:
            try:
                return self._r.execute(query, params).fetchall()
            except sqlite3.Error as exc:
                raise store_error(self.db, self._busy_ms, "read", exc) from exc

    def _entry(self, row: Sequence[Any]) -> StoredEntry:
        # A file edited outside Truss may hold anything in any column (a text where bytes belong).
        return stored_entry(_as_bytes(row[0]), _as_bytes(row[1]), str(row[2]), _as_bytes(row[3]).hex())

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

    def _frontier_now(self) -> Frontier:
        """The log's frontier as of one snapshot (size and nodes read in one read transaction)."""
        self._check_open()
        with self._rlock:
            conn = self._r
            try:
                conn.execute("BEGIN")
                try:
                    return read_frontier(conn, self.db)
                finally:
                    conn.execute("COMMIT")
            except sqlite3.Error as exc:
                raise store_error(self.db, self._busy_ms, "read", exc) from exc

    def node(self, level: int, index: int) -> bytes:
        """The hash of the complete subtree ``(level, index)``; ``StoreError`` if it is not stored."""
        return self.nodes([(level, index)])[(level, index)]

    def nodes(self, keys: Sequence[tuple[int, int]]) -> dict[tuple[int, int], bytes]:
        """The complete subtrees ``keys`` in one query (per 400 keys), each through the primary key."""
        self._check_open()
        with self._rlock:
            try:
                found = read_nodes(self._r, keys)
            except sqlite3.Error as exc:
                raise store_error(self.db, self._busy_ms, "read", exc) from exc
        for level, index in keys:
            if (level, index) not in found:
                raise self._missing_node(level, index)
        return found

    def node_hashes(self, keys: Iterable[tuple[int, int]]) -> Iterator[bytes]:
        """The hashes of the complete subtrees ``keys``, in their order, streamed from one query (per
        400 keys); ``StoreError`` at the first one not stored. For a fold that holds none of them."""
        self._check_open()
        try:
            yield from iter_node_hashes(self._r, self._rlock, keys, self._missing_node)
        except sqlite3.Error as exc:
            raise store_error(self.db, self._busy_ms, "read", exc) from exc

    def _missing_node(self, level: int, index: int) -> StoreError:
        return StoreError(
            f"{self.db}: Merkle node ({level}, {index}) is not stored",
            remedy="run `truss ledger verify --all`; the tree may have been modified",
            db=str(self.db),
            level=level,
            index=index,
        )

    def close(self) -> None:
        if self._closed:
            return
        with self._writer.lock, self._rlock:
            self._closed = True
            self._writer.close()
            self._r.close()
