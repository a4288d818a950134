"""What the SQL stores say alike: the same tables, queries and row conversions in SQLite and PostgreSQL.

``SqlReads`` is the part of ``LedgerStore`` both SQL stores answer with the same queries (sessions,
entries page by page, payloads, checkpoints, envelopes, the tree's head); a store mixes it in with
its placeholder (``class SqliteStore(SqlReads, mark="?")``, ``mark="%s"`` for psycopg) and supplies
``_rows`` (one query on its reading connection, its errors mapped to ``StoreError``), ``_entry`` (a
row's raw columns as a ``StoredEntry``: each driver hands back its own types) and ``_frontier_now``.
Every query text is a ``LiteralString`` built once per store class, as psycopg's typing asks.

Nothing read here is trusted: a session row is a cache of its chain, and an entry a row holds is
handed to verification as it is (``stored_entry`` makes an unreadable one into an entry that
verification reports as malformed instead of failing here).

``SessionRows`` is the one write they share: the statement that leaves a session's row as an
append left it (inserted for a new session, else updated), inside the writer's transaction.

What it does not do: the other writes, connections, the Merkle nodes (each store looks them up its
own way), or decide what is true (``truss.ledger.verification``).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar, LiteralString, Self

from truss.ledger.canonical import canonical
from truss.ledger.entry import Record, StoredEntry, session_status
from truss.ledger.merkle import EMPTY_ROOT, Frontier
from truss.ledger.stores.base import SessionHead, SessionInfo, StoredCheckpoint, session_fields

__all__ = ["SessionRows", "SqlReads", "checkpoint_of", "stored_entry"]

PAGE = 1000
FIRST_PAGE = 8  # read_session's first page: what reading a session's first entry costs
_SESSION_SELECT: LiteralString = (
    "SELECT id, contract, principal, status, entries, started_ms, updated_ms, head, ended FROM sessions"
)
_CHECKPOINT_SELECT: LiteralString = "SELECT size, root, note, created_ms FROM checkpoints"


def stored_entry(raw: bytes, sig: bytes, keyid: str, digest: str) -> StoredEntry:
    """The entry a row holds; rows edited outside Truss may hold anything, so one that does not
    parse becomes an entry verification reports as malformed rather than an error here."""
    try:
        return StoredEntry.from_raw(raw, sig, keyid, digest)
    except (ValueError, UnicodeDecodeError):
        return StoredEntry(entry={"unreadable": True}, hash=digest, sig=sig, keyid=keyid, raw=raw or b"-")


def checkpoint_of(row: Sequence[Any]) -> StoredCheckpoint:
    """A ``_CHECKPOINT_SELECT`` row as the checkpoint it holds."""
    return StoredCheckpoint(int(row[0]), bytes(row[1]), str(row[2]), int(row[3]))


def _session_info(row: Sequence[Any]) -> SessionInfo:
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


class ReadSql:
    """The read queries in one placeholder style (``?`` or ``%s``)."""

    def __init__(self, mark: LiteralString) -> None:
        def q(text: LiteralString) -> LiteralString:
            return text.replace("?", mark)  # the texts below hold no other question mark

        self.mark: LiteralString = mark
        self.session: LiteralString = q(_SESSION_SELECT + " WHERE id = ?")
        self.session_page: LiteralString = q(
            "SELECT raw, sig, keyid, hash, seq FROM entries WHERE session = ? AND seq >= ? ORDER BY seq LIMIT ?"
        )
        self.range_page: LiteralString = q(
            "SELECT raw, sig, keyid, hash, idx FROM entries WHERE idx >= ? AND idx < ? ORDER BY idx LIMIT ?"
        )
        self.blob: LiteralString = q("SELECT data FROM blobs WHERE ref = ?")
        self.erased: LiteralString = q("SELECT ref FROM erased WHERE session = ?")
        self.linked: LiteralString = q("SELECT ref FROM session_blobs WHERE session = ?")
        self.checkpoints: LiteralString = _CHECKPOINT_SELECT + " ORDER BY size"
        self.latest: LiteralString = _CHECKPOINT_SELECT + " ORDER BY size DESC LIMIT 1"
        self.covering: LiteralString = q(_CHECKPOINT_SELECT + " WHERE size >= ? ORDER BY size LIMIT 1")
        self.envelope: LiteralString = q("SELECT envelope FROM sessions WHERE id = ?")

    def sessions(self, status: str | None, limit: int | None, principal: Any) -> tuple[LiteralString, tuple[Any, ...]]:
        where: list[LiteralString] = []
        params: list[Any] = []
        if status is not None:
            where.append("status = " + self.mark)
            params.append(status)
        if principal is not None:
            where.append("principal = " + self.mark)
            params.append(canonical(principal).decode("utf-8"))
        query = _SESSION_SELECT
        if where:
            query += " WHERE " + " AND ".join(where)
        query += " ORDER BY started_ms DESC, id DESC"
        if limit is not None:
            query += " LIMIT " + self.mark
            params.append(max(0, limit))
        return query, tuple(params)


class SessionRows:
    """The statement that leaves a session's row as an append left it, in one placeholder style.

    ``flags``: how the driver's ``ended`` column takes false and true (SQLite's integer, psycopg's
    bool: sqlite3 binds a Python bool through its adapter lookup, several times an int's cost).
    """

    def __init__(self, mark: LiteralString, flags: tuple[Any, Any]) -> None:
        self._insert: LiteralString = (
            "INSERT INTO sessions (id, contract, principal, status, entries, started_ms, updated_ms, head, ended)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
        ).replace("?", mark)
        self._update: LiteralString = (
            "UPDATE sessions SET entries = ?, head = ?, updated_ms = ?, ended = ?, status = ? WHERE id = ?"
        ).replace("?", mark)
        self._flags = flags

    def after(
        self, session: str, head: SessionHead | None, records: Sequence[Record], out: Sequence[StoredEntry]
    ) -> tuple[SessionHead, LiteralString, tuple[Any, ...]]:
        """``out`` (the entries ``records`` became) appended to ``session``, whose row was ``head``
        (None: a new session, its row inserted): the session's new head, and the statement that
        records it."""
        last = out[-1]
        kind = last.kind
        now = SessionHead(last.seq + 1, last.hash, kind == "session_ended")
        status = session_status(session, kind, last.body)
        if head is None:
            contract, principal = session_fields(records[0])
            principal_json = None if principal is None else canonical(principal).decode("utf-8")
            started = out[0].ts
            row = (session, contract, principal_json, status, now.seq, started, last.ts, bytes.fromhex(now.head))
            return now, self._insert, (*row, self._flags[now.ended])
        return now, self._update, (now.seq, bytes.fromhex(now.head), last.ts, self._flags[now.ended], status, session)


class SqlReads(ABC):
    """The reads of ``LedgerStore`` both SQL stores make alike (see the module docstring); each store
    supplies the four abstract methods below."""

    read_sql: ClassVar[ReadSql]

    def __init_subclass__(cls, *, mark: LiteralString, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.read_sql = ReadSql(mark)

    @abstractmethod
    def _rows(self, query: LiteralString, params: tuple[Any, ...]) -> Sequence[Sequence[Any]]:
        """The rows ``query`` (in this store's placeholder style) returns for ``params``."""

    @abstractmethod
    def _entry(self, row: Sequence[Any]) -> StoredEntry:
        """A row of ``raw, sig, keyid, hash`` (then anything) as its entry (``stored_entry``)."""

    @abstractmethod
    def _frontier_now(self) -> Frontier:
        """The log's frontier as of one snapshot."""

    def session(self, session: str) -> SessionInfo | None:
        rows = self._rows(self.read_sql.session, (session,))
        return _session_info(rows[0]) if rows else None

    def sessions(
        self, *, status: str | None = None, limit: int | None = None, principal: Any = None
    ) -> list[SessionInfo]:
        """Sessions, most recently started first; filtered by status and principal (JSON equality)."""
        return [_session_info(r) for r in self._rows(*self.read_sql.sessions(status, limit, principal))]

    def read_session(self, session: str, *, from_seq: int = 0) -> Iterator[StoredEntry]:
        """The session's entries in seq order from ``from_seq``, read a page at a time: the first
        page small (a listing reads one entry of each session), the next ones growing to ``PAGE``."""
        seq, page = from_seq, FIRST_PAGE
        while True:
            rows = self._rows(self.read_sql.session_page, (session, seq, page))
            for row in rows:
                yield self._entry(row)
            if len(rows) < page:
                return
            seq, page = int(rows[-1][4]) + 1, min(PAGE, page * 8)

    def read_range(self, start: int, stop: int) -> Iterator[StoredEntry]:
        """Entries with ``start <= index < stop`` in index order, read a page at a time."""
        index = max(0, start)
        while index < stop:
            rows = self._rows(self.read_sql.range_page, (index, stop, PAGE))
            for row in rows:
                yield self._entry(row)
            if len(rows) < PAGE:
                return
            index = int(rows[-1][4]) + 1

    def blob(self, ref: str) -> bytes | None:
        rows = self._rows(self.read_sql.blob, (ref,))
        return bytes(rows[0][0]) if rows else None

    def erased_refs(self, session: str) -> set[str]:
        return {str(r[0]) for r in self._rows(self.read_sql.erased, (session,))}

    def session_refs(self, session: str) -> set[str]:
        """Refs whose bytes this session still links to."""
        return {str(r[0]) for r in self._rows(self.read_sql.linked, (session,))}

    def tree_size(self) -> int:
        return self._frontier_now().size

    def tree_root(self) -> bytes:
        return self._frontier_now().root()

    def tree_head(self) -> tuple[int, bytes]:
        """``(size, root)`` read together, so an append in between cannot split them."""
        frontier = self._frontier_now()
        return frontier.size, frontier.root() if frontier.size else EMPTY_ROOT

    def checkpoints(self) -> list[StoredCheckpoint]:
        return [checkpoint_of(r) for r in self._rows(self.read_sql.checkpoints, ())]

    def latest_checkpoint(self) -> StoredCheckpoint | None:
        rows = self._rows(self.read_sql.latest, ())
        return checkpoint_of(rows[0]) if rows else None

    def checkpoint_covering(self, size: int) -> StoredCheckpoint | None:
        rows = self._rows(self.read_sql.covering, (size,))
        return checkpoint_of(rows[0]) if rows else None

    def envelope(self, session: str) -> bytes | None:
        rows = self._rows(self.read_sql.envelope, (session,))
        return bytes(rows[0][0]) if rows and rows[0][0] is not None else None

    @abstractmethod
    def close(self) -> None:
        """Close the store's connections."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
