"""The verified reader checks a session's payloads (V11) a page at a time, and answers the payloads
it verified from that read: a resume's replay neither fetches nor hashes them a second time, and
what did not verify is never answered (docs/ledger-format.md, R1 and R5)."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path
from typing import Any, cast

import pytest

from truss._errors import VerificationError
from truss.ledger.canonical import sha256_ref
from truss.ledger.entry import Record
from truss.ledger.keys import IdentityKey, TrustedKeys
from truss.ledger.note import sign_checkpoint
from truss.ledger.reader import VerifiedStore
from truss.ledger.stores import LedgerStore, open_store
from truss.testing import ManualClock

CALLS = 700  # more than one page of entries


def _key() -> IdentityKey:
    return IdentityKey.from_seed(hashlib.sha256(b"verified payloads").digest(), "payloads.truss.test")


class _Counted:
    """A real store that counts the payload reads made through it."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.one_by_one = 0
        self.batches = 0

    def blob(self, ref: str) -> bytes | None:
        self.one_by_one += 1
        return self._inner.blob(ref)

    def blobs_for(self, refs: Any) -> dict[str, bytes]:
        self.batches += 1
        return self._inner.blobs_for(refs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@pytest.fixture
def store_key() -> IdentityKey:
    """The key the shared ``store`` fixture (tests/ledger/conftest.py) signs with."""
    return _key()


def _session(store: Any, calls: int = CALLS) -> list[str]:
    """A session of ``calls`` entries, each with a payload of its own and one they all share."""
    shared = b'{"timezone":"UTC"}'
    refs: list[str] = []
    store.append("s_long", [Record("session_started", {"contract": "c"})])
    for i in range(calls):
        data = f'{{"n":{i}}}'.encode()
        ref = sha256_ref(data)
        refs.append(ref)
        body = {"call": f"c{i}", "args": sha256_ref(shared), "result": ref}
        store.append("s_long", [Record("mcp_tool_call", body, {ref: data, sha256_ref(shared): shared})])
    sign_checkpoint(store, _key())
    return refs


def test_a_verified_read_fetches_its_payloads_a_page_at_a_time(store: Any) -> None:
    refs = _session(store)
    counted = _Counted(store)
    reader = VerifiedStore(cast(LedgerStore, counted), TrustedKeys([_key().verifier]))
    entries = list(reader.read_session("s_long"))
    assert len(entries) == CALLS + 1
    assert counted.one_by_one == 0, "no payload is read on its own"
    assert 1 <= counted.batches <= 3, "one query per page of entries"
    assert all(reader.blob(ref) == f'{{"n":{i}}}'.encode() for i, ref in enumerate(refs))
    assert counted.one_by_one == 0, "what the read verified is answered from it"
    assert reader.blobs_for(refs[:5]) == {ref: store.blob(ref) for ref in refs[:5]}
    assert counted.batches <= 3


def test_a_payload_changed_in_the_store_is_refused_and_never_answered_from_a_read(tmp_path: Path) -> None:
    store = open_store(tmp_path / "ledger.db", key=_key(), clock=ManualClock(), create=True)
    try:
        refs = _session(store, calls=40)
        with sqlite3.connect(tmp_path / "ledger.db") as db:
            db.execute("UPDATE blobs SET data = CAST('{\"n\":-1}' AS BLOB) WHERE ref = ?", (refs[20],))
        reader = VerifiedStore(store, TrustedKeys([_key().verifier]))
        for _ in range(2):  # a second read is refused the same way: nothing of the first was kept
            with pytest.raises(VerificationError) as refused:
                list(reader.read_session("s_long"))
            assert refused.value.fields["reason"] == "blob_mismatch"
            assert refused.value.fields["seq"] == 21
        with pytest.raises(VerificationError) as again:
            reader.blob(refs[20])
        assert again.value.fields["reason"] == "blob_mismatch"
        assert reader.blob(refs[3]) == b'{"n":3}', "a payload that hashes to its ref is still answered"
    finally:
        store.close()


def test_an_erasure_through_the_reader_is_not_undone_by_an_earlier_read(store: Any) -> None:
    refs = _session(store, calls=10)
    reader = VerifiedStore(store, TrustedKeys([_key().verifier]))
    list(reader.read_session("s_long"))
    assert reader.blob(refs[0]) == b'{"n":0}'
    reader.erase_payloads("s_long")
    assert reader.blob(refs[0]) is None
    assert reader.blobs_for(refs) == {}


def test_an_erasure_by_another_writer_is_seen_at_the_next_read(store: Any) -> None:
    refs = _session(store, calls=10)
    reader = VerifiedStore(store, TrustedKeys([_key().verifier]))
    list(reader.read_session("s_long"))
    store.erase_payloads("s_long")  # not through this reader: another process, say
    list(reader.read_session("s_long"))
    assert reader.blob(refs[0]) is None
