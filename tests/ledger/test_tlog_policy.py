"""C2SP tlog-policy: the spec's example, the quorum and its shortfalls, bad policies (one data file
per mistake), and checkpoints verified under a policy, forks included."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.ledger._witness_keys import C2SP, ORIGIN, log_key, witness_key
from truss._errors import PolicyError, VerificationError
from truss.ledger.cosignature import cosign, with_signature_lines
from truss.ledger.keyhistory import KeyHistory, KeyPeriod
from truss.ledger.keys import IdentityKey
from truss.ledger.note import parse_note, sign_checkpoint_note
from truss.ledger.tlog_policy import (
    Policy,
    PolicyLog,
    PolicyWitness,
    evaluate,
    find_fork,
    parse_policy,
    verify_witnessed,
)
from truss.ledger.witnessed import verify_with_policy

BAD = sorted((Path(__file__).parent / "bad_policies").glob("*.policy"))
ROOT_A, ROOT_B = bytes(range(32)), bytes(range(1, 33))


def _fill(template: str) -> str:
    """The spec's example with each ``<vkey>`` filled: the log key first, then one witness key each."""
    out, n = template, 0
    out = out.replace("log <vkey>", f"log {log_key().verifier.vkey}", 1)
    while "<vkey>" in out:
        out = out.replace("<vkey>", witness_key(f"example-{n}").verifier.vkey, 1)
        n += 1
    return out


def _bad(path: Path) -> str:
    text = path.read_bytes().decode("utf-8")
    return (
        text.replace("{W1}", witness_key("a").verifier.vkey)
        .replace("{W2}", witness_key("b").verifier.vkey)
        .replace("{L}", log_key().verifier.vkey)
    )


def test_the_spec_example_policy_needs_two_x_witnesses_and_one_y_witness() -> None:
    policy = parse_policy(_fill((C2SP / "tlog-policy_example.policy").read_text()), file="example.policy")
    assert [log.key.name for log in policy.logs] == [ORIGIN]
    assert sorted(policy.witnesses) == ["X1", "X2", "X3", "Y1", "Y2", "Y3"]
    assert policy.quorum == "X-and-Y" and policy.groups["X-witnesses"].threshold == 2
    assert evaluate(policy, ["X1", "X3", "Y2"]).ok
    short = evaluate(policy, ["X1", "Y1", "Y2"])
    assert not short.ok
    assert [(s.name, s.have, s.need, s.missing) for s in short.short] == [
        ("X-and-Y", 1, 2, ("X-witnesses",)),
        ("X-witnesses", 1, 2, ("X2", "X3")),
    ]


def test_a_two_of_two_quorum_names_the_witness_that_is_missing() -> None:
    policy = parse_policy(
        f"witness w1 {witness_key('w1').verifier.vkey} http://127.0.0.1:1\n"
        f"witness w2 {witness_key('w2').verifier.vkey}\n"
        "group both all w1 w2\nquorum both\n"
    )
    assert policy.witnesses["w1"].url == "http://127.0.0.1:1" and policy.witnesses["w2"].url is None
    result = evaluate(policy, ["w1"])
    assert not result.ok and result.short[0].missing == ("w2",)
    assert "w2" in result.describe()
    assert evaluate(parse_policy("quorum none\n"), []).ok


def test_comments_blank_lines_and_tabs_are_allowed() -> None:
    policy = parse_policy(f"# witnesses\n\n\twitness\tw1  {witness_key('w1').verifier.vkey}  \n  # x\nquorum w1\n")
    assert list(policy.witnesses) == ["w1"]


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_a_bad_policy_is_refused_with_its_line(path: Path) -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy(_bad(path), file=path.name)
    assert info.value.file == path.name
    if path.stem != "no_quorum_line":
        assert isinstance(info.value.line, int)


def _cosigned(root: bytes, *witnesses: str, size: int = 5) -> bytes:
    note = sign_checkpoint_note(ORIGIN, size, root, log_key()).note
    assert note is not None
    text = parse_note(note).text
    return with_signature_lines(note, [cosign(text, witness_key(w), 1_700_000_000) for w in witnesses])


def _policy() -> str:
    return (
        f"log {log_key().verifier.vkey}\nwitness w1 {witness_key('w1').verifier.vkey}\n"
        f"witness w2 {witness_key('w2').verifier.vkey}\ngroup any-one any w1 w2\nquorum any-one\n"
    )


def test_a_checkpoint_under_a_policy_reports_its_cosigners_and_quorum() -> None:
    policy = parse_policy(_policy())
    witnessed = verify_witnessed(_cosigned(ROOT_A, "w2", "stranger"), policy)
    assert sorted(witnessed.cosignatures) == ["w2"] and witnessed.quorum.ok
    assert not verify_witnessed(_cosigned(ROOT_A), policy).quorum.ok


