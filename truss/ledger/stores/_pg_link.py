"""Connections to a PostgreSQL ledger: how each one is set up, the tables, errors as Truss's.

Every connection Truss opens (the writer's, the readers' pool) is configured the same way: a
``synchronous_commit`` of ``off`` is raised to ``on`` (invariant 5, durable before dependent; a
stronger level the operator chose is kept), read committed, ``lock_timeout`` at the store's busy
timeout, and ``search_path`` set to the ledger's schema only. A server running with
``fsync = off`` is refused. The tables are created once, under an advisory lock, by the first
process that opens the ledger with an identity key.

What it does not do: append (``_pg_writer``) or read (``postgresql``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, LiteralString, cast

import psycopg
import psycopg.errors
from psycopg import sql

from truss._errors import InputError, KeyFileError, NotFoundError, StoreBusyError, StoreConflictError, StoreError
from truss.ledger.cosignature import merge_notes
from truss.ledger.keyhistory import LOG_SESSION
from truss.ledger.keys import IdentityKey
from truss.ledger.merkle import Frontier
from truss.ledger.stores._pg_url import PostgresTarget

__all__ = [
    "KEY_RETIRED",
    "SCHEMA_VERSION",
    "Conn",
    "PgLink",
    "first_line",
    "insert_checkpoint",
    "key_retired",
    "missing_node",
    "select_nodes",
]

SCHEMA_VERSION = 1

Conn = psycopg.Connection[tuple[Any, ...]]

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
CREATE TABLE IF NOT EXISTS leases (
    session text PRIMARY KEY, owner text NOT NULL, host text NOT NULL, pid bigint NOT NULL,
    epoch bigint NOT NULL, acquired_ms bigint NOT NULL, expires_ms bigint NOT NULL
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


class PgLink:
    """How to reach one ledger: its URL, schema and busy timeout; connects and maps errors."""

    def __init__(self, target: PostgresTarget, busy_timeout_ms: int) -> None:
        self.target = target
        self.db = target.shown
        self._busy_ms = busy_timeout_ms

    def connect(self) -> Conn:
        try:
            conn: Conn = psycopg.connect(
                self.target.conninfo, autocommit=True, connect_timeout=max(1, self._busy_ms // 1000)
            )
        except psycopg.Error as exc:
            raise StoreError(
                f"cannot connect to the PostgreSQL ledger {self.db}: {first_line(exc)}",
                remedy="check that the server runs and the URL names it; a password comes from PGPASSWORD, "
                "a passfile or a service file",
                db=self.db,
            ) from exc
        try:
            self.configure(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def configure(self, conn: Conn) -> None:
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

    def check_server(self, conn: Conn) -> None:
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

    def init_schema(self, conn: Conn, *, create: bool, new_origin: str | None, founder: str | None = None) -> str:
        """Create the ledger if asked and absent; returns its origin. ``founder``: the verifier key of
        the key creating it (kept in ``meta`` for ``key_in_set``, a guard; trust is verification's)."""
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
                if new_origin is None:
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
                        (str(SCHEMA_VERSION).encode(), new_origin.encode("utf-8")),
                    )
                    if founder is not None:
                        conn.execute(
                            "INSERT INTO meta (k, v) VALUES ('founder', %s) ON CONFLICT (k) DO NOTHING",
                            (founder.encode("utf-8"),),
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
            raise self.error("open", exc) from exc
        version = bytes(rows.get("schema", b"")).decode("utf-8", "replace")
        if not (version.isascii() and version.isdigit() and int(version) >= 1) or "origin" not in rows:
            # No Truss writes a schema below 1 or none at all: the meta rows were changed outside Truss.
            raise InputError(
                f"{self.db} is not a usable Truss ledger: its meta table states no valid schema version and origin",
                remedy="the tables were modified outside Truss; restore them from a copy you trust",
                db=self.db,
            )
        if int(version) != SCHEMA_VERSION:
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

    def error(self, what: str, exc: psycopg.Error) -> StoreError:
        if isinstance(exc, psycopg.errors.LockNotAvailable | psycopg.errors.QueryCanceled):
            return StoreBusyError(
                f"{self.db}: the ledger stayed locked by another writer for {self._busy_ms} ms",
                remedy="another Truss process is writing; retry when it finishes",
                retryable=True,
                db=self.db,
            )
        if isinstance(exc, psycopg.errors.UniqueViolation):
            return StoreConflictError(
                f"{self.db}: another writer recorded this step ({first_line(exc)})",
                remedy="re-read the session and retry from its head",
                db=self.db,
            )
        if isinstance(exc, psycopg.OperationalError):
            return StoreError(
                f"{self.db}: ledger {what} failed: the connection to PostgreSQL failed: {first_line(exc)}",
                remedy="check that the server runs; the last committed state is intact",
                retryable=True,
                db=self.db,
            )
        return StoreError(
            f"{self.db}: ledger {what} failed: {type(exc).__name__}: {first_line(exc)}",
            remedy="check the server's log and the role's privileges; the last committed state is intact",
            db=self.db,
        )


def insert_checkpoint(conn: Conn, db: str, now_ms: int, *, size: int, root: bytes, note: str) -> None:
    """Store a signed checkpoint; ``StoreConflictError`` if another root is stored at ``size``.

    When a checkpoint is already held at ``size``, the signature lines of ``note`` it lacks
    (witnesses' cosignatures) are merged into it (``cosignature.merge_notes``), under the row's
    lock, so two workers adding cosignatures at once both keep theirs. Call it inside a
    transaction (``conn.transaction()``) for the row lock to last until the update.
    """
    conn.execute(
        "INSERT INTO checkpoints (size, root, note, created_ms) VALUES (%s, %s, %s, %s) ON CONFLICT (size) DO NOTHING",
        (size, root, note, now_ms),
    )
    held = conn.execute("SELECT root, note FROM checkpoints WHERE size = %s FOR UPDATE", (size,)).fetchone()
    if held is None:
        return
    if bytes(held[0]) != root:
        raise StoreConflictError(
            f"{db}: a checkpoint of size {size} with another root is already stored",
            remedy="the log was forked: run `truss ledger verify --all`",
            size=size,
        )
    merged = merge_notes(str(held[1]), note)
    if merged != str(held[1]):
        conn.execute("UPDATE checkpoints SET note = %s WHERE size = %s", (merged, size))


def key_retired(conn: Conn, key: IdentityKey) -> bool:
    """Whether a key rotation recorded in the ledger retired ``key``, or a removal took it out of the key set.

    Key statements live in the log's own session, so this reads a few rows of one session's index
    (``UNIQUE (session, seq)``).
    """
    row = conn.execute(KEY_RETIRED, (LOG_SESSION, key.key_id, key.verifier.vkey.encode())).fetchone()
    return row is not None


def key_in_set(conn: Conn, key: IdentityKey) -> bool:
    """Whether ``key`` may sign entries of this ledger: it founded the log (the key that created it,
    or without that record the signer of entry 0; an empty log without one takes any key named
    after it), a rotation handed the log to it, or a ``key_admitted``
    statement admitted it as a worker (and no ``key_removed`` took it out since).

    A guard that refuses a worker nobody admitted before it writes anything; verification, from
    the keys the verifier trusts, is what decides (``truss.ledger.keyhistory``).
    """
    vkey = key.verifier.vkey
    founder = conn.execute("SELECT v FROM meta WHERE k = 'founder'").fetchone()
    if founder is not None:
        if bytes(founder[0]).decode("utf-8", "replace") == vkey:
            return True
    else:  # a ledger created without a key (migrate) or by an older Truss: entry 0's signer founded it
        row = conn.execute("SELECT keyid FROM entries WHERE idx = 0").fetchone()
        if row is None or str(row[0]) == key.key_id:
            return True
    allowed = False
    for kind, raw in conn.execute(_KEY_STATEMENTS, (LOG_SESSION,)).fetchall():
        try:
            body: Any = json.loads(bytes(raw)).get("body")
        except (ValueError, AttributeError):
            continue
        if not isinstance(body, dict) or cast(dict[str, Any], body).get("key") != vkey:
            continue
        allowed = kind != "key_removed"
    return allowed


KEY_RETIRED: LiteralString = (
    "SELECT 1 FROM entries WHERE session = %s AND ((kind = 'key_rotated' AND keyid = %s) "
    "OR (kind = 'key_removed' AND position(%s::bytea IN raw) > 0)) LIMIT 1"
)
"""A ``key_rotated`` entry signed by the key (it retired itself), or a ``key_removed`` naming it.

Parameters: the log session, the key id, the key's verifier key text (as bytes)."""
_KEY_STATEMENTS: LiteralString = (
    "SELECT kind, raw FROM entries WHERE session = %s AND kind IN ('key_rotated', 'key_admitted', 'key_removed') "
    "ORDER BY seq"
)


def missing_node(db: str, level: int, index: int) -> StoreError:
    return StoreError(
        f"{db}: Merkle node ({level}, {index}) is not stored",
        remedy="run `truss ledger verify --all`; the tree may have been modified",
        db=db,
        level=level,
        index=index,
    )


_SELECT_NODES: LiteralString = (
    "SELECT n.level, n.idx, n.hash FROM unnest(%s::smallint[], %s::bigint[]) AS k(level, idx) "
    "JOIN nodes AS n ON n.level = k.level AND n.idx = k.idx"
)


def select_nodes(
    rows: Callable[[LiteralString, tuple[Any, ...]], list[tuple[Any, ...]]], db: str, keys: Sequence[tuple[int, int]]
) -> dict[tuple[int, int], bytes]:
    """The Merkle nodes ``keys`` in one query (the keys as two arrays joined on the primary key);
    ``StoreError`` naming one that is not stored."""
    found = {
        (int(r[0]), int(r[1])): bytes(r[2]) for r in rows(_SELECT_NODES, ([k[0] for k in keys], [k[1] for k in keys]))
    }
    for level, index in keys:
        if (level, index) not in found:
            raise missing_node(db, level, index)
    return found


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
