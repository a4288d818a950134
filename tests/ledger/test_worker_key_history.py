"""Worker keys in the log's key history: admitted and removed by signed statements in ``@log``,
followed from the log key. Each attack is a data file in ``tampered_admissions/`` named after it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.ledger.tampered_admissions.regenerate import W1, W2
from truss._errors import VerificationError
from truss.ledger.entry import StoredEntry, seal
from truss.ledger.keyhistory import admission_record, follow_rotations, join_request
from truss.ledger.keys import TrustedKeys

FIXTURES = Path(__file__).parent / "tampered_admissions"
ORIGIN = "truss.test/witnessed-log"
ATTACKS = {
    "admission_signed_by_a_worker_key": "forged_admission",
    "removal_signed_by_a_worker_key": "forged_admission",
    "admission_signed_by_a_retired_log_key": "forged_admission",
    "admission_without_the_workers_consent": "bad_admission",
    "removal_of_a_key_never_admitted": "bad_admission",
    "admission_of_a_key_of_another_log": "bad_admission",
    "admission_with_an_extra_field": "bad_admission",
    "admission_of_a_removed_key_again": "bad_admission",
}
REMEDIES = {
    "forged_admission": "do not trust entries signed by the key it names; the log's key set was forged",
    "bad_admission": "the log's key set is malformed; do not trust entries signed after it",
}


def _fixture(name: str) -> tuple[TrustedKeys, list[StoredEntry]]:
    doc: Any = json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))
    return TrustedKeys.from_texts(doc["trusted"]), [StoredEntry.from_json(e) for e in doc["entries"]]


def _entry_by(key: Any, index: int) -> StoredEntry:
    return seal(key, log=ORIGIN, session="s-run", seq=0, index=index, ts=1_700_000_000_000, kind="session_started",
                body={}, prev="0" * 64)  # fmt: skip


def test_a_worker_key_signs_entries_from_its_admission_until_its_removal_and_never_a_checkpoint() -> None:
    trusted, entries = _fixture("valid_two_workers_one_removed")
    history = follow_rotations(entries, trusted, origin=ORIGIN)
    admit_w1, admit_w2, remove_w1 = entries[1].index, entries[2].index, entries[3].index
    assert [(p.role, p.from_index, p.until_index) for p in history.periods] == [
        ("log", 0, None),
        ("worker", admit_w1 + 1, remove_w1 + 1),
        ("worker", admit_w2 + 1, None),
    ]
    assert history.check(_entry_by(W1, admit_w1 + 1)) is None
    assert history.check(_entry_by(W2, remove_w1 + 100)) is None
    before = history.check(_entry_by(W1, admit_w1))
    after = history.check(_entry_by(W1, remove_w1 + 1))
    assert before is not None and before[0] == "retired_key"
    assert after is not None and after[0] == "retired_key"
    for size in (admit_w1 + 2, remove_w1 + 5):
        assert history.checkpoint_keys(size) == [history.periods[0].key]


@pytest.mark.parametrize("name", sorted(ATTACKS), ids=sorted(ATTACKS))
def test_a_forged_or_malformed_admission_or_removal_fails_with_its_reason(name: str) -> None:
    trusted, entries = _fixture(name)
    with pytest.raises(VerificationError) as caught:
        follow_rotations(entries, trusted, origin=ORIGIN)
    assert caught.value.fields["reason"] == ATTACKS[name]
    assert caught.value.fields["session"] == "@log"
    statement = next(e for e in entries if e.index == caught.value.index)
    assert caught.value.seq == statement.seq and caught.value.remedy == REMEDIES[ATTACKS[name]]


def test_an_admission_record_refuses_a_proof_that_is_not_the_workers() -> None:
    from truss._errors import InputError

    assert admission_record(W1.verifier, join_request(W1)).kind == "key_admitted"
    with pytest.raises(InputError):
        admission_record(W1.verifier, join_request(W2))
    with pytest.raises(InputError):
        admission_record(W1.verifier, "not base64!")
