"""The SQLite store: durability settings, concurrency, two processes, tampering (conformance: test_store_registry)."""

from __future__ import annotations

import gc
import sqlite3
import subprocess
import sys
import textwrap
import threading
import weakref
from pathlib import Path

import anyio
import pytest

from truss._errors import KeyFileError, NotFoundError, StoreBusyError
from truss.ledger.entry import Record
from truss.ledger.keys import IdentityKey, TrustedKeys
from truss.ledger.merkle import MemoryTree
from truss.ledger.stores.sqlite import SqliteStore, open_sqlite
from truss.ledger.verification import verify_ledger
from truss.testing import ManualClock

REPO = Path(__file__).resolve().parents[2]


def _key() -> IdentityKey:
    return IdentityKey.from_seed(bytes(range(32)), "store.truss.test")


def test_sqlite_store_uses_wal_and_full_sync_on_every_connection(tmp_path: Path) -> None:
    store = open_sqlite(tmp_path / "l.db", key=_key(), clock=ManualClock())
    for settings in store.connection_settings().values():
        assert settings == {"journal_mode": "wal", "synchronous": 2, "busy_timeout": 5000}  # 2 is FULL
    store.append("s", [Record("session_started", {"contract": "c"})], durable=False)
    assert store.connection_settings()["writer"]["synchronous"] == 1  # NORMAL for process durability
    store.append("s", [Record("model_turn", {})])
    assert store.connection_settings()["writer"]["synchronous"] == 2
    store.close()


def test_a_reopened_store_continues_the_chain_and_the_tree(tmp_path: Path) -> None:
    key, clock = _key(), ManualClock()
    tree = MemoryTree()
    with open_sqlite(tmp_path / "l.db", key=key, clock=clock) as store:
        for e in store.append("s", [Record("session_started", {"contract": "c"}), Record("model_turn", {})]):
            tree.append(e.raw)
    with open_sqlite(tmp_path / "l.db", key=key, clock=clock) as store:
        more = store.append("s", [Record("model_turn", {"n": 2})])
        tree.append(more[0].raw)
        assert more[0].seq == 2 and more[0].index == 2
        assert store.tree_head() == (3, tree.root())
        assert verify_ledger(store, TrustedKeys([key.verifier])).ok


def test_opening_a_ledger_with_a_key_of_another_log_is_refused(tmp_path: Path) -> None:
    open_sqlite(tmp_path / "l.db", key=_key(), clock=ManualClock()).close()
    with pytest.raises(KeyFileError):
        open_sqlite(tmp_path / "l.db", key=IdentityKey.generate("other.truss.test"), clock=ManualClock())


def test_a_missing_ledger_is_not_created_for_reading(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError):
        open_sqlite(tmp_path / "absent.db", key=None, clock=ManualClock(), create=False)
    assert not (tmp_path / "absent.db").exists()


@pytest.mark.anyio
async def test_16_tasks_appending_to_16_sessions_leave_16_valid_chains(tmp_path: Path) -> None:
    key = _key()
    store = open_sqlite(tmp_path / "l.db", key=key, clock=ManualClock())

    async def writer(n: int) -> None:
        session = f"s_{n:02d}"
        await anyio.to_thread.run_sync(lambda: store.append(session, [Record("session_started", {"contract": "c"})]))
        for i in range(25):
            await anyio.to_thread.run_sync(
                lambda i=i: store.append(session, [Record("mcp_tool_call", {"i": i})], expect_seq=i + 1)
            )

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for n in range(16):
                tg.start_soon(writer, n)
    trusted = TrustedKeys([key.verifier])
    whole = verify_ledger(store, trusted)
    assert whole.ok and whole.entries == 16 * 26 and whole.sessions == 16
    assert sorted(e.index for e in store.read_range(0, 10_000)) == list(range(16 * 26))
    for n in range(16):
        assert verify_ledger(store, trusted, session=f"s_{n:02d}").ok
    store.close()


