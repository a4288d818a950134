"""Worker keys on a shared ledger: which keys the log admitted, and the checkpoint a worker ends with.

Many Truss processes (workers) write one ledger; each signs its entries with its own identity key,
admitted to the log's key set by a ``key_admitted`` statement in ``@log`` that a log key signed
(``truss.ledger.keyhistory``). Checkpoints are signed by the log key only, so a worker never signs
one: where a log-key process would sign the checkpoint that ends a session, a worker waits (bounded)
for the log's publisher to store one covering its entries and uses that (``end_checkpoint``).

A store shared across processes that can wait for a checkpoint implements ``CheckpointWaiter``
(PostgreSQL: by the server's clock); elsewhere a worker takes a covering checkpoint if one is
already stored and otherwise fails with what to run. The key set here is read from the store to
decide what to do, not to decide trust: verification follows the statements from trusted keys.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

from truss._errors import StoreError
from truss.ledger.entry import StoredEntry
from truss.ledger.keyhistory import log_entries
from truss.ledger.keys import IdentityKey
from truss.ledger.note import Checkpoint, CheckpointStore, covering_checkpoint, sign_checkpoint

__all__ = ["CHECKPOINT_WAIT_MS", "CheckpointWaiter", "end_checkpoint", "is_worker_key", "worker_vkeys"]

CHECKPOINT_WAIT_MS = 30_000
"""How long a worker waits for the log key's publisher to store a checkpoint covering its entries."""


@runtime_checkable
class CheckpointWaiter(Protocol):
    def await_checkpoint(self, covering: int, timeout_ms: int) -> bool: ...


class _WorkerStore(CheckpointStore, Protocol):
    def session(self, session: str) -> Any: ...

    def read_session(self, session: str, *, from_seq: int = 0) -> Iterable[StoredEntry]: ...


def worker_vkeys(entries: Iterable[StoredEntry]) -> set[str]:
    """The verifier keys ``@log``'s statements make worker keys: admitted ones and their rotated successors."""
    workers: set[str] = set()
    for item in entries:
        key = item.body.get("key")
        admitted = item.kind == "key_admitted"
        succeeds = item.kind == "key_rotated" and item.body.get("replaces") in workers
        if isinstance(key, str) and (admitted or succeeds):
            workers.add(key)
    return workers


def is_worker_key(store: _WorkerStore, key: IdentityKey) -> bool:
    """True when the log admitted ``key`` as a worker key (so it signs entries, not checkpoints)."""
    return key.verifier.vkey in worker_vkeys(log_entries(store))


def end_checkpoint(store: _WorkerStore, key: IdentityKey, *, wait_ms: int = CHECKPOINT_WAIT_MS) -> Checkpoint:
    """The checkpoint a session ends with: signed with ``key`` when it is a log key; for a worker
    key, the one the log key's publisher stores covering the tree as it is now (waited for, at most
    ``wait_ms``). ``StoreError`` (retryable) when none arrives: the session's record is complete, only
    its checkpoint is missing."""
    if not is_worker_key(store, key):
        return sign_checkpoint(store, key)
    size, _ = store.tree_head()
    latest = store.latest_checkpoint()  # one index lookup, as ``sign_checkpoint`` does: not every checkpoint
    covered = latest is not None and latest.size >= size
    if not covered and isinstance(store, CheckpointWaiter):
        covered = store.await_checkpoint(size, wait_ms)
    if not covered:
        raise StoreError(
            f"no checkpoint signed by the log key covers this worker's entries (log size {size}) after "
            f"{wait_ms // 1000} s: a worker key signs no checkpoint",
            remedy="run the log's publisher (`truss ledger checkpoint --every 1s` in the home holding the log "
            "key); every entry of the session is recorded, only the checkpoint and verdict envelope are missing",
            retryable=True,
            reason="no_checkpoint_publisher",
        )
    return covering_checkpoint(store, size)
