"""Key rotation: the log's key history followed from a trusted starting key; forged and malformed
rotation statements (one data file per attack); a retired key refused by the store."""

from __future__ import annotations

import json
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from truss._errors import KeyFileError, StoreError, VerificationError
from truss.keyring import read_history, rotate_identity_key, trust_root
from truss.ledger import verify
from truss.ledger.bundle import export_bundle, verify_bundle
from truss.ledger.canonical import canonical
from truss.ledger.entry import Record, StoredEntry
from truss.ledger.envelope import sign_verdict, verdict_statement
from truss.ledger.keyhistory import (
    LOG_SESSION,
    admission_record,
    append_to_log,
    ensure_log_session,
    follow_rotations,
    join_request,
    removal_record,
    rotation_record,
)
from truss.ledger.keys import IdentityKey, TrustedKeys, VerifierKey
from truss.ledger.note import parse_checkpoint, parse_note, sign_checkpoint_note
from truss.ledger.reader import VerifiedStore
from truss.ledger.stores import open_store
from truss.ledger.stores.sqlite import open_sqlite
from truss.ledger.verification import verify_ledger
from truss.testing import ManualClock

FIXTURES = Path(__file__).parent / "tampered_rotations"
ORIGIN = "truss.test/witnessed-log"
ATTACKS = {
    "forged_rotation_signed_by_the_key_it_introduces": "forged_rotation",
    "rotation_signed_by_a_retired_key": "forged_rotation",
    "rotation_naming_another_key_as_the_one_replaced": "forged_rotation",
    "rotation_with_a_from_index_in_the_future": "bad_rotation",
    "rotation_without_the_new_keys_consent": "bad_rotation",
    "rotation_body_changed_after_signing": "bad_rotation",
}
REMEDIES = {
    "forged_rotation": "do not trust entries signed by the key it introduces; the log's key history was forged",
    "bad_rotation": "the key history is malformed; do not trust entries signed after it",
}


def _fixture(name: str) -> tuple[TrustedKeys, list[StoredEntry]]:
    doc: Any = json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))
    return TrustedKeys.from_texts(doc["trusted"]), [StoredEntry.from_json(e) for e in doc["entries"]]


def test_two_rotations_are_followed_from_the_first_key_and_each_key_signs_only_its_span() -> None:
    trusted, entries = _fixture("valid_two_rotations")
    history = follow_rotations(entries, trusted, origin=ORIGIN)
    spans = [(p.from_index, p.until_index) for p in history.periods]
    first, second = entries[1].index, entries[2].index
    assert spans == [(0, first + 1), (first + 1, second + 1), (second + 1, None)]
    assert len(history.trusted) == 3 and len(history.rotations) == 2
    assert history.checkpoint_keys(first + 1) == [history.periods[0].key, history.periods[1].key]
    assert history.checkpoint_keys(second + 5) == [history.periods[2].key]


@pytest.mark.parametrize("name", sorted(ATTACKS), ids=sorted(ATTACKS))
def test_a_forged_or_malformed_rotation_statement_fails_with_its_reason(name: str) -> None:
    trusted, entries = _fixture(name)
    with pytest.raises(VerificationError) as info:
        follow_rotations(entries, trusted, origin=ORIGIN)
    assert info.value.reason == ATTACKS[name]
    assert info.value.session == LOG_SESSION and isinstance(info.value.index, int)
    statement = next(e for e in entries if e.index == info.value.index)
    assert info.value.seq == statement.seq and info.value.remedy == REMEDIES[ATTACKS[name]]


def test_a_verifier_that_starts_from_a_later_key_skips_the_statements_before_it() -> None:
    _, entries = _fixture("valid_two_rotations")
    later = VerifierKey.parse(entries[1].body["key"])
    history = follow_rotations(entries, TrustedKeys([later]), origin=ORIGIN)
    assert history.periods[0].key == later and len(history.periods) == 2


