"""Checkpoints are found by size: a run's end, `verify SESSION`, an export and `verify --since` never
read every stored checkpoint, so their cost does not grow with the number of runs a ledger holds; nor
does `verify SESSION`'s proof of each entry in the log read a whole Merkle path per entry."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from truss.ledger import verify
from truss.ledger.audit import verify_since
from truss.ledger.bundle import export_bundle, verify_bundle
from truss.ledger.entry import Record
from truss.ledger.keys import IdentityKey, TrustedKeys
from truss.ledger.note import sign_checkpoint
from truss.ledger.reader import VerifiedStore


class _Lean:
    """A store whose every method works except reading all checkpoints at once."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def checkpoints(self) -> Any:
        raise AssertionError("read every stored checkpoint")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _CountedNodes:
    """A store that counts the stored Merkle subtrees ``node_hashes`` is asked for."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.asked = 0

    def node_hashes(self, keys: Any) -> Any:
        keys = list(keys)
        self.asked += len(keys)
        return self._inner.node_hashes(keys)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _no_full_read(store: Any) -> Any:
    return _Lean(store)


def _key() -> IdentityKey:
    return IdentityKey.from_seed(hashlib.sha256(b"checkpoint lookups").digest(), "lookups.truss.test")


@pytest.fixture
def store_key() -> IdentityKey:
    """The key the shared ``store`` fixture (tests/ledger/conftest.py) signs with."""
    return _key()


def _many_runs(store: Any, runs: int) -> None:
    for i in range(runs):
        session = f"s_{i:03d}"
        store.append(session, [Record("session_started", {"contract": "c"})])
        store.append(session, [Record("session_ended", {"status": "ended"})])
        sign_checkpoint(store, _key())


def test_a_run_end_signs_its_checkpoint_from_the_latest_one_alone(store: Any) -> None:
    _many_runs(store, 30)
    store.append("s_last", [Record("session_started", {"contract": "c"})])
    signed = sign_checkpoint(_no_full_read(store), _key())
    assert signed.size == store.tree_size()
    latest = store.latest_checkpoint()
    assert latest is not None and latest.size == signed.size


def test_verify_session_export_and_since_use_lookups_by_size(store: Any) -> None:
    _many_runs(store, 30)
    trusted = TrustedKeys([_key().verifier])
    early = store.checkpoint_covering(1)
    assert early is not None
    lean = _no_full_read(store)
    report = verify(lean, trusted, session="s_004")
    assert report.ok, report
    bundle = export_bundle(lean, "s_004", vkey=_key().verifier.vkey)
    assert verify_bundle(bundle, trusted).ok
    since = verify_since(lean, early.note.encode(), trusted)
    assert since.ok and since.old_size == early.size and since.size == store.tree_size()


def test_an_export_carries_the_first_checkpoint_covering_the_session_not_the_latest(store: Any) -> None:
    _many_runs(store, 5)
    bundle = export_bundle(_no_full_read(store), "s_001", vkey=_key().verifier.vkey)
    covering = store.checkpoint_covering(4)  # s_001's last entry is the log's entry 3
    assert covering is not None and covering.size == 4
    assert json.loads(bundle)["checkpoint"] == covering.note


def test_the_verified_reader_reads_a_session_against_the_latest_checkpoint_alone(store: Any) -> None:
    _many_runs(store, 30)
    reader = VerifiedStore(_no_full_read(store), TrustedKeys([_key().verifier]))
    assert [item.seq for item in reader.read_session("s_004")] == [0, 1]
    info = reader.session("s_004")
    assert info is not None and info.entries == 2 and info.ended and info.verified == "chain"


def test_verify_session_proves_each_entry_reading_about_two_stored_nodes_not_a_whole_path(store: Any) -> None:
    _many_runs(store, 40)
    for turn in range(64):
        store.append(
            "long", [Record("session_started" if turn == 0 else "model_turn", {"contract": "c", "turn": turn})]
        )
    sign_checkpoint(store, _key())
    counted = _CountedNodes(store)
    lookups: Any = counted  # the store's whole protocol, through __getattr__
    report = verify(lookups, TrustedKeys([_key().verifier]), session="long")
    assert report.ok and report.entries == 64, report
    path = store.tree_size().bit_length()  # about the nodes one whole inclusion proof reads here
    assert counted.asked <= 2 * 64 + 2 * path < 64 * path // 2, "a whole path per entry would read 64 x ~8"
