"""C2SP tlog-cosignature v1: the spec's example, Ed25519 and ML-DSA-44 cosignatures, and the rules."""

from __future__ import annotations

import base64
import os
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.ledger._witness_keys import C2SP, ORIGIN, log_key, witness_key
from truss._errors import VerificationError
from truss.ledger.cosignature import (
    cosign,
    ed25519_message,
    has_cosignatures,
    merge_notes,
    mldsa_message,
    verify_cosignatures,
    with_signature_lines,
)
from truss.ledger.keys import MLDSA44_COSIGNATURE_ALG, CosignerVerifier, mldsa44_available, typed_key_id
from truss.ledger.note import open_checkpoint, parse_checkpoint, parse_note, sign_checkpoint_note

ROOT = bytes(range(32))

# Outside CI an older cryptography skips these; under CI (which installs a current one) they must run.
needs_mldsa = pytest.mark.skipif(
    not mldsa44_available() and not os.environ.get("CI"),
    reason="the installed cryptography has no ML-DSA-44 (install cryptography 46 or later)",
)


def _signed(size: int = 7) -> bytes:
    note = sign_checkpoint_note(ORIGIN, size, ROOT, log_key()).note
    assert note is not None
    return note


def test_the_spec_example_cosignature_carries_its_key_id_and_the_timestamp_of_the_example_message() -> None:
    note = parse_note((C2SP / "tlog-cosignature_cosigned-checkpoint.note").read_bytes())
    log, witness = note.signatures
    assert log.name == "example.com/behind-the-sofa" and witness.name == "witness.example.com/w1"
    (timestamp,) = struct.unpack(">Q", witness.signature[:8])
    assert witness.key_id.hex() == "8d66cf3f" and len(witness.signature) == 8 + 64
    message = (C2SP / "tlog-cosignature_ed25519-signed-message.txt").read_bytes()
    assert ed25519_message(note.text, timestamp) == message, "the bytes the spec says a v1 cosignature signs"


def test_an_ed25519_cosignature_verifies_and_the_note_still_opens_with_the_log_key() -> None:
    witness = witness_key("w1")
    note = _signed()
    line = cosign(parse_note(note).text, witness, 1_700_000_000)
    cosigned = with_signature_lines(note, [line])
    [found] = verify_cosignatures(cosigned, [witness.verifier])
    assert (found.name, found.timestamp, found.alg) == (witness.name, 1_700_000_000, 0x04)
    assert open_checkpoint(cosigned, [log_key().verifier]).size == 7, "a cosignature line is ignored by the log check"
    assert has_cosignatures(cosigned) and not has_cosignatures(note)


def test_the_cosigner_key_id_commits_to_signature_type_4() -> None:
    witness = witness_key("w1")
    assert witness.key_id == typed_key_id(witness.name, 0x04, witness.verifier.public_key).hex()
    assert witness.key_id != typed_key_id(witness.name, 0x01, witness.verifier.public_key).hex()
    assert CosignerVerifier.parse(witness.verifier.vkey) == witness.verifier


@needs_mldsa
def test_an_ml_dsa_44_cosignature_signs_the_cosigned_message_structure_and_verifies() -> None:
    witness = witness_key("w-pq", alg=MLDSA44_COSIGNATURE_ALG)
    note = _signed(9)
    line = cosign(parse_note(note).text, witness, 1_700_000_001)
    assert len(line.signature) == 8 + 2420
    [found] = verify_cosignatures(with_signature_lines(note, [line]), [CosignerVerifier.parse(witness.verifier.vkey)])
    assert found.alg == MLDSA44_COSIGNATURE_ALG
    message = mldsa_message(witness.name, 1_700_000_001, ORIGIN, 9, ROOT)
    assert message.startswith(b"subtree/v1\n\x00") and message.endswith(struct.pack(">QQ", 0, 9) + ROOT)


