"""The group commit queue both SQL stores share (``_group_commit``), driven with a fake commit.

The fake commit blocks the first group until the followers have queued (each follower's wait
event is counted as it is made), so the grouping is the same every run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType

import pytest

from truss._errors import StoreConflictError, StoreError
from truss.ledger.entry import Record, StoredEntry
from truss.ledger.stores import _group_commit
from truss.ledger.stores._group_commit import GroupCommit, Pending, batch_error, fail_all, finish

WAIT_S = 5


class _Run:
    """Drives a ``GroupCommit`` whose commit the test decides: a leader held in its first commit,
    followers queued behind it in a known order."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, settle: Callable[[list[Pending]], None]) -> None:
        queued = threading.Semaphore(0)

        class CountedEvent(threading.Event):
            def __init__(self) -> None:
                super().__init__()
                queued.release()  # made under the queue lock, as a follower queues

        monkeypatch.setattr(_group_commit, "Event", CountedEvent)
        self._queued = queued
        self._settle = settle
        self._leading = threading.Event()
        self._release = threading.Event()
        self.groups: list[tuple[str, list[str]]] = []  # (committing thread, sessions)
        self.returned: dict[str, list[StoredEntry] | BaseException] = {}
        self.results: dict[str, list[StoredEntry]] = {}
        self._threads: list[threading.Thread] = []
        self.queue = GroupCommit(threading.Lock(), group=True)

    def _commit(self, group: list[Pending]) -> None:
        self.groups.append((threading.current_thread().name, [p.session for p in group]))
        if len(self.groups) == 1:
            self._leading.set()
            assert self._release.wait(WAIT_S)
        for p in group:
            p.result = self.results[p.session] = []  # an object of its own, to tell whose it is
        self._settle(group)

    def _append(self, session: str) -> None:
        pending = Pending(session, [Record("model_turn", {"s": session})], True, None)
        try:
            self.returned[session] = self.queue.run(pending, self._commit)
        except BaseException as exc:  # a store error, what a broken commit raised in its leader, an interrupt
            self.returned[session] = exc

    def start(self, session: str) -> None:
        # A daemon: a caller left waiting for ever (the bug a test catches) does not keep pytest from ending.
        thread = threading.Thread(target=self._append, args=(session,), name=session, daemon=True)
        self._threads.append(thread)
        thread.start()
        if len(self._threads) == 1:
            assert self._leading.wait(WAIT_S), "the first caller leads"
        else:
            assert self._queued.acquire(timeout=WAIT_S), f"{session} queued behind the leader"

    def finish(self) -> None:
        self._release.set()
        for thread in self._threads:
            thread.join(WAIT_S)
            assert not thread.is_alive()

    def through(self, *sessions: str) -> None:
        """The first session leads; the others queue behind it in this order; then all finish."""
        for session in sessions:
            self.start(session)
        self.finish()


def test_followers_commit_together_led_by_the_oldest_and_each_gets_its_own_entries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = _Run(monkeypatch, finish)
    run.through("leader", "first", "second", "third")
    assert run.groups == [("leader", ["leader"]), ("first", ["first", "second", "third"])]
    for session in ("leader", "first", "second", "third"):
        assert run.returned[session] is run.results[session]


def test_an_error_of_a_failed_group_reaches_every_member(monkeypatch: pytest.MonkeyPatch) -> None:
    failure = StoreError("the disk is full")

    def settle(group: list[Pending]) -> None:
        if len(group) > 1:
            fail_all(group, failure)
        else:
            finish(group)

    run = _Run(monkeypatch, settle)
    run.through("leader", "first", "second")
    assert run.groups[1] == ("first", ["first", "second"])
    assert run.returned["leader"] == []
    assert run.returned["first"] is failure and run.returned["second"] is failure


def test_a_commit_that_raises_without_settling_its_group_fails_its_followers_instead_of_leaving_them_waiting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def settle(group: list[Pending]) -> None:
        if len(group) > 1:
            raise RuntimeError("a bug in the backend's commit")
        finish(group)

    run = _Run(monkeypatch, settle)
    run.through("leader", "first", "second", "third")  # joins every thread, bounded
    assert run.groups[1] == ("first", ["first", "second", "third"])
    assert run.returned["leader"] == []
    assert isinstance(run.returned["first"], RuntimeError), "the group's leader gets its own exception"
    for session in ("second", "third"):
        error = run.returned[session]
        assert isinstance(error, StoreError) and "RuntimeError" in error.message