def test_a_store_dropped_without_close_frees_its_writer_at_once(tmp_path: Path) -> None:
    # The writer and its group-commit queue hold no reference cycle, so the writer's connection
    # closes when the store's last reference goes, not at some later garbage collection.
    store = open_sqlite(tmp_path / "l.db", key=_key(), clock=ManualClock())
    store.append("s", [Record("session_started", {"contract": "c"})])
    writer = weakref.ref(store._writer)  # pyright: ignore[reportPrivateUsage]
    gc.disable()
    try:
        del store
        assert writer() is None
    finally:
        gc.enable()


def test_concurrent_durable_appends_share_commits(tmp_path: Path) -> None:
    store = open_sqlite(tmp_path / "l.db", key=_key(), clock=ManualClock())
    barrier = threading.Barrier(16)

    def writer(n: int) -> None:
        store.append(f"s_{n}", [Record("session_started", {"contract": "c"})])
        barrier.wait(timeout=30)
        for i in range(20):
            store.append(f"s_{n}", [Record("model_turn", {"i": i})])

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    stats = store.stats()
    assert stats["batches"] == 16 * 21
    assert stats["commits"] < stats["batches"], "concurrent writers share transactions"
    assert verify_ledger(store, TrustedKeys([_key().verifier])).ok
    store.close()


_WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from truss._clock import SystemClock
    from truss.ledger.entry import Record
    from truss.ledger.keys import IdentityKey
    from truss.ledger.stores.sqlite import open_sqlite

    db, session, count = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    key = IdentityKey.from_seed(bytes(range(32)), "store.truss.test")
    store = open_sqlite(db, key=key, clock=SystemClock(), busy_timeout_ms=30000)
    store.append(session, [Record("session_started", {"contract": "c"})])
    for i in range(count):
        store.append(session, [Record("model_turn", {"i": i})], durable=i % 4 == 0)
    store.close()
    print("done")
    """
)


@pytest.mark.slow
def test_two_processes_appending_to_one_ledger_file_do_not_corrupt_it(tmp_path: Path) -> None:
    db = tmp_path / "l.db"
    key = _key()
    open_sqlite(db, key=key, clock=ManualClock()).close()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(db), f"s_proc{n}", "150"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(2)
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert out.strip() == "done"
    store = open_sqlite(db, key=key, clock=ManualClock())
    report = verify_ledger(store, TrustedKeys([key.verifier]))
    assert report.ok and report.entries == 302 and report.sessions == 2, report
    store.close()


def test_a_writer_blocked_past_the_busy_timeout_fails_clearly_and_writes_nothing(tmp_path: Path) -> None:
    db = tmp_path / "l.db"
    key = _key()
    store = open_sqlite(db, key=key, clock=ManualClock(), busy_timeout_ms=50)
    store.append("s", [Record("session_started", {"contract": "c"})])
    other = sqlite3.connect(str(db), isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process's writer holds the lock
    with pytest.raises(StoreBusyError) as info:
        store.append("s", [Record("model_turn", {})])
    assert info.value.retryable
    other.execute("ROLLBACK")
    other.close()
    assert store.append("s", [Record("model_turn", {})])[0].seq == 1, "nothing half-written: seq 1 is still free"
    store.close()


def _tamper(db: Path, sql: str) -> None:
    conn = sqlite3.connect(str(db), isolation_level=None)
    conn.execute(sql)
    conn.close()


@pytest.mark.parametrize(
    ("attack", "sql", "session", "reason"),
    [
        ("deleted_last_entry_of_a_session", "DELETE FROM entries WHERE idx = 3", "s_a", "head_mismatch"),
        ("deleted_last_entry_of_a_session", "DELETE FROM entries WHERE idx = 3", None, "index_gap"),
        ("deleted_last_entry_of_the_log", "DELETE FROM entries WHERE idx = 4", None, "truncated"),
        ("deleted_middle_entry", "DELETE FROM entries WHERE session = 's_a' AND seq = 1", "s_a", "seq_gap"),
        (
            "body_edited_in_place",
            "UPDATE entries SET raw = replace(raw, '\"n\":1', '\"n\":7') WHERE idx = 2",
            None,
            "hash_mismatch",
        ),
        ("raw_made_unreadable", "UPDATE entries SET raw = X'FF00' WHERE idx = 3", None, "malformed"),
        ("hash_column_edited", "UPDATE entries SET hash = zeroblob(32) WHERE idx = 1", None, "hash_mismatch"),
        ("blob_bytes_edited", "UPDATE blobs SET data = X'00'", "s_a", "blob_mismatch"),
        ("session_row_deleted", "DELETE FROM sessions WHERE id = 's_b'", None, "head_mismatch"),
    ],
)
def test_a_tampered_sqlite_ledger_is_reported(
    tmp_path: Path, attack: str, sql: str, session: str | None, reason: str
) -> None:
    from truss.ledger.canonical import sha256_ref

    db = tmp_path / "l.db"
    key = _key()
    with open_sqlite(db, key=key, clock=ManualClock()) as store:
        ref = sha256_ref(b"payload")
        store.append("s_a", [Record("session_started", {"contract": "c"})])
        store.append("s_b", [Record("session_started", {"contract": "c"})])
        store.append(
            "s_a", [Record("model_turn", {"n": 1, "p": ref}, {ref: b"payload"}), Record("model_turn", {"n": 2})]
        )
        store.append("s_b", [Record("model_turn", {"n": 3})])
    _tamper(db, sql)
    with open_sqlite(db, key=None, clock=ManualClock(), create=False) as store:
        report = verify_ledger(store, TrustedKeys([key.verifier]), session=session)
    assert not report.ok and report.reason == reason, (attack, report)


@pytest.mark.parametrize(
    ("sql", "session", "reason", "counts", "named"),
    [
        ("DELETE FROM entries WHERE idx = 2", "s_a", "head_mismatch", (1, 1, 0), "s_a"),
        ("DELETE FROM entries WHERE idx = 2", None, "truncated", (2, 2, 0), None),
        ("DELETE FROM sessions WHERE id = 's_b'", None, "head_mismatch", (3, 2, 0), "s_b"),
    ],
)
def test_a_failure_found_after_the_entries_verified_keeps_their_counts_and_names_the_session(
    tmp_path: Path, sql: str, session: str | None, reason: str, counts: tuple[int, int, int], named: str | None
) -> None:
    db = tmp_path / "l.db"
    key = _key()
    with open_sqlite(db, key=key, clock=ManualClock()) as store:
        store.append("s_a", [Record("session_started", {"contract": "c"})])
        store.append("s_b", [Record("session_started", {"contract": "c"})])
        store.append("s_a", [Record("model_turn", {"n": 1})])
    _tamper(db, sql)
    with open_sqlite(db, key=None, clock=ManualClock(), create=False) as store:
        report = verify_ledger(store, TrustedKeys([key.verifier]), session=session)
    assert not report.ok and report.reason == reason
    assert (report.entries, report.sessions, report.blobs_checked) == counts
    assert report.session == named and report.head is None and report.seq is None and report.index is None


def test_a_read_only_store_refuses_to_append(tmp_path: Path) -> None:
    from truss._errors import StoreError

    open_sqlite(tmp_path / "l.db", key=_key(), clock=ManualClock()).close()
    store: SqliteStore = open_sqlite(tmp_path / "l.db", key=None, clock=ManualClock())
    with pytest.raises(StoreError):
        store.append("s", [Record("session_started", {})])
    store.close()


def test_reads_page_through_sessions_and_ranges_longer_than_one_page(tmp_path: Path) -> None:
    key = _key()
    with open_sqlite(tmp_path / "l.db", key=key, clock=ManualClock()) as store:
        records = [Record("session_started", {"contract": "c"})] + [Record("model_turn", {"i": i}) for i in range(2499)]
        assert store.bulk_append([("s_long", records), ("s_short", records[:3])], per_txn=1) == 2503
        assert [e.seq for e in store.read_session("s_long")] == list(range(2500))
        assert [e.seq for e in store.read_session("s_long", from_seq=999)] == list(range(999, 2500))
        assert [e.index for e in store.read_range(998, 2502)] == list(range(998, 2502))
        assert verify_ledger(store, TrustedKeys([key.verifier])).ok