def _home(tmp_path: Path) -> tuple[Path, Path, IdentityKey]:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    key = IdentityKey.create(home / "identity.key", name=ORIGIN)
    return home / "identity.key", home / "ledger.db", key


def _run(db: Path, key: IdentityKey, session: str, clock: ManualClock) -> None:
    with closing(open_store(db, key=key, clock=clock)) as store:
        records = [Record("session_started", {"contract": "c"}), Record("session_ended", {"status": "pass"})]
        store.append(session, records)


def test_entries_before_and_after_a_rotation_verify_from_the_first_key_alone(tmp_path: Path) -> None:
    key_path, db, first = _home(tmp_path)
    clock = ManualClock()
    _run(db, first, "s_before", clock)
    result = rotate_identity_key(key_path, lambda k: open_store(db, key=k, clock=clock, create=False))
    current = IdentityKey.load(key_path)
    assert current.verifier == result.new and current.name == first.name, "same origin, new key"
    assert [k.key_id for k in read_history(key_path)] == [first.key_id, current.key_id]
    assert trust_root(key_path) == [first.verifier]
    _run(db, current, "s_after", clock)
    with closing(open_store(db, key=None, clock=clock, create=False)) as store:
        history = follow_rotations(store.read_session(LOG_SESSION), TrustedKeys([first.verifier]), origin=store.origin)
        report = verify_ledger(store, history.trusted, extra=[history.check])
        assert report.ok, report
        assert not verify_ledger(store, TrustedKeys([first.verifier])).ok, "without following, the new key is unknown"
        [rotation] = history.rotations
        assert rotation.statement is not None and rotation.from_index == rotation.statement.index + 1


def test_the_store_refuses_a_retired_key_at_open_and_at_its_next_append(tmp_path: Path) -> None:
    key_path, db, first = _home(tmp_path)
    clock = ManualClock()
    _run(db, first, "s_1", clock)
    still_open = open_store(db, key=first, clock=clock)  # another process holding the old key
    rotate_identity_key(key_path, lambda k: open_store(db, key=k, clock=clock, create=False))
    with pytest.raises(StoreError) as info:
        still_open.append("s_2", [Record("session_started", {"contract": "c"})])
    assert info.value.reason == "key_retired"
    still_open.close()
    with pytest.raises(KeyFileError) as opened:
        open_store(db, key=first, clock=clock)
    assert opened.value.reason == "key_retired"


def test_a_removed_worker_key_is_refused_by_the_sqlite_store_at_its_next_append_and_at_open(tmp_path: Path) -> None:
    _, db, log_key = _home(tmp_path)
    clock = ManualClock()
    _run(db, log_key, "s_1", clock)
    worker = IdentityKey.generate(log_key.name)
    with closing(open_store(db, key=log_key, clock=clock)) as log_store:
        append_to_log(log_store, [admission_record(worker.verifier, join_request(worker))])
        with closing(open_store(db, key=worker, clock=clock)) as still_open:  # the worker, opened before
            still_open.append("s_w", [Record("session_started", {"contract": "c"})])
            append_to_log(log_store, [removal_record(worker.verifier)])
            size = still_open.tree_size()
            with pytest.raises(StoreError) as info:
                still_open.append("s_w", [Record("session_ended", {"status": "pass"})])
            assert info.value.reason == "key_retired"
            assert still_open.tree_size() == size, "nothing is signed by the removed key"
    with pytest.raises(KeyFileError) as opened:
        open_store(db, key=worker, clock=clock)
    assert opened.value.reason == "key_retired"
    with closing(open_store(db, key=None, clock=clock, create=False)) as store:
        trusted = TrustedKeys([log_key.verifier])
        history = follow_rotations(store.read_session(LOG_SESSION), trusted, origin=store.origin)
        report = verify_ledger(store, history.trusted, extra=[history.check])
        assert report.ok, report


