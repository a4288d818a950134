"""Signed notes and checkpoints: the C2SP known answer, the signature rules, tampered checkpoints."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from truss._errors import BundleFormatError, VerificationError
from truss.ledger.keys import IdentityKey, VerifierKey
from truss.ledger.merkle import MemoryTree, verify_consistency
from truss.ledger.note import (
    Checkpoint,
    format_checkpoint,
    open_checkpoint,
    open_note,
    parse_checkpoint,
    parse_note,
    sign_checkpoint_note,
    sign_note,
)

NOTES = Path(__file__).parent / "vectors" / "note"
ORIGIN = "truss.test/log"


def _read(name: str) -> bytes:
    return (NOTES / name).read_bytes()


def _log_key() -> VerifierKey:
    return VerifierKey.parse((NOTES / "test_log.vkey").read_text())


def _signing_key(label: str = "truss test log key", name: str = ORIGIN) -> IdentityKey:
    return IdentityKey.from_seed(hashlib.sha256(label.encode()).digest(), name)


# -- the C2SP example --------------------------------------------------------------------------


def test_the_c2sp_example_note_verifies_with_its_example_key() -> None:
    key = VerifierKey.parse((NOTES / "c2sp_example.vkey").read_text())
    note, verified = open_note(_read("c2sp_example.note"), [key])
    assert note.text == "This is an example message.\n"
    assert [(s.name, s.key_id.hex()) for s in verified] == [("example.com/foo", "530d903a")]


def test_the_c2sp_example_note_round_trips_byte_for_byte() -> None:
    data = _read("c2sp_example.note")
    assert parse_note(data).to_bytes() == data


def test_the_c2sp_example_with_a_changed_text_is_rejected() -> None:
    key = VerifierKey.parse((NOTES / "c2sp_example.vkey").read_text())
    data = _read("c2sp_example.note").replace(b"example message", b"exemplary message")
    with pytest.raises(VerificationError) as err:
        open_note(data, [key])
    assert err.value.reason == "bad_signature"


# -- signature rules ---------------------------------------------------------------------------


def test_signatures_by_unknown_keys_are_ignored() -> None:
    checkpoint = open_checkpoint(_read("checkpoint_unknown_signature_line_added.note"), [_log_key()])
    assert checkpoint.size == 5


def test_a_line_by_an_unknown_cosigner_whose_name_holds_del_is_ignored_not_refused() -> None:
    data = _read("checkpoint_unknown_cosigner_with_del_in_its_name_added.note")
    assert [s.name for s in parse_note(data).signatures] == [ORIGIN, "witness\x7f.example"]
    checkpoint = open_checkpoint(data, [_log_key()])
    assert checkpoint.size == 5
    _, verified = open_note(data, [_log_key()])
    assert [s.name for s in verified] == [ORIGIN]


def test_a_failing_known_signature_rejects_the_note_even_beside_a_good_one() -> None:
    with pytest.raises(VerificationError) as err:
        open_checkpoint(_read("checkpoint_known_signature_fails_beside_a_good_one.note"), [_log_key()])
    assert err.value.reason == "bad_signature"


def test_a_note_without_any_trusted_signature_is_rejected() -> None:
    with pytest.raises(VerificationError) as err:
        open_note(_read("c2sp_example.note"), [_log_key()])
    assert err.value.reason == "no_trusted_signature"


def test_a_key_sharing_the_name_but_not_the_key_id_is_not_trusted() -> None:
    with pytest.raises(VerificationError) as err:
        open_checkpoint(_read("checkpoint_signed_by_unknown_key.note"), [_log_key()])
    assert err.value.reason == "no_trusted_signature"


@given(st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs")), max_size=200))
def test_any_text_signs_and_opens(line: str) -> None:
    key = _signing_key()
    text = line + "\n"
    note, verified = open_note(sign_note(text, [key]), [key.verifier])
    assert note.text == text and len(verified) == 1


def test_several_signers_each_verify() -> None:
    first, second = _signing_key(), _signing_key("second", "truss.test/witness")
    data = sign_note("two signers\n", [first, second])
    assert len(open_note(data, [first.verifier, second.verifier])[1]) == 2
    assert len(open_note(data, [second.verifier])[1]) == 1


@pytest.mark.parametrize(
    "data",
    [
        b"no blank line\n\xe2\x80\x94 a AAAAAAA=\n",
        b"text\n\n",
        b"text\n\n- a AAAAAAA=\n",
        b"text\n\n\xe2\x80\x94 a not*base64\n",
        b"text\n\n\xe2\x80\x94 a AAAA\n",
        b"text\n\n\xe2\x80\x94 a AAAAAAA=",
        b"te\x01xt\n\n\xe2\x80\x94 a AAAAAAA=\n",
        b"te\x7fxt\n\n\xe2\x80\x94 a AAAAAAA=\n",
        b"text\n\n\xe2\x80\x94 a\x1fb AAAAAAA=\n",
        b"\xff\n\n\xe2\x80\x94 a AAAAAAA=\n",
        b"text\n\n\xe2\x80\x94 a+b AAAAAAA=\n",
        b"x" * 70000,
    ],
    ids=[
        "no_blank_line",
        "no_signature",
        "hyphen_not_em_dash",
        "bad_base64",
        "signature_too_short",
        "no_final_newline",
        "control_character",
        "del_in_text",
        "control_character_in_key_name",
        "not_utf8",
        "plus_in_key_name",
        "too_large",
    ],
)
def test_malformed_notes_are_refused_as_bad_input(data: bytes) -> None:
    with pytest.raises(BundleFormatError):
        open_note(data, [_log_key()])


def test_more_than_100_signatures_are_refused() -> None:
    line = "\u2014 x/y AAAAAAAAAAAA\n"
    with pytest.raises(BundleFormatError) as err:
        parse_note(("text\n\n" + line * 101).encode())
    assert err.value.reason == "too_many_signatures"


# -- checkpoints -------------------------------------------------------------------------------


def test_a_valid_checkpoint_opens_with_its_size_and_root() -> None:
    tree = MemoryTree()
    for i in range(5):
        tree.append(f"entry {i}".encode())
    checkpoint = open_checkpoint(_read("checkpoint_valid.note"), [_log_key()], origin=ORIGIN)
    assert (checkpoint.origin, checkpoint.size, checkpoint.root) == (ORIGIN, 5, tree.root())
    assert checkpoint.note == _read("checkpoint_valid.note")


@pytest.mark.parametrize(
    ("fixture", "reason"),
    [
        ("checkpoint_signed_by_unknown_key.note", "no_trusted_signature"),
        ("checkpoint_extension_lines_added.note", "checkpoint_extensions"),
        ("checkpoint_extension_line_inserted_after_signing.note", "bad_signature"),
        ("checkpoint_wrong_tree_size.note", "bad_signature"),
        ("checkpoint_root_changed.note", "bad_signature"),
        ("checkpoint_origin_is_not_the_key_name.note", "no_trusted_signature"),
        ("checkpoint_known_signature_fails_beside_a_good_one.note", "bad_signature"),
    ],
)
def test_tampered_checkpoints_are_rejected(fixture: str, reason: str) -> None:
    with pytest.raises(VerificationError) as err:
        open_checkpoint(_read(fixture), [_log_key()])
    assert err.value.reason == reason


def test_the_parser_reports_extension_lines_it_finds() -> None:
    note = parse_note(_read("checkpoint_extension_lines_added.note"))
    assert parse_checkpoint(note.text).extensions == ("extra/ext 1",)
    opened = open_checkpoint(_read("checkpoint_extension_lines_added.note"), [_log_key()], allow_extensions=True)
    assert opened.extensions == ("extra/ext 1",)


def test_a_checkpoint_of_another_origin_is_refused() -> None:
    with pytest.raises(VerificationError) as err:
        open_checkpoint(_read("checkpoint_valid.note"), [_log_key()], origin="truss.test/other")
    assert err.value.reason == "origin_mismatch"


def test_signing_a_checkpoint_writes_no_extension_lines_and_reopens() -> None:
    key = _signing_key()
    signed = sign_checkpoint_note(ORIGIN, 12, bytes(range(32)), key)
    assert signed.note is not None
    assert (
        parse_note(signed.note).text == f"{ORIGIN}\n12\n{format_checkpoint(ORIGIN, 12, bytes(range(32))).split()[2]}\n"
    )
    assert open_checkpoint(signed.note, [key.verifier]) == signed


def test_a_checkpoint_is_signed_only_by_the_key_named_after_its_origin() -> None:
    with pytest.raises(ValueError):
        sign_checkpoint_note("truss.test/other", 1, bytes(32), _signing_key())


@pytest.mark.parametrize(
    "body",
    [
        "origin\n5\n",
        "origin\n05\nAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n",
        "origin\n-5\nAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n",
        "origin\n5\nAAAA\n",
        "origin\n5\nAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
        "origin\n5\nAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n\n",
        "origin with space\n5\nAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n",
        "origin\n99999999999999999999\nAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n",
    ],
    ids=[
        "no_root",
        "leading_zero",
        "negative",
        "short_root",
        "no_final_newline",
        "empty_extension",
        "space_in_origin",
        "size_out_of_range",
    ],
)
def test_malformed_checkpoint_bodies_are_refused(body: str) -> None:
    with pytest.raises(BundleFormatError):
        parse_checkpoint(body)


@given(st.integers(0, 2**63 - 1), st.binary(min_size=32, max_size=32))
def test_checkpoint_bodies_round_trip(size: int, root: bytes) -> None:
    assert parse_checkpoint(format_checkpoint(ORIGIN, size, root)) == Checkpoint(ORIGIN, size, root)


def test_two_valid_checkpoints_of_one_size_with_different_roots_are_a_fork() -> None:
    honest = open_checkpoint(_read("checkpoint_valid.note"), [_log_key()])
    forked = open_checkpoint(_read("checkpoint_fork_same_size_other_root.note"), [_log_key()])
    assert honest.size == forked.size and honest.root != forked.root
    # Each is validly signed on its own; together no proof can make them one log.
    assert not verify_consistency(honest.size, forked.size, honest.root, forked.root, [])


@given(st.binary(max_size=400))
def test_arbitrary_bytes_never_open_as_a_note_and_never_crash(data: bytes) -> None:
    with pytest.raises((BundleFormatError, VerificationError)):
        open_checkpoint(data, [_log_key()])


@given(st.data())
def test_a_checkpoint_with_any_byte_changed_does_not_open(data: st.DataObject) -> None:
    original = _read("checkpoint_valid.note")
    position = data.draw(st.integers(0, len(original) - 1))
    value = data.draw(st.integers(0, 255).filter(lambda v: v != original[position]))
    mutated = original[:position] + bytes([value]) + original[position + 1 :]
    with pytest.raises((BundleFormatError, VerificationError)):
        open_checkpoint(mutated, [_log_key()])