def test_a_log_the_policy_does_not_list_is_refused() -> None:
    other = "truss.test/other-log"
    key = log_key(name=other)
    note = sign_checkpoint_note(other, 1, ROOT_A, key).note
    assert note is not None
    with pytest.raises(VerificationError) as info:
        verify_witnessed(note, parse_policy(_policy()), [key.verifier])
    assert info.value.reason == "log_not_in_policy"


def test_two_cosigned_checkpoints_of_one_size_with_different_roots_are_reported_as_a_fork_with_both() -> None:
    policy = parse_policy(_policy())
    first = verify_witnessed(_cosigned(ROOT_A, "w1"), policy, source="a.note")
    second = verify_witnessed(_cosigned(ROOT_B, "w2"), policy, source="b.note")
    fork = find_fork([first, second])
    assert fork is not None and (fork.first.source, fork.second.source) == ("a.note", "b.note")
    report = verify_with_policy(
        policy,
        origin=ORIGIN,
        keys_for=lambda _size: [log_key().verifier],
        required=[(_cosigned(ROOT_A, "w1"), "a.note"), (_cosigned(ROOT_B, "w2"), "b.note")],
    )
    assert (report.ok, report.step, report.reason) == (False, "W3", "fork")
    assert len(report.to_json()["fork"]) == 2 and all("note" in f for f in report.to_json()["fork"])


def test_a_note_that_disagrees_with_the_log_as_held_is_a_fork_too() -> None:
    policy = parse_policy(_policy())
    report = verify_with_policy(
        policy,
        origin=ORIGIN,
        keys_for=lambda _size: [log_key().verifier],
        required=[],
        others=[(_cosigned(ROOT_B, "w1"), "kept.note")],
        tree_size=9,
        root_at=lambda _size: ROOT_A,
    )
    assert (report.step, report.reason) == ("W4", "fork")


def test_a_policy_naming_the_first_log_key_does_not_let_that_key_sign_after_it_was_rotated_away() -> None:
    # The policy was written when the log had its first key; the log then rotated to a new one at
    # index 4. A checkpoint of size 10 signed with the retired key, and cosigned, is not the log's.
    first, second = log_key(), log_key("rotated log key")
    history = KeyHistory([KeyPeriod(first.verifier, 0, 4), KeyPeriod(second.verifier, 4, None)])
    policy = parse_policy(f"log {first.verifier.vkey}\nwitness w1 {witness_key('w1').verifier.vkey}\nquorum w1\n")

    def signed(key: IdentityKey, size: int) -> bytes:
        note = sign_checkpoint_note(ORIGIN, size, ROOT_A, key).note
        assert note is not None
        return with_signature_lines(note, [cosign(parse_note(note).text, witness_key("w1"), 1_700_000_000)])

    def check(note: bytes) -> tuple[bool, str | None]:
        report = verify_with_policy(
            policy, origin=ORIGIN, keys_for=history.checkpoint_keys, required=[(note, "held.note")]
        )
        return report.ok, report.step

    assert check(signed(second, 10)) == (True, None)
    assert check(signed(first, 3)) == (True, None), "before the rotation the first key signs"
    assert check(signed(first, 10)) == (False, "W1")


def test_a_witness_whose_key_id_collides_with_another_s_is_credited_only_for_its_own_cosignature() -> None:
    # Key ids are 4 bytes: a hostile witness of the policy can grind a key whose (name, key id) is
    # the honest witness's. Its cosignature must count for itself, never for the witness it mimics.
    honest = witness_key("a")
    hostile = witness_key("mimic", name=honest.name)
    hostile.key_id = hostile.verifier.key_id = honest.key_id  # what 2**32 tries at grinding give
    policy = Policy(
        (PolicyLog(log_key().verifier),),
        {"H": PolicyWitness("H", hostile.verifier), "A": PolicyWitness("A", honest.verifier)},
        {},
        "A",
    )
    note = sign_checkpoint_note(ORIGIN, 5, ROOT_A, log_key()).note
    assert note is not None
    by_hostile = with_signature_lines(note, [cosign(parse_note(note).text, hostile, 1_700_000_000)])
    witnessed = verify_witnessed(by_hostile, policy)
    assert (sorted(witnessed.cosignatures), witnessed.quorum.ok) == (["H"], False)
    by_honest = with_signature_lines(note, [cosign(parse_note(note).text, honest, 1_700_000_000)])
    witnessed = verify_witnessed(by_honest, policy)
    assert (sorted(witnessed.cosignatures), witnessed.quorum.ok) == (["A"], True)
