"""The SQLite store's schema versions: a schema 1 ledger (nodes keyed ``(level, idx)``, the Merkle
frontier rewritten in ``meta`` by every append) is brought to schema 2 (nodes keyed by the leaf
that completes them, no stored frontier) when it is opened, all or nothing, and verifies as before.

A schema 1 file is made from a schema 2 one by the inverse of the migration, with the DDL schema 1
shipped with (so the test does not depend on an old Truss being installed)."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest

from truss._errors import InputError, VerificationError
from truss.ledger.audit import verify_store
from truss.ledger.canonical import sha256_ref
from truss.ledger.entry import Record
from truss.ledger.keys import IdentityKey, TrustedKeys
from truss.ledger.merkle import Frontier, leaf_hash
from truss.ledger.note import sign_checkpoint
from truss.ledger.stores.sqlite import SCHEMA_VERSION, open_sqlite
from truss.testing import ManualClock

_V1_NODES = (
    "CREATE TABLE nodes (level INTEGER NOT NULL, idx INTEGER NOT NULL, hash BLOB NOT NULL,"
    " PRIMARY KEY (level, idx)) WITHOUT ROWID"
)


def _key() -> IdentityKey:
    return IdentityKey.from_seed(hashlib.sha256(b"schema").digest(), "schema.truss.test")


def _trusted() -> TrustedKeys:
    return TrustedKeys([_key().verifier])


def _fill(db: Path, sessions: int = 3, turns: int = 6) -> tuple[int, bytes]:
    with open_sqlite(db, key=_key(), clock=ManualClock()) as store:
        for s in range(sessions):
            store.append(f"s_{s}", [Record("session_started", {"contract": "c"})])
        for t in range(turns):
            for s in range(sessions):
                data = b"payload %d %d" % (s, t)
                ref = sha256_ref(data)
                store.append(f"s_{s}", [Record("model_turn", {"t": t, "p": ref}, {ref: data})])
            if t == 2:
                sign_checkpoint(store, _key())
        return store.tree_head()


def _as_schema_1(db: Path, *, frontier: bytes | None = None) -> None:
    """Rewrite a schema 2 ledger as schema 1 wrote it: ``(level, idx)`` nodes and a stored frontier."""
    conn = sqlite3.connect(str(db), isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        size = int(conn.execute("SELECT COUNT(*) FROM entries").fetchone()[0])
        state = frontier
        if state is None:
            rebuilt = Frontier()
            for (raw,) in conn.execute("SELECT raw FROM entries ORDER BY idx"):
                rebuilt.append(leaf_hash(bytes(raw)))
            assert rebuilt.size == size
            state = rebuilt.to_state()
        conn.execute("ALTER TABLE nodes RENAME TO nodes_v2")
        conn.execute(_V1_NODES)
        conn.execute("INSERT INTO nodes (level, idx, hash) SELECT level, ((last + 1) >> level) - 1, hash FROM nodes_v2")
        conn.execute("DROP TABLE nodes_v2")
        conn.execute("INSERT INTO meta (k, v) VALUES ('frontier', ?)", (state,))
        conn.execute("UPDATE meta SET v = ? WHERE k = 'schema'", (b"1",))
        conn.execute("COMMIT")
    finally:
        conn.close()


def _schema(db: Path) -> tuple[str, list[str], bool]:
    conn = sqlite3.connect(str(db))
    try:
        version = bytes(conn.execute("SELECT v FROM meta WHERE k = 'schema'").fetchone()[0]).decode()
        columns = [str(r[1]) for r in conn.execute("PRAGMA table_info(nodes)")]
        frontier = conn.execute("SELECT 1 FROM meta WHERE k = 'frontier'").fetchone() is not None
        return version, columns, frontier
    finally:
        conn.close()


def test_a_new_ledger_keys_its_nodes_by_the_leaf_that_completes_them_and_stores_no_frontier(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    _fill(db, sessions=1, turns=7)
    assert _schema(db) == (str(SCHEMA_VERSION), ["last", "level", "hash"], False)
    conn = sqlite3.connect(str(db))
    # Leaf 7 completes (0, 7), (1, 3), (2, 1) and (3, 0): one append's nodes are one key range.
    rows = conn.execute("SELECT level FROM nodes WHERE last = 7 ORDER BY level").fetchall()
    conn.close()
    assert [r[0] for r in rows] == [0, 1, 2, 3]


def test_a_schema_1_ledger_is_migrated_when_opened_and_verifies_with_the_same_tree(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    head = _fill(db)
    _as_schema_1(db)
    assert _schema(db) == ("1", ["level", "idx", "hash"], True)
    with open_sqlite(db, key=None, clock=ManualClock(), create=False) as store:  # a reader migrates too
        assert store.tree_head() == head
        report = verify_store(store, _trusted())
        assert report.ok, report
    assert _schema(db) == (str(SCHEMA_VERSION), ["last", "level", "hash"], False)


def test_a_migrated_ledger_takes_appends_and_checkpoints_and_still_verifies(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    size, _ = _fill(db)
    _as_schema_1(db)
    with open_sqlite(db, key=_key(), clock=ManualClock()) as store:
        [entry] = store.append("s_0", [Record("model_turn", {"after": True})])
        assert entry.index == size
        sign_checkpoint(store, _key())
        assert store.tree_size() == size + 1
        assert verify_store(store, _trusted()).ok
    with open_sqlite(db, key=None, clock=ManualClock(), create=False) as store:
        assert verify_store(store, _trusted()).ok


def test_a_schema_1_ledger_whose_stored_frontier_disagrees_with_its_nodes_is_refused_and_left_unchanged(
    tmp_path: Path,
) -> None:
    db = tmp_path / "ledger.db"
    _fill(db)
    forged = Frontier()
    forged.append(b"\x07" * 32)
    _as_schema_1(db, frontier=forged.to_state())
    with pytest.raises(VerificationError) as info:
        open_sqlite(db, key=_key(), clock=ManualClock(), create=False)
    assert info.value.fields["reason"] == "tree_mismatch"
    assert _schema(db) == ("1", ["level", "idx", "hash"], True)


def test_a_ledger_of_an_unknown_schema_is_refused_as_unusable_input(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    _fill(db, sessions=1, turns=1)
    conn = sqlite3.connect(str(db), isolation_level=None)
    conn.execute("UPDATE meta SET v = ? WHERE k = 'schema'", (b"9",))
    conn.close()
    with pytest.raises(InputError, match="schema 9"):
        open_sqlite(db, key=None, clock=ManualClock(), create=False)


def test_a_reader_reports_a_missing_frontier_node_as_a_tree_mismatch(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    _fill(db, sessions=1, turns=6)  # 7 leaves: the frontier is (2, 0), (1, 2), (0, 6)
    conn = sqlite3.connect(str(db), isolation_level=None)
    conn.execute("DELETE FROM nodes WHERE last = 5 AND level = 1")
    conn.close()
    with open_sqlite(db, key=None, clock=ManualClock(), create=False) as store:
        with pytest.raises(VerificationError) as info:
            store.tree_head()
        assert info.value.fields["reason"] == "tree_mismatch"
        with pytest.raises(VerificationError, match="is not stored"):
            verify_store(store, _trusted())  # as an unreadable stored frontier was: refused, exit 1
