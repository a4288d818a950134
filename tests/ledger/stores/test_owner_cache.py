"""The SQLite writer keeps what it knows of the ledger (the log's frontier, the heads and leases of
the sessions it drives) between its commits, and re-reads it whenever another connection committed:
two stores on one file, each appending in turn or taking a session over, keep one valid log."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from truss._errors import StoreConflictError
from truss.ledger import verify
from truss.ledger.entry import Record
from truss.ledger.keys import IdentityKey, TrustedKeys
from truss.ledger.stores import open_store
from truss.ledger.stores.base import LeaseOwner, LedgerStore
from truss.testing import ManualClock


def _key() -> IdentityKey:
    return IdentityKey.from_seed(hashlib.sha256(b"owner cache").digest(), "cache.truss.test")


def _two(tmp_path: Path, clock: ManualClock) -> tuple[LedgerStore, LedgerStore]:
    first = open_store(str(tmp_path / "ledger.db"), key=_key(), clock=clock, create=True)
    second = open_store(str(tmp_path / "ledger.db"), key=_key(), clock=clock)
    return first, second


def test_two_writers_taking_turns_on_one_session_keep_one_chain(tmp_path: Path) -> None:
    clock = ManualClock()
    first, second = _two(tmp_path, clock)
    try:
        first.append("s_1", [Record("session_started", {"contract": "c"})])
        for turn in range(1, 7):
            writer = first if turn % 3 else second  # a writer's warm cache must see the other's appends
            [entry] = writer.append("s_1", [Record("model_turn", {"turn": turn})])
            assert entry.seq == turn and entry.index == turn
        second.append("s_2", [Record("session_started", {"contract": "c"})])
        [entry] = first.append("s_1", [Record("model_turn", {"turn": 7})])
        assert entry.index == 8, "the log index counts the other writer's session too"
        assert verify(first, TrustedKeys([_key().verifier])).ok
    finally:
        first.close()
        second.close()


def test_an_owner_with_a_warm_cache_is_refused_once_another_store_took_its_session_over(tmp_path: Path) -> None:
    clock = ManualClock()
    first, second = _two(tmp_path, clock)
    try:
        lease = first.acquire_lease("s_1", LeaseOwner("own_a", "host-a", 1), ttl_ms=1_000)
        first.append("s_1", [Record("session_started", {"contract": "c"})], epoch=lease.epoch)
        first.append("s_1", [Record("model_turn", {"turn": 1})], epoch=lease.epoch)  # warm: nothing read back
        clock.advance(1_001)
        taken = second.acquire_lease("s_1", LeaseOwner("own_b", "host-b", 2), ttl_ms=1_000)
        with pytest.raises(StoreConflictError) as refused:
            first.append("s_1", [Record("model_turn", {"turn": 2})], epoch=lease.epoch)
        assert refused.value.fields.get("reason") == "stale_epoch"
        [entry] = second.append("s_1", [Record("model_turn", {"turn": 2})], epoch=taken.epoch)
        assert entry.seq == 2
        assert verify(second, TrustedKeys([_key().verifier]), session="s_1").ok
    finally:
        first.close()
        second.close()


def test_a_lease_renewed_through_the_same_store_keeps_fencing_its_epoch(tmp_path: Path) -> None:
    clock = ManualClock()
    store = open_store(str(tmp_path / "ledger.db"), key=_key(), clock=clock, create=True)
    try:
        lease = store.acquire_lease("s_1", LeaseOwner("own_a", "host-a", 1), ttl_ms=1_000)
        store.append("s_1", [Record("session_started", {"contract": "c"})], epoch=lease.epoch)
        clock.advance(1_001)
        taken = store.acquire_lease("s_1", LeaseOwner("own_b", "host-b", 2), ttl_ms=1_000)
        with pytest.raises(StoreConflictError):
            store.append("s_1", [Record("model_turn", {"turn": 1})], epoch=lease.epoch)
        store.append("s_1", [Record("model_turn", {"turn": 1})], epoch=taken.epoch)
    finally:
        store.close()
