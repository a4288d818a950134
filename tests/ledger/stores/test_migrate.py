"""``migrate_ledger``: a SQLite ledger copied into PostgreSQL verifies there with the same keys."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tests._services.postgres import require_psycopg
from tests.ledger._fixtures import build_store, golden_key
from truss._errors import StoreConflictError, VerificationError
from truss.ledger.audit import verify_store
from truss.ledger.keys import TrustedKeys
from truss.ledger.note import sign_checkpoint
from truss.ledger.store import SqliteStore, open_store
from truss.testing import ManualClock

require_psycopg()  # before the store import: a skip (a failure under CI), not a collection error
from truss.ledger.stores.migrate import migrate_ledger  # noqa: E402
from truss.ledger.stores.postgresql import PostgresStore, parse_postgres_url  # noqa: E402


def _source(tmp_path: Path) -> SqliteStore:
    key = golden_key()
    store: SqliteStore = build_store(key, lambda k, clock: open_store(tmp_path / "ledger.db", key=k, clock=clock))
    sign_checkpoint(store, key)
    store.erase_payloads("s_alpha")
    return store


def _target(url: str, origin: str) -> PostgresStore:
    return PostgresStore(parse_postgres_url(url), key=None, clock=ManualClock(), origin=origin)


def test_a_migrated_ledger_verifies_with_the_same_keys_and_says_what_the_source_said(
    tmp_path: Path, postgres_url: str
) -> None:
    source = _source(tmp_path)
    target = _target(postgres_url, source.origin)
    trusted = TrustedKeys([golden_key().verifier])
    report = migrate_ledger(source, target, trusted)
    assert (report.entries, report.sessions, report.checkpoints) == (11, 2, 1)
    assert verify_store(target, trusted).ok
    assert target.tree_head() == source.tree_head()
    assert [e.raw for e in target.read_range(0, 99)] == [e.raw for e in source.read_range(0, 99)]
    assert [e.sig for e in target.read_range(0, 99)] == [e.sig for e in source.read_range(0, 99)]
    assert target.sessions() == source.sessions()
    assert target.checkpoints()[0].note == source.checkpoints()[0].note
    assert target.envelope("s_alpha") == source.envelope("s_alpha")
    assert target.erased_refs("s_alpha") == source.erased_refs("s_alpha")
    refs = {ref for e in source.read_range(0, 99) for ref in e.refs()}
    assert target.blobs_for(refs) == source.blobs_for(refs), "erased payloads stay erased, kept ones are kept"
    source.close()
    target.close()


def test_a_source_that_does_not_verify_is_not_copied_at_all(tmp_path: Path, postgres_url: str) -> None:
    source = _source(tmp_path)
    source.close()
    conn = sqlite3.connect(str(tmp_path / "ledger.db"), isolation_level=None)
    conn.execute("UPDATE entries SET raw = replace(raw, 'repo-triage', 'repo-triagE') WHERE idx = 0")
    conn.close()
    source = open_store(tmp_path / "ledger.db", key=None, clock=ManualClock(), create=False)
    target = _target(postgres_url, source.origin)
    with pytest.raises(VerificationError):
        migrate_ledger(source, target, TrustedKeys([golden_key().verifier]))
    assert target.tree_size() == 0 and target.sessions() == [] and target.checkpoints() == []
    source.close()
    target.close()


def test_migrating_into_a_ledger_that_holds_entries_is_refused(tmp_path: Path, postgres_url: str) -> None:
    source = _source(tmp_path)
    target = _target(postgres_url, source.origin)
    trusted = TrustedKeys([golden_key().verifier])
    migrate_ledger(source, target, trusted)
    with pytest.raises(StoreConflictError):
        migrate_ledger(source, target, trusted)
    assert target.tree_size() == 11
    source.close()
    target.close()


# What a copy reads besides the entries goes through the verified reader's rules: a source whose
# rows or envelopes say what its signed entries do not is refused, and nothing is copied.
_SOURCE_ATTACKS = {
    "forged_verdict_envelope": 'UPDATE sessions SET envelope = CAST(\'{"payloadType":"x"}\' AS BLOB)'
    " WHERE id = 's_alpha'",
    "session_row_status_rewritten": "UPDATE sessions SET status = 'pass' WHERE id = 's_beta'",
}


@pytest.mark.parametrize("attack", sorted(_SOURCE_ATTACKS))
def test_a_source_whose_rows_or_envelopes_contradict_its_entries_is_not_copied_at_all(
    tmp_path: Path, postgres_url: str, attack: str
) -> None:
    _source(tmp_path).close()
    conn = sqlite3.connect(str(tmp_path / "ledger.db"), isolation_level=None)
    assert conn.execute(_SOURCE_ATTACKS[attack]).rowcount == 1
    conn.close()
    source = open_store(tmp_path / "ledger.db", key=None, clock=ManualClock(), create=False)
    target = _target(postgres_url, source.origin)
    with pytest.raises(VerificationError):
        migrate_ledger(source, target, TrustedKeys([golden_key().verifier]))
    assert target.tree_size() == 0 and target.sessions() == [] and target.checkpoints() == []
    source.close()
    target.close()
