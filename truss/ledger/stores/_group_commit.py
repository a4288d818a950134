"""Group commit, as the SQLite and PostgreSQL writers share it: concurrent appends, one transaction.

Every append is a ``Pending`` batch (encoded in the caller's thread). ``GroupCommit.run`` commits it:

- without group commit, alone, under the writer lock;
- with it (leader/follower), the first caller to find no leader takes every batch queued so far
  and commits them together under the writer lock, sharing one flush; callers that queue
  meanwhile wait on their own event. A batch's event is set once it has its result or error, so
  a finished follower returns at once instead of waiting for the next commit. The leader then
  hands the lead to the oldest waiter (its event is set while it is not done: it wakes to lead
  the next group), or, when nobody waits, gives it up. A waiter interrupted in its wait (a signal
  in the main thread) leaves the queue unwritten and hands on a lead it was given, so the callers
  behind it are not left waiting for a leader that went away.

The backend's ``commit(group)`` runs the one transaction and settles every batch of the group:
``finish`` when it commits (each batch with its entries, or its own error when it failed alone in
its savepoint), ``fail_all`` when the whole group fails, so every member gets the error.

What it does not do: SQL, locks of the database, sealing (``base.seal_batch``) or deciding which
errors fail a group: the backends (``_sqlite_writer``, ``_pg_writer``) do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from threading import Event, Lock

from truss._errors import StoreConflictError, StoreError, TrussError
from truss.ledger.entry import Record, StoredEntry, encode_record

__all__ = ["GroupCommit", "Pending", "batch_error", "fail_all", "finish"]


class Pending:
    """One caller's batch waiting for a group commit."""

    __slots__ = (
        "bodies",
        "done",
        "durable",
        "epoch",
        "error",
        "expect_index",
        "expect_seq",
        "records",
        "result",
        "rotates",
        "session",
        "wake",
    )

    def __init__(
        self,
        session: str,
        records: Sequence[Record],
        durable: bool,
        expect_seq: int | None,
        *,
        expect_index: int | None = None,
        epoch: int | None = None,
    ) -> None:
        # Checked and encoded here, in the caller's thread, so the writer only splices and signs.
        bodies: list[bytes] = []
        rotates = False
        for record in records:  # one pass, no generator: every append makes one of these
            bodies.append(encode_record(record))
            rotates = rotates or record.kind == "key_rotated"
        self.bodies = bodies
        self.rotates = rotates  # a key rotation: the key signs nothing after this batch
        self.session = session
        self.records = records
        self.durable = durable
        self.expect_seq = expect_seq
        self.expect_index = expect_index
        self.epoch = epoch
        self.result: list[StoredEntry] = []
        self.error: TrussError | None = None
        self.done = False
        # Only a follower waits (its event is made when it queues); a lone writer never needs one.
        self.wake: Event | None = None


def finish(group: Sequence[Pending]) -> None:
    """The group committed: every batch is done (with its entries or its own error); wake the waiters."""
    for pending in group:
        pending.done = True
        if pending.wake is not None:
            pending.wake.set()


def fail_all(group: Sequence[Pending], exc: TrussError, *, keep_own: bool = False) -> None:
    """The group's transaction failed: nothing of it is written, and every batch gets ``exc``.

    ``keep_own``: a batch that already failed alone (its savepoint rolled back) keeps its own error.
    """
    for pending in group:
        if not keep_own or pending.error is None:
            pending.error = exc
        pending.result = []
        pending.done = True
        if pending.wake is not None:
            pending.wake.set()


def batch_error(pending: Pending, exc: Exception, detail: Callable[[BaseException], str] = str) -> TrussError:
    """What a batch that failed alone raises: a store's own error as it is, a broken unique
    constraint (another writer recorded the same step) as ``StoreConflictError``."""
    if isinstance(exc, TrussError):
        return exc
    return StoreConflictError(
        f"session {pending.session}: another writer recorded this step ({detail(exc)})",
        remedy="re-read the session and retry from its head",
        session=pending.session,
    )