def test_batches_committed_after_a_rotation_in_its_transaction_are_refused_not_signed_by_the_retired_key(
    tmp_path: Path,
) -> None:
    _, db, first = _home(tmp_path)
    clock = ManualClock()
    _run(db, first, "s_1", clock)
    new = IdentityKey.generate(first.name)
    with closing(open_sqlite(str(db), key=first, clock=clock)) as store:
        ensure_log_session(store)
        rotation = rotation_record(first, new, store.tree_size() + 1)
        started = Record("session_started", {"contract": "c"})
        with pytest.raises(StoreError) as info:  # one transaction, as a group commit of two callers is
            store.bulk_append([(LOG_SESSION, [rotation]), ("s_2", [started])])
        assert info.value.reason == "key_retired"
        assert store.session("s_2") is None, "nothing is signed by the key the rotation retired"
    with closing(open_store(db, key=None, clock=clock, create=False)) as store:
        history = follow_rotations(store.read_session(LOG_SESSION), TrustedKeys([first.verifier]), origin=store.origin)
        assert len(history.rotations) == 1
        report = verify_ledger(store, history.trusted, extra=[history.check])
        assert report.ok, report


@pytest.mark.parametrize("backend", ["sqlite", "memory"])
def test_records_after_a_rotation_in_its_own_batch_are_refused_whole_not_signed_by_the_retired_key(
    tmp_path: Path, backend: str
) -> None:
    first = IdentityKey.generate(ORIGIN)
    clock = ManualClock()
    url = str(tmp_path / "ledger.db") if backend == "sqlite" else "memory:"
    with closing(open_store(url, key=first, clock=clock, create=True)) as store:
        ensure_log_session(store)
        size = store.tree_size()
        rotation = rotation_record(first, IdentityKey.generate(ORIGIN), size + 1)
        with pytest.raises(StoreError) as info:
            store.append(LOG_SESSION, [rotation, Record("model_turn", {})])
        assert info.value.reason == "key_retired"
        assert store.tree_size() == size, "nothing of the batch is written"
        assert verify_ledger(store, TrustedKeys([first.verifier])).ok


def test_a_rotation_interrupted_after_its_statement_is_completed_by_rotating_again(tmp_path: Path) -> None:
    key_path, db, first = _home(tmp_path)
    clock = ManualClock()
    _run(db, first, "s_1", clock)
    prepared = key_path.with_name("identity.key.next")

    def crash_after_recording(key: IdentityKey | None) -> Any:
        store = open_store(db, key=key, clock=clock, create=False)
        original_close = store.close

        def close() -> None:
            original_close()
            raise KeyboardInterrupt  # the process dies once the statement is committed

        store.close = close  # type: ignore[method-assign]
        return store

    with pytest.raises(KeyboardInterrupt):
        rotate_identity_key(key_path, crash_after_recording)
    assert prepared.exists() and IdentityKey.load(key_path).key_id == first.key_id
    result = rotate_identity_key(key_path, lambda k: open_store(db, key=k, clock=clock, create=False))
    assert result.completed_earlier and not prepared.exists()
    assert IdentityKey.load(key_path).verifier == result.new


def _rotated_bundle(tmp_path: Path) -> tuple[IdentityKey, IdentityKey, dict[str, Any]]:
    """The first and current keys of a log rotated once, and the bundle of a session after it."""
    key_path, db, first = _home(tmp_path)
    clock = ManualClock()
    _run(db, first, "s_before", clock)
    rotate_identity_key(key_path, lambda k: open_store(db, key=k, clock=clock, create=False))
    current = IdentityKey.load(key_path)
    _run(db, current, "s_after", clock)
    with closing(open_store(db, key=current, clock=clock, create=False)) as store:
        doc: Any = json.loads(export_bundle(store, "s_after", vkey=current.verifier.vkey, signer=current))
    assert verify_bundle(canonical(doc), TrustedKeys([first.verifier])).ok
    return first, current, doc


