"""The PostgreSQL store against a real server: conformance, URLs, durability, locks, the publisher."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from tests._services.postgres import TempPostgres, require_psycopg
from truss._errors import InputError, KeyFileError, NotFoundError, StoreBusyError, StoreError, UsageError
from truss.keyring import rotate_identity_key
from truss.ledger.cosignature import cosign, with_signature_lines
from truss.ledger.entry import Record
from truss.ledger.keyhistory import LOG_SESSION, follow_rotations
from truss.ledger.keys import CosignerKey, IdentityKey, TrustedKeys
from truss.ledger.merkle import MemoryTree
from truss.ledger.note import open_checkpoint, sign_checkpoint, sign_checkpoint_note
from truss.ledger.verification import verify_ledger
from truss.testing import ManualClock, check_ledger_store
from truss.testing._processes import check_ledger_store_across_processes

require_psycopg()  # before the store import: a skip (a failure under CI), not a collection error
from truss.ledger.stores.postgresql import PostgresStore, open_postgresql, parse_postgres_url  # noqa: E402


def _key() -> IdentityKey:
    return IdentityKey.from_seed(bytes(range(32)), "store.truss.test")


def _start() -> Record:
    return Record("session_started", {"contract": "c"})


def test_postgresql_store_passes_the_conformance_check(postgres_urls: Callable[[], str]) -> None:
    check_ledger_store(lambda key, clock: open_postgresql(postgres_urls(), key=key, clock=clock))


def test_four_processes_of_four_writers_share_one_postgresql_log(postgres_url: str) -> None:
    check_ledger_store_across_processes(postgres_url, processes=4, sessions=4, steps=10)


def test_four_processes_of_four_writers_share_one_sqlite_file(tmp_path: Path) -> None:
    check_ledger_store_across_processes(str(tmp_path / "ledger.db"), processes=4, sessions=4, steps=10)


@pytest.mark.parametrize(
    ("attack", "url"),
    [
        ("password_in_user_info", "postgresql://truss:hunter2@db.internal/ledger"),
        ("password_query_parameter", "postgresql://truss@db.internal/ledger?password=hunter2"),
        ("sslpassword_query_parameter", "postgres://db.internal/ledger?sslpassword=hunter2"),
    ],
)
def test_a_url_holding_a_password_is_refused_without_echoing_it(attack: str, url: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_postgres_url(url)
    assert "hunter2" not in info.value.diagnostics(), attack


def test_truss_url_parameters_are_taken_out_before_libpq_sees_the_url() -> None:
    target = parse_postgres_url("postgresql://truss@/ledger?host=/run/pg&schema=team_a&checkpoint_interval=250ms")
    assert (target.schema, target.checkpoint_interval_ms) == ("team_a", 250)
    assert "schema" not in target.conninfo and "checkpoint_interval" not in target.conninfo
    assert "host=%2Frun%2Fpg" in target.conninfo and "application_name=truss" in target.conninfo
    with pytest.raises(UsageError):
        parse_postgres_url("postgresql:///ledger?schema=Robert');DROP")


def test_every_connection_commits_synchronously_whatever_the_url_asks(postgres_url: str) -> None:
    with open_postgresql(
        postgres_url + "&options=-csynchronous_commit%3Doff", key=_key(), clock=ManualClock()
    ) as store:
        settings = store.connection_settings()
    assert settings["synchronous_commit"] == "on" and settings["fsync"] == "on"
    assert settings["default_transaction_isolation"] == "read committed"


def test_a_server_that_loses_commits_in_a_crash_is_refused(postgres_server: TempPostgres) -> None:
    with TempPostgres(postgres_server.bindir, settings={"fsync": "off"}) as server, pytest.raises(StoreError) as info:
        open_postgresql(server.new_schema(), key=_key(), clock=ManualClock())
    assert info.value.fields.get("reason") == "unsafe_server"


def test_a_reopened_store_continues_the_chain_and_the_tree(postgres_url: str) -> None:
    key, clock, tree = _key(), ManualClock(), MemoryTree()
    with open_postgresql(postgres_url, key=key, clock=clock) as store:
        for entry in store.append("s", [_start(), Record("model_turn", {})]):
            tree.append(entry.raw)
    with open_postgresql(postgres_url, key=key, clock=clock) as store:
        [more] = store.append("s", [Record("model_turn", {"n": 2})])
        tree.append(more.raw)
        assert (more.seq, more.index) == (2, 2)
        assert store.tree_head() == (3, tree.root())
        assert verify_ledger(store, TrustedKeys([key.verifier])).ok


def test_opening_a_ledger_with_a_key_of_another_log_is_refused(postgres_url: str) -> None:
    open_postgresql(postgres_url, key=_key(), clock=ManualClock()).close()
    with pytest.raises(KeyFileError):
        open_postgresql(postgres_url, key=IdentityKey.generate("other.truss.test"), clock=ManualClock())


def test_a_missing_ledger_is_not_created_for_reading(postgres_url: str, postgres_server: TempPostgres) -> None:
    with pytest.raises(NotFoundError):
        open_postgresql(postgres_url, key=None, clock=ManualClock(), create=False)
    schema = parse_postgres_url(postgres_url).schema
    with postgres_server.admin() as admin:
        assert admin.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone() == (0,)


def test_a_schema_holding_other_tables_is_not_taken_for_a_ledger(
    postgres_url: str, postgres_server: TempPostgres
) -> None:
    schema = parse_postgres_url(postgres_url).schema
    with postgres_server.admin() as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
        admin.execute(f'CREATE TABLE "{schema}".invoices (id int)')
    with pytest.raises(InputError):
        open_postgresql(postgres_url, key=_key(), clock=ManualClock())


def test_an_unreachable_server_is_a_clear_store_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError) as info:
        PostgresStore(
            parse_postgres_url(f"postgresql://truss@/ledger?host={tmp_path}"),
            key=_key(),
            clock=ManualClock(),
            busy_timeout_ms=1000,
        )
    assert "cannot connect" in info.value.message


def test_a_writer_blocked_past_the_lock_timeout_fails_clearly_and_writes_nothing(
    postgres_url: str, postgres_server: TempPostgres
) -> None:
    target = parse_postgres_url(postgres_url)
    store = PostgresStore(target, key=_key(), clock=ManualClock(), busy_timeout_ms=200)
    store.append("s", [_start()])
    with postgres_server.admin() as other:
        other.execute("BEGIN")
        other.execute(f'SELECT * FROM "{target.schema}".tree FOR UPDATE')  # another worker's batch
        with pytest.raises(StoreBusyError) as info:
            store.append("s", [Record("model_turn", {})])
        other.execute("ROLLBACK")
    assert info.value.retryable
    assert store.append("s", [Record("model_turn", {})])[0].seq == 1, "nothing half-written: seq 1 is still free"
    store.close()


@pytest.mark.anyio
async def test_sessions_ending_at_once_share_one_checkpoint_from_one_publisher(
    postgres_url: str, postgres_server: TempPostgres
) -> None:
    key = _key()
    target = parse_postgres_url(postgres_url)
    stores = [open_postgresql(postgres_url, key=key, clock=ManualClock()) for _ in range(3)]
    got: dict[int, bytes] = {}

    def end_session(n: int) -> None:
        store = stores[n]
        store.append(f"s_{n}", [_start(), Record("verdict", {"status": "pass"}), Record("session_ended", {})])
        checkpoint = sign_checkpoint(store, key)
        assert checkpoint.note is not None
        got[n] = checkpoint.note

    with postgres_server.admin() as publisher, postgres_server.admin() as watcher:
        publisher.execute("BEGIN")
        publisher.execute(f'SELECT * FROM "{target.schema}".publisher FOR UPDATE')  # a publisher at work
        threads = [threading.Thread(target=end_session, args=(n,)) for n in range(3)]
        for t in threads:
            t.start()
        with anyio.fail_after(60):
            while True:  # until all three wait for the publisher row (another connection: fresh statistics)
                row = watcher.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s",
                    ("%FROM publisher%",),
                ).fetchone()
                if row is not None and row[0] == 3:
                    break
                await anyio.sleep(0.01)
        publisher.execute("ROLLBACK")
        for t in threads:
            t.join(timeout=60)
    assert sorted(got) == [0, 1, 2]
    stored = stores[0].checkpoints()
    assert [cp.size for cp in stored] == [9], "the first publisher's checkpoint covers all three"
    for note in got.values():
        assert open_checkpoint(note, [key.verifier], origin=key.name).size == 9
    for store in stores:
        store.close()


def test_a_session_ending_within_the_interval_still_gets_a_checkpoint_covering_it(
    postgres_url: str, postgres_server: TempPostgres
) -> None:
    key = _key()
    target = parse_postgres_url(postgres_url + "&checkpoint_interval=300ms")
    with PostgresStore(target, key=key, clock=ManualClock()) as store:
        store.append("s_a", [_start()])
        first = sign_checkpoint(store, key)
        [verdict] = store.append("s_b", [_start(), Record("verdict", {"status": "pass"})])[1:]
        second = sign_checkpoint(store, key)  # signed less than 300 ms after the first: it waits its turn
        assert first.size == 1 and second.size > verdict.index
        assert [cp.size for cp in store.checkpoints()] == [1, 3]


def test_a_key_rotated_away_by_another_worker_signs_nothing_more_and_cannot_reopen(
    postgres_url: str, tmp_path: Path
) -> None:
    clock = ManualClock()
    first = IdentityKey.create(tmp_path / "identity.key", name="store.truss.test")
    worker = open_postgresql(postgres_url, key=first, clock=clock)  # another host, still holding the old key
    worker.append("s_1", [_start()])
    rotate_identity_key(tmp_path / "identity.key", lambda k: open_postgresql(postgres_url, key=k, clock=clock))
    with pytest.raises(StoreError) as refused:
        worker.append("s_1", [Record("model_turn", {})])
    assert refused.value.reason == "key_retired"
    worker.close()
    with pytest.raises(KeyFileError) as reopened:
        open_postgresql(postgres_url, key=first, clock=clock)
    assert reopened.value.reason == "key_retired"
    current = IdentityKey.load(tmp_path / "identity.key")
    with open_postgresql(postgres_url, key=current, clock=clock) as store:
        store.append("s_2", [_start()])
        history = follow_rotations(store.read_session(LOG_SESSION), TrustedKeys([first.verifier]), origin=store.origin)
        assert verify_ledger(store, history.trusted, extra=[history.check]).ok


def test_cosignatures_two_workers_add_to_one_checkpoint_at_once_are_both_kept(postgres_url: str) -> None:
    key, clock = _key(), ManualClock()
    stores = [open_postgresql(postgres_url, key=key, clock=clock) for _ in range(2)]
    try:
        stores[0].append("s", [_start()])
        size, root = stores[0].tree_head()
        signed = sign_checkpoint_note(stores[0].origin, size, root, key)
        assert signed.note is not None
        note = signed.note
        stores[0].add_checkpoint(size, root, note.decode())
        witnesses = [CosignerKey.from_seed(bytes([n]) * 32, f"witness.test/w{n}") for n in (1, 2)]
        cosigned = [with_signature_lines(note, [cosign(signed.text(), w, 1_700_000_000)]).decode() for w in witnesses]
        threads = [
            threading.Thread(target=store.add_checkpoint, args=(size, root, text))
            for store, text in zip(stores, cosigned, strict=True)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        [held] = [c for c in stores[1].checkpoints() if c.size == size]
        assert all(w.name in held.note for w in witnesses), held.note
    finally:
        for store in stores:
            store.close()
