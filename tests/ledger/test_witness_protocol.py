"""The C2SP tlog-witness add-checkpoint protocol, sans-IO: the spec's example bytes, bad requests (one
data file per attack), the witness's decisions and the client's reading of every answer."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.ledger._witness_keys import C2SP, ORIGIN, log_key
from truss.ledger.keys import VerifierKey
from truss.ledger.merkle import EMPTY_ROOT, MemoryTree
from truss.ledger.note import parse_note, sign_checkpoint_note
from truss.ledger.witness import (
    SIZE_CONTENT_TYPE,
    AddCheckpoint,
    LogState,
    Refusal,
    check_submission,
    format_add_checkpoint,
    format_size,
    interpret,
    judge,
    parse_add_checkpoint,
)

BAD = sorted((Path(__file__).parent / "bad_witness_requests").glob("*.txt"))
LOGS: dict[str, list[VerifierKey]] = {ORIGIN: [log_key().verifier]}


def _tree(n: int, salt: bytes = b"") -> MemoryTree:
    tree = MemoryTree()
    for i in range(n):
        tree.append(salt + b"entry %d" % i)
    return tree


def _note(tree: MemoryTree, size: int | None = None, key_label: str = "log key") -> bytes:
    size = tree.size if size is None else size
    note = sign_checkpoint_note(ORIGIN, size, tree.root(size), log_key(key_label)).note
    assert note is not None
    return note


def _submit(old: int, proof: list[bytes], note: bytes, state: LogState | None) -> tuple[int, int | None]:
    submission = check_submission(format_add_checkpoint(AddCheckpoint(old, tuple(proof), note)), LOGS)
    verdict = judge(submission, state)
    if verdict.ok:
        return 200, None
    assert verdict.refusal is not None
    return verdict.refusal.status, verdict.conflict_size


def test_the_spec_example_request_parses_to_its_old_size_proof_and_doubly_signed_checkpoint() -> None:
    body = (C2SP / "tlog-witness_add-checkpoint_request.txt").read_bytes()
    request = parse_add_checkpoint(body)
    assert request.old_size == 20852014 and len(request.proof) == 4
    note = parse_note(request.checkpoint)
    assert note.text.splitlines()[1] == "20852163"
    assert [s.name for s in note.signatures] == ["example.com/behind-the-sofa"] * 2, "two keys of one log"
    assert format_add_checkpoint(request) == body, "formatting gives the spec's bytes back"


def test_the_spec_example_response_is_three_signature_lines_by_two_witnesses() -> None:
    outcome = interpret(200, "text/plain", (C2SP / "tlog-witness_add-checkpoint_response.txt").read_bytes())
    assert outcome.kind == "cosigned"
    assert [line.name for line in outcome.lines] == ["witness.example/w1", "witness.example/w1", "witness.example/w2"]


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_a_malformed_request_is_refused_with_400(path: Path) -> None:
    with pytest.raises(Refusal) as info:
        check_submission(path.read_bytes(), LOGS)
    assert info.value.status == 400


def test_a_checkpoint_of_a_log_the_witness_does_not_follow_is_404() -> None:
    note = (C2SP / "tlog-checkpoint_example.note").read_bytes()
    with pytest.raises(Refusal) as info:
        check_submission(format_add_checkpoint(AddCheckpoint(0, (), note)), LOGS)
    assert info.value.status == 404 and info.value.reason == "unknown_log"


def test_a_checkpoint_signed_by_another_key_under_the_log_name_is_403() -> None:
    forged = _note(_tree(3), key_label="someone else's key")
    with pytest.raises(Refusal) as info:
        check_submission(format_add_checkpoint(AddCheckpoint(0, (), forged)), LOGS)
    assert info.value.status == 403


def test_an_old_size_above_the_checkpoint_size_is_400() -> None:
    with pytest.raises(Refusal) as info:
        check_submission(format_add_checkpoint(AddCheckpoint(9, (), _note(_tree(3)))), LOGS)
    assert info.value.status == 400 and info.value.reason == "old_beyond_size"


def test_the_first_checkpoint_is_cosigned_from_old_zero_and_a_stale_old_size_gets_409_with_the_latest() -> None:
    tree = _tree(8)
    assert _submit(0, [], _note(tree, 5), None) == (200, None)
    state = LogState(5, tree.root(5))
    assert _submit(0, [], _note(tree), state) == (409, 5)
    assert _submit(5, tree.consistency_proof(5, 8), _note(tree), state) == (200, None)


def test_a_consistency_proof_that_does_not_verify_is_422_and_kept_as_evidence() -> None:
    tree = _tree(8)
    proof = tree.consistency_proof(5, 8)
    proof[0] = bytes(32)
    submission = check_submission(format_add_checkpoint(AddCheckpoint(5, tuple(proof), _note(tree))), LOGS)
    verdict = judge(submission, LogState(5, tree.root(5)))
    assert verdict.refusal is not None and verdict.refusal.status == 422 and verdict.refusal.evidence


def test_the_same_size_with_another_root_is_a_fork_answered_409_with_that_size_and_kept_as_evidence() -> None:
    # tlog-witness: "If the old size matches the checkpoint size, the witness MUST check that the
    # root hashes are also identical. If they don't match, [...] 409 Conflict".
    honest, rewritten = _tree(5), _tree(5, salt=b"rewritten ")
    submission = check_submission(format_add_checkpoint(AddCheckpoint(5, (), _note(rewritten))), LOGS)
    verdict = judge(submission, LogState(5, honest.root()))
    assert verdict.refusal is not None and (verdict.refusal.status, verdict.refusal.reason) == (409, "fork")
    assert verdict.conflict_size == 5 and verdict.refusal.evidence
    assert judge(check_submission(format_add_checkpoint(AddCheckpoint(5, (), _note(honest))), LOGS),
                 LogState(5, honest.root())).ok, "the same checkpoint again is cosigned again"  # fmt: skip


def test_a_proof_from_size_zero_and_an_empty_tree_with_another_root_are_422() -> None:
    tree = _tree(4)
    assert _submit(0, [bytes(32)], _note(tree), None)[0] == 422
    empty = sign_checkpoint_note(ORIGIN, 0, bytes(32), log_key()).note
    assert empty is not None
    assert _submit(0, [], empty, None)[0] == 422
    good_empty = sign_checkpoint_note(ORIGIN, 0, EMPTY_ROOT, log_key()).note
    assert good_empty is not None and _submit(0, [], good_empty, None)[0] == 200


@pytest.mark.parametrize(
    ("status", "content_type", "body", "kind", "size"),
    [
        (409, SIZE_CONTENT_TYPE, format_size(42), "conflict", 42),
        (409, "text/plain", b"42\n", "bad_response", None),
        (409, SIZE_CONTENT_TYPE, b"042\n", "bad_response", None),
        (404, "text/plain", b"", "unknown_log", None),
        (403, "text/plain", b"", "forbidden", None),
        (400, "text/plain", b"", "bad_request", None),
        (422, "text/plain", b"", "bad_proof", None),
        (429, "text/plain", b"", "retry", None),
        (503, "text/plain", b"", "retry", None),
        (302, "text/plain", b"", "bad_response", None),
        (200, "text/plain", b"not a signature line\n", "bad_response", None),
    ],
)
def test_the_client_reads_every_answer_of_the_protocol(
    status: int, content_type: str, body: bytes, kind: str, size: int | None
) -> None:
    outcome = interpret(status, content_type, body)
    assert (outcome.kind, outcome.size) == (kind, size)


@given(st.integers(min_value=0, max_value=2**63 - 1), st.lists(st.binary(min_size=32, max_size=32), max_size=63))
def test_requests_round_trip_through_format_and_parse(old: int, proof: list[bytes]) -> None:
    note = _note(_tree(2))
    request = AddCheckpoint(old, tuple(proof), note)
    assert parse_add_checkpoint(format_add_checkpoint(request)) == request
