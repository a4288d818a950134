"""What a run reads after its journal's head must continue that head's chain.

A suspended run (``Session._reload``) and a resumed one index what the store holds after the head
they know; the journal refuses an entry that does not chain to it (``truss.journal.Journal.extend``,
``truss.ledger.verification.chain_link``): a ``VerificationError`` naming the session, the seq and
the reason, never an entry silently taken into the run.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

import pytest

from tests.gate.support import new_store
from truss._errors import VerificationError
from truss.gate import Journal
from truss.ledger.entry import Record
from truss.ledger.stores.sqlite import SqliteStore

SESSION = "s_chain"


def _recorded(tmp_path: Path) -> tuple[SqliteStore, Path]:
    store, _ = new_store(tmp_path)
    store.append(SESSION, [Record("session_started", {"contract": "c"})])
    for n in range(3):
        store.append(SESSION, [Record("model_turn", {"turn": n, "n": n})])
    return store, tmp_path / "ledger.db"


def _tamper(db: Path, seq: int, change: dict[str, object], *, rehash: bool) -> None:
    with sqlite3.connect(db) as conn:
        (raw,) = conn.execute("SELECT raw FROM entries WHERE session = ? AND seq = ?", (SESSION, seq)).fetchone()
        entry = {**json.loads(raw), **change}
        forged = json.dumps(entry, separators=(",", ":"), sort_keys=True).encode()
        if rehash:
            conn.execute("UPDATE entries SET raw = ?, hash = ? WHERE session = ? AND seq = ?",
                         (forged, hashlib.sha256(forged).digest(), SESSION, seq))  # fmt: skip
        else:
            conn.execute("UPDATE entries SET raw = ? WHERE session = ? AND seq = ?", (forged, SESSION, seq))


def _journal_at(store: SqliteStore, head: int) -> Journal:
    return Journal(store, SESSION, recorded=list(store.read_session(SESSION))[: head + 1])


def test_entries_after_the_head_that_continue_its_chain_are_indexed(tmp_path: Path) -> None:
    store, _ = _recorded(tmp_path)
    journal = _journal_at(store, 1)
    journal.extend(store.read_session(SESSION, from_seq=journal.next_seq))
    assert journal.head is not None and journal.head.seq == 3


@pytest.mark.parametrize(
    ("seq", "change", "rehash", "reason"),
    [
        (2, {"prev": "ab" * 32}, True, "prev_mismatch"),  # the first entry read forks from another head
        (3, {"prev": "cd" * 32}, True, "prev_mismatch"),  # a later one does not follow the one before
        (2, {"body": {"turn": 0, "n": 9}}, False, "hash_mismatch"),  # its bytes changed under its hash
    ],
    ids=["first_entry_forks_from_the_head", "later_entry_breaks_the_chain", "entry_changed_under_its_hash"],
)
def test_a_tampered_entry_after_the_head_is_a_ledger_error_not_indexed(
    tmp_path: Path, seq: int, change: dict[str, object], rehash: bool, reason: str
) -> None:
    store, db = _recorded(tmp_path)
    journal = _journal_at(store, 1)
    _tamper(db, seq, change, rehash=rehash)
    with pytest.raises(VerificationError) as caught:
        journal.extend(store.read_session(SESSION, from_seq=journal.next_seq))
    assert (caught.value.fields["reason"], caught.value.fields["seq"]) == (reason, seq)
    assert caught.value.fields["session"] == SESSION
    assert journal.head is not None and journal.head.seq == seq - 1


def test_entries_read_past_a_gap_after_the_head_are_refused(tmp_path: Path) -> None:
    store, _ = _recorded(tmp_path)
    journal = _journal_at(store, 1)
    with pytest.raises(VerificationError) as caught:
        journal.extend(store.read_session(SESSION, from_seq=3))
    assert (caught.value.fields["reason"], caught.value.fields["seq"]) == ("seq_gap", 3)


def test_a_verified_whole_read_is_indexed_as_given_but_what_follows_a_head_is_still_checked(tmp_path: Path) -> None:
    # ``chained``: the resume's verified read of the whole session (R1 checked each link) is indexed
    # without hashing it again; entries given after a head, chained or not, are checked as ever.
    store, db = _recorded(tmp_path)
    whole = list(store.read_session(SESSION))
    journal = Journal(store, SESSION, recorded=whole[:2], chained=True)
    assert journal.head is not None and journal.head.seq == 1
    _tamper(db, 2, {"body": {"turn": 0, "n": 9}}, rehash=False)
    with pytest.raises(VerificationError) as caught:
        journal.extend(store.read_session(SESSION, from_seq=journal.next_seq), chained=True)
    assert (caught.value.fields["reason"], caught.value.fields["seq"]) == ("hash_mismatch", 2)
    assert journal.head.seq == 1
