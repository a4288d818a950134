"""Whole-log Merkle checks (LogAudit) over a real SQLite ledger, tampered where an attacker would."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator
from contextlib import closing
from pathlib import Path

import pytest

from tests.ledger.test_bundle import Ledger, build_ledger, trusted
from truss._errors import VerificationError
from truss.ledger import verify
from truss.ledger.audit import LogAudit, SessionInLog
from truss.ledger.note import sign_checkpoint_note
from truss.ledger.reader import VerifiedStore
from truss.ledger.verification import verify_ledger


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    built = build_ledger(tmp_path / "ledger.db")
    yield built
    built.store.close()


def audit(ledger: Ledger) -> tuple[str, str] | None:
    store = ledger.store
    log = LogAudit(store.checkpoints(), trusted(), store.origin, node=store.node)
    report = verify_ledger(store, trusted(), extra=[log.check])
    if not report.ok:
        return (report.reason or "", report.message or "")
    size, root = store.tree_head()
    return log.finish(size, root)


def _sql(ledger: Ledger, statement: str, *params: object) -> None:
    with closing(sqlite3.connect(ledger.store.db)) as conn, conn:
        conn.execute(statement, params)


def test_an_honest_log_passes_every_merkle_step(ledger: Ledger) -> None:
    assert audit(ledger) is None


def test_every_stored_checkpoint_is_checked_against_the_rebuilt_tree(ledger: Ledger) -> None:
    store = ledger.store
    log = LogAudit(store.checkpoints(), trusted(), store.origin)
    assert verify_ledger(store, trusted(), extra=[log.check]).ok
    assert log.checked == len(store.checkpoints()) == 2


def test_a_stored_leaf_that_is_not_the_entry_at_its_index_is_reported(ledger: Ledger) -> None:
    _sql(ledger, "UPDATE nodes SET hash = ? WHERE last = 5 AND level = 0", b"\x09" * 32)
    finding = audit(ledger)
    assert finding is not None and finding[0] == "leaf_mismatch"


def test_a_signed_checkpoint_whose_root_is_not_the_logs_is_reported(ledger: Ledger) -> None:
    forged = sign_checkpoint_note(ledger.store.origin, 4, b"\x07" * 32, ledger.key)
    assert forged.note is not None
    ledger.store.add_checkpoint(4, b"\x07" * 32, forged.note.decode())
    finding = audit(ledger)
    assert finding is not None and finding[0] == "checkpoint_root_mismatch"


def test_a_checkpoint_row_that_differs_from_its_note_is_reported(ledger: Ledger) -> None:
    _sql(ledger, "UPDATE checkpoints SET root = ? WHERE size = (SELECT MIN(size) FROM checkpoints)", b"\x05" * 32)
    finding = audit(ledger)
    assert finding is not None and finding[0] == "bad_stored_checkpoint"


def test_a_stored_checkpoint_with_a_broken_signature_is_reported(ledger: Ledger) -> None:
    _sql(ledger, "UPDATE checkpoints SET note = replace(note, 'bundles.truss.test', 'bundles.truss.test ') ")
    finding = audit(ledger)
    assert finding is not None


def test_a_checkpoint_beyond_the_log_means_the_log_shrank(ledger: Ledger) -> None:
    size, _ = ledger.store.tree_head()
    forged = sign_checkpoint_note(ledger.store.origin, size + 3, b"\x07" * 32, ledger.key)
    assert forged.note is not None
    ledger.store.add_checkpoint(size + 3, b"\x07" * 32, forged.note.decode())
    finding = audit(ledger)
    assert finding is not None and finding[0] == "log_shrank"


def test_a_stored_tree_root_that_the_entries_do_not_give_is_reported(ledger: Ledger) -> None:
    store = ledger.store
    log = LogAudit(store.checkpoints(), trusted(), store.origin)
    assert verify_ledger(store, trusted(), extra=[log.check]).ok
    size, root = store.tree_head()
    assert log.finish(size, root) is None
    finding = log.finish(size, b"\x00" * 32)
    assert finding is not None and finding[0] == "tree_mismatch"


def test_each_entry_of_one_session_is_proven_against_the_latest_checkpoint(ledger: Ledger) -> None:
    store = ledger.store
    in_log = SessionInLog(store.checkpoints(), trusted(), store.origin, store.nodes)
    report = verify_ledger(store, trusted(), session="s_verdict", extra=[in_log.check])
    assert report.ok and in_log.proven == report.entries == 9


def test_a_session_whose_stored_tree_was_altered_is_not_proven(ledger: Ledger) -> None:
    # Leaf 4's own proof does not read leaf 4; the proof of its sibling, leaf 5, does.
    _sql(ledger, "UPDATE nodes SET hash = ? WHERE last = 4 AND level = 0", b"\x09" * 32)
    store = ledger.store
    in_log = SessionInLog(store.checkpoints(), trusted(), store.origin, store.nodes)
    report = verify_ledger(store, trusted(), session="s_verdict", extra=[in_log.check])
    assert not report.ok and report.reason == "not_in_log" and report.index == 5


@pytest.mark.parametrize(
    ("statement", "value"),
    [
        ("UPDATE nodes SET hash = ? WHERE last = 4 AND level = 0", b"\x09" * 32),
        ("UPDATE nodes SET hash = ? WHERE last = 4 AND level = 0", b"\x09" * 31),
        ("DELETE FROM nodes WHERE last = 4 AND level = 0 AND ? IS NOT NULL", b""),
    ],
    ids=["altered", "short", "deleted"],
)
def test_verify_session_folds_each_proof_from_the_nodes_sqlite_streams_and_names_the_entry_an_altered_one_fails(
    ledger: Ledger, statement: str, value: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ledger.store
    streamed: list[int] = []
    stream = store.node_hashes

    def node_hashes(keys: Iterable[tuple[int, int]]) -> Iterator[bytes]:
        streamed.append(1)
        return stream(keys)

    monkeypatch.setattr(store, "node_hashes", node_hashes)
    assert verify(store, trusted(), session="s_verdict").ok
    assert len(streamed) == 9, "one streamed lookup per entry's proof"
    _sql(ledger, statement, value)
    report = verify(store, trusted(), session="s_verdict")
    assert not report.ok and report.reason == "not_in_log" and report.index == 5


def test_the_verified_reader_proves_a_session_in_batches_and_reads_it_whole(ledger: Ledger) -> None:
    store = ledger.store
    read = list(VerifiedStore(store, trusted()).read_session("s_verdict"))
    assert [e.seq for e in read] == list(range(9))
    assert read == list(store.read_session("s_verdict"))


def test_the_verified_reader_refuses_a_session_whose_proof_reads_an_altered_node_naming_the_entry(
    ledger: Ledger,
) -> None:
    # Leaf 3 is s_other's; the batch proof of s_verdict reads it as the sibling of its leaf 2 (seq 1).
    _sql(ledger, "UPDATE nodes SET hash = ? WHERE last = 3 AND level = 0", b"\x09" * 32)
    yielded: list[int] = []
    with pytest.raises(VerificationError) as refused:
        for item in VerifiedStore(ledger.store, trusted()).read_session("s_verdict"):
            yielded.append(item.seq)
    assert refused.value.fields.get("reason") == "not_in_log"
    assert refused.value.fields.get("index") == 2 and refused.value.fields.get("seq") == 1
    assert yielded == []  # nothing of the batch is read before it is proven