def test_a_cosignature_over_another_checkpoint_is_refused_as_bad_cosignature() -> None:
    witness = witness_key("w1")
    line = cosign(parse_note(_signed(7)).text, witness, 1_700_000_000)
    moved = with_signature_lines(_signed(8), [line])
    with pytest.raises(VerificationError) as info:
        verify_cosignatures(moved, [witness.verifier])
    assert info.value.reason == "bad_cosignature" and info.value.witness == witness.name


def test_a_cosignature_with_its_timestamp_changed_does_not_verify() -> None:
    witness = witness_key("w1")
    note = _signed()
    line = cosign(parse_note(note).text, witness, 1_700_000_000)
    forged = type(line)(line.name, line.key_id, struct.pack(">Q", 1_800_000_000) + line.signature[8:])
    with pytest.raises(VerificationError):
        verify_cosignatures(with_signature_lines(note, [forged]), [witness.verifier])


def test_a_zero_timestamp_is_refused_when_cosigning_and_when_verifying() -> None:
    witness = witness_key("w1")
    note = _signed()
    with pytest.raises(ValueError):
        cosign(parse_note(note).text, witness, 0)
    text = parse_note(note).text
    line = cosign(text, witness, 1)
    zero = type(line)(witness.name, bytes.fromhex(witness.key_id), struct.pack(">Q", 0) + b"\0" * 64)
    with pytest.raises(VerificationError):
        verify_cosignatures(with_signature_lines(note, [zero]), [witness.verifier])


def test_lines_by_unknown_cosigners_are_ignored() -> None:
    stranger, known = witness_key("stranger"), witness_key("w1")
    note = _signed()
    cosigned = with_signature_lines(note, [cosign(parse_note(note).text, stranger, 1_700_000_000)])
    assert verify_cosignatures(cosigned, [known.verifier]) == []


def test_a_cosigner_whose_name_holds_del_is_ignored_when_unknown_and_verifies_when_trusted() -> None:
    odd, known = witness_key("odd", "witness\x7f.example/w"), witness_key("w1")
    note = _signed()
    cosigned = with_signature_lines(note, [cosign(parse_note(note).text, odd, 1_700_000_000)])
    assert verify_cosignatures(cosigned, [known.verifier]) == []
    [found] = verify_cosignatures(cosigned, [odd.verifier])
    assert found.name == "witness\x7f.example/w"
    assert open_checkpoint(cosigned, [log_key().verifier]).size == 7
    assert merge_notes(note.decode(), cosigned.decode()) == cosigned.decode()


def test_merging_keeps_every_cosigner_once_and_the_log_signature_first() -> None:
    w1, w2 = witness_key("w1"), witness_key("w2")
    note = _signed()
    text = parse_note(note).text
    a = with_signature_lines(note, [cosign(text, w1, 10)]).decode()
    b = with_signature_lines(note, [cosign(text, w2, 11), cosign(text, w1, 12)]).decode()
    merged = parse_note(merge_notes(a, b).encode())
    assert [s.name for s in merged.signatures] == [ORIGIN, w1.name, w2.name]
    assert merge_notes(a, "not a note") == a
    assert merge_notes(a, _signed(8).decode()) == a, "a note of another checkpoint is not merged in"


@given(st.integers(min_value=1, max_value=2**63 - 1), st.integers(min_value=0, max_value=2**40))
def test_cosign_then_verify_round_trips_for_any_timestamp_and_size(timestamp: int, size: int) -> None:
    witness = witness_key("w1")
    note = sign_checkpoint_note(ORIGIN, size, ROOT, log_key()).note
    assert note is not None
    line = cosign(parse_note(note).text, witness, timestamp)
    [found] = verify_cosignatures(with_signature_lines(note, [line]), [witness.verifier])
    assert found.timestamp == timestamp
    assert parse_checkpoint(parse_note(note).text).size == size
    assert base64.b64decode(found.line.split(" ")[2])[:4].hex() == witness.key_id