def _unsettled(exc: BaseException) -> StoreError:
    return StoreError(
        f"the group commit this append was part of stopped ({type(exc).__name__}) before it said whether the"
        " append was written",
        remedy="Read the session again before going on: the append may or may not be recorded",
    )


class GroupCommit:
    """The leader/follower queue of one writer (see the module docstring).

    ``lock`` is the writer's lock, held across every ``commit``. The writer passes its ``commit``
    with each call rather than the queue keeping it, so a writer and its queue form no reference
    cycle (a dropped store's connections close as it is dropped). ``commit(group)`` must settle
    every batch of ``group`` (``finish`` or ``fail_all``) unless it raises.
    """

    __slots__ = ("_group", "_leading", "_lock", "_qlock", "_queue")

    def __init__(self, lock: Lock, *, group: bool) -> None:
        self._lock = lock
        self._group = group
        self._qlock = Lock()
        self._queue: list[Pending] = []
        self._leading = False

    def run(self, pending: Pending, commit: Callable[[list[Pending]], None]) -> list[StoredEntry]:
        """Commit ``pending``, alone or with the batches queued beside it; its entries, or its error raised."""
        if not self._group:
            with self._lock:
                commit([pending])
        else:
            with self._qlock:
                self._queue.append(pending)
                lead = not self._leading
                self._leading = True
                if not lead:
                    pending.wake = Event()
            if pending.wake is not None:
                try:
                    pending.wake.wait()
                except BaseException:
                    # Interrupted as it waits (a signal in the main thread): it leaves the queue, so
                    # nothing of it is written, passing the lead on if it had been handed it, else
                    # the callers behind it would wait for ever. A leader that took it settles it.
                    self._withdraw(pending)
                    raise
            if not pending.done:
                self._lead(pending, commit)
        if pending.error is not None:
            raise pending.error
        return pending.result

    def _lead(self, pending: Pending, commit: Callable[[list[Pending]], None]) -> None:
        group: list[Pending] = []
        try:
            with self._qlock:
                group, self._queue = self._queue, []
            with self._lock:
                commit(group)
        except BaseException as exc:
            # ``commit`` raised before it settled its group (a bug, or an interrupt in the leader's
            # thread): its followers would wait for ever. They get a store error instead; the
            # leader its own exception.
            unsettled = [p for p in group if not p.done]
            if unsettled:
                fail_all(unsettled, _unsettled(exc))
            raise
        finally:
            with self._qlock:
                if not group:  # stopped before it took the queue: it is still queued, first
                    self._queue = [p for p in self._queue if p is not pending]
                self._hand_on()

    def _hand_on(self) -> None:
        """Give the lead to the oldest waiter, or give it up; with ``_qlock`` held."""
        if self._queue:
            wake = self._queue[0].wake  # a follower's: it queued while a leader held the lead
            assert wake is not None
            wake.set()  # not done: it wakes as the next leader
        else:
            self._leading = False

    def _withdraw(self, pending: Pending) -> None:
        """Take ``pending``, a follower that stopped waiting, out of the queue if no leader took it."""
        with self._qlock:
            if not any(p is pending for p in self._queue):
                return  # in a group already: its leader settles it
            self._queue = [p for p in self._queue if p is not pending]
            assert pending.wake is not None
            if pending.wake.is_set():  # still queued and woken: it had been handed the lead
                self._hand_on()

    def bulk(
        self, batches: Iterable[tuple[str, Sequence[Record]]], commit: Callable[[list[Pending]], None], *, per_txn: int
    ) -> int:
        """Commit many batches, ``per_txn`` per transaction, each transaction but the last not
        durable (the last one's flush covers them all); the first failing batch raises and stops.
        Returns the number of entries appended."""
        count = 0
        chunk: list[Pending] = []

        def flush(last: bool) -> None:
            nonlocal count
            for p in chunk:
                p.durable = False
            if last and chunk:
                chunk[-1].durable = True
            with self._lock:
                commit(chunk)
            for p in chunk:
                if p.error is not None:
                    raise p.error
                count += len(p.result)
            chunk.clear()

        for session, records in batches:
            chunk.append(Pending(session, list(records), False, None))
            if len(chunk) >= per_txn:
                flush(False)
        flush(True)
        return count