def _verdict(doc: dict[str, Any], key: IdentityKey, *, contract_hash: str, checkpoint: str | None) -> dict[str, Any]:
    statement = verdict_statement(
        session="s_after",
        head=doc["entries"][-1]["hash"],
        status="pass",
        checks=[],
        contract_hash=contract_hash,
        checkpoint=checkpoint,
    )
    return sign_verdict(statement, key).to_json()


def test_a_bundle_whose_verdict_names_a_checkpoint_the_retired_key_signed_is_not_called_a_fork(
    tmp_path: Path,
) -> None:
    # After a rotation, whoever holds the old key can sign a verdict envelope naming a checkpoint of
    # the bundle's size with another root. That checkpoint is not the log's (the key no longer signs
    # at that size), so B8 must refuse it as such rather than report the log as forked.
    first, current, doc = _rotated_bundle(tmp_path)
    size = parse_checkpoint(parse_note(doc["checkpoint"].encode()).text).size
    forged = sign_checkpoint_note(ORIGIN, size, bytes(32), first).note
    assert forged is not None
    doc["envelope"] = _verdict(doc, current, contract_hash="sha256:x", checkpoint=forged.decode())
    report = verify_bundle(canonical(doc), TrustedKeys([first.verifier]))
    assert (report.ok, report.step, report.reason) == (False, "B8", "no_trusted_signature")


def test_a_verdict_envelope_the_retired_key_signed_for_a_session_after_the_rotation_does_not_verify(
    tmp_path: Path,
) -> None:
    # The session ended after the rotation, so its verdict was signed by the key of that time. The
    # old key's holder can sign another statement about it (another contract, another checkpoint).
    first, current, doc = _rotated_bundle(tmp_path)
    trusted = TrustedKeys([first.verifier])
    doc["envelope"] = _verdict(doc, current, contract_hash="sha256:other", checkpoint=None)
    assert verify_bundle(canonical(doc), trusted).ok, "the key of that time may sign it"
    doc["envelope"] = _verdict(doc, first, contract_hash="sha256:other", checkpoint=None)
    report = verify_bundle(canonical(doc), trusted)
    assert (report.ok, report.step, report.reason) == (False, "B7", "retired_key")


def _envelope_for(db: Path, session: str, key: IdentityKey) -> bytes:
    """A verdict envelope for the stored ``session`` (its head and status), signed by ``key``."""
    with closing(open_store(db, key=None, clock=ManualClock(), create=False)) as store:
        info = store.session(session)
        assert info is not None
        statement = verdict_statement(
            session=session, head=info.head, status="pass", checks=[], contract_hash="sha256:other", checkpoint=None
        )
        envelope = canonical(sign_verdict(statement, key).to_json())
        store.set_envelope(session, envelope)
        return envelope


def test_a_stored_verdict_envelope_the_retired_key_signed_after_the_rotation_fails_verify_all_and_the_read(
    tmp_path: Path,
) -> None:
    # L7 and R4 apply B7's rule: the old key's holder can re-sign the verdict of a session that
    # ended after the rotation (another contract), and the store would keep it.
    first, current, _ = _rotated_bundle(tmp_path)
    db = tmp_path / "home" / "ledger.db"
    trusted = TrustedKeys([first.verifier])
    _envelope_for(db, "s_before", first)  # signed by the key of that time: it stays good
    kept = _envelope_for(db, "s_after", current)
    with closing(open_store(db, key=None, clock=ManualClock(), create=False)) as store:
        assert verify(store, trusted).ok, "the key of each session's time may sign its verdict"
        assert VerifiedStore(store, trusted).envelope("s_after") == kept
    _envelope_for(db, "s_after", first)
    with closing(open_store(db, key=None, clock=ManualClock(), create=False)) as store:
        report = verify(store, trusted)
        assert (report.ok, report.reason) == (False, "retired_key")
        reader = VerifiedStore(store, trusted)
        assert reader.envelope("s_before") is not None
        with pytest.raises(VerificationError) as info:
            reader.envelope("s_after")
        assert (info.value.reason, info.value.session) == ("retired_key", "s_after")
