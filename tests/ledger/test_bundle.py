"""Bundles and the log: export, offline verification, tampered bundles named after the attack, --since.

``build_ledger`` makes the deterministic ledger (fixed-seed key, manual clock) that the tampered
bundles under ``tampered_bundles/`` were cut from (``tampered_bundles/regenerate.py``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from truss._errors import BundleFormatError, NotFoundError, VerificationError
from truss._json import as_dict, as_list
from truss.ledger.audit import verify_since
from truss.ledger.bundle import (
    TlogProof,
    check_bundle,
    export_bundle,
    format_tlog_proof,
    parse_tlog_proof,
    verify_bundle,
)
from truss.ledger.canonical import canonical, sha256_ref
from truss.ledger.entry import Record
from truss.ledger.envelope import sign_verdict, verdict_statement
from truss.ledger.keys import IdentityKey, TrustedKeys
from truss.ledger.merkle import consistency_proof
from truss.ledger.note import sign_checkpoint, sign_checkpoint_note
from truss.ledger.stores.sqlite import SqliteStore, open_sqlite
from truss.testing import ManualClock, MemoryStore

TAMPERED = Path(__file__).parent / "tampered_bundles"
LOG_NAME = "bundles.truss.test"
VERDICT_SESSION = "s_verdict"
OTHER_SESSION = "s_other"


def log_key() -> IdentityKey:
    return IdentityKey.from_seed(hashlib.sha256(b"truss bundle test log key").digest(), LOG_NAME)


def stranger_key() -> IdentityKey:
    return IdentityKey.from_seed(hashlib.sha256(b"a key nobody trusts").digest(), LOG_NAME)


def _blob(value: Any) -> tuple[str, bytes]:
    data = canonical(value)
    return sha256_ref(data), data


@dataclass
class Ledger:
    store: SqliteStore
    key: IdentityKey
    checkpoint_note: bytes


def build_ledger(db: Path, *, key: IdentityKey | None = None, rewrite_other: bool = False) -> Ledger:
    """Two interleaved sessions, each ending with a verdict, a checkpoint and an envelope.

    ``rewrite_other`` changes one entry of ``s_other`` only: ``s_verdict``'s entries stay
    byte-identical, so the result is a fork of the same log at the same size.
    """
    key = key or log_key()
    clock = ManualClock()
    store = open_sqlite(db, key=key, clock=clock)
    args_ref, args = _blob({"repo_path": "/srv/demo"})
    result_ref, result = _blob({"content": [{"type": "text", "text": "On branch main"}], "isError": False})
    store.append(OTHER_SESSION, [Record("session_started", {"contract": "other"})])
    store.append(VERDICT_SESSION, [Record("session_started", {"contract": "hello"})])
    for n in range(3):
        clock.advance(0.1)
        store.append(
            VERDICT_SESSION,
            [
                Record(
                    "mcp_tool_intent",
                    {"call": f"c{n}", "tool": "mcp:time:get_time", "args": args_ref},
                    {args_ref: args},
                )
            ],
        )
        body = {"note": "rewritten" if rewrite_other and n == 1 else f"step {n}"}
        store.append(OTHER_SESSION, [Record("model_turn", body)])
        store.append(
            VERDICT_SESSION,
            [
                Record(
                    "mcp_tool_call",
                    {"call": f"c{n}", "tool": "mcp:time:get_time", "args": args_ref, "result": result_ref},
                    {result_ref: result},
                )
            ],
        )
    store.append(VERDICT_SESSION, [Record("verdict", {"status": "pass", "checks": [], "contract_hash": "sha256:x"})])
    ended = store.append(VERDICT_SESSION, [Record("session_ended", {"status": "pass"})])[-1]
    checkpoint = sign_checkpoint(store, key)
    assert checkpoint.note is not None
    envelope = sign_verdict(
        verdict_statement(
            session=VERDICT_SESSION,
            head=ended.hash,
            status="pass",
            checks=[],
            contract_hash="sha256:x",
            checkpoint=checkpoint.note.decode(),
        ),
        key,
    )
    if not rewrite_other:
        store.set_envelope(VERDICT_SESSION, envelope.to_bytes())
    store.append(OTHER_SESSION, [Record("verdict", {"status": "fail", "checks": [], "contract_hash": "sha256:y"})])
    other_end = store.append(OTHER_SESSION, [Record("session_ended", {"status": "fail"})])[-1]
    other_cp = sign_checkpoint(store, key)
    assert other_cp.note is not None
    store.set_envelope(
        OTHER_SESSION,
        sign_verdict(
            verdict_statement(
                session=OTHER_SESSION,
                head=other_end.hash,
                status="fail",
                checks=[],
                contract_hash="sha256:y",
                checkpoint=other_cp.note.decode(),
            ),
            key,
        ).to_bytes(),
    )
    return Ledger(store=store, key=key, checkpoint_note=checkpoint.note)


def trusted() -> TrustedKeys:
    return TrustedKeys([log_key().verifier])


def export(ledger: Ledger, session: str = VERDICT_SESSION, *, payloads: bool = True) -> bytes:
    return export_bundle(ledger.store, session, vkey=ledger.key.verifier.vkey, payloads=payloads)


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    built = build_ledger(tmp_path / "ledger.db")
    yield built
    built.store.close()


# -- the happy path ----------------------------------------------------------------------------


def test_an_exported_bundle_verifies_offline_with_the_log_key(ledger: Ledger) -> None:
    report = check_bundle(export(ledger), trusted())
    assert report.ok and report.exit_code == 0
    assert report.session == VERDICT_SESSION and report.entries == 9 and report.verdict == "pass"
    info = ledger.store.session(VERDICT_SESSION)
    assert info is not None and report.head == info.head
    assert report.vkey_trusted is True
    assert report.blobs_checked == 9 and report.blobs_absent == 0


def test_a_bundle_without_payloads_still_verifies_and_counts_what_is_absent(ledger: Ledger) -> None:
    data = export(ledger, payloads=False)
    assert json.loads(data)["blobs"] == {}
    report = check_bundle(data, trusted())
    assert report.ok and report.blobs_checked == 0 and report.blobs_absent == 9


def test_the_bundle_proof_is_a_c2sp_tlog_proof_of_the_head_in_the_verdict_checkpoint(ledger: Ledger) -> None:
    doc = json.loads(export(ledger))
    proof = parse_tlog_proof(doc["proof"])
    assert doc["proof"].startswith("c2sp.org/tlog-proof@v1\nindex ")
    assert proof.index == doc["entries"][-1]["entry"]["index"]
    assert proof.checkpoint == ledger.checkpoint_note == doc["checkpoint"].encode()


def test_export_is_deterministic(ledger: Ledger) -> None:
    assert export(ledger) == export(ledger)


def test_a_bundle_does_not_verify_under_a_key_the_verifier_does_not_trust(ledger: Ledger) -> None:
    report = verify_bundle(export(ledger), TrustedKeys([stranger_key().verifier]))
    assert not report.ok and report.step == "B3" and report.reason == "no_trusted_signature"
    assert report.exit_code == 1


def test_a_session_without_a_covering_checkpoint_is_not_exported_without_a_signer(tmp_path: Path) -> None:
    store = open_sqlite(tmp_path / "l.db", key=log_key(), clock=ManualClock())
    store.append("s_new", [Record("session_started", {"contract": "x"})])
    with pytest.raises(NotFoundError):
        export_bundle(store, "s_new", vkey=log_key().verifier.vkey)
    data = export_bundle(store, "s_new", vkey=log_key().verifier.vkey, signer=log_key())
    assert check_bundle(data, trusted()).ok
    assert [cp.size for cp in store.checkpoints()] == [1]
    store.close()


def test_an_unknown_session_is_not_found(ledger: Ledger) -> None:
    with pytest.raises(NotFoundError):
        export(ledger, "s_missing")


# -- tampered bundles (data files named after the attack) -------------------------------------

TAMPERED_CASES = [
    ("proof_hash_changed", "B5", "bad_inclusion_proof"),
    ("inclusion_proof_of_a_middle_entry_changed", "B4", "not_in_log"),
    ("middle_entries_proofs_swapped", "B4", "not_in_log"),
    ("wrong_tree_size", "B3", "bad_signature"),
    ("proof_index_of_another_entry", "B5", "bad_inclusion_proof"),
    ("checkpoint_signed_by_unknown_key", "B3", "no_trusted_signature"),
    ("checkpoint_extension_lines_added", "B3", "checkpoint_extensions"),
    ("fork_same_size_different_root", "B8", "fork"),
    ("entries_removed_from_the_middle", "B4", "seq_gap"),
    ("entries_removed_from_the_end", "B5", "bad_inclusion_proof"),
    ("entries_reordered", "B4", "reordered"),
    ("entry_spliced_from_another_session", "B4", "foreign_session"),
    ("verdict_envelope_points_at_another_sessions_head", "B7", "verdict_head_mismatch"),
    ("verdict_envelope_of_another_session", "B7", "verdict_session_mismatch"),
    ("verdict_envelope_status_changed", "B7", "bad_signature"),
    ("payload_changed", "B4", "blob_mismatch"),
    ("payload_added_that_no_entry_names", "B6", "unreferenced_blob"),
    ("whole_bundle_resigned_by_another_key", "B3", "no_trusted_signature"),
]


@pytest.mark.parametrize(("name", "step", "reason"), TAMPERED_CASES, ids=[c[0] for c in TAMPERED_CASES])
def test_tampered_bundles_are_rejected_at_the_step_that_catches_them(name: str, step: str, reason: str) -> None:
    data = (TAMPERED / f"{name}.json").read_bytes()
    report = verify_bundle(data, trusted())
    assert (report.ok, report.step, report.reason, report.exit_code) == (False, step, reason, 1), report.message
    with pytest.raises(VerificationError):
        check_bundle(data, trusted())


def test_the_untampered_source_of_the_fixtures_verifies() -> None:
    assert check_bundle((TAMPERED / "original.json").read_bytes(), trusted()).ok


UNPARSEABLE = ["not_json", "wrong_format_tag", "unknown_field", "nested_too_deep", "entry_missing_its_signature"]


@pytest.mark.parametrize("name", UNPARSEABLE)
def test_unparseable_bundles_are_bad_input_not_a_verification_failure(name: str) -> None:
    data = (TAMPERED / f"{name}.json").read_bytes()
    report = verify_bundle(data, trusted())
    assert not report.ok and report.exit_code == 2 and report.step in ("B1", "B4")
    with pytest.raises(BundleFormatError):
        check_bundle(data, trusted())


LONE_SURROGATES = [
    ("checkpoint_holding_a_lone_surrogate", "B3", "bad_note"),
    ("tlog_proof_holding_a_lone_surrogate", "B5", "bad_proof"),
]


@pytest.mark.parametrize(("name", "step", "reason"), LONE_SURROGATES, ids=[c[0] for c in LONE_SURROGATES])
def test_a_lone_surrogate_in_a_bundles_notes_is_bad_input_at_its_step_not_a_crash(
    name: str, step: str, reason: str
) -> None:
    data = (TAMPERED / f"{name}.json").read_bytes()
    report = verify_bundle(data, trusted())
    assert (report.ok, report.step, report.reason, report.exit_code) == (False, step, reason, 2), report.message
    assert "lone surrogate" in (report.message or "")
    with pytest.raises(BundleFormatError):
        check_bundle(data, trusted())


# -- signing checkpoints over the store, and --since ----------------------------------------


def test_checkpoints_are_stored_and_a_repeat_without_appends_reuses_the_last(ledger: Ledger) -> None:
    sizes = [cp.size for cp in ledger.store.checkpoints()]
    again = sign_checkpoint(ledger.store, ledger.key)
    assert [cp.size for cp in ledger.store.checkpoints()] == sizes
    assert again.size == sizes[-1] and again.note == ledger.store.checkpoints()[-1].note.encode()


def test_truss_refuses_to_sign_a_checkpoint_inconsistent_with_an_earlier_one(ledger: Ledger) -> None:
    store = ledger.store
    size, _ = store.tree_head()
    # Another root at an earlier size, as if history had been rewritten before it was signed.
    forged = sign_checkpoint_note(store.origin, size - 3, b"\x07" * 32, ledger.key)
    assert forged.note is not None
    store.add_checkpoint(size - 3 + 100, b"\x07" * 32, forged.note.decode())
    with pytest.raises(VerificationError) as err:
        sign_checkpoint(store, ledger.key)
    assert err.value.reason == "log_shrank"


def test_a_stored_checkpoint_that_the_tree_does_not_extend_blocks_signing(tmp_path: Path) -> None:
    key = log_key()
    store = open_sqlite(tmp_path / "l.db", key=key, clock=ManualClock())
    store.append("s_a", [Record("session_started", {"contract": "x"})])
    store.append("s_a", [Record("session_ended", {})])
    forged = sign_checkpoint_note(store.origin, 1, b"\x07" * 32, key)
    assert forged.note is not None
    store.add_checkpoint(1, b"\x07" * 32, forged.note.decode())
    with pytest.raises(VerificationError) as err:
        sign_checkpoint(store, key)
    assert err.value.reason == "inconsistent_checkpoint"
    store.close()


def test_since_proves_the_log_extends_an_auditors_earlier_checkpoint(ledger: Ledger) -> None:
    report = verify_since(ledger.store, ledger.checkpoint_note, trusted())
    assert report.ok and report.old_size is not None and report.size is not None
    assert report.old_size < report.size


def test_since_catches_a_key_holder_who_rewrote_history(tmp_path: Path) -> None:
    honest = build_ledger(tmp_path / "honest.db")
    rewritten = build_ledger(tmp_path / "rewritten.db", rewrite_other=True)
    report = verify_since(rewritten.store, honest.checkpoint_note, trusted())
    assert not report.ok and report.exit_code == 1 and report.reason in ("fork", "inconsistent")
    honest.store.close()
    rewritten.store.close()


def test_since_refuses_a_checkpoint_the_verifier_does_not_trust(ledger: Ledger) -> None:
    size, root = ledger.store.tree_head()
    foreign = sign_checkpoint_note(LOG_NAME, size, root, stranger_key())
    assert foreign.note is not None
    report = verify_since(ledger.store, foreign.note, trusted())
    assert not report.ok and report.reason == "no_trusted_signature"


def test_since_reports_a_log_shorter_than_the_old_checkpoint(ledger: Ledger) -> None:
    size, _ = ledger.store.tree_head()
    future = sign_checkpoint_note(LOG_NAME, size + 5, b"\x01" * 32, ledger.key)
    assert future.note is not None
    report = verify_since(ledger.store, future.note, trusted())
    assert not report.ok and report.reason == "log_shrank"


def tamper(original: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """A deep copy of a bundle document with top-level fields replaced."""
    doc: dict[str, Any] = json.loads(json.dumps(original))
    doc.update(changes)
    return doc


def flip_b64(text: str) -> str:
    raw = bytearray(base64.b64decode(text))
    raw[0] ^= 1
    return base64.b64encode(bytes(raw)).decode()


def _with_verdict_checkpoint(ledger: Ledger, doc: dict[str, Any], note: str) -> dict[str, Any]:
    head = doc["entries"][-1]["hash"]
    statement = verdict_statement(
        session=VERDICT_SESSION, head=head, status="pass", checks=[], contract_hash="sha256:x", checkpoint=note
    )
    return tamper(doc, envelope=sign_verdict(statement, ledger.key).to_json())


def test_a_verdict_naming_a_later_checkpoint_needs_a_consistency_proof(ledger: Ledger) -> None:
    doc = json.loads(export(ledger))
    later = ledger.store.checkpoints()[-1]
    first = ledger.store.checkpoints()[0]
    assert later.size > first.size
    without = _with_verdict_checkpoint(ledger, doc, later.note)
    report = verify_bundle(canonical(without), trusted())
    assert (report.ok, report.step, report.reason) == (False, "B8", "inconsistent_checkpoints")
    proof = consistency_proof(first.size, later.size, ledger.store.node)
    with_proof = tamper(without, consistency=[base64.b64encode(h).decode() for h in proof])
    assert check_bundle(canonical(with_proof), trusted()).ok


def test_export_refuses_a_checkpoint_the_stored_tree_does_not_match(ledger: Ledger) -> None:
    with closing(sqlite3.connect(ledger.store.db)) as conn, conn:
        conn.execute("UPDATE nodes SET hash = ? WHERE last = 7 AND level = 3", (b"\x09" * 32,))
    with pytest.raises(VerificationError) as err:
        export(ledger)
    assert err.value.reason == "checkpoint_root_mismatch"


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["s_a", "s_b", "s_c"]),
            st.dictionaries(st.text(max_size=5), st.integers(-(2**53 - 1), 2**53 - 1)),
        ),
        max_size=30,
    ),
    st.sampled_from(["s_a", "s_b", "s_c"]),
    st.booleans(),
)
def test_any_interleaving_of_sessions_exports_a_bundle_that_verifies(
    steps: list[tuple[str, dict[str, int]]], session: str, payloads: bool
) -> None:
    key = log_key()
    store = MemoryStore(key=key, clock=ManualClock())
    for sid in ("s_a", "s_b", "s_c"):
        store.append(sid, [Record("session_started", {"contract": sid})])
    for sid, body in steps:
        ref, data = _blob(body)
        store.append(sid, [Record("model_turn", {"body": body, "request": ref}, {ref: data})])
    data = export_bundle(store, session, vkey=key.verifier.vkey, payloads=payloads, signer=key)
    report = verify_bundle(data, trusted())
    assert report.ok, report.message
    assert report.entries == 1 + sum(1 for sid, _ in steps if sid == session)


def test_concurrent_sessions_ending_together_all_get_consistent_checkpoints(tmp_path: Path) -> None:
    key = log_key()
    store = open_sqlite(tmp_path / "l.db", key=key, clock=ManualClock())
    errors: list[BaseException] = []

    def session(n: int) -> None:
        try:
            sid = f"s_{n}"
            store.append(sid, [Record("session_started", {"contract": "x"})])
            for _ in range(5):
                store.append(sid, [Record("model_turn", {"n": n})])
            store.append(sid, [Record("session_ended", {})])
            sign_checkpoint(store, key)
        except BaseException as exc:  # collected for the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=session, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    size, _ = store.tree_head()
    assert store.checkpoints()[-1].size == size == 8 * 7
    for n in range(8):
        data = export_bundle(store, f"s_{n}", vkey=key.verifier.vkey)
        assert check_bundle(data, trusted()).ok
    store.close()


class _RacingStore:
    """A store where another session appends and signs right after a head is read."""

    def __init__(self, store: SqliteStore, key: IdentityKey) -> None:
        self.inner = store
        self.key = key
        self.origin = store.origin
        self.raced = False

    def tree_head(self) -> tuple[int, bytes]:
        head = self.inner.tree_head()
        if not self.raced:
            self.raced = True
            self.inner.append("s_racer", [Record("session_started", {"contract": "x"})])
            sign_checkpoint(self.inner, self.key)
        return head

    def node(self, level: int, index: int) -> bytes:
        return self.inner.node(level, index)

    def nodes(self, keys: Sequence[tuple[int, int]]) -> dict[tuple[int, int], bytes]:
        return self.inner.nodes(keys)

    def checkpoints(self) -> list[Any]:
        return list(self.inner.checkpoints())

    def latest_checkpoint(self) -> Any:
        return self.inner.latest_checkpoint()

    def checkpoint_covering(self, size: int) -> Any:
        return self.inner.checkpoint_covering(size)

    def add_checkpoint(self, size: int, root: bytes, note: str) -> None:
        self.inner.add_checkpoint(size, root, note)


def test_a_checkpoint_signed_by_another_session_meanwhile_is_not_mistaken_for_a_shrunk_log(tmp_path: Path) -> None:
    key = log_key()
    store = open_sqlite(tmp_path / "l.db", key=key, clock=ManualClock())
    store.append("s_a", [Record("session_started", {"contract": "x"})])
    signed = sign_checkpoint(_RacingStore(store, key), key)
    assert signed.size == 1
    assert sorted(cp.size for cp in store.checkpoints()) == [1, 2]
    store.close()


@given(
    st.integers(0, 2**63 - 1),
    st.lists(st.binary(min_size=32, max_size=32), max_size=64),
    st.none() | st.binary(max_size=40),
)
def test_tlog_proofs_round_trip(index: int, hashes: list[bytes], extra: bytes | None) -> None:
    note = (TAMPERED / "original.json").read_bytes()
    checkpoint = json.loads(note)["checkpoint"].encode()
    proof = TlogProof(index, tuple(hashes), checkpoint, extra)
    assert parse_tlog_proof(format_tlog_proof(proof)) == proof


@pytest.mark.parametrize(
    "text",
    [
        "c2sp.org/tlog-proof@v2\nindex 1\n\ncp\n",
        "c2sp.org/tlog-proof@v1\nindex 01\n\ncp\n",
        "c2sp.org/tlog-proof@v1\nindex 1\nAAAA\n\ncp\n",
        "c2sp.org/tlog-proof@v1\n\ncp\n",
        "c2sp.org/tlog-proof@v1\nindex 1",
    ],
    ids=["other_version", "leading_zero", "short_hash", "no_index", "no_checkpoint"],
)
def test_malformed_tlog_proofs_are_refused(text: str) -> None:
    with pytest.raises(BundleFormatError):
        parse_tlog_proof(text)


def test_payloads_a_session_erased_stay_out_of_its_bundle_even_if_another_session_holds_them(tmp_path: Path) -> None:
    key = log_key()
    store = open_sqlite(tmp_path / "l.db", key=key, clock=ManualClock())
    ref, data = _blob({"secretish": "value"})
    for sid in ("s_keep", "s_erase"):
        store.append(sid, [Record("session_started", {"contract": "x"})])
        store.append(sid, [Record("model_turn", {"request": ref}, {ref: data})])
    store.erase_payloads("s_erase")
    erased = json.loads(export_bundle(store, "s_erase", vkey=key.verifier.vkey, signer=key))
    kept = json.loads(export_bundle(store, "s_keep", vkey=key.verifier.vkey, signer=key))
    assert erased["blobs"] == {} and ref in kept["blobs"]
    assert check_bundle(canonical(erased), trusted()).blobs_absent == 1
    store.close()


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_a_bundle_with_any_byte_changed_never_crashes_the_verifier(data: st.DataObject) -> None:
    original = (TAMPERED / "original.json").read_bytes()
    position = data.draw(st.integers(0, len(original) - 1))
    value = data.draw(st.integers(0, 255))
    mutated = original[:position] + bytes([value]) + original[position + 1 :]
    report = verify_bundle(mutated, trusted())
    if mutated != original and report.ok:
        # What may change and still verify: the informational vkey, or another spelling of the
        # same bytes in a signed field's base64.
        assert _same_but_vkey_or_spelling(json.loads(original), json.loads(mutated), "")


def _same_but_vkey_or_spelling(a: Any, b: Any, path: str) -> bool:
    left, right = as_dict(a), as_dict(b)
    if left is not None and right is not None:
        return left.keys() == right.keys() and all(
            _same_but_vkey_or_spelling(left[k], right[k], f"{path}/{k}") for k in left
        )
    first, second = as_list(a), as_list(b)
    if first is not None and second is not None:
        return len(first) == len(second) and all(
            _same_but_vkey_or_spelling(x, y, f"{path}/{i}") for i, (x, y) in enumerate(zip(first, second, strict=True))
        )
    if a == b or path == "/vkey":
        return True
    if isinstance(a, str) and isinstance(b, str):
        try:
            return base64.b64decode(a + "==", altchars=b"-_") == base64.b64decode(b + "==", altchars=b"-_")
        except ValueError:
            return False
    return False


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_are_bad_input_not_a_crash(data: bytes) -> None:
    report = verify_bundle(data, trusted())
    assert not report.ok and report.exit_code == 2