@pytest.mark.parametrize("woken", [False, True], ids=["while-it-waits", "as-it-is-woken-to-lead"])
def test_a_follower_interrupted_in_its_wait_leaves_the_queue_unwritten_and_the_followers_behind_it_still_commit(
    monkeypatch: pytest.MonkeyPatch, woken: bool
) -> None:
    run = _Run(monkeypatch, finish)
    counted: type[threading.Event] = _group_commit.Event

    class Interrupted(counted):
        def wait(self, timeout: float | None = None) -> bool:
            if threading.current_thread().name != "first":
                return super().wait(timeout)
            if woken:
                assert super().wait(WAIT_S), "the leader hands the lead to the oldest follower"
            raise KeyboardInterrupt  # what a signal raises in the main thread's wait

    monkeypatch.setattr(_group_commit, "Event", Interrupted)
    run.through("leader", "first", "second", "third")  # joins every thread, bounded
    assert isinstance(run.returned["first"], KeyboardInterrupt)
    assert "first" not in run.results, "the interrupted batch is in no group: nothing of it is written"
    assert run.groups == [("leader", ["leader"]), ("second", ["second", "third"])]
    assert run.returned["second"] is run.results["second"] and run.returned["third"] is run.results["third"]
    later = Pending("later", [Record("model_turn", {})], True, None)
    assert run.queue.run(later, finish) == [], "nobody holds the lead: a new caller leads at once"


class _InterruptedOnce:
    """A queue lock whose ``nth`` taking by the thread ``name`` is interrupted (a signal as it waits for it)."""

    def __init__(self, name: str, nth: int) -> None:
        self._inner = threading.Lock()
        self._name, self._nth, self._taken = name, nth, 0

    def __enter__(self) -> bool:
        if threading.current_thread().name == self._name:
            self._taken += 1
            if self._taken == self._nth:
                raise KeyboardInterrupt
        return self._inner.__enter__()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._inner.__exit__(kind, exc, tb)


def test_a_follower_interrupted_as_it_takes_the_lead_it_was_handed_passes_it_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = _Run(monkeypatch, finish)
    monkeypatch.setattr(run.queue, "_qlock", _InterruptedOnce("first", 2))  # 1: it queues; 2: it leads
    run.through("leader", "first", "second", "third")  # joins every thread, bounded
    assert isinstance(run.returned["first"], KeyboardInterrupt)
    assert run.groups == [("leader", ["leader"]), ("second", ["second", "third"])]
    assert run.returned["second"] is run.results["second"] and run.returned["third"] is run.results["third"]


def test_a_batch_that_failed_alone_in_a_committed_group_raises_its_own_error_and_the_others_return(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    own = StoreConflictError("session second: another writer recorded this step")

    def settle(group: list[Pending]) -> None:
        for p in group:
            if p.session == "second":  # its savepoint rolled back; the group commits
                p.result, p.error = [], own
        finish(group)

    run = _Run(monkeypatch, settle)
    run.through("leader", "first", "second", "third")
    assert run.groups[1] == ("first", ["first", "second", "third"])
    assert run.returned["second"] is own
    assert run.returned["first"] is run.results["first"] and run.returned["third"] is run.results["third"]


def test_fail_all_replaces_a_batch_error_unless_asked_to_keep_it() -> None:
    own, failure = StoreConflictError("own"), StoreError("all")
    kept, replaced = Pending("a", [], True, None), Pending("b", [], True, None)
    kept.error = replaced.error = own
    fail_all([kept], failure, keep_own=True)
    fail_all([replaced], failure)
    assert (kept.error, replaced.error) == (own, failure)
    assert kept.done and replaced.done


def test_a_broken_unique_constraint_is_a_conflict_on_the_batch_session_and_a_store_error_stays_itself() -> None:
    pending = Pending("s-1", [], True, None)
    conflict = batch_error(pending, ValueError("UNIQUE constraint failed\ndetail"), lambda e: str(e).splitlines()[0])
    assert isinstance(conflict, StoreConflictError)
    assert conflict.fields["session"] == "s-1"
    assert "UNIQUE constraint failed)" in conflict.message
    error = StoreError("mine")
    assert batch_error(pending, error) is error


def test_without_group_commit_every_batch_commits_alone_under_the_lock() -> None:
    lock = threading.Lock()
    held: list[bool] = []

    def commit(group: list[Pending]) -> None:
        held.append(lock.locked())
        finish(group)

    queue = GroupCommit(lock, group=False)
    assert queue.run(Pending("s", [Record("model_turn", {})], True, None), commit) == []
    assert held == [True]
